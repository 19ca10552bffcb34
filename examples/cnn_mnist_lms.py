"""MNIST CNN trained with a TensorFlow Estimator, with Large Model Support.

The network is the one from the old "layers" tutorial: 5x5 convolution
(32 filters) and 2x2 max-pool, 5x5 convolution (64 filters) and max-pool,
a 1024-unit dense layer with 40% dropout, and 10 logits, written with
`tf.compat.v1.layers` inside an Estimator `model_fn`.

It shows the Estimator way of turning LMS on: pass the `LMS` object as a
training hook, ``estimator.train(input_fn, steps=..., hooks=[lms])``. The
Estimator builds a fresh graph for each `train()` call; the hook's
`begin()` edits it before the training session is created.

It needs tf.estimator, so TensorFlow 2.15 (`pip install 'tflms[tf215]'`):
on TensorFlow 2.16+, where tf.estimator was removed, it says so and exits
with status 2 (mnist_deep_lms.py trains an MNIST CNN with a Session).

As in mnist_deep_lms.py, --image_size resizes the 28x28 digits inside the
model so the activations (and LMS's work) grow.

Examples::

    python cnn_mnist_lms.py
    python cnn_mnist_lms.py --lms --swapout-threshold 1 --swapin-ahead 1 \\
        --swapin-groupby 0
    python cnn_mnist_lms.py --lms --image_size 112 --autotune-gpu-mem 2

The last line is ``RESULT first_loss=... loss=... accuracy=...``: the loss
of the first training step, then the test loss and accuracy after training.
"""

import argparse
import shutil
import sys
import tempfile

import _lms_flags
import _mnist_data


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description="MNIST CNN trained with tf.estimator and Large Model "
                    "Support (hooks=[lms]).")
    _lms_flags.add_size_flags(
        parser, image_size=28, batch_size=100, epochs=1, steps=2000,
        image_help="side of the images the network sees; the 28x28 digits "
                   "are resized to it inside the model")
    _mnist_data.add_data_flags(parser)
    parser.add_argument("--model_dir", default=None,
                        help="Estimator checkpoint folder (default: a "
                             "temporary folder, deleted at the end)")
    parser.add_argument("--learning_rate", type=float, default=1e-3,
                        help="Adam learning rate (default 1e-3)")
    parser.add_argument("--log_every", type=int, default=100,
                        help="log the training loss every N steps")
    parser.add_argument("--seed", type=int, default=0, help="random seed")
    _lms_flags.add_lms_flags(parser)
    return parser.parse_args(argv)


def make_model_fn(tf, image_size, learning_rate):
    layers = tf.compat.v1.layers

    def model_fn(features, labels, mode):
        training = mode == tf.estimator.ModeKeys.TRAIN
        x = features["image"]
        if image_size != 28:
            x = tf.image.resize(x, [image_size, image_size])
        x = layers.conv2d(x, 32, 5, padding="same", activation=tf.nn.relu,
                          name="conv1")
        x = layers.max_pooling2d(x, 2, 2, name="pool1")
        x = layers.conv2d(x, 64, 5, padding="same", activation=tf.nn.relu,
                          name="conv2")
        x = layers.max_pooling2d(x, 2, 2, name="pool2")
        x = layers.flatten(x)
        x = layers.dense(x, 1024, activation=tf.nn.relu, name="dense")
        x = layers.dropout(x, rate=0.4, training=training)
        logits = layers.dense(x, 10, name="logits")
        classes = tf.argmax(logits, axis=1)

        if mode == tf.estimator.ModeKeys.PREDICT:
            return tf.estimator.EstimatorSpec(
                mode, predictions={"classes": classes,
                                   "probabilities": tf.nn.softmax(logits)})

        loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(
            labels=labels, logits=logits)
        if training:
            optimizer = tf.compat.v1.train.AdamOptimizer(learning_rate)
            train_op = optimizer.minimize(
                loss, global_step=tf.compat.v1.train.get_global_step())
            return tf.estimator.EstimatorSpec(mode, loss=loss,
                                              train_op=train_op)
        metrics = {"accuracy": tf.compat.v1.metrics.accuracy(labels,
                                                             classes)}
        return tf.estimator.EstimatorSpec(mode, loss=loss,
                                          eval_metric_ops=metrics)

    return model_fn


def make_train_input_fn(tf, data, batch_size, seed):
    def input_fn():
        # A Python generator keeps the images out of the graph (no large
        # constants) and gives every batch the same, full size.
        def gen():
            for xb, yb in _mnist_data.batches(data.x_train, data.y_train,
                                              batch_size, seed=seed):
                yield {"image": xb}, yb

        return tf.data.Dataset.from_generator(
            gen,
            output_signature=(
                {"image": tf.TensorSpec([batch_size, 28, 28, 1],
                                        tf.float32)},
                tf.TensorSpec([batch_size], tf.int64)))
    return input_fn


def make_eval_input_fn(tf, x, y, batch_size):
    def input_fn():
        def gen():
            for start in range(0, len(x), batch_size):
                yield ({"image": x[start:start + batch_size]},
                       y[start:start + batch_size])

        return tf.data.Dataset.from_generator(
            gen,
            output_signature=(
                {"image": tf.TensorSpec([None, 28, 28, 1], tf.float32)},
                tf.TensorSpec([None], tf.int64)))
    return input_fn


def make_loss_recorder(tf):
    """A hook that keeps the training loss of every step it sees."""

    class LossRecorder(tf.compat.v1.train.SessionRunHook):
        def __init__(self):
            self.losses = []
            self._loss = None

        def begin(self):
            self._loss = tf.compat.v1.get_collection(
                tf.compat.v1.GraphKeys.LOSSES)[0]

        def before_run(self, run_context):
            return tf.compat.v1.train.SessionRunArgs(self._loss)

        def after_run(self, run_context, run_values):
            self.losses.append(float(run_values.results))

    return LossRecorder()


def main(argv=None):
    args = parse_args(argv)
    # tf.estimator was removed in TensorFlow 2.16: exit 2 saying so.
    _lms_flags.exit_unless_estimator("examples/cnn_mnist_lms.py")
    import tensorflow as tf

    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.INFO if args.lms
                                       else tf.compat.v1.logging.WARN)
    print(_lms_flags.describe_devices(), flush=True)
    data = _mnist_data.load(args.data_dir, eval_samples=args.eval_samples)
    x_test, y_test = data.x_test, data.y_test

    model_dir = args.model_dir or tempfile.mkdtemp(prefix="cnn_mnist_lms_")
    config = tf.estimator.RunConfig(model_dir=model_dir,
                                    tf_random_seed=args.seed,
                                    log_step_count_steps=args.log_every,
                                    save_checkpoints_steps=args.steps,
                                    save_summary_steps=args.log_every)
    estimator = tf.estimator.Estimator(
        model_fn=make_model_fn(tf, args.image_size, args.learning_rate),
        config=config)

    # LMS's begin() runs in every train() call's fresh graph. The Estimator
    # graph's batch dimension comes from the input_fn, so batch_size here
    # only matters for shapes it cannot see.
    lms = _lms_flags.make_lms(args, batch_size=args.batch_size)
    recorder = make_loss_recorder(tf)
    hooks = [recorder] + ([lms] if lms is not None else [])
    try:
        for epoch in range(args.epochs):
            estimator.train(make_train_input_fn(tf, data, args.batch_size,
                                                args.seed + epoch),
                            steps=args.steps, hooks=hooks)
            print("epoch %d: last training loss %.4f"
                  % (epoch + 1, recorder.losses[-1]), flush=True)
        result = estimator.evaluate(
            make_eval_input_fn(tf, x_test, y_test, args.batch_size))
    finally:
        if args.model_dir is None:
            shutil.rmtree(model_dir, ignore_errors=True)
    print("Test loss %.4f, accuracy %.4f after %d steps"
          % (result["loss"], result["accuracy"], result["global_step"]),
          flush=True)
    _lms_flags.print_result(recorder.losses[0], result["loss"],
                            result["accuracy"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
