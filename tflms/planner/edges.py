"""Control edges a plan adds between existing ops: deferral of fills,
noise and ops on held inputs made long before use, and serialization of
the chosen levels."""

from tflms import analysis
from tflms import graph_index as gi
from tflms.planner.triggers import find_trigger, may_trigger


# Ops that make a tensor from a shape and a scalar alone. The gradient of a
# v1 ``tf.cond`` (Keras' learning-phase conds around every batch norm) builds
# such zeros for the branch that is not taken; they depend only on the
# forward shapes, so TensorFlow makes them during the forward pass and holds
# them until the backward Merge reads them. Making one later costs a control
# edge, not a transfer.
DEFERRABLE_TYPES = frozenset({"Fill"})

# Counter-based random ops: their output is a function of the shape, key
# and counter they read, not of when they run (unlike the stateful
# ``RandomUniform``, whose kernel advances a generator). Keras 3's dropout
# draws its noise with them from a seed known at the step's start, so the
# noise of every layer (``[batch, heads, seq, seq]`` in attention) and the
# keep-mask compared from it are made at once in the first levels. Each is
# deferred with the chain of ops that needs nothing later (the mask's
# ``GreaterEqual``) until just before the chain's first other reader.
DEFERRABLE_NOISE_TYPES = frozenset({
    "StatelessRandomUniformV2", "StatelessRandomNormalV2",
    "StatelessTruncatedNormalV2", "StatelessRandomUniform",
    "StatelessRandomNormal", "StatelessTruncatedNormal",
    "StatelessRandomUniformFullIntV2", "StatelessRandomUniformIntV2",
})

# Ops of a deferred noise chain at most (the noise, its comparison).
_NOISE_CHAIN_OPS = 4


def deferral_edges(index, roles, extra_edges=()):
    """Control edges ``(trigger, op)`` that delay `DEFERRABLE_TYPES` ops
    until shortly before their first reader, and `DEFERRABLE_NOISE_TYPES`
    ops, with the ops of their chain that need nothing made after them,
    until shortly before the chain's first other reader (`_noise_deferral`),
    and any other op whose inputs are constants or are read again at or
    after its first reader, until just after that reader's latest other
    input (`_held_inputs_deferral`: its inputs are held then anyway).

    An op qualifies when it is an active device op outside loops whose
    output has rank >= 2 and whose earliest successor (data, control, or
    `extra_edges` such as serialization) is at least three levels later. Its
    trigger is found as a swap-in's is (`find_trigger` with
    ``swapin_ahead=1``): an ancestor of that successor at a level in
    ``(level(op), level(successor) - 1)``. Every descendant of the op is at
    or after that successor, so the trigger is none of them and no cycle can
    close; and the op moves to the trigger's next level, before all of its
    successors, so no other op's level changes.

    Args:
      index: a `GraphIndex` with the planning levels (after serialization,
        whose edges it holds in `planned_edges`).
      roles: its `OpRoles`.
      extra_edges: more control edges not in the graph.

    Returns:
      A tuple of ``(trigger_id, op_id)``, sorted by op id.
    """
    levels = index.levels
    extra = {}
    for a, b in tuple(index.planned_edges) + tuple(extra_edges):
        extra.setdefault(a, []).append(b)
    edges = []
    for op, t in enumerate(index.types):
        if t in DEFERRABLE_NOISE_TYPES:
            edge = _noise_deferral(index, roles, op, extra)
            if edge is not None:
                edges.append(edge)
            continue
        if t not in DEFERRABLE_TYPES:
            edge = _held_inputs_deferral(index, roles, op, extra)
            if edge is not None:
                edges.append(edge)
            continue
        if not roles.orderable(index, op):
            continue
        shape = index.output_shapes[op][0] if index.output_shapes[op] else None
        if shape is None or len(shape) < 2:
            continue
        successors = list(index.successors(op)) + extra.get(op, [])
        if not successors:
            continue
        first = min(successors, key=lambda c: (levels[c], c))
        if levels[first] - levels[op] < 3:
            continue
        trigger = find_trigger(index, roles, op, first, 1)
        if trigger is not None:
            edges.append((trigger, op))
    return tuple(edges)


def _deferrable(index, roles, op):
    return (op in roles.device_ops and op not in roles.inactive
            and op in roles.waiters and not index.in_v1_loop[op]
            and not index.is_stateful[op])


def _noise_deferral(index, roles, op, extra):
    """``(trigger, op)`` that delays the noise `op` and the ops that need
    nothing made after it (its chain) until just before the chain's first
    other reader, or None. The chain's ops are descendants of `op`, so
    they follow it; the trigger is an ancestor of that reader outside the
    chain, so no cycle closes."""
    if not _deferrable(index, roles, op):
        return None
    shape = index.output_shapes[op][0] if index.output_shapes[op] else None
    if shape is None or len(shape) < 2:
        return None
    levels = index.levels
    start = levels[op]
    chain, frontier = {op}, [op]
    while frontier:
        v = frontier.pop()
        for c in index.fanouts[v]:
            if c in chain or len(chain) >= _NOISE_CHAIN_OPS:
                continue
            if _deferrable(index, roles, c) and not extra.get(c) and all(
                    p in chain or levels[p] < start
                    for p in index.predecessors(c)):
                chain.add(c)
                frontier.append(c)
    readers = set()
    for v in chain:
        readers.update(index.successors(v))
        readers.update(extra.get(v, ()))
    readers -= chain
    if not readers:
        return None
    first = min(readers, key=lambda c: (levels[c], c))
    if levels[first] - start < 3:
        return None
    trigger = find_trigger(index, roles, op, first, 1)
    if trigger is None or trigger in chain:
        return None
    return (trigger, op)


def _held_inputs_deferral(index, roles, op, extra):
    """``(trigger, op)`` that delays `op` until just before its first
    reader, or None: where every tensor it reads is a constant or is read
    again at or after that reader (so it is held there anyway), making
    `op` later holds nothing longer and frees its output in between
    (Keras 3's accuracy compares the logits with a constant into a mask
    that waits for the rest of the NaN check)."""
    if not _deferrable(index, roles, op) or \
            index.types[op] in gi.BUFFER_FORWARDING_TYPES or \
            index.forwards_input[op] is not None:
        return None
    shape = index.output_shapes[op][0] if index.output_shapes[op] else None
    if shape is None or len(shape) < 2:
        return None
    levels = index.levels
    successors = list(index.successors(op)) + extra.get(op, [])
    if not successors:
        return None
    first = min(successors, key=lambda c: (levels[c], c))
    if levels[first] - levels[op] < 3:
        return None
    held = False
    for p, k in index.inputs[op]:
        if index.types[p] in _CONSTANT_TYPES:
            continue
        if not any(c != op and levels[c] >= levels[first]
                   for c, _ in index.consumers[p][k]):
            return None
        held = True
    if not held:
        return None
    # Right after the reader's latest other input (its levels are below
    # the reader's, so it is no descendant of `op`): the inputs made just
    # before it are then gone (the NaN check's BitwiseAnd, once its Less
    # is made).
    inputs = [p for p in index.predecessors(first)
              if p != op and levels[p] > levels[op]
              and may_trigger(index, roles, p, first)]
    if not inputs:
        return None
    return (max(inputs, key=lambda p: (levels[p], p)), op)


# Producers of tensors that stay on the device for the whole step.
_CONSTANT_TYPES = frozenset({"Const", "HostConst"})


def levels_over_size(index, roles, gib, batch_size=None):
    """Levels whose active device ops' outputs together exceed `gib` GiB."""
    limit = gib * (1 << 30)
    chosen = []
    for lvl, ops in enumerate(index.ops_by_level):
        total = 0
        for op in ops:
            if op in roles.device_ops and op not in roles.inactive:
                for out in range(len(index.output_shapes[op])):
                    total += gi.tensor_bytes(index, op, out, batch_size) or 0
        if total > limit:
            chosen.append(lvl)
    return chosen


# Ops that bring a step's data in: an op depends on the feeds of the data
# inputs among its ancestors.
_DATA_INPUT_TYPES = frozenset({
    "Placeholder", "PlaceholderV2", "PlaceholderWithDefault",
})

# Stateful ops without side effects: reading a variable, or passing a
# reference to one along, changes nothing.
_READ_ONLY_STATEFUL_TYPES = frozenset({
    "VarHandleOp", "ReadVariableOp", "VariableV2", "Variable",
    "VarIsInitializedOp", "IsVariableInitialized", "VariableShape",
    "ResourceGather", "ResourceGatherNd", "RefIdentity", "RefSwitch",
    "RefMerge", "RefEnter", "RefExit", "RefNextIteration",
})


def requirement_masks(index):
    """Per op, a bitmask of what running it requires besides computing: the
    data inputs it needs fed (placeholders) and the side effects it sets off
    (variable updates, random draws, iterator reads, checkpoint I/O...),
    over its data and control ancestors, itself included."""
    masks = [0] * index.num_ops
    bit = 0
    for level in index.ops_by_level:
        for op in level:
            mask = 0
            for p in index.predecessors(op):
                mask |= masks[p]
            t = index.types[op]
            if t in _DATA_INPUT_TYPES or (
                    index.is_stateful[op]
                    and t not in _READ_ONLY_STATEFUL_TYPES):
                mask |= 1 << bit
                bit += 1
            masks[op] = mask
    return masks


def serialization_edges(index, roles, slices, extra_levels=(),
                        excluded=frozenset()):
    """Control edges that make the ops of the chosen levels run one by one.

    A control edge ``a -> b`` makes every run of `b` run `a` first, so only
    edges that cannot change what a fetch does are made:

    * stateful ops (variable updates, random numbers, checkpoint I/O,
      iterators...) are never chained;
    * only ops that depend on a placeholder or a side effect are chained:
      the activations of a step. Initializers, the Saver's ops and
      computations on variables alone stay runnable on their own;
    * `b` waits only for an op whose `requirement_masks` are a subset of
      its own: no fetch needs a feed, or sets off a side effect, it did not
      before. With several train ops, or gradient accumulation, one never
      updates the variables of another; an evaluation branch on another
      placeholder is never tied to the training step; an op made under
      ``tf.control_dependencies([counter.assign_add(1)])`` never makes the
      forward pass count.

    The eligible ops are taken in level order, and within a level by id
    with ops TensorFlow may merge (`fusions.fusion_partners`) next to each
    other; each is chained after the latest earlier one that it may wait
    for. Ops in one level
    never depend on each other and every edge goes forward in that order,
    so no cycle can close.

    Args:
      index: a `GraphIndex` (original levels).
      roles: `OpRoles`.
      slices: `slice` objects (`Settings.serialization_levels`).
      extra_levels: more level indices (e.g. from `levels_over_size`).
      excluded: op ids that must not be chained (e.g. variable
        initializers, which must stay runnable without the training inputs).

    Returns:
      A tuple of ``(from_id, to_id)`` edges, and the sorted chosen levels.
    """
    all_levels = list(range(index.num_levels))
    chosen = set(extra_levels)
    for s in slices:
        chosen.update(all_levels[s])
    masks = None
    last_by_mask = {}  # requirement mask -> (position, op) of its latest op
    edges = []
    position = 0
    for lvl in sorted(chosen):
        # Ops TensorFlow may merge at run time (`fusions.fusion_partners`)
        # stay next to each other in the chain: an op chained between two
        # of them would sit on a cycle through the merged node.
        fused = roles.fused_with
        in_order = sorted(
            index.ops_by_level[lvl],
            key=lambda o: (min(fused.get(o, frozenset()) | {o}), o))
        for op in in_order:
            if (op in roles.device_ops and op not in roles.inactive
                    and op not in excluded
                    and not index.is_stateful[op]
                    and not index.in_v1_cond[op] and not index.in_v1_loop[op]
                    and index.types[op] not in analysis.NEVER_SWAPPED_TYPES
                    and index.types[op] not in gi.CONTROL_FLOW_V1_TYPES):
                if masks is None:
                    masks = requirement_masks(index)
                mask = masks[op]
                if not mask:
                    continue
                before = [last for m, last in last_by_mask.items()
                          if m & ~mask == 0]
                if before:
                    edges.append((max(before)[1], op))
                last_by_mask[mask] = (position, op)
                position += 1
    existing = set()
    for a, b in edges:
        if a in index.control_inputs[b]:
            existing.add((a, b))
    return tuple(e for e in edges if e not in existing), sorted(chosen)
