"""`peak_memory`: one graph through the virtual cluster and the oracle's
replays of its step stats."""

import re
from typing import Iterable, Optional, Sequence, Union

import tensorflow as tf
from tensorflow.core.framework import graph_pb2
from tensorflow.core.protobuf import meta_graph_pb2
from tensorflow.python.grappler import item as gitem

from tflms import hardware
from tflms.tf.oracle.copies import _link
from tflms.tf.oracle.virtual_cluster import (_UNLIMITED, VirtualCluster,
                                          _as_graph_def, _cluster, _GraphLike,
                                          _with_memory, cpu_properties,
                                          gpu_properties, place_on_gpu)
from tflms.tf.oracle.oracle_result import LiveTensor, OracleResult
from tflms.tf.oracle.runtime import _runtime_replay, _static_output_bytes
from tflms.tf.oracle.trace import _replay


def _fetch_names(fetches) -> list:
    if isinstance(fetches, (str, tf.Tensor, tf.Operation)):
        fetches = [fetches]
    names = []
    for fetch in fetches:
        if isinstance(fetch, (tf.Tensor, tf.Operation)):
            name = (fetch.op.name if isinstance(fetch, tf.Tensor)
                    else fetch.name)
        elif isinstance(fetch, str):
            name = fetch.lstrip("^").split(":")[0]
        else:
            raise TypeError(f"cannot fetch {fetch!r}")
        if name not in names:
            names.append(name)
    if not names:
        raise ValueError("peak_memory needs at least one fetch")
    return names


def _metagraph(graph_def: graph_pb2.GraphDef, fetch_names: Sequence[str]):
    meta = meta_graph_pb2.MetaGraphDef()
    meta.graph_def.CopyFrom(graph_def)
    # Grappler's item builder takes its fetch nodes from this collection.
    meta.collection_def["train_op"].node_list.value.extend(fetch_names)
    return meta


_REQUIRES = re.compile(r"Graph requires (\d+) bytes of memory on device (\S+)")


def _scheduler_peak(meta, gpu_props, cpu_props, gpu_device, cpu_device):
    # A one-byte GPU (and a CPU of unknown size, which the check skips) makes
    # VirtualCluster::Run fail with the scheduler's own GPU peak in the text.
    cluster = _cluster(_with_memory(gpu_props, 1), _with_memory(cpu_props, 0),
                       gpu_device, cpu_device)
    try:
        cluster.DeterminePeakMemoryUsage(gitem.Item(meta))
    except tf.errors.ResourceExhaustedError as err:
        match = _REQUIRES.search(str(err))
        if match is None:
            raise
        return int(match.group(1))
    finally:
        cluster.Shutdown()
    return 0


def peak_memory(graph: _GraphLike,
                fetches: Union[str, tf.Tensor, tf.Operation, Iterable],
                gpu_memory_bytes: Optional[int] = None,
                *,
                place: Union[bool, str] = True,
                cluster: Optional[VirtualCluster] = None,
                scheduler_check: bool = False,
                interconnect=None,
                gpu=None) -> OracleResult:
    """Measures the GPU and host memory peaks of one step of ``graph``.

    Args:
      graph: a ``tf.Graph`` or ``GraphDef``; it is not modified.
      fetches: what one step runs (train op, loss, ...): ops, tensors or
        names. Only their transitive fan-in is simulated.
      gpu_memory_bytes: capacity to judge the result against (see
        ``OracleResult.fits``). Measurement itself always uses an unlimited
        simulated device so that it never aborts.
      place: True: apply `place_on_gpu` first; a device string: that,
        with the device as its ``host`` (LMS's ``cpu_device``); False:
        the graph's devices as they are (unplaced ops on the GPU).
      cluster: the `VirtualCluster` (device properties and names);
        default ``VirtualCluster()``: the GPU ``gpu`` names and
        `cpu_properties`.
      scheduler_check: if True, also obtain the virtual scheduler's own GPU
        peak (one more simulation).
      interconnect: None (the default) for copies that take no time in the
        runtime replay; or the link to time them on, by name (a key of
        `tflms.hardware.INTERCONNECTS` such as ``"pcie4"``, or ``"instant"``),
        as a `tflms.hardware.Interconnect`, or as a rate in bytes/s per
        direction. Only ``runtime_gpu_peak_bytes`` (and its live tensors and
        time) changes: swapped-out GPU buffers are held until their copies
        to the host end (see the `tflms.tf.oracle` docstring).
      gpu: the GPU to simulate, a `tflms.hardware.Gpu` or a key of
        `tflms.hardware.GPUS`; None for `tflms.hardware.DEFAULT_GPU`, the
        V100. Its memory is not the capacity: that is
        ``gpu_memory_bytes``.

    Returns:
      An `OracleResult`.

    Raises:
      ValueError: for an unknown ``interconnect`` name or a rate that is
        not positive, an unknown ``gpu``, or both ``gpu`` and
        ``cluster.gpu_props``.
    """
    cluster = VirtualCluster() if cluster is None else cluster
    gpu_props, gpu_device = cluster.gpu_props, cluster.gpu_device
    cpu_device = cluster.cpu_device
    if gpu is not None and gpu_props is not None:
        raise ValueError(
            "peak_memory takes gpu or cluster.gpu_props, not both; got "
            "gpu=%r and gpu_props for %r"
            % (getattr(gpu, "name", gpu), gpu_props.model))
    link_name, bytes_per_s = _link(interconnect)
    host = place if isinstance(place, str) else None
    graph_def = (place_on_gpu(graph, host=host) if place
                 else _as_graph_def(graph))
    fetch_names = _fetch_names(fetches)
    meta = _metagraph(graph_def, fetch_names)
    if gpu_props is None:
        gpu_props = gpu_properties(
            hardware.DEFAULT_GPU if gpu is None else gpu)
    cpu_props = (cluster.cpu_props if cluster.cpu_props is not None
                 else cpu_properties())

    cluster = _cluster(_with_memory(gpu_props, _UNLIMITED),
                       _with_memory(cpu_props, _UNLIMITED),
                       gpu_device, cpu_device)
    try:
        item = gitem.Item(meta, ignore_colocation=True,
                          ignore_user_placement=False)
        reported = cluster.DeterminePeakMemoryUsage(item)
        _, run_time, step_stats = cluster.MeasureCosts(item)
    finally:
        cluster.Shutdown()

    # GraphMemory reports -1 for a device that ran nothing.
    raw_gpu, raw_live = reported.get(gpu_device, (0, []))
    raw_gpu = max(0, raw_gpu)
    host_peak = max(0, reported.get(cpu_device, (0, []))[0])
    raw_live_at_peak = sorted(
        (LiveTensor(name=f"{node}:{port}", nbytes=int(nbytes),
                    alloc_ns=int(alloc), dealloc_ns=int(dealloc))
         for node, port, nbytes, alloc, dealloc in raw_live),
        key=lambda t: (-t.nbytes, t.name))

    replayed_raw, _, _ = _replay(step_stats, graph_def, gpu_device,
                                 correct=False)
    corrected, live_at_peak, transfers = _replay(step_stats, graph_def,
                                                 gpu_device, correct=True)
    runtime, runtime_live, runtime_peak_ns, timed_copies = _runtime_replay(
        step_stats, graph_def, gpu_device, _static_output_bytes(graph),
        bytes_per_s, fetch_names)

    scheduler_gpu = None
    if scheduler_check:
        scheduler_gpu = _scheduler_peak(meta, gpu_props, cpu_props,
                                        gpu_device, cpu_device)

    return OracleResult(
        gpu_peak_bytes=int(corrected),
        raw_gpu_peak_bytes=int(raw_gpu),
        replayed_raw_gpu_peak_bytes=int(replayed_raw),
        host_peak_bytes=int(host_peak),
        scheduler_gpu_peak_bytes=scheduler_gpu,
        live_at_peak=tuple(live_at_peak),
        raw_live_at_peak=tuple(raw_live_at_peak),
        transfers=tuple(transfers),
        run_time_s=float(run_time),
        gpu_memory_bytes=gpu_memory_bytes,
        gpu_device=gpu_device,
        runtime_gpu_peak_bytes=int(runtime),
        runtime_live_at_peak=tuple(runtime_live),
        runtime_peak_ns=int(runtime_peak_ns),
        interconnect=link_name,
        interconnect_bytes_per_s=bytes_per_s,
        timed_copies=tuple(timed_copies),
    )
