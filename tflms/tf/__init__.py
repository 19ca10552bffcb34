"""The TensorFlow wing: every module of tflms that reads, traces or edits
TensorFlow objects.

Below it, the planning core (`graph_index`, `analysis`, `planner`,
`simulator`, `steptime`, `stages`, `pipeline`...) is pure Python and never
imports this package; above it, `tflms.lms` and the command line use it.

  reader.py         the one reader of a tf.Graph (a FuncGraph too): the
                    training step's fetches and its GraphIndex
  rewriter.py       apply_plan: the ONLY module that mutates a tf.Graph
  function_api.py   the only user of TensorFlow's internal function APIs
  lms_function.py   LMSFunction: lms.function(step), traced per signature
  adapters/         one adapter per entry point (Session graph and hook,
                    Keras 2, Keras 3, Keras 3 under a strategy, tf.function,
                    a step on one worker of a multi-worker strategy)
  swaps_ran.py      which swap ops TensorFlow ran (partition graphs)
  compat.py         the TensorFlow and Keras stacks: versions, Keras 2 or 3
  keras2_session.py Keras 2's session renewed after a rewrite
  keras_models.py   Keras 2 model files (tflms plan / verify)
  keras3_trace.py   a Keras 3 model's train step traced for planning
  distributed.py    Horovod and tf.distribute (graph mode): ranks agree
  multi_worker.py   MultiWorkerMirroredStrategy: a worker's devices, the
                    workers' agreement
  verify.py, verify_keras3.py   tflms verify: with and without LMS
  live_capacity.py  tflms capacity on a live graph or Keras 3 model
  oracle/           GPU memory measured on Grappler's virtual cluster, the
                    check on the simulator (tests, benchmarks, tflms plan
                    --oracle); LMS.run never calls it

Importing this package registers `local_devices` with `tflms.budget`, so
that auto-tuning without ``autotune_gpu_mem`` asks TensorFlow for the GPU's
memory.
"""

from tflms import budget


def local_devices():
    """`DeviceAttributes` of every local device (name, device_type,
    memory_limit), for the device budget. Imported when asked: listing
    devices initialises the GPU runtime."""
    from tensorflow.python.client import device_lib
    return device_lib.list_local_devices()


budget.register_device_lister(local_devices)
