"""Deep MNIST classifier trained with a plain `tf.compat.v1.Session`, with
Large Model Support.

This is the "deep" convolutional MNIST network of the old TensorFlow
tutorials (two 5x5 convolution + max-pool stages, a 1024-unit fully
connected layer with dropout, and a 10-way softmax), written against
`tf.compat.v1` and trained in graph mode.

It shows the Session way of turning LMS on: build the whole training graph,
then call ``LMS(...).run(graph)`` *before* the Session is created. LMS edits
the graph in place, adding swap-out and swap-in operations; the Session then
runs the edited graph like any other.

MNIST itself is tiny, so to give LMS something to do, --image_size makes the
network upsample the 28x28 digits inside the graph: activations grow with
the square of the size, as they would with real high-resolution inputs.

Examples::

    python mnist_deep_lms.py                      # plain training
    python mnist_deep_lms.py --lms --swapout-threshold 1 --swapin-ahead 1 \\
        --swapin-groupby 0                        # fixed LMS parameters
    python mnist_deep_lms.py --lms --image_size 112 --autotune-gpu-mem 2

The last line printed is ``RESULT first_loss=... loss=... accuracy=...``:
test-set loss before and after training, and test accuracy after it.
"""

import argparse
import sys
import time

import numpy as np

import _lms_flags
import _mnist_data


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description="Deep MNIST CNN trained with tf.compat.v1.Session and "
                    "Large Model Support (lms.run(graph)).")
    _lms_flags.add_size_flags(
        parser, image_size=28, batch_size=50, epochs=1, steps=1000,
        image_help="side of the images the network sees; the 28x28 digits "
                   "are resized to it inside the graph")
    _mnist_data.add_data_flags(parser)
    parser.add_argument("--learning_rate", type=float, default=1e-4,
                        help="Adam learning rate (default 1e-4)")
    parser.add_argument("--log_every", type=int, default=100,
                        help="print the training loss every N steps")
    parser.add_argument("--seed", type=int, default=0, help="random seed")
    _lms_flags.add_lms_flags(parser)
    return parser.parse_args(argv)


def build_graph(tf, image_size, learning_rate):
    """The training graph; returns a dict of the tensors and ops used."""
    v1 = tf.compat.v1
    images = v1.placeholder(tf.float32, [None, 28, 28, 1], name="images")
    labels = v1.placeholder(tf.int64, [None], name="labels")
    keep_prob = v1.placeholder_with_default(1.0, [], name="keep_prob")

    def weight(name, shape):
        return v1.get_variable(
            name, shape, initializer=v1.truncated_normal_initializer(
                stddev=0.1))

    def bias(name, size):
        return v1.get_variable(name, [size],
                               initializer=v1.constant_initializer(0.1))

    x = images
    if image_size != 28:
        x = tf.image.resize(x, [image_size, image_size], name="upsample")

    with v1.variable_scope("conv1"):
        x = tf.nn.relu(tf.nn.conv2d(x, weight("w", [5, 5, 1, 32]), 1, "SAME")
                       + bias("b", 32))
    x = tf.nn.max_pool2d(x, 2, 2, "SAME", name="pool1")
    with v1.variable_scope("conv2"):
        x = tf.nn.relu(tf.nn.conv2d(x, weight("w", [5, 5, 32, 64]), 1,
                                    "SAME") + bias("b", 64))
    x = tf.nn.max_pool2d(x, 2, 2, "SAME", name="pool2")

    flat_size = int(np.prod(x.shape[1:]))
    x = tf.reshape(x, [-1, flat_size])
    with v1.variable_scope("fc1"):
        x = tf.nn.relu(tf.matmul(x, weight("w", [flat_size, 1024]))
                       + bias("b", 1024))
    x = tf.nn.dropout(x, rate=1.0 - keep_prob)
    with v1.variable_scope("fc2"):
        logits = tf.matmul(x, weight("w", [1024, 10])) + bias("b", 10)

    loss = tf.reduce_mean(
        tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels,
                                                       logits=logits),
        name="loss")
    correct = tf.equal(tf.argmax(logits, 1), labels)
    accuracy = tf.reduce_mean(tf.cast(correct, tf.float32), name="accuracy")
    train_op = v1.train.AdamOptimizer(learning_rate).minimize(loss)
    return dict(images=images, labels=labels, keep_prob=keep_prob, loss=loss,
                accuracy=accuracy, train_op=train_op)


def evaluate(sess, model, x, y, batch_size):
    """Mean loss and accuracy over (x, y), fed in mini-batches."""
    total_loss = total_acc = 0.0
    for start in range(0, len(x), batch_size):
        xb, yb = x[start:start + batch_size], y[start:start + batch_size]
        loss, acc = sess.run([model["loss"], model["accuracy"]],
                             {model["images"]: xb, model["labels"]: yb})
        total_loss += loss * len(xb)
        total_acc += acc * len(xb)
    return total_loss / len(x), total_acc / len(x)


def main(argv=None):
    args = parse_args(argv)
    import tensorflow as tf

    tf.compat.v1.disable_eager_execution()
    print(_lms_flags.describe_devices(), flush=True)
    data = _mnist_data.load(args.data_dir, eval_samples=args.eval_samples)
    x_test, y_test = data.x_test, data.y_test

    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.set_random_seed(args.seed)
        model = build_graph(tf, args.image_size, args.learning_rate)
        init = tf.compat.v1.global_variables_initializer()
        lms = _lms_flags.make_lms(args, batch_size=args.batch_size)
        if lms is not None:
            # The Session way: edit the finished graph before the Session
            # exists (a Session freezes the graph it has started to run).
            lms.run(graph)

    feed = _mnist_data.batches(data.x_train, data.y_train, args.batch_size,
                               seed=args.seed)
    with tf.compat.v1.Session(graph=graph) as sess:
        sess.run(init)
        first_loss, first_acc = evaluate(sess, model, x_test, y_test,
                                         args.batch_size)
        print("Before training: test loss %.4f, accuracy %.4f"
              % (first_loss, first_acc), flush=True)
        step = 0
        start = time.time()
        for epoch in range(args.epochs):
            for _ in range(args.steps):
                xb, yb = next(feed)
                _, loss = sess.run(
                    [model["train_op"], model["loss"]],
                    {model["images"]: xb, model["labels"]: yb,
                     model["keep_prob"]: 0.5})
                step += 1
                if args.log_every and step % args.log_every == 0:
                    print("epoch %d step %d: training loss %.4f"
                          % (epoch + 1, step, loss), flush=True)
        elapsed = time.time() - start
        loss, acc = evaluate(sess, model, x_test, y_test, args.batch_size)
    print("Trained %d steps in %.1f s (%.1f ms/step); test loss %.4f, "
          "accuracy %.4f" % (step, elapsed, 1000 * elapsed / max(step, 1),
                             loss, acc), flush=True)
    _lms_flags.print_result(first_loss, loss, acc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
