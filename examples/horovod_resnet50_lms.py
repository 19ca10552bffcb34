"""Data-parallel ResNet50 with Horovod and Large Model Support.

Why this example exists
-----------------------
LMS lets one GPU train a model whose activations do not fit in its memory;
Horovod spreads the batches of a job over many GPUs and nodes, averaging
the gradients with allreduce. Together they train very large models (big
images, 3D volumes) faster than one GPU could. Each rank (one process per
GPU) rewrites its own graph with LMS; the ranks must all make the same
rewrite, which they do when they run the same model with the same LMS
parameters (see docs/distributed.md for why it matters: Horovod matches
collectives by name).

What the script does
--------------------
ResNet50 on synthetic images (as in Keras_ResNet50.py), compiled in graph
mode with ``horovod.tensorflow.keras.DistributedOptimizer`` and a learning
rate scaled by the number of ranks. Rank r reads its own random images
(seed + r) and uses GPU ``local_rank`` (``visible_device_list``). The
callbacks are the LMS callback and
``tflms.BroadcastGlobalVariablesCallback(0, lms=lms)``, which
checks that every rank rewrote its graph the same way and then broadcasts
rank 0's initial weights (Horovod's own Keras callback needs
``keras.backend.get_session()``, which Keras 2.15 lacks).

Examples::

    # 4 GPUs on each of two nodes, LMS auto-tuned for 16 GiB GPUs:
    horovodrun -np 8 -H host1:4,host2:4 python horovod_resnet50_lms.py \\
        --image_size 1024 --batch_size 1 --lms --autotune-gpu-mem 16
    # On a CPU-only machine, two ranks, fixed swapping parameters:
    horovodrun -np 2 -H localhost:2 --gloo python horovod_resnet50_lms.py \\
        --image_size 32 --batch_size 2 --steps 2 --lms \\
        --swapout-threshold 40 --swapin-ahead 10 --swapin-groupby 5

With auto-tuning, give ``--autotune-gpu-mem`` explicitly: every rank then
plans for the same budget and finds the same parameters (free memory can
differ a little from GPU to GPU). The host memory the simulator allows a
rank is the node's memory divided by the ranks on the node
(``HOROVOD_LOCAL_SIZE``).

Every rank prints ``rank R/N: first_loss=... loss=... weights_checksum=...``
(the sum of the trainable weights: equal on every rank, since all ranks
apply the same averaged gradients); rank 0 then prints the ``RESULT ...``
line.
"""

import argparse
import sys
import time

import numpy as np

import _lms_flags
import Keras_ResNet50


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description="Data-parallel Keras ResNet50 on synthetic data with "
                    "Horovod and Large Model Support. Start it with "
                    "horovodrun, e.g. horovodrun -np 4 -H localhost:4 python "
                    "horovod_resnet50_lms.py --lms")
    Keras_ResNet50.add_resnet_flags(parser, image_size=224, optimizer="sgd")
    parser.add_argument("--learning_rate", type=float, default=1e-3,
                        help="learning rate of one rank; the job uses it "
                             "times the number of ranks (default 1e-3)")
    parser.add_argument("--verbose", type=int, default=2, choices=(0, 1, 2),
                        help="Keras verbosity on rank 0 (default 2)")
    parser.add_argument("--seed", type=int, default=0,
                        help="random seed; rank r uses seed + r for its "
                             "data")
    _lms_flags.add_lms_flags(parser)
    args = parser.parse_args(argv)
    Keras_ResNet50.check_resnet_args(parser, args)
    return args


def import_horovod():
    try:
        import horovod.tensorflow.keras as hvd
    except ImportError:
        from tflms.tf.distributed import HOROVOD_INSTALL_HINT
        raise SystemExit("error: " + HOROVOD_INSTALL_HINT) from None
    return hvd


def pin_gpu(tf, hvd):
    """One GPU per rank: GPU `local_rank` becomes this process's GPU 0."""
    config = tf.compat.v1.ConfigProto()
    if tf.config.list_physical_devices("GPU"):
        config.gpu_options.allow_growth = True
        config.gpu_options.visible_device_list = str(hvd.local_rank())
    tf.compat.v1.keras.backend.set_session(tf.compat.v1.Session(config=config))


def main(argv=None):
    args = parse_args(argv)
    import tensorflow as tf

    tf.compat.v1.disable_eager_execution()
    hvd = import_horovod()
    from tflms import BroadcastGlobalVariablesCallback

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    pin_gpu(tf, hvd)
    # The same graph-level seed on every rank; the broadcast makes the
    # initial weights equal anyway.
    _lms_flags.keras2().utils.set_random_seed(args.seed)
    if rank == 0:
        print(_lms_flags.describe_devices(), flush=True)
        print("ResNet50 on %d ranks: %dx%d images, batch size %d per rank"
              % (size, args.image_size, args.image_size, args.batch_size),
              flush=True)

    model = _lms_flags.keras2().applications.ResNet50(
        weights=None, input_shape=(args.image_size, args.image_size, 3),
        classes=args.num_classes)
    optimizer = hvd.DistributedOptimizer(Keras_ResNet50.make_optimizer(
        tf, args.optimizer, args.learning_rate * size))
    model.compile(optimizer=optimizer,
                  loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])

    recorder = _lms_flags.batch_loss_recorder(tf)
    lms = _lms_flags.make_lms(args, batch_size=args.batch_size)
    callbacks = [recorder] + ([lms] if lms is not None else [])
    callbacks.append(BroadcastGlobalVariablesCallback(0, lms=lms))

    start = time.time()
    history = model.fit(
        Keras_ResNet50.synthetic_batches(
            args.image_size, args.batch_size, args.num_classes,
            args.seed + rank),
        steps_per_epoch=args.steps, epochs=args.epochs, callbacks=callbacks,
        verbose=args.verbose if rank == 0 else 0)
    elapsed = time.time() - start
    # Trainable weights only: batch-norm moving statistics are per rank
    # (each rank updates them from its own batches).
    checksum = float(sum(
        np.sum(w, dtype=np.float64) for w in
        tf.compat.v1.keras.backend.batch_get_value(model.trainable_weights)))
    print("rank %d/%d: first_loss=%.4f loss=%.4f weights_checksum=%.6f "
          "swap_ops=%d" % (
              rank, size, recorder.losses[0], history.history["loss"][-1],
              checksum,
              0 if lms is None or lms.last_run is None else
              len(lms.last_run.swapout_ops) +
              len(lms.last_run.swapin_ops)), flush=True)
    if rank == 0:
        steps = args.steps * args.epochs
        print("Trained %d steps in %.1f s (%.1f images/s over %d ranks)"
              % (steps, elapsed, steps * args.batch_size * size / elapsed,
                 size), flush=True)
        _lms_flags.print_result(recorder.losses[0],
                                history.history["loss"][-1],
                                history.history["accuracy"][-1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
