"""The replay of ``GraphMemory::InferFromTrace`` on the virtual scheduler's
step stats, with and without the swapped-in-copy correction (the
``tflms.tf.oracle`` docstring: ``raw_gpu_peak_bytes`` and
``gpu_peak_bytes``)."""

from tflms.tf.oracle.virtual_cluster import _recv_name
from tflms.tf.oracle.oracle_result import LiveTensor, Transfer


def _parse_input(name: str):
    """Returns (node, port) of a data input, or None for a control input."""
    if name.startswith("^"):
        return None
    node, _, port = name.partition(":")
    return node, int(port) if port else 0


class _Interval:
    __slots__ = ("device", "nbytes", "alloc", "dealloc", "transferred")

    def __init__(self, device):
        self.device = device
        self.nbytes = 0
        self.alloc = 0
        self.dealloc = 0
        self.transferred = False


def _replay(step_stats, graph_def, gpu_device, correct):
    """Replays GraphMemory::InferFromTrace, optionally fixing the blind spot.

    Args:
      step_stats: the virtual scheduler's ``StepStats``.
      graph_def: the graph the item was built from.
      gpu_device: full name of the GPU device.
      correct: if True, keep GPU copies of transferred tensors alive until
        their last GPU consumer ends.

    Returns:
      ``(peak_bytes, live_at_peak, transfers)`` for the GPU, where
      ``live_at_peak`` is a list of ``LiveTensor`` and ``transfers`` a list of
      ``Transfer`` (empty if not ``correct``).
    """
    placement = {}
    times = {}   # node -> (start_ns, end_ns) with InferFromTrace's rounding.
    for dev_stats in step_stats.dev_stats:
        for ns in dev_stats.node_stats:
            placement[ns.node_name] = dev_stats.device
            start = ns.all_start_micros * 1000
            times[ns.node_name] = (start,
                                   start + ns.op_end_rel_micros * 1000)

    tensors = {}

    def interval(key, device):
        if key not in tensors:
            tensors[key] = _Interval(device)
        return tensors[key]

    for dev_stats in step_stats.dev_stats:
        for ns in dev_stats.node_stats:
            start, end = times[ns.node_name]
            for port, out in enumerate(ns.output):
                live = interval((ns.node_name, port), dev_stats.device)
                allocation = out.tensor_description.allocation_description
                live.nbytes = allocation.allocated_bytes
                live.alloc = start
                live.dealloc = max(live.dealloc, end + 1)

    # Consumers as recorded in the original graph; TF-inserted _Send/_Recv
    # nodes are not in it and therefore extend nobody's life.
    gpu_readers = {}  # (src, port) -> [consumer names on the GPU]
    for node in graph_def.node:
        if node.name not in times:
            continue
        _, end = times[node.name]
        swapped = set()
        if "_swap_to_host" in node.attr:
            swapped = set(node.attr["_swap_to_host"].list.i)
        for index, inp in enumerate(node.input):
            if index in swapped:
                continue
            parsed = _parse_input(inp)
            if parsed is None:
                continue
            live = interval(parsed, placement.get(parsed[0], ""))
            live.dealloc = max(live.dealloc, end + 1)
            if (placement[node.name] == gpu_device
                    and placement.get(parsed[0]) != gpu_device):
                gpu_readers.setdefault(parsed, []).append(node.name)

    transfers = []
    if correct:
        for (src, port), readers in gpu_readers.items():
            recv = _recv_name(src, port, gpu_device)
            live = tensors.get((recv, 0))
            if live is None:
                continue
            raw_end = live.dealloc
            for reader in readers:
                live.dealloc = max(live.dealloc, times[reader][1] + 1)
            live.transferred = True
            transfers.append(Transfer(
                source=f"{src}:{port}", recv_node=recv, nbytes=live.nbytes,
                start_ns=live.alloc, raw_end_ns=raw_end,
                corrected_end_ns=live.dealloc, consumers=tuple(readers)))
        transfers.sort(key=lambda t: (t.start_ns, t.source))

    events = {}
    for key, live in tensors.items():
        if live.device != gpu_device:
            continue
        events.setdefault(live.alloc, []).append((key, live.nbytes))
        events.setdefault(live.dealloc, []).append((key, -live.nbytes))
    # As in InferFromTrace, the peak is sampled only after every event of a
    # timestamp, and only a strictly larger total moves it.
    peak, current, live_keys, peak_keys = 0, 0, set(), set()
    for stamp in sorted(events):
        for key, delta in events[stamp]:
            current += delta
            if delta >= 0:
                live_keys.add(key)
            else:
                live_keys.discard(key)
        if current > peak:
            peak, peak_keys = current, set(live_keys)
    at_peak = [LiveTensor(name=f"{k[0]}:{k[1]}", nbytes=tensors[k].nbytes,
                          alloc_ns=tensors[k].alloc,
                          dealloc_ns=tensors[k].dealloc,
                          transferred=tensors[k].transferred)
               for k in peak_keys]
    at_peak.sort(key=lambda t: (-t.nbytes, t.name))
    return peak, at_peak, transfers
