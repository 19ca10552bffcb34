"""Measurements shared by the benchmark sections.

Everything here works on one built graph (`benchmarks.models.Built`) and
returns plain dicts of numbers, ready for JSON:

* `oracle_peaks`: GPU and host peaks from `tflms.tf.oracle` (Grappler's virtual
  cluster: one simulated V100 and one CPU), after `forward_identities`. The
  GPU peak is the oracle's runtime peak: the virtual scheduler's step
  replayed with TensorFlow's buffer rules (see below).
* `grappler_memory_optimize`: TensorFlow's own memory optimizer
  (``SWAPPING_HEURISTICS`` or ``RECOMPUTATION_HEURISTICS``) applied offline
  with ``tf_optimizer.OptimizeGraph`` on that virtual cluster, every other
  Grappler pass off, so that the result is what TensorFlow itself would swap
  or recompute for a GPU of the given size.
* `apply_tflms`: the public `tflms.LMS` with fixed parameters or auto-tuned
  to a budget, with the step time `tflms.steptime` predicts for its plan
  over each of `STEP_LINKS`.
* `predicted_step_without_lms`: the step time `tflms.steptime` predicts
  for a graph as given.
* real runs on this machine's CPU are `benchmarks.cpu_measure`'s.

How TensorFlow's swaps are measured. Grappler's swapping pass inserts
``_CopyFromGpuToHost`` / ``_CopyFromHostToGpu`` pairs placed on the GPU whose
first output lives in host memory. Those kernels exist only in GPU builds of
TensorFlow, so the virtual cluster of this CPU build cannot run them, and its
memory accounting would charge a GPU-placed op's output to the GPU anyway.
`grappler_memory_optimize` therefore rewrites each pair into the equivalent
pair of ``Identity`` ops on the CPU, keeping TensorFlow's choice of tensors,
rerouted consumers and swap-in control dependency. That is exactly the form
of an LMS swap, so both are measured by the same oracle rules (a GPU copy of
a swapped-in tensor lives until its last GPU reader).

Which GPU peak is reported. `tflms.tf.oracle.peak_memory` gives three numbers
for one simulated step. ``raw_gpu_peak`` is Grappler's own ``GraphMemory``
count (what TensorFlow's swapping heuristic plans with). ``corrected_peak``
is that count with the swapped-in copies kept until their last reader.
Both keep ``InferFromTrace``'s buffer rules, which are not the runtime's:
every ``Reshape``, ``Squeeze``, ``ExpandDims``, ``IdentityN`` and
``ReadVariableOp`` output is a new buffer (TensorFlow's kernels hand on
their input's buffer), each input stays allocated 1 ns past its last
reader, so in the microsecond-truncated schedule it overlaps the next op's
output, and variables are not counted at all (only their reads).
``gpu_peak`` is ``runtime_gpu_peak_bytes``: the same schedule, the same
swapped-in-copy correction, with the runtime's rules (forwarding ops and
variable reads allocate nothing, variables and optimizer slots are resident
all step, a buffer is released when its last reader ends). It is the number
to hold against a GPU's memory, and the one `tests/test_autotune_oracle.py`
judges plans by. On the 12-layer, seq-2048 Transformer tuned to 4 GiB the
corrected count was 490 MiB higher (reshape outputs +552 MiB, the 1 ns
overlap +248 MiB, no variables -310 MiB).
"""

import time

import tensorflow as tf
from tensorflow.core.protobuf import config_pb2
from tensorflow.core.protobuf import device_properties_pb2
from tensorflow.core.protobuf import meta_graph_pb2
from tensorflow.core.protobuf import rewriter_config_pb2
from tensorflow.python.grappler import cluster as gcluster
from tensorflow.python.grappler import tf_optimizer

from benchmarks import common
from tflms.tf import reader as tf_reader
from tflms import LMS
from tflms import autotune
from tflms.tf.adapters import graph_step
from tflms.tf.adapters import rewrite
from tflms.tf.adapters import tf_function
from tflms.tf import oracle
from tflms import pipeline
from tflms import steptime
from tflms.settings import Settings

__all__ = [
    "STEP_LINKS",
    "GIB",
    "MIB",
    "oracle_peaks",
    "grappler_memory_optimize",
    "apply_tflms",
    "probe_peaks",
    "step_index",
    "predicted_step_without_lms",
    "tensor_bytes_of",
    "median",
    "fmt_bytes",
]

GIB = common.GIB
MIB = common.MIB
fmt_bytes = common.fmt_bytes
median = common.median

_SWAP_OUT_OP = "_CopyFromGpuToHost"
_SWAP_IN_OP = "_CopyFromHostToGpu"
_MEM_MODES = ("SWAPPING_HEURISTICS", "RECOMPUTATION_HEURISTICS",
              "HEURISTICS")

# The links a plan's step is predicted over (`tflms.hardware` names): PCIe
# 4.0 x16, today's common host link and the tuner's default, and NVLink 2.0,
# the POWER9-V100 link the original TFLMSv2 was built for.
STEP_LINKS = ("pcie4", "nvlink2")


# Ops whose kernel hands its input buffer on instead of allocating, with one
# data input and one output of the same shape, so that they can be dropped
# from a graph (the oracle's runtime replay forwards
# `graph_index.BUFFER_FORWARDING_TYPES`, a superset, without dropping
# anything).
_FORWARDING_TYPES = frozenset({"Identity", "StopGradient", "PreventGradient"})


def _split_input(name):
    if name.startswith("^"):
        return None
    node, _, port = name.partition(":")
    return node, int(port or 0)


def forward_identities(graph_def, keep=()):
    """Copy of `graph_def` without same-device Identity-like ops.

    Grappler removes most Identity-like ops before a real run
    (``tf.gradients`` alone adds one per gradient of an ``Add``, via
    ``tuple/control_dependency``), so the virtual scheduler should not
    schedule them either. (Their buffers are forwarded by the oracle's
    runtime replay in any case; ops that change the shape, such as
    ``Reshape``, are forwarded there but cannot be dropped from a graph
    here.) Each such op whose input is on its own
    device is dropped: its data consumers read its input directly and
    inherit its control inputs, its control consumers wait for its input's
    op and its control inputs instead. Ops on another device than their
    input (LMS's and TensorFlow's swap ops), ops marked
    ``_grappler_do_not_remove`` and names in `keep` stay.

    Returns:
      ``(graph_def, removed count)``.
    """
    nodes = {n.name: n for n in graph_def.node}
    alias = {}  # name -> ((src, port), control inputs)
    for node in graph_def.node:
        if (node.op not in _FORWARDING_TYPES or node.name in keep
                or "_grappler_do_not_remove" in node.attr):
            continue
        data = [i for i in node.input if not i.startswith("^")]
        if len(data) != 1:
            continue
        src = _split_input(data[0])
        if src[0] not in nodes or nodes[src[0]].device != node.device:
            continue
        controls = [i[1:] for i in node.input if i.startswith("^")]
        alias[node.name] = (src, controls)

    def resolve(name, port):
        """The tensor an aliased output stands for, and the controls met."""
        controls = []
        seen = 0
        while name in alias and port == 0 and seen < len(alias) + 1:
            (name, port), extra = alias[name]
            controls.extend(extra)
            seen += 1
        return name, port, controls

    def resolve_control(name):
        out = []
        stack = [name]
        while stack:
            n = stack.pop()
            if n in alias:
                (src, _), extra = alias[n]
                stack.append(src)
                stack.extend(extra)
            else:
                out.append(n)
        return out

    result = type(graph_def)()
    result.versions.CopyFrom(graph_def.versions)
    result.library.CopyFrom(graph_def.library)
    for node in graph_def.node:
        if node.name in alias:
            continue
        copy = result.node.add()
        copy.CopyFrom(node)
        data, controls = [], []
        for inp in node.input:
            if inp.startswith("^"):
                controls.extend(resolve_control(inp[1:]))
                continue
            name, port = _split_input(inp)
            name, port, extra = resolve(name, port)
            data.append(name if port == 0 else "%s:%d" % (name, port))
            for c in extra:
                controls.extend(resolve_control(c))
        del copy.input[:]
        copy.input.extend(data)
        # A control edge from an op already feeding data is redundant.
        seen = {d.split(":")[0] for d in data}
        for c in controls:
            if c not in seen and c != node.name:
                seen.add(c)
                copy.input.append("^" + c)
    return result, len(alias)


def oracle_peaks(graph_or_def, fetch, place=True, forward=True,
                 interconnect=None):
    """GPU and host peaks of one step from `tflms.tf.oracle.peak_memory`.

    Args:
      graph_or_def: a `tf.Graph` or `GraphDef`.
      fetch: the op one step runs.
      place: put every non-CPU op on the GPU first (`oracle.place_on_gpu`).
      forward: measure the graph after `forward_identities` (what a real
        runtime allocates); False measures it as given.
      interconnect: None (the default) for the runtime peak with instant
        copies; a link name from `tflms.hardware.INTERCONNECTS` (or a rate
        in bytes/s) to hold swapped GPU buffers while their copies run at
        that rate in the cluster's model times (``oracle.peak_memory``'s
        ``interconnect``). Then gpu_peak is that timed peak (the instant
        one needs a second call with None), and the dict also has
        interconnect, the link's name; without it the dict is as before.

    Returns:
      dict with gpu_peak (the runtime peak, see the module docstring),
      corrected_peak (``InferFromTrace``'s rules plus the swapped-in-copy
      correction), raw_gpu_peak (Grappler's own count), host_peak (bytes),
      step_s (the cost model's V100 step time), transfers (GPU copies of
      CPU tensors), top (the three largest buffers live at the GPU peak),
      forwarded (Identity-like ops dropped) and oracle_s (time the
      measurement took).
    """
    start = time.perf_counter()
    removed = 0
    if forward:
        fetch_name = fetch if isinstance(fetch, str) else fetch.name
        graph_def = (oracle.place_on_gpu(graph_or_def) if place
                     else _as_def(graph_or_def))
        graph_def, removed = forward_identities(
            graph_def, keep={fetch_name.split(":")[0]})
        graph_or_def, place = graph_def, False
    result = oracle.peak_memory(graph_or_def, fetch, place=place,
                                interconnect=interconnect)
    extra = {}
    if interconnect is not None:
        extra["interconnect"] = result.interconnect
    return {
        "forwarded": removed,
        "gpu_peak": int(result.runtime_gpu_peak_bytes),
        "corrected_peak": int(result.gpu_peak_bytes),
        "raw_gpu_peak": int(result.raw_gpu_peak_bytes),
        "host_peak": int(result.host_peak_bytes),
        "step_s": float(result.run_time_s),
        "transfers": len(result.transfers),
        "top": [t.name for t in result.runtime_live_at_peak[:3]],
        "oracle_s": time.perf_counter() - start,
        **extra,
    }


def _as_def(graph_or_def):
    if isinstance(graph_or_def, tf.Graph):
        return graph_or_def.as_graph_def()
    return graph_or_def


def tensor_bytes_of(graph):
    """A function giving the static size of a tensor of `graph` by name."""
    def size(name):
        node, _, port = name.partition(":")
        tensor = graph.get_operation_by_name(node).outputs[int(port or 0)]
        shape = tensor.shape
        if not shape.is_fully_defined():
            return 0
        return int(shape.num_elements()) * tensor.dtype.size
    return size


def _virtual_cluster(gpu_memory_bytes):
    gpu = device_properties_pb2.NamedDevice(name=oracle.GPU_DEVICE)
    gpu.properties.CopyFrom(oracle.gpu_properties(
        memory_bytes=int(gpu_memory_bytes)))
    cpu = device_properties_pb2.NamedDevice(name=oracle.CPU_DEVICE)
    cpu.properties.CopyFrom(oracle.cpu_properties())
    return gcluster.Cluster(devices=[gpu, cpu])


def _memory_only_config(mode):
    """A RewriterConfig that runs only Grappler's memory optimizer."""
    config = config_pb2.ConfigProto()
    rewrite = config.graph_options.rewrite_options
    off = rewriter_config_pb2.RewriterConfig.OFF
    for field in rewrite.DESCRIPTOR.fields:
        if (field.enum_type is not None
                and field.enum_type.name == "Toggle"):
            setattr(rewrite, field.name, off)
    rewrite.memory_optimization = getattr(rewriter_config_pb2.RewriterConfig,
                                          mode)
    rewrite.min_graph_nodes = -1
    return config


def grappler_memory_optimize(graph, fetch, mode, gpu_memory_bytes):
    """TensorFlow's memory optimizer on the oracle's virtual GPU.

    Args:
      graph: the `tf.Graph` of a built model (not modified). It is placed
        on the GPU and passed through `forward_identities` first.
      fetch: the op one step runs.
      mode: "SWAPPING_HEURISTICS", "RECOMPUTATION_HEURISTICS" or
        "HEURISTICS" (RewriterConfig.MemOptType names).
      gpu_memory_bytes: memory of the simulated GPU; the swapping heuristic
        only acts when the step's peak exceeds it.

    Returns:
      ``(graph_def, info)``: the optimized GraphDef (placed, swap pairs as
      CPU Identity pairs, ready for ``oracle.peak_memory(..., place=False)``)
      and a dict with swap_outs, swap_ins, swapout_bytes, swapin_bytes,
      recomputed (ops TensorFlow added that are not swaps), optimize_s.
    """
    if mode not in _MEM_MODES:
        raise ValueError("mode must be one of %s; got %r" % (_MEM_MODES, mode))
    # TensorFlow's optimizer sees the graph the oracle judges: the same
    # placement, Identity-like ops already forwarded.
    placed, _ = forward_identities(oracle.place_on_gpu(graph),
                                   keep={fetch.name})
    meta = meta_graph_pb2.MetaGraphDef()
    meta.graph_def.CopyFrom(placed)
    meta.collection_def["train_op"].node_list.value.append(fetch.name)
    cluster = _virtual_cluster(gpu_memory_bytes)
    start = time.perf_counter()
    try:
        optimized = tf_optimizer.OptimizeGraph(
            _memory_only_config(mode), meta, verbose=False, cluster=cluster)
    finally:
        cluster.Shutdown()
    elapsed = time.perf_counter() - start

    original = {n.name for n in placed.node}
    size = tensor_bytes_of(graph)
    by_name = {n.name: n for n in optimized.node}
    info = {"swap_outs": 0, "swap_ins": 0, "swapout_bytes": 0,
            "swapin_bytes": 0, "recomputed": 0, "optimize_s": elapsed}
    for node in optimized.node:
        if node.op == _SWAP_OUT_OP:
            info["swap_outs"] += 1
            info["swapout_bytes"] += size(node.input[0])
        elif node.op == _SWAP_IN_OP:
            info["swap_ins"] += 1
            source = by_name[node.input[0].split(":")[0]]
            info["swapin_bytes"] += size(source.input[0])
        elif node.name not in original and node.op != "NoOp":
            info["recomputed"] += 1
        if node.op in (_SWAP_OUT_OP, _SWAP_IN_OP):
            node.op = "Identity"
            node.device = oracle.CPU_DEVICE
            if "_class" in node.attr:
                del node.attr["_class"]
        # The annotation only guides Grappler's own passes; left in place
        # it would make the oracle ignore the rerouted input.
        if "_swap_to_host" in node.attr:
            del node.attr["_swap_to_host"]
    return optimized, info


def apply_tflms(built, params=None, budget_gib=None, settings=None):
    """Rewrite `built.graph` in place with the public `tflms.LMS`.

    Args:
      built: a `Built` model.
      params: ``(swapout_threshold, swapin_ahead, swapin_groupby,
        sync_mode)`` for a fixed-parameter edit, or None to auto-tune.
      budget_gib: ``autotune_gpu_mem`` when auto-tuning.
      settings: other LMS properties to set, ``{name: value}`` (a
        capacity case's ``lms``, such as ``{"interconnect": "instant"}``).

    Returns:
      dict with status ("swapped", "not needed" or "no fit"), edit_s,
      swap_outs, swap_ins, swapout_bytes, swapin_bytes, params (the
      parameters used), sim_peak (the simulator's device peak for the
      plan, copies timed at the tuner's interconnect), sim_instant_peak
      (the same plan with copies instant, as `oracle_peaks` replays them
      by default: the number to compare with its gpu_peak),
      predicted_step (`_predicted_steps`: the step with the plan
      over each of `STEP_LINKS`; without a plan, the step as given; or
      step_error when the step-time model rejects the plan) and, for
      "no fit", the error text.
    """
    if params is None:
        lms = LMS()
        lms.autotune_gpu_mem = budget_gib
        lms.autotune_host_mem = common.SERVER_HOST_MEM_GIB
    else:
        t, a, g, s = params
        lms = LMS(swapout_threshold=t, swapin_ahead=a, swapin_groupby=g,
                  sync_mode=s)
    for name, value in (settings or {}).items():
        setattr(lms, name, value)
    lms.batch_size = built.batch_size
    start = time.perf_counter()
    try:
        # Planned for a GPU whatever this machine runs (`step_target`).
        target = step_target(built, lms.settings)
        result = (rewrite.rewrite_session_graph(built.graph, lms.settings,
                                                target=target)
                  if built.function is None
                  else rewrite.rewrite_function_graph(built.graph,
                                                     lms.settings,
                                                     target=target))
    except autotune.AutotuneError as err:
        return {"status": "no fit", "edit_s": time.perf_counter() - start,
                "error": str(err).split(". ")[0]}
    elapsed = time.perf_counter() - start
    out = {"status": "swapped" if result.rewritten else "not needed",
           "edit_s": elapsed, "swap_outs": 0, "swap_ins": 0,
           "swapout_bytes": 0, "swapin_bytes": 0, "params": None}
    if result.rewritten:
        # The simulator's view of the applied plan, for comparison with
        # the oracle (replayed here when the parameters were fixed).
        planned = pipeline.simulate_plan(result.planned)
        p = planned.params
        out["sim_peak"] = int(planned.with_lms.peak_device_bytes)
        out["sim_instant_peak"] = int(
            pipeline.instant_replay(planned).peak_device_bytes)
        out.update(swap_outs=len(result.swapout_ops),
                   swap_ins=len(result.swapin_ops),
                   swapout_bytes=int(planned.plan.swapout_bytes()),
                   swapin_bytes=int(planned.plan.swapin_bytes()),
                   params=[p.swapout_threshold, p.swapin_ahead,
                           p.swapin_groupby, p.sync_mode])
    if result.planned is not None:  # without a plan: the step as given
        try:
            out["predicted_step"] = _predicted_steps(
                planned if result.rewritten else result.planned)
        except ValueError as err:  # levels the step-time model rejects
            out["step_error"] = str(err)[:200]
    return out


def probe_peaks(method, built, budget_gib, settings=None):
    """One capacity probe of `built` (edited in place) without the original
    TFLMSv2 (`tflmsv2.measured` is that one): "none", the oracle on the
    graph as given; "tf_swap", TensorFlow's ``SWAPPING_HEURISTICS`` with
    the budget as the simulated GPU's memory, then the oracle; "tflms",
    `apply_tflms` auto-tuned to the budget with `settings` besides, then
    the oracle unless no plan fits ("no fit").

    Returns:
      dict of the probe's numbers (``gpu_peak`` absent without a plan).
    """
    if method == "none":
        return oracle_peaks(built.graph, built.train_op)
    if method == "tf_swap":
        optimized, row = grappler_memory_optimize(
            built.graph, built.train_op, "SWAPPING_HEURISTICS",
            int(budget_gib * GIB))
        row.update(oracle_peaks(optimized, built.train_op.name, place=False))
        return row
    if method == "tflms":
        row = apply_tflms(built, budget_gib=budget_gib, settings=settings)
        if row["status"] != "no fit":
            row.update(oracle_peaks(built.graph, built.train_op))
        return row
    raise ValueError("method must be one of none, tf_swap, tflms; got %r"
                     % (method,))


def _predicted_steps(planned, gpu=None):
    """`steptime.predict_planned` of `planned` over each of `STEP_LINKS`.

    Returns:
      dict with gpu (the name; default `Settings().gpu`, the GPU the
      pipeline plans for), without_lms_s (the graph's own compute, the same
      over every link) and links: per link name, with_lms_s, exposed_s
      (waiting for copies) and recompute_s.
    """
    gpu = gpu or Settings().gpu
    out = {"gpu": gpu, "links": {}}
    for link in STEP_LINKS:
        step = steptime.predict_planned(planned, gpu=gpu, interconnect=link)
        out["without_lms_s"] = step.without_lms_s
        out["links"][link] = {"with_lms_s": step.with_lms_s,
                              "exposed_s": step.exposed_transfer_s,
                              "recompute_s": step.recompute_s}
    return out


def step_index(built):
    """The `GraphIndex` of `built`'s training step: found by `tflms.step`'s
    rules in a Session graph, or a function graph's outputs and control
    outputs with its captured variables resident (`tflms.tf.lms_function`)."""
    if built.function is not None:
        return tf_function.step_of(built.graph)[1]
    return tf_reader.build_index(built.graph)


def step_target(built, settings):
    """The `target.Target` `built`'s step is planned on with `settings`,
    as LMS plans every step (`graph_step.step_target`, a Session graph's
    as a function graph's): Grappler's groups kept whole, planned for a
    GPU (oneDNN's CPU passes merge nothing there)."""
    del built  # every step's target is the same
    return graph_step.step_target(settings, here=False)


def predicted_step_without_lms(built, gpu=None):
    """The step `tflms.steptime` predicts for `built.graph` as given (no
    copies, so no link), as `tflms plan` predicts a graph it does not
    rewrite.

    Returns:
      dict with gpu (default `Settings().gpu`) and without_lms_s.
    """
    gpu = gpu or Settings().gpu
    index = step_index(built)
    roles = pipeline.classify(index, Settings(),
                              step_target(built, Settings()))
    step = steptime.StepTimeModel(index, roles, built.batch_size,
                                  gpu=gpu).predict()
    return {"gpu": gpu, "without_lms_s": step.without_lms_s}
