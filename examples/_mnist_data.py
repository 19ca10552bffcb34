"""MNIST for the examples, without downloading anything.

`load(data_dir)` looks for ``mnist.npz`` in the layout Keras caches it
(arrays ``x_train``, ``y_train``, ``x_test``, ``y_test``):

  1. ``<data_dir>/mnist.npz`` when --data_dir is given;
  2. ``$KERAS_HOME/datasets/mnist.npz``, else ``~/.keras/datasets/mnist.npz``.

If neither exists it falls back to scikit-learn's ``load_digits``: 1,797
8x8 hand-written digits that ship inside scikit-learn, upscaled to 28x28 so
the MNIST models run unchanged. Either way it prints which data set it used.

Images come back as float32 ``[N, 28, 28, 1]`` in [0, 1]; labels as int64.
"""

import os

import numpy as np

__all__ = ["MnistData", "add_data_flags", "load", "batches", "NUM_CLASSES",
           "IMAGE_SIZE"]

NUM_CLASSES = 10
IMAGE_SIZE = 28


class MnistData:
    """Train and test arrays plus a description of where they came from."""

    def __init__(self, x_train, y_train, x_test, y_test, name):
        self.x_train = x_train
        self.y_train = y_train
        self.x_test = x_test
        self.y_test = y_test
        self.name = name

    def __repr__(self):
        return "MnistData(%s: %d train, %d test)" % (
            self.name, len(self.x_train), len(self.x_test))


def _candidates(data_dir):
    if data_dir:
        path = os.path.expanduser(data_dir)
        # Accept the file itself as well as the folder holding it.
        yield path if path.endswith(".npz") else os.path.join(path,
                                                              "mnist.npz")
        return
    keras_home = os.environ.get("KERAS_HOME")
    if keras_home:
        yield os.path.join(os.path.expanduser(keras_home), "datasets",
                           "mnist.npz")
    yield os.path.join(os.path.expanduser("~"), ".keras", "datasets",
                       "mnist.npz")


def _scale(images):
    images = images.astype(np.float32)
    if images.max() > 1.0:
        images /= 255.0
    return images.reshape((-1, IMAGE_SIZE, IMAGE_SIZE, 1))


def _from_npz(path):
    with np.load(path) as f:
        return MnistData(_scale(f["x_train"]), f["y_train"].astype(np.int64),
                         _scale(f["x_test"]), f["y_test"].astype(np.int64),
                         "MNIST from %s" % path)


def _from_sklearn_digits(test_fraction=0.2, seed=0):
    # Imported here: real-MNIST users need neither.
    from scipy import ndimage
    from sklearn.datasets import load_digits

    digits = load_digits()
    small = digits.images.astype(np.float32) / 16.0  # values are 0..16
    # 8x8 -> 20x20 by bilinear zoom, centred in a 28x28 frame like MNIST's
    # 20x20 digits in their 28x28 field.
    zoomed = ndimage.zoom(small, (1, 2.5, 2.5), order=1)
    zoomed = np.clip(zoomed, 0.0, 1.0)
    images = np.zeros((len(small), IMAGE_SIZE, IMAGE_SIZE), np.float32)
    pad = (IMAGE_SIZE - zoomed.shape[1]) // 2
    images[:, pad:pad + zoomed.shape[1], pad:pad + zoomed.shape[2]] = zoomed
    labels = digits.target.astype(np.int64)

    order = np.random.RandomState(seed).permutation(len(images))
    n_test = int(round(len(images) * test_fraction))
    test, train = order[:n_test], order[n_test:]
    return MnistData(images[train, ..., None], labels[train],
                     images[test, ..., None], labels[test],
                     "scikit-learn digits (8x8 upscaled to 28x28; no "
                     "mnist.npz found)")


def add_data_flags(parser):
    """Add --data_dir and --eval_samples, the flags `load` takes, to an
    `argparse.ArgumentParser`."""
    parser.add_argument("--data_dir", default=None,
                        help="folder holding mnist.npz (default: the Keras "
                             "cache, else scikit-learn's digits)")
    parser.add_argument("--eval_samples", type=int, default=0,
                        help="test images to evaluate on (0: all)")


def load(data_dir=None, verbose=True, eval_samples=0):
    """Real MNIST when an ``mnist.npz`` is found, else sklearn's digits.

    With `eval_samples` > 0 the test set is cut to its first
    `eval_samples` images.

    Raises FileNotFoundError when `data_dir` is given but holds no
    ``mnist.npz``, so a typo does not silently train on the fallback.
    """
    data = None
    for path in _candidates(data_dir):
        if os.path.isfile(path):
            data = _from_npz(path)
            break
    if data is None:
        if data_dir:
            raise FileNotFoundError(
                "--data_dir %r holds no mnist.npz (the file Keras caches as "
                "~/.keras/datasets/mnist.npz)" % data_dir)
        data = _from_sklearn_digits()
    if eval_samples:
        data.x_test = data.x_test[:eval_samples]
        data.y_test = data.y_test[:eval_samples]
    if verbose:
        print("Data set: %s: %d training and %d test images"
              % (data.name, len(data.x_train), len(data.x_test)), flush=True)
    return data


def batches(x, y, batch_size, seed=0):
    """Endless shuffled ``(images, labels)`` mini-batches, all full size.

    Every batch has exactly `batch_size` rows (LMS plans for one batch
    size), so a data set smaller than a batch is sampled with replacement.
    """
    rng = np.random.RandomState(seed)
    n = len(x)
    while True:
        if n < batch_size:
            idx = rng.randint(0, n, size=batch_size)
            yield x[idx], y[idx]
            continue
        order = rng.permutation(n)
        for start in range(0, n - batch_size + 1, batch_size):
            idx = order[start:start + batch_size]
            yield x[idx], y[idx]
