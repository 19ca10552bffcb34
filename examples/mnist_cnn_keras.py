"""The Keras MNIST convnet, trained with `fit_generator` and Large Model
Support.

The model is the small convnet of the classic Keras MNIST example: two 3x3
convolutions (32 and 64 filters), 2x2 max-pooling, dropout, a 128-unit
dense layer, dropout, and a 10-way softmax.

It shows the Keras way of turning LMS on:

1. call ``tf.compat.v1.disable_eager_execution()`` before building the model
   (LMS edits graphs, so Keras must build one);
2. compile with a graph-mode optimizer (a string such as 'adam', or
   ``tf.keras.optimizers.legacy.*``);
3. pass the `LMS` object as a callback:
   ``model.fit_generator(gen, steps_per_epoch=..., callbacks=[lms])``.

The callback picks the batch size up from Keras and edits the training
graph when training starts.

--image_size adds a Resizing layer in front of the network so the 28x28
digits are seen at a larger size and the activations grow.

Examples::

    python mnist_cnn_keras.py
    python mnist_cnn_keras.py --lms --swapout-threshold 1 --swapin-ahead 1 \\
        --swapin-groupby 0
    python mnist_cnn_keras.py --lms --image_size 224 --autotune-gpu-mem 4

The last line is ``RESULT first_loss=... loss=... accuracy=...``: the loss of
the first training batch, then the test loss and accuracy after training.
"""

import argparse
import sys

import _lms_flags
import _mnist_data


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description="Keras MNIST CNN trained with fit_generator and Large "
                    "Model Support (callbacks=[lms]).")
    _lms_flags.add_size_flags(
        parser, image_size=28, batch_size=128, epochs=2, steps=400,
        image_help="side of the images the network sees; a Resizing layer "
                   "scales the 28x28 digits to it")
    _mnist_data.add_data_flags(parser)
    parser.add_argument("--verbose", type=int, default=2, choices=(0, 1, 2),
                        help="Keras verbosity (default 2: a line per epoch)")
    parser.add_argument("--seed", type=int, default=0, help="random seed")
    _lms_flags.add_lms_flags(parser)
    return parser.parse_args(argv)


def build_model(tf, image_size):
    layers = _lms_flags.keras2().layers
    inputs = _lms_flags.keras2().Input((28, 28, 1), name="image")
    x = inputs
    if image_size != 28:
        x = layers.Resizing(image_size, image_size, name="upsample")(x)
    x = layers.Conv2D(32, 3, activation="relu")(x)
    x = layers.Conv2D(64, 3, activation="relu")(x)
    x = layers.MaxPooling2D(2)(x)
    x = layers.Dropout(0.25)(x)
    x = layers.Flatten()(x)
    x = layers.Dense(128, activation="relu")(x)
    x = layers.Dropout(0.5)(x)
    outputs = layers.Dense(10, activation="softmax")(x)
    return _lms_flags.keras2().Model(inputs, outputs, name="mnist_cnn")


def main(argv=None):
    args = parse_args(argv)
    import tensorflow as tf

    # Graph mode first: LMS cannot edit eagerly executed code.
    tf.compat.v1.disable_eager_execution()
    # Seeds Python, NumPy and TensorFlow (graph-level seed) at once.
    _lms_flags.keras2().utils.set_random_seed(args.seed)
    print(_lms_flags.describe_devices(), flush=True)
    data = _mnist_data.load(args.data_dir, eval_samples=args.eval_samples)
    x_test, y_test = data.x_test, data.y_test

    model = build_model(tf, args.image_size)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])

    # [recorder] plus, with --lms, the LMS callback (given --batch_size).
    recorder, callbacks = _lms_flags.keras_callbacks(tf, args)

    model.fit_generator(
        _mnist_data.batches(data.x_train, data.y_train, args.batch_size,
                            seed=args.seed),
        steps_per_epoch=args.steps, epochs=args.epochs, callbacks=callbacks,
        verbose=args.verbose)
    loss, acc = model.evaluate(x_test, y_test, batch_size=args.batch_size,
                               verbose=0)
    print("Test loss %.4f, accuracy %.4f" % (loss, acc), flush=True)
    _lms_flags.print_result(recorder.losses[0], loss, acc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
