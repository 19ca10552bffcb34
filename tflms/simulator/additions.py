"""What a plan adds to the graph one replay counts: swap nodes, recompute
clones, their buffers and reads, and the inputs they reroute.
"""

import collections

from tflms.inplace import inplace_candidates
from tflms.simulator.buffers import (DEVICE, HOST, NO_BUFFER, alias_slot,
                                     tensor_name)


class Additions:
    """What a plan adds to the graph one replay counts: nodes (swap ops and
    clones, numbered after the graph's), buffers, reads, rerouted inputs,
    and whether any original op may change level."""

    def __init__(self, buffers, levels):
        """Nothing added yet to the graph of `buffers` (`GraphBuffers`) and
        `levels` (`GraphLevels`)."""
        self._buffers = buffers
        self._num_base_nodes = levels.num_nodes
        self.node = levels.num_nodes  # next node id
        self._first_buffer = len(buffers.buf_name)
        self._base_levels = levels.levels
        self.bytes, self.space, self.alloc, self.names = [], [], [], []
        self.use_buf, self.use_node = [], []
        self.new_levels = []     # levels of the new nodes, in node order
        self.swap_nodes = []     # (producer, swap-out node, waiters, swap-ins)
        self.swapin_of = {}      # (producer, output, k) -> (node, copy buffer)
        self.clone_nodes, self.clone_reroutes = [], []
        self.rerouted = {}       # (consumer, slot) -> buffer it reads now
        self.masked = []         # the graph's reads a reroute removes
        # (buffer, level) pairs from copy_levels: device buffers held until
        # a copy to the host ends, device copies allocated when it starts.
        self.held, self.allocated = [], []
        self.shortened = False   # a rerouted edge held up its consumer's level
        self.moved = False       # some original op must move (or may)
        self.swapout_bytes = self.swapin_bytes = self.recompute_bytes = 0
        # (tensor id, node, held-through level or None): added reads of the
        # graph's tensors, made when every reroute is known.
        self._tensor_reads = []
        # A graph op's own output buffer -> the swap-in's device copy it is
        # written into (`written_into_copy`): the copy holds the output.
        self.written_into = {}

    def new_node(self):
        self.node += 1
        return self.node - 1

    def buffer(self, nbytes, space, maker):
        """A new buffer made by node `maker`; returns its id."""
        self.bytes.append(nbytes)
        self.space.append(space)
        self.alloc.append(maker)
        return self._first_buffer + len(self.bytes) - 1

    def read(self, buf, node):
        self.use_buf.append(buf)
        self.use_node.append(node)

    def reroute(self, consumer, slot, buf, producer, new_level):
        """`consumer`'s input `slot` reads `buf` (made at `new_level`)
        instead of `producer`'s tensor."""
        self.rerouted[(consumer, slot)] = buf
        levels = self._base_levels
        # The rerouted input no longer reads the producer. That can lower
        # the consumer only if the producer was its latest input (then
        # levels are computed afresh).
        if levels[consumer] - levels[producer] < 2:
            self.shortened = True
        if levels[consumer] <= new_level:
            self.moved = True
        if buf != NO_BUFFER:
            self.read(buf, consumer)

    def add_swaps(self, swaps, copy_levels, detail):
        """Swap ops are nodes numbered after the graph's (and gate) nodes,
        in plan order: each swap-out, then its swap-ins. One pass records
        their edges, buffers and reads, and their levels from the graph's
        levels: a swap-out one above its source, a swap-in one above its
        swap-out and triggers. The swap-out reads the tensor and owns a
        host buffer; each swap-in reads it and owns a device copy, which
        its consumers read instead of the tensor."""
        out_base = self._buffers.out_base
        tensor_bytes = self._buffers.tensor_bytes
        tensor_buffer = self._buffers.tensor_buffer
        base_levels = self._base_levels
        index = self._buffers.index
        for s_index, swap in enumerate(swaps):
            p = swap.producer
            t = out_base[p] + swap.output
            size = tensor_bytes[t]
            b = tensor_buffer[t]
            self.swapout_bytes += size
            self.swapin_bytes += size * len(swap.swap_ins)
            so = self.new_node()
            so_level = base_levels[p] + 1
            self.new_levels.append(so_level)
            if detail:
                tname = safe_name(tensor_name(index, p, swap.output))
                self.names.append("lms/swapout_%s" % tname)
            if b != NO_BUFFER:
                # Read once every reroute is known (`add_rerouted_reads`).
                self._tensor_reads.append((t, so, None if copy_levels is None
                                           else copy_levels.held_through[
                                               s_index]))
            host_buf = self.buffer(size, HOST, so)
            ins = []
            for sin in swap.swap_ins:
                si = self.new_node()
                ins.append((si, sin))
                si_level = so_level
                for trig in sin.triggers:
                    if base_levels[trig] > si_level:
                        si_level = base_levels[trig]
                si_level += 1
                self.new_levels.append(si_level)
                self.read(host_buf, si)
                copy_buf = self.buffer(size, DEVICE, si)
                if copy_levels is not None:
                    self.allocated.append((
                        copy_buf,
                        copy_levels.allocated_from[s_index][len(ins) - 1]))
                self.swapin_of[(p, swap.output, len(ins) - 1)] = (si, copy_buf)
                if detail:
                    self.names.append("lms/swapin_%s (device copy)" % tname)
                for c, slot in sin.consumers:
                    self.reroute(c, slot, copy_buf, p, si_level)
                if len(sin.consumers) == 1:
                    own = written_into_copy(self._buffers, self.rerouted,
                                            p, swap.output,
                                            *sin.consumers[0])
                    if own is not None and own not in self.written_into:
                        self.written_into[own] = copy_buf
            for w in swap.waiters:
                if base_levels[w] <= so_level:
                    self.moved = True
            self.swap_nodes.append((p, so, swap.waiters, ins))

    def add_recomputes(self, recomputes, detail):
        """One node per clone, after the swap nodes. A clone runs one level
        after its trigger and its inputs; its outputs are device buffers
        from then to their last reader (aliasing types forward their
        input's buffer, as the originals do); the late readers read the
        last clone, so the original buffer is freed after its early
        readers. A clone another recompute reads (a ``'recompute'``
        source) is kept until that read too."""
        out_base = self._buffers.out_base
        tensor_bytes = self._buffers.tensor_bytes
        tensor_buffer = self._buffers.tensor_buffer
        base_levels = self._base_levels
        base_nodes = self._num_base_nodes
        index = self._buffers.index
        overwritten_by = self._buffers.overwritten_by
        clones_of = {}  # (producer, output) -> (clone nodes, their buffers)
        # Clone outputs another recompute reads: (producer, output, n, k).
        shared = {src[1:] for rec in recomputes
                  for src in rec.sources("recompute")}
        for rec in recomputes:
            p = rec.producer
            # Reads of each clone output (n, k) by the recompute's own
            # clones: an output read once, by one clone, is that clone's
            # to write over.
            clone_reads = collections.Counter(
                src[1:] for src in rec.sources("clone"))
            # Buffers this recompute's clones made -> the clone output
            # (n, k) that holds them now (views made by aliasing types
            # do not hold one of their own).
            holder = {}
            self.recompute_bytes += tensor_bytes[out_base[p] + rec.output]
            if detail:
                rname = "lms/recompute_%s" % safe_name(
                    tensor_name(index, p, rec.output))
            nodes, bufs = [], []
            for op, sources in zip(rec.ops, rec.inputs):
                cn = self.new_node()
                preds = [rec.trigger]
                level = base_levels[rec.trigger]
                in_bufs = []
                for src in sources:
                    if src[0] == "clone":
                        v, b = nodes[src[1]], bufs[src[1]][src[2]]
                    elif src[0] == "swapin":
                        v, b = self.swapin_of[(src[1], src[2], src[3])]
                    elif src[0] == "recompute":
                        made, made_bufs = clones_of[(src[1], src[2])]
                        v, b = made[src[3]], made_bufs[src[3]][src[4]]
                    else:
                        v = src[1]
                        b = tensor_buffer[out_base[v] + src[2]]
                    preds.append(v)
                    v_level = (base_levels[v] if v < base_nodes
                               else self.new_levels[v - base_nodes])
                    level = max(level, v_level)
                    in_bufs.append(b)
                self.new_levels.append(level + 1)
                for src_index, src in enumerate(sources):
                    b = in_bufs[src_index]
                    if src[0] != "tensor":
                        if b != NO_BUFFER:
                            self.read(b, cn)
                        continue
                    t = out_base[src[1]] + src[2]
                    writer = overwritten_by.get(t)
                    if writer is not None and base_levels[writer] <= level:
                        # The runtime keeps the tensor: the clone's read
                        # holds it, so `writer` cannot write over it and
                        # makes a buffer of its own. Counted as the
                        # tensor's own buffer from `writer` on.
                        b = self.buffer(tensor_bytes[t], DEVICE, writer)
                        in_bufs[src_index] = b
                        if detail:
                            self.names.append("%s (kept for %s)" % (
                                tensor_name(index, src[1], src[2]), rname))
                        self.read(b, cn)
                    elif b != NO_BUFFER:
                        # Read once every reroute is known
                        # (`add_rerouted_reads`).
                        self._tensor_reads.append((t, cn, None))
                out_bufs = []
                for k in range(len(index.output_shapes[op])):
                    slot = alias_slot(index.types[op], k, index.inputs[op],
                                      (), index.forwards_input[op])
                    if slot is not None and slot < len(in_bufs):
                        out_bufs.append(in_bufs[slot])
                        continue
                    size = tensor_bytes[out_base[op] + k]
                    if size == 0:
                        out_bufs.append(NO_BUFFER)
                        continue
                    if k == 0:
                        b = self._clone_written_over(
                            op, sources, rec, bufs, size, clone_reads,
                            shared, holder)
                        if b is not None:
                            holder[b] = (len(nodes), k)
                            out_bufs.append(b)
                            continue
                    out_bufs.append(self.buffer(size, DEVICE, cn))
                    holder[out_bufs[-1]] = (len(nodes), k)
                    if detail:
                        self.names.append("%s/%s:%d" % (
                            rname, safe_name(index.names[op]), k))
                nodes.append(cn)
                bufs.append(out_bufs)
                self.clone_nodes.append((cn, preds))
            last = nodes[-1]
            last_level = self.new_levels[last - base_nodes]
            out_buf = bufs[-1][rec.output]
            for c, slot in rec.consumers:
                self.reroute(c, slot, out_buf, p, last_level)
            self.clone_reroutes.append((p, last, rec.consumers))
            clones_of[(p, rec.output)] = (nodes, bufs)

    def _clone_written_over(self, op, sources, rec, bufs, size, clone_reads,
                            shared, holder):
        """The buffer a clone of `op` (reading `sources`) writes its output
        0 into, as the original's kernel would (`tflms.inplace`), or None:
        the first candidate input that is an earlier clone's output of the
        same size and element size, in a buffer of the recompute's own that
        holds it alone (`holder`), read only by this clone, once, and by no
        other recompute (`shared`). Unlike the graph's own ops, this is
        decided on the plan: a clone's readers are the plan's."""
        index = self._buffers.index
        out_base = self._buffers.out_base
        tensor_bytes = self._buffers.tensor_bytes
        itemsize = index.output_itemsizes[op][0]
        for slot in inplace_candidates(index.types[op], len(sources)):
            src = sources[slot]
            if src[0] != "clone":
                continue
            n, k = src[1], src[2]
            made = rec.ops[n]
            if (clone_reads[(n, k)] != 1
                    or (rec.producer, rec.output, n, k) in shared
                    or index.output_itemsizes[made][k] != itemsize
                    or tensor_bytes[out_base[made] + k] != size):
                continue
            b = bufs[n][k]
            if b != NO_BUFFER and holder.get(b) == (n, k):
                return b
        return None

    def add_rerouted_reads(self):
        """Reads the rerouted inputs no longer make of the producer's buffer
        (masked) move to the copy they now read, along the graph's alias
        chains; the swap-outs' and clones' reads of the graph's tensors go
        to the buffer each tensor is in once the reroutes are made."""
        for u, copy_buf in self._buffers.rerouted_uses(self.rerouted):
            self.masked.append(u)
            if copy_buf != NO_BUFFER:
                self.read(copy_buf, int(self._buffers.use_node[u]))
        for t, node, held in self._tensor_reads:
            b = self._buffers.buffer_read(t, self.rerouted)
            if b == NO_BUFFER:
                continue
            self.read(b, node)
            if held is not None:
                self.held.append((b, held))

    def hold_tensors(self, held_through):
        """Hold the buffer each ``((producer, output), level)`` of
        `held_through` is in (once the reroutes are made) through its
        level: the gradients whose copies to an update on the host end
        after their last reader (`CopyLevels.gradients_held_through`)."""
        out_base = self._buffers.out_base
        for (p, k), level in held_through:
            b = self._buffers.buffer_read(out_base[p] + k, self.rerouted)
            if b != NO_BUFFER:
                self.held.append((b, level))


def written_into_copy(buffers, rerouted, p, output, consumer, slot):
    """The buffer of `consumer`'s output 0 when the runtime writes it into
    the device copy of a swap-in of tensor ``(p, output)`` that `consumer`
    alone reads, through input `slot`, or None (`tflms.inplace`): a device
    op whose kernel may take that slot's buffer, and whose output, in the
    graph without a plan (`buffers`, a `GraphBuffers`), has a buffer of
    its own of the copy's size and element size. The copy then has one
    reference, the kernel's: a softmax gradient's ``g * y`` written into
    its own swap-in of ``y`` while a second swap-in brings ``y`` back for
    ``(g - sum) * y``. Where an earlier candidate input is rerouted too
    (`rerouted`: ``(consumer, slot)`` pairs), the kernel would try it
    first, and nothing is assumed."""
    index = buffers.index
    if buffers.space[consumer] != DEVICE or consumer in buffers.inactive:
        return None
    candidates = inplace_candidates(index.types[consumer],
                                    len(index.inputs[consumer]))
    if slot not in candidates:
        return None
    if any((consumer, earlier) in rerouted
           for earlier in candidates[:candidates.index(slot)]):
        return None
    if not index.output_shapes[consumer] or \
            index.output_itemsizes[consumer][0] != \
            index.output_itemsizes[p][output]:
        return None
    out_base, tensor_bytes = buffers.out_base, buffers.tensor_bytes
    t = out_base[consumer]
    own = buffers.tensor_buffer[t]
    if (own == NO_BUFFER or int(buffers.buf_alloc[own]) != consumer
            or buffers.buf_space[own] != DEVICE
            or tensor_bytes[t] != tensor_bytes[out_base[p] + output]):
        return None
    return own


def safe_name(name):
    """`name` with the characters an op name cannot hold replaced."""
    return name.replace("/", "_").replace(":", "_")
