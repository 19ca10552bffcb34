"""The replay of the step stats with the TensorFlow executor's buffer rules
(the ``tflms.tf.oracle`` docstring: ``runtime_gpu_peak_bytes``): forwarding
ops, resident variables, release at launch, swapped-in copies allocated
when the host sends them."""

import functools

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import graph_pb2
from tensorflow.python.framework import op_def_registry

from tflms.graph_index.index import (ALLOCATING_REF_TYPES,
                                     BUFFER_FORWARDING_TYPES, NEUTRAL_OPERANDS)
from tflms.inplace import inplace_candidates
from tflms.tf import reader
from tflms.tf.oracle.copies import _hold_for_copies
from tflms.tf.oracle.virtual_cluster import (_GraphLike, _is_cpu_device,
                                          _recv_name, _sanitized)
from tflms.tf.oracle.oracle_result import LiveTensor
from tflms.tf.oracle.trace import _parse_input

# ReadVariableOp returns the variable's own buffer (outside copy-on-read
# mode, which only sparse gathers turn on).
VARIABLE_READ_TYPES = frozenset({"ReadVariableOp"})
VARIABLE_TYPES = frozenset({"VarHandleOp", "VariableV2"})


def _neutral_operand_slot(node, nodes, sizes):
    """The data input whose buffer `node` (x op neutral constant) returns
    once Grappler folds it (`NEUTRAL_OPERANDS`), or None."""
    neutral, pairs = NEUTRAL_OPERANDS[node.op]
    data = [i for i in node.input if not i.startswith("^")]
    for kept, other in pairs:
        if max(kept, other) >= len(data):
            continue
        const = nodes.get(_parse_input(data[other])[0])
        x_key = _parse_input(data[kept])
        # Same bytes as x (the same dtype): broadcasting changed nothing.
        if (const is None or const.op != "Const"
                or sizes.get(x_key) != sizes.get((node.name, 0))):
            continue
        if reader.holds_only(const.attr["value"].tensor, neutral):
            return kept
    return None


@functools.lru_cache(maxsize=None)
def _ref_output_ports(op_type: str) -> frozenset:
    """Output ports of `op_type` that are references to a variable's buffer.

    Ports are counted through the op def's output args up to the first
    list-valued one (no registered op has a reference output after one).
    Unknown op types (functions of the graph's library) have none.
    """
    op_def = op_def_registry.get(op_type)
    if op_def is None or op_type in ALLOCATING_REF_TYPES:
        return frozenset()
    ports = set()
    for port, arg in enumerate(op_def.output_arg):
        if arg.number_attr or arg.type_list_attr:
            break
        if arg.is_ref:
            ports.add(port)
    return frozenset(ports)


def _variable_bytes(node) -> int:
    dtype = tf.as_dtype(node.attr["dtype"].type)
    dims = [d.size for d in node.attr["shape"].shape.dim]
    if any(d < 0 for d in dims):
        return 0  # unknown size counts as zero, as everywhere in the oracle
    return int(np.prod(dims, dtype=np.int64)) * dtype.base_dtype.size


def _static_output_bytes(graph: _GraphLike) -> dict:
    """Bytes of every tensor whose static shape TensorFlow fully knows.

    Shapes come from TensorFlow's own shape inference on graph
    construction (a `GraphDef` is imported into a scratch graph), which
    evaluates small constant subgraphs such as the ``InvertPermutation``
    that gives a gradient ``Transpose`` its permutation. Grappler's static
    inference, which sizes the virtual scheduler's outputs, does not, and
    records such an output as 4 bytes.

    Returns:
      dict ``(node name, port) -> bytes``; resource, variant and string
      tensors and tensors with an unknown dimension are left out.
    """
    if isinstance(graph, graph_pb2.GraphDef):
        graph_def = graph_pb2.GraphDef()
        graph_def.CopyFrom(graph)
        # The measurement ignores colocation; so does this import, which
        # would reject a constraint naming a node that was dropped.
        for node in graph_def.node:
            if "_class" in node.attr:
                del node.attr["_class"]
        scratch = tf.Graph()
        with scratch.as_default():
            tf.compat.v1.import_graph_def(graph_def, name="")
        graph = scratch
    sizes = {}
    for op in graph.get_operations():
        for port, tensor in enumerate(op.outputs):
            dtype = tensor.dtype.base_dtype
            if (dtype in (tf.resource, tf.variant, tf.string)
                    or not tensor.shape.is_fully_defined()):
                continue
            sizes[(op.name, port)] = (tensor.shape.num_elements()
                                      * dtype.size)
    return sizes


def _runtime_replay(step_stats, graph_def, gpu_device, static_bytes=None,
                    bytes_per_s=None, fetch_names=()):
    """Replays the step with the TensorFlow runtime's buffer rules.

    Same step stats, microsecond times and swapped-in-copy correction as
    `_replay`; forwarding ops and variable reads allocate nothing, variables
    are resident, a buffer is released when its last GPU reader is launched
    (or its last host reader ends), and a host tensor's GPU copy is
    allocated when the host sends it. See the `tflms.tf.oracle` docstring.

    With ``bytes_per_s``, copies between the GPU and the host take time on
    one FIFO stream per direction: a GPU buffer read by a CPU op is held
    until its copy to the host has ended, and a GPU copy of a CPU tensor
    until its copy from the host has ended (and its last GPU reader, as
    without). Allocations do not move.

    Args:
      step_stats: the virtual scheduler's ``StepStats``.
      graph_def: the graph the item was built from.
      gpu_device: full name of the GPU device.
      static_bytes: `_static_output_bytes` of the graph, or None. A tensor
        (or a GPU copy of one) is counted at least at this size.
      bytes_per_s: the link's rate per direction, or None for copies that
        take no time.
      fetch_names: the nodes the step fetches. Grappler keeps a fetched
        ``IdentityN`` whole, so its reads hold their inputs even where no
        node reads the output.

    Returns:
      ``(peak_bytes, live_at_peak, peak_ns, timed_copies)`` for the GPU:
      ``live_at_peak`` a list of ``LiveTensor``, largest first; ``peak_ns``
      when the peak was reached; ``timed_copies`` a list of `TimedCopy`
      (empty without ``bytes_per_s``).
    """
    step = _RuntimeStep(step_stats, graph_def, gpu_device, static_bytes,
                        fetch_names)
    _write_in_place(step, timed=bytes_per_s is not None)
    live, sent_from, sent_early = _allocations(step)
    to_host_ready = _hold_for_reads(step, live)
    timed_copies = []
    if bytes_per_s is not None:
        timed_copies = _hold_for_copies(step, live, to_host_ready, sent_from,
                                        bytes_per_s)
    resident = _resident_variables(step, graph_def)
    peak, at_peak, peak_ns = _peak(step, live, sent_early, resident)
    return peak, at_peak, peak_ns, timed_copies


class _RuntimeStep:
    """One step's stats read with the runtime's buffer rules: where and
    when each op ran, each output's bytes, and the GPU buffer each read
    holds. Part of `_runtime_replay`.

    Attributes:
      nodes: node name -> `NodeDef` of the graph.
      placement, times: op -> its device, and its (start, end) in ns.
      sizes: ``(op, port)`` -> bytes allocated (at least the static size).
      order: GPU op -> its position in the GPU's execution order.
      gpu_device: full name of the GPU device.
      written_into: in-place output -> the input buffer it took
        (`_write_in_place` fills it).
      host_done: host op -> when it has ended (`_host_done`'s memo).
      fetch_names: the nodes the step fetches.
    """

    def __init__(self, step_stats, graph_def, gpu_device, static_bytes,
                 fetch_names=()):
        self.nodes = {node.name: node for node in graph_def.node}
        self.fetch_names = frozenset(fetch_names)
        self.gpu_device = gpu_device
        placement, times, sizes = {}, {}, {}
        order = {}
        for dev_stats in step_stats.dev_stats:
            for ns in dev_stats.node_stats:
                placement[ns.node_name] = dev_stats.device
                if dev_stats.device == gpu_device:
                    order[ns.node_name] = len(order)
                start = ns.all_start_micros * 1000
                times[ns.node_name] = (start,
                                       start + ns.op_end_rel_micros * 1000)
                for port, out in enumerate(ns.output):
                    sizes[(ns.node_name, port)] = (
                        out.tensor_description.allocation_description
                        .allocated_bytes)
        for (name, port), nbytes in (static_bytes or {}).items():
            for key in ((name, port),
                        (_recv_name(name, port, gpu_device), 0)):
                if key in sizes and sizes[key] < nbytes:
                    sizes[key] = nbytes
        self.placement, self.times, self.sizes = placement, times, sizes
        self.order = order
        self.written_into = {}
        self.host_done = {}

    def gpu_buffer(self, key):
        """The GPU buffer a GPU reader of tensor `key` reads: the
        scheduler's _Recv copy for a tensor from another device, the
        forwarded buffer's owner for a forwarding op or an op that wrote
        its output into an input's buffer, None for a variable."""
        nodes, gpu_device = self.nodes, self.gpu_device
        while True:
            name, port = key
            if self.placement.get(name) != gpu_device:
                return (_recv_name(name, port, gpu_device), 0)
            node = nodes.get(name)
            if node is not None and (node.op in VARIABLE_READ_TYPES
                                     or port in _ref_output_ports(node.op)):
                return None
            if node is not None and node.op in NEUTRAL_OPERANDS:
                slot = _neutral_operand_slot(node, nodes, self.sizes)
            elif node is not None and node.op in BUFFER_FORWARDING_TYPES:
                slot = port if node.op == "IdentityN" else 0
            else:
                slot = None
            if slot is None:
                if key in self.written_into:
                    key = self.written_into[key]
                    continue
                return key
            data = [i for i in node.input if not i.startswith("^")]
            key = _parse_input(data[slot])

    def release_key(self, name):
        """When op `name` lets go of its inputs. A GPU op: when it is
        launched (its start), right after its own allocations, in the
        GPU's execution order. Host ops that took time: when they end,
        before any op that starts in that microsecond. A zero-length op
        elsewhere (an LMS swap-out, whose copy takes time on a real
        machine): after everything the GPU does in that microsecond."""
        start, end = self.times[name]
        if name in self.order:
            return (start, 1, self.order[name], 1)
        if start < end:
            return (end, 0, 0, 0)
        return (end, 2, 0, 0)

    def host_copy_origin(self, key):
        """The GPU tensor of which CPU tensor `key` is the host copy (an
        LMS swap-in forwards its swap-out, which reads the swapped tensor),
        or None for a tensor made on the host."""
        while self.placement.get(key[0]) != self.gpu_device:
            node = self.nodes.get(key[0])
            if node is None or node.op not in BUFFER_FORWARDING_TYPES:
                return None
            data = [i for i in node.input if not i.startswith("^")]
            key = _parse_input(data[key[1] if node.op == "IdentityN" else 0])
        return key

    def host_ended(self, name):
        """`_host_done` of host op `name`."""
        return _host_done(name, self.nodes, self.times, self.placement,
                          self.gpu_device, self.host_done)

    def reads(self):
        """`_gpu_reads` of the step."""
        return _gpu_reads(self.nodes, self.times, self.placement,
                          self.gpu_device, self.fetch_names)


def _allocations(step):
    """The GPU buffers the step allocates: ``live`` (buffer -> [alloc ns,
    release key of its maker, transferred]), ``sent_from`` (the host
    tensor each _Recv copies) and ``sent_early`` (copies allocated before
    their _Recv ran).

    TensorFlow's intra-process rendezvous allocates the GPU copy when the
    tensor is sent, at the end of its producer on the host (the _Recv,
    which has no inputs, waits from the start of the step), not when the
    virtual scheduler gets to the _Recv in the GPU's queue, which may be
    after GPU ops that were ready earlier."""
    gpu_device, placement, times = step.gpu_device, step.placement, step.times
    recv_suffix = "_on_" + _sanitized(gpu_device)
    sent_from = {}
    for key in step.sizes:
        if placement[key[0]] != gpu_device:
            sent_from[(_recv_name(*key, gpu_device), 0)] = key
    sent_early = set()
    live = {}
    for key in step.sizes:
        name = key[0]
        if placement[name] != gpu_device:
            continue
        if name in step.nodes and step.gpu_buffer(key) != key:
            continue  # forwarded (or a variable read): no allocation
        transferred = name not in step.nodes and name.endswith(recv_suffix)
        alloc = times[name][0]
        source = sent_from.get(key) if transferred else None
        if source is not None:
            sent = step.host_ended(source[0])
            if sent < alloc:
                alloc = sent
                sent_early.add(key)
        live[key] = [alloc, step.release_key(name), transferred]
    return live, sent_from, sent_early


def _hold_for_reads(step, live):
    """Extends each buffer in `live` to its last reader's release; returns
    when each GPU tensor a CPU op reads is first read (the runtime sends a
    tensor to the host once, for its first CPU reader)."""
    times = step.times
    to_host_ready = {}
    for name, parsed, reader_on_gpu in step.reads():
        if not reader_on_gpu:
            to_host_ready[parsed] = min(
                to_host_ready.get(parsed, times[name][0]), times[name][0])
        buffer = step.gpu_buffer(parsed)
        if buffer in live:
            live[buffer][1] = max(live[buffer][1], step.release_key(name))
    return to_host_ready


def _resident_variables(step, graph_def):
    """A `LiveTensor` per variable on the GPU, for the whole step."""
    step_end = max((end for _, end in step.times.values()), default=0)
    resident = []
    for node in graph_def.node:
        if node.op not in VARIABLE_TYPES:
            continue
        device = step.placement.get(node.name)
        on_gpu = (device == step.gpu_device if device is not None
                  else not _is_cpu_device(node.device))
        if on_gpu:
            resident.append(LiveTensor(
                name=node.name, nbytes=_variable_bytes(node), alloc_ns=0,
                dealloc_ns=step_end, variable=True))
    return resident


def _peak(step, live, sent_early, resident):
    """``(peak bytes, live at the peak largest first, peak ns)`` of the
    allocations and releases in `live`, the `resident` variables counted
    throughout.

    An allocation sorts with the ops launched in its microsecond, by
    execution order, before the releases of its own op. A copy sent from
    the host before its _Recv's turn comes after the GPU ops launched in
    that microsecond that were ready before it was sent, and before those
    that became ready then (a reader of another copy, which waits for that
    copy to arrive)."""
    order, times, sizes = step.order, step.times, step.sizes
    launched_at = {}
    for name, position in order.items():
        launched_at.setdefault(times[name][0], []).append((position, name))

    ready_ns = {}  # GPU op -> when it could start, see _gpu_ready

    def sent_position(sent_ns):
        later = []
        for position, name in launched_at.get(sent_ns, ()):
            if name not in ready_ns:
                ready_ns[name] = _gpu_ready(name, step.nodes, times,
                                            step.placement, step.gpu_device,
                                            step.host_done)
            if ready_ns[name] >= sent_ns:
                later.append(position)
        return min(later) - 0.5 if later else len(order)

    events = []
    for key, (alloc, release, _) in live.items():
        position = (sent_position(alloc) if key in sent_early
                    else order.get(key[0], 0))
        events.append(((alloc, 1, position, 0), sizes[key], key))
        events.append((release, -sizes[key], key))
    current = sum(t.nbytes for t in resident)
    peak, count, peak_keys, peak_ns = current, {}, [], 0
    for when, nbytes, key in sorted(events):
        current += nbytes
        count[key] = count.get(key, 0) + (1 if nbytes >= 0 else -1)
        if current > peak:
            peak, peak_ns = current, when[0]
            peak_keys = [k for k, n in count.items() if n > 0]
    at_peak = [LiveTensor(name=f"{k[0]}:{k[1]}", nbytes=sizes[k],
                          alloc_ns=live[k][0], dealloc_ns=live[k][1][0],
                          transferred=live[k][2])
               for k in peak_keys]
    at_peak.extend(resident)
    at_peak.sort(key=lambda t: (-t.nbytes, t.name))
    return peak, at_peak, peak_ns


def _gpu_reads(nodes, times, placement, gpu_device, fetch_names=()):
    """``(reader, (tensor name, port), reader on the GPU)`` for every read
    that holds a GPU buffer: a GPU reader reads a GPU buffer (maybe a
    copy); a CPU reader (an LMS swap-out) keeps the GPU tensor it copies
    alive. Part of `_runtime_replay` (its names).

    An ``IdentityN``'s read of an input it hands on to no reader holds
    nothing: Grappler removes that read (and the ``IdentityN``) before
    the step runs (`GraphIndex.hands_on_unread`), though the virtual
    scheduler, which optimizes nothing, runs it. A fetched ``IdentityN``
    (`fetch_names`) stays whole, every read included."""
    unread = _unread_handoffs(nodes, fetch_names)
    for name in times:
        node = nodes.get(name)
        if node is None:
            continue
        reader_on_gpu = placement[name] == gpu_device
        slot = -1
        for text in node.input:
            parsed = _parse_input(text)
            if parsed is None:
                continue
            slot += 1
            if parsed[0] not in placement or (name, slot) in unread:
                continue
            if not reader_on_gpu and placement[parsed[0]] != gpu_device:
                continue
            yield name, parsed, reader_on_gpu


def _unread_handoffs(nodes, fetch_names=()):
    """``(IdentityN, input slot)`` of the graph whose output of that
    index no node reads, fetched ``IdentityN`` ops (`fetch_names`) aside:
    Grappler keeps a fetch node as it is."""
    read = set()
    for node in nodes.values():
        for text in node.input:
            parsed = _parse_input(text)
            if parsed is not None:
                read.add(parsed)
    return {(name, slot) for name, node in nodes.items()
            if node.op == "IdentityN" and name not in fetch_names
            for slot in range(sum(1 for i in node.input
                                  if not i.startswith("^")))
            if (name, slot) not in read}


def _write_in_place(step, timed):
    """Fills `step.written_into` (output key -> input buffer) with the GPU
    ops whose kernels write their output into an input's buffer
    (`tflms.inplace`): in the GPU's execution order, an op takes the first
    candidate input whose buffer has the output's size and whose last
    reader it is, read through one slot only. A buffer a host op reads is
    taken only when copies are instant and that read has ended (with timed
    copies the copy to the host may still hold it). Part of
    `_runtime_replay`."""
    gpu_buffer, release_key = step.gpu_buffer, step.release_key
    nodes, order, sizes = step.nodes, step.order, step.sizes
    written_into = step.written_into
    readers = {}  # buffer -> [(release key, reader, reader on the GPU)]
    for name, parsed, on_gpu in step.reads():
        buffer = gpu_buffer(parsed)
        if buffer is not None:
            readers.setdefault(buffer, []).append(
                (release_key(name), name, on_gpu))
    for name in sorted(order, key=order.get):
        node = nodes.get(name)
        if node is None or (name, 0) not in sizes:
            continue
        data = [i for i in node.input if not i.startswith("^")]
        candidates = inplace_candidates(node.op, len(data))
        if not candidates or gpu_buffer((name, 0)) != (name, 0):
            continue
        mine = release_key(name)
        buffers = [gpu_buffer(_parse_input(text)) for text in data]
        for slot in candidates:
            buffer = buffers[slot]
            if (buffer is None or buffers.count(buffer) != 1
                    or sizes.get(buffer) != sizes[(name, 0)]):
                continue
            reads = readers.get(buffer, ())
            if max(reads)[:2] != (mine, name):
                continue  # read after this op: the count is not one
            if timed and not all(on_gpu for _, _, on_gpu in reads):
                continue
            written_into[(name, 0)] = buffer
            readers[buffer] = list(reads) + readers.pop((name, 0), [])
            break


def _host_done(name, nodes, times, placement, gpu_device, memo):
    """When host op `name` has really ended, in the step stats' times.

    The virtual scheduler makes an op ready at the end of the input it
    processed last, not of the one that ended last, so a host op may start
    in the schedule before a GPU op it waits for (an LMS swap-in's trigger)
    has ended. An op ends no earlier than its own end and every input's,
    data or control, host inputs counted the same way (`memo` keeps them).
    """
    stack = [name]
    while stack:
        op = stack[-1]
        if op in memo:
            stack.pop()
            continue
        node = nodes.get(op)
        inputs = [] if node is None else [
            text.lstrip("^").partition(":")[0] for text in node.input]
        inputs = [i for i in inputs if i in times]
        pending = [i for i in inputs
                   if placement[i] != gpu_device and i not in memo]
        if pending:
            stack.extend(pending)
            continue
        done = times[op][1]
        for i in inputs:
            done = max(done, memo[i] if placement[i] != gpu_device
                       else times[i][1])
        memo[op] = done
        stack.pop()
    return memo[name]


def _gpu_ready(name, nodes, times, placement, gpu_device, host_done):
    """When GPU op `name` could start: every input has ended (a GPU input),
    been copied (a host tensor: its _Recv has run) or been done on the host
    (a control input from a host op, `_host_done`)."""
    ready = 0
    node = nodes.get(name)
    for text in ([] if node is None else node.input):
        control = text.startswith("^")
        source, _, port = text.lstrip("^").partition(":")
        if source not in times:
            continue
        if placement[source] == gpu_device:
            ready = max(ready, times[source][1])
            continue
        recv = _recv_name(source, port or 0, gpu_device)
        if not control and recv in times:
            ready = max(ready, times[recv][0])
        else:
            ready = max(ready, _host_done(source, nodes, times, placement,
                                          gpu_device, host_done))
    return ready
