"""How long one training step takes on a named GPU, with and without a plan.

Pure: takes a `GraphIndex`, `OpRoles`, a batch size and a `planner.Plan`,
imports no TensorFlow. The memory simulator says whether a plan fits; this
model says what it costs in time.

The model
---------

* **Compute.** Ops run one at a time on the GPU's compute stream, in the
  order of the simulator's levels (level by level, a level's ops back to
  back in op-id order). An op takes a roofline estimate
  ``max(flops / achieved_flops, bytes_touched / achieved_bandwidth)`` plus
  `LAUNCH_OVERHEAD_S`. FLOPs are the index's (`GraphIndex.flops`:
  matrix products and convolutions and their gradients; every other op
  counts as memory-bound); bytes touched are the op's input and output
  tensors (`graph_index.tensor_bytes`) that go through device memory,
  and the variables an update writes through resource handles
  (`StepTimeModel.state_bytes`: an optimizer's update reads and writes
  the variable and its slots).
  The achieved rates are the GPU's peaks times an `Efficiency`
  (`ACHIEVED`: fractions fitted to published training throughput,
  benchmarks/step_time.py): per precision for matrix products and for
  convolutions, and one for memory. The precision (`PRECISIONS`) is
  float16 or bfloat16 (`half`) for ops with 2-byte outputs, TF32 (`tf32`,
  on GPUs that have it) or FP32 for the others (`Gpu.peak_flops`). Ops
  that run no kernel (`NO_KERNEL_TYPES`: forwarding ops, variable reads,
  constants, placeholders, v1 control flow) and ops off the managed
  device take no time.
* **Fusion.** An elementwise op (`ELEMENTWISE_TYPES`) whose output only
  elementwise ops and reductions (`REDUCTION_TYPES`) on the device read is
  computed inside their kernels, as XLA fuses it: that output is neither
  written nor read through memory, and the op launches no kernel of its
  own (`StepTimeModel.fused`). Only with ``fusion=True`` (XLA); without
  XLA TensorFlow runs every op as a kernel of its own.
* **Layout.** With ``layout="NCHW"`` (the layout of the run's
  convolution tensors, default ``"NHWC"``, TensorFlow's), a convolution
  on the tensor cores (2-byte or TF32 products) has each of its 4-D or
  5-D tensors transposed into or out of NHWC, where cuDNN runs
  tensor-core convolutions: a memory-bound kernel each that reads and
  writes the tensor (`StepTimeModel.transposed_bytes`). In NHWC, and for
  FP32 products (the CUDA cores'), nothing is transposed.
* **Copies.** Swap-outs queue first in, first out on one device-to-host
  copy stream at the link's device-to-host rate
  (`Interconnect.d2h_bytes_per_s`), swap-ins on one host-to-device stream
  at its host-to-device rate (`h2d_bytes_per_s`); both run beside the
  compute stream. A swap-out
  can start when its tensor has been made; a swap-in when its triggers have
  finished and its swap-out has finished. A reader of a swap-in waits until
  the copy has finished. With ``sync_mode`` 1 or 3, the plan's waiters
  (`planner.SwapPlan.waiters`) wait for the swap-out; with 2 or 3, each
  swap-in is triggered by its reader's other inputs, so the reader waits
  for the whole copy. Nothing else waits: with one compute stream, an op's
  graph predecessors have finished before it starts.
* **Recomputes.** The clones of a `planner.RecomputePlan` run on the
  compute stream just before the first of its late readers, as long as the
  ops they copy take, once the swap-ins they read have arrived
  (`StepTime.recompute_s`).
* **Optimizer updates on the host.** With ``offload_optimizer``
  (`StepTimeModel`'s ``offload``), each offloaded update copies the
  weights to the host at the start of the step and its gradient once it
  is made (the device-to-host stream, with the swap-outs), runs on the
  host once both have arrived (one host stream, the kernel's bytes
  touched at `hardware.HOST_UPDATE_RATE` plus an overhead per
  update), and copies the new
  weights back (the host-to-device stream, with the swap-ins); what
  waited for the update waits for that copy (`host_updates`).
* **The step** ends when the compute stream, both copy streams and the
  host's updates are idle. Without LMS it is the sum of the op times
  (offloaded updates counted on the device, where they run without LMS);
  the exposed transfer time is the difference.

Memory and time: the per-level start times (`StepTime.level_start_s`) and,
per swap, the level at which its swap-out copy has finished
(`SwapTiming.out_done_level`: the tensor stays on the device until then)
and the level at which each swap-in copy starts
(`SwapInTiming.start_level`: the copy occupies the device from then) are
what the simulator needs to count copies that take time: `copy_levels`
turns them into a `simulator.CopyLevels`, and `replay_in_time` replays a
plan with them (what the auto-tuner checks its chosen plan with).

Not modelled: overlapping kernels (several streams, or ops of one
level running concurrently), cuDNN algorithm choice per shape and layout
(an NCHW run pays only its transposes), the transposes a layout optimizer
(Grappler's, XLA's) adds at the edges of the regions it lays out, fusion
beyond elementwise chains (epilogues of matrix products, Grappler's
remapper), caches, host-side op scheduling, input pipelines, and copy
rates below the link's.

Hardware numbers are the vendors' published peak rates (sources in
`GPUS` and `INTERCONNECTS`; the Grace Hopper link's copy rates are
measured ones); docs/benchmarks.md compares the predictions with
published throughput.

The package: `rates` (what an op achieves of its GPU's peak: `Efficiency`,
`PEAK`, `ACHIEVED`, the op types timed apart), `op_costs` (`OpCosts`:
each op's kernel seconds; `KernelOptions`: how the kernels run),
`step_time_model` (`StepTimeModel`, which replays a step over the op
costs, and its `StepTime`), `host_updates` (offloaded optimizer updates
in a step: `HostUpdateTiming`), `planned` (a `pipeline.Planned` timed, and a
plan's replay with its copies timed).
"""

# The hardware tables live in `tflms.hardware` (standard library only, for
# the settings' checks); they are re-exported here, where they are used.
from tflms.hardware import (DEFAULT_GPU, DEFAULT_INTERCONNECT, GPUS, INSTANT,
                            INTERCONNECTS, LINKS, PRECISIONS, Gpu,
                            Interconnect, gpu_named, interconnect_named)
from tflms.steptime.rates import (ACHIEVED, CONVOLUTION_TYPES,
                                  ELEMENTWISE_TYPES, LAUNCH_OVERHEAD_S,
                                  NO_KERNEL_TYPES, PEAK, REDUCTION_TYPES,
                                  Efficiency)
from tflms.steptime.op_costs import KernelOptions, OpCosts
from tflms.steptime.host_updates import HostUpdateTiming
from tflms.steptime.step_time_model import (StepTime, StepTimeModel,
                                            SwapInTiming, SwapTiming)
from tflms.steptime.planned import (copy_levels, predict_planned,
                                    replay_in_time)

__all__ = [
    "Gpu",
    "Interconnect",
    "GPUS",
    "INTERCONNECTS",
    "INSTANT",
    "LINKS",
    "DEFAULT_GPU",
    "DEFAULT_INTERCONNECT",
    "PRECISIONS",
    "Efficiency",
    "PEAK",
    "ACHIEVED",
    "LAUNCH_OVERHEAD_S",
    "NO_KERNEL_TYPES",
    "ELEMENTWISE_TYPES",
    "CONVOLUTION_TYPES",
    "REDUCTION_TYPES",
    "gpu_named",
    "interconnect_named",
    "KernelOptions",
    "OpCosts",
    "StepTimeModel",
    "predict_planned",
    "copy_levels",
    "replay_in_time",
    "StepTime",
    "SwapTiming",
    "SwapInTiming",
    "HostUpdateTiming",
]
