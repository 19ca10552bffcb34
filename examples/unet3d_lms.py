"""3D U-Net segmentation of synthetic volumes, with Large Model Support.

Volumetric models are where device memory runs out first: every feature map
is a cube, so doubling the volume side multiplies activation memory by
eight. A 3D U-Net makes it worse by keeping each encoder level's output
alive until the matching decoder level concatenates it back in, which is
exactly the kind of long-lived tensor that LMS moves to host memory and
brings back just before it is needed. (IBM's TFLMSv2 work showed this on
brain-tumour MRI: with LMS, a 3D U-Net trained on full-resolution volumes
instead of crops or down-sampled scans.)

The network (Keras functional API):

* an encoder of --depth levels, each two 3x3x3 convolutions (optionally with
  batch normalization) and a 2x2x2 max-pool, the number of filters doubling
  from --base_filters at each level;
* a bottleneck block;
* a decoder that goes back up with 2x2x2 transposed convolutions (or
  ``--upsampling nearest``: UpSampling3D followed by a convolution),
  concatenates the encoder output of the same level and applies two
  convolutions;
* a 1x1x1 convolution with a sigmoid for a foreground/background mask.

Data are synthetic, made with NumPy on the host: each volume holds a few
balls of random centre and radius, brighter than a noisy background; the
target mask marks the voxels inside the balls.

LMS is enabled the Keras way: graph mode, a graph-mode optimizer, and
``model.fit(generator, callbacks=[lms])``.

Examples::

    python unet3d_lms.py --volume_size 64 --base_filters 16 --depth 3
    python unet3d_lms.py --volume_size 192 --batch_size 1 --lms
    python unet3d_lms.py --volume_size 32 --lms --swapout-threshold 1 \\
        --swapin-ahead 1 --swapin-groupby 0

The last line is ``RESULT first_loss=... loss=... accuracy=... dice=...``:
the first batch's loss, then the last epoch's loss, voxel accuracy and Dice
coefficient.
"""

import argparse
import sys
import time

import numpy as np

import _lms_flags


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description="3D U-Net on synthetic volumes with Large Model Support "
                    "(callbacks=[lms]).")
    # A 3D network has --volume_size instead of --image_size.
    group = _lms_flags.add_size_flags(parser, image_size=None, batch_size=1,
                                      epochs=2, steps=20)
    group.add_argument("--volume_size", type=int, default=64,
                       help="side of the cubic input volumes; must be a "
                            "multiple of 2**depth (default 64)")
    group.add_argument("--image_size", dest="volume_size", type=int,
                       help="same as --volume_size")
    group.add_argument("--base_filters", type=int, default=16,
                       help="filters of the first level, doubled at each "
                            "level down (default 16)")
    group.add_argument("--depth", type=int, default=3,
                       help="number of down-sampling levels (default 3)")
    parser.add_argument("--upsampling", choices=("transpose", "nearest"),
                        default="transpose",
                        help="decoder up-sampling: Conv3DTranspose or "
                             "UpSampling3D + Conv3D (default transpose)")
    parser.add_argument("--batch_norm", action="store_true",
                        help="batch normalization after each convolution")
    parser.add_argument("--learning_rate", type=float, default=1e-3,
                        help="Adam learning rate (default 1e-3)")
    parser.add_argument("--verbose", type=int, default=2, choices=(0, 1, 2),
                        help="Keras verbosity (default 2: a line per epoch)")
    parser.add_argument("--seed", type=int, default=0, help="random seed")
    _lms_flags.add_lms_flags(parser)
    args = parser.parse_args(argv)
    if args.depth < 1:
        parser.error("--depth must be at least 1")
    if args.base_filters < 1:
        parser.error("--base_filters must be at least 1")
    if args.volume_size < 2 ** args.depth or \
            args.volume_size % (2 ** args.depth):
        parser.error("--volume_size %d must be a multiple of 2**depth = %d"
                     % (args.volume_size, 2 ** args.depth))
    return args


def build_unet(tf, volume_size, base_filters, depth, upsampling="transpose",
               batch_norm=False):
    layers = _lms_flags.keras2().layers

    def conv_block(x, filters, name):
        for i in (1, 2):
            x = layers.Conv3D(filters, 3, padding="same",
                              use_bias=not batch_norm,
                              name="%s_conv%d" % (name, i))(x)
            if batch_norm:
                x = layers.BatchNormalization(name="%s_bn%d" % (name, i))(x)
            x = layers.Activation("relu", name="%s_relu%d" % (name, i))(x)
        return x

    inputs = _lms_flags.keras2().Input((volume_size,) * 3 + (1,),
                                       name="volume")
    x = inputs
    skips = []
    for level in range(depth):
        x = conv_block(x, base_filters * 2 ** level, "down%d" % level)
        skips.append(x)
        x = layers.MaxPooling3D(2, name="pool%d" % level)(x)
    x = conv_block(x, base_filters * 2 ** depth, "bottleneck")
    for level in reversed(range(depth)):
        filters = base_filters * 2 ** level
        if upsampling == "transpose":
            x = layers.Conv3DTranspose(filters, 2, strides=2, padding="same",
                                       name="up%d_transpose" % level)(x)
        else:
            x = layers.UpSampling3D(2, name="up%d_upsample" % level)(x)
            x = layers.Conv3D(filters, 2, padding="same",
                              name="up%d_conv0" % level)(x)
        x = layers.Concatenate(name="up%d_concat" % level)([x, skips[level]])
        x = conv_block(x, filters, "up%d" % level)
    outputs = layers.Conv3D(1, 1, activation="sigmoid", name="mask")(x)
    return _lms_flags.keras2().Model(inputs, outputs, name="unet3d")


def synthetic_volumes(volume_size, batch_size, seed, max_balls=3):
    """Endless (volumes, masks) batches of noisy bright balls.

    Volumes are float32 ``[batch, v, v, v, 1]``; masks are 1 inside a ball
    and 0 outside.
    """
    rng = np.random.RandomState(seed)
    grid = np.arange(volume_size, dtype=np.float32)
    zz, yy, xx = np.meshgrid(grid, grid, grid, indexing="ij")
    shape = (batch_size,) + (volume_size,) * 3 + (1,)
    while True:
        masks = np.zeros(shape, np.float32)
        for b in range(batch_size):
            for _ in range(rng.randint(1, max_balls + 1)):
                radius = rng.uniform(0.1, 0.25) * volume_size
                centre = rng.uniform(radius, volume_size - radius, size=3)
                inside = ((zz - centre[0]) ** 2 + (yy - centre[1]) ** 2
                          + (xx - centre[2]) ** 2) <= radius ** 2
                masks[b, ..., 0][inside] = 1.0
        noise = rng.normal(0.0, 0.5, size=shape).astype(np.float32)
        yield masks + noise, masks


def dice_coefficient(tf):
    def dice(y_true, y_pred):
        axes = list(range(1, 5))
        inter = tf.reduce_sum(y_true * y_pred, axis=axes)
        total = tf.reduce_sum(y_true, axis=axes) + tf.reduce_sum(y_pred,
                                                                 axis=axes)
        return tf.reduce_mean((2.0 * inter + 1.0) / (total + 1.0))
    return dice


def main(argv=None):
    args = parse_args(argv)
    import tensorflow as tf

    tf.compat.v1.disable_eager_execution()
    _lms_flags.keras2().utils.set_random_seed(args.seed)
    print(_lms_flags.describe_devices(), flush=True)
    model = build_unet(tf, args.volume_size, args.base_filters, args.depth,
                       args.upsampling, args.batch_norm)
    print("3D U-Net: %d^3 volumes, batch size %d, depth %d, %d base filters,"
          " %d parameters" % (args.volume_size, args.batch_size, args.depth,
                              args.base_filters, model.count_params()),
          flush=True)
    model.compile(
        optimizer=_lms_flags.keras2().optimizers.legacy.Adam(
            args.learning_rate),
        loss="binary_crossentropy",
        metrics=["accuracy", dice_coefficient(tf)])

    # [recorder] plus, with --lms, the LMS callback (given --batch_size).
    recorder, callbacks = _lms_flags.keras_callbacks(tf, args)

    start = time.time()
    history = model.fit(
        synthetic_volumes(args.volume_size, args.batch_size, args.seed),
        steps_per_epoch=args.steps, epochs=args.epochs, callbacks=callbacks,
        verbose=args.verbose)
    elapsed = time.time() - start
    steps = args.steps * args.epochs
    print("Trained %d steps in %.1f s (%.1f volumes/s)"
          % (steps, elapsed, steps * args.batch_size / elapsed), flush=True)
    hist = history.history
    _lms_flags.print_result(recorder.losses[0], hist["loss"][-1],
                            hist["accuracy"][-1], dice=hist["dice"][-1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
