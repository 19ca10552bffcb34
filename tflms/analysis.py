"""Pure questions about an indexed graph: which ops LMS may touch, and how.

All functions take a `GraphIndex` (plain data) and return plain data; none
of them reads or edits the `tf.Graph`, and this module does not import
TensorFlow: what the answers need from TensorFlow (collections, function
libraries, control-flow contexts) `tflms.tf.reader.build_index` has read
into the index already. So every function here also works on a literal
graph from `graph_index.from_edges`.

Why one module: it is a flat list of small functions, the longest
`classify_ops` at 80 lines, and `classify_ops` calls most of the others
(inactive, constant, possibly-dead, collective ops, device matching) to
make the `OpRoles` every stage plans with; splitting it by topic would
only move those calls across modules. The ops TensorFlow merges at run
time, a question of their own, are `tflms.fusions`'; the ops that only
initialize variables, which `classify_ops` does not ask about, are
`tflms.initializers`'.
"""

import dataclasses

from tflms import fusions
from tflms import graph_index as gi
from tflms.target import Target

__all__ = [
    "NEVER_SWAPPED_TYPES",
    "OpRoles",
    "classify_ops",
    "same_device",
    "compute_devices",
    "inactive_ops",
    "constant_ops",
    "SHAPE_ONLY_TYPES",
    "collective_ops",
    "maybe_dead_ops",
    "ops_matching",
    "ancestors_within",
    "learning_parameter_bytes",
    "has_training_ops",
    "in_gradient_scope",
    "largest_device_op",
    "op_bytes",
]

# Ops whose outputs are never swapped and that never read a swap-in: inputs,
# constants, variables and their reads, and cheap data fillers. Their
# tensors are resident anyway or are recreated every step.
NEVER_SWAPPED_TYPES = frozenset({
    "Const", "Identity", "Placeholder", "PlaceholderWithDefault",
    "VarHandleOp", "VarIsInitializedOp", "VariableShape", "ReadVariableOp",
    "AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp",
    "ResourceGather", "ResourceScatterAdd", "ResourceScatterSub",
    "ResourceScatterMul", "ResourceScatterDiv", "ResourceScatterMin",
    "ResourceScatterMax", "ResourceScatterUpdate", "ResourceScatterNdUpdate",
    "ResourceScatterNdAdd", "Range", "RandomUniform",
    "Assign", "AssignAdd", "AssignSub", "Queue", "ScatterAdd", "ScatterSub",
    "ScatterUpdate", "TruncatedNormal", "Variable", "VariableV2",
    "NoOp",
})

# Ops that read only the shape of their input. Grappler replaces them by
# constants when shapes are static, and on a GPU they never need the data:
# bringing a tensor back for them would be a wasted transfer.
SHAPE_ONLY_TYPES = frozenset({
    "Shape", "ShapeN", "Size", "Rank", "ZerosLike", "OnesLike",
    "BroadcastGradientArgs",
})

# Ops whose value depends only on their input's shape: constants when the
# shape is static.
_STATIC_WHEN_SHAPED_TYPES = frozenset({
    "Shape", "ShapeN", "Size", "Rank", "ZerosLike", "OnesLike",
})

# Ops that must never be the trigger of a swap-in: they either do not run
# every step in the right phase, or run at a time unrelated to the graph's
# dataflow.
_NEVER_TRIGGER_TYPES = ((NEVER_SWAPPED_TYPES - {"Identity"})
                        | gi.CONTROL_FLOW_V1_TYPES)

# Ops without inputs that cannot make an op active on their own: an op fed
# only by these and by inactive ops is inactive too.
_SOURCELESS_TYPES = frozenset({
    "Const", "VarHandleOp", "VariableV2", "Variable", "Placeholder",
    "PlaceholderWithDefault",
})


@dataclasses.dataclass(frozen=True)
class OpRoles:
    """What LMS may do with each op, as frozensets of op ids.

    Attributes:
      device_ops: ops on the devices LMS manages (`Target.manages`).
      inactive: ops that do not run in the chosen learning mode.
      sources: ops whose outputs may be swapped out.
      sinks: ops that may read a swapped-in tensor.
      triggers: ops that may start a swap-in through a control edge.
      waiters: ops that may wait on a transfer, or hold back a synchronous
        swap-in (sync modes): never dead, never a control-flow primitive.
      has_loops: True if the graph has v1 or v2 loops.
      fused_with: op id -> frozenset of the op ids TensorFlow may merge it
        with at run time (`fusions.fusion_partners`); LMS never orders
        such ops through its own edges.
    """

    device_ops: frozenset
    inactive: frozenset
    sources: frozenset
    sinks: frozenset
    triggers: frozenset
    waiters: frozenset
    has_loops: bool
    fused_with: dict = dataclasses.field(default_factory=dict)

    def orderable(self, index, op):
        """True if LMS may order `op` by a control edge of its own: it runs
        on the managed device in the chosen learning mode, outside a v1
        loop (whose body runs once per iteration)."""
        return (op in self.device_ops and op not in self.inactive
                and not index.in_v1_loop[op])


def _device_key(device):
    spec = gi.parse_device(device)
    return (spec.job, spec.replica, spec.task,
            spec.device_type or "", spec.device_index or 0)


def same_device(a, b):
    """True unless `a` and `b` are placements on two different devices.

    An unplaced op (empty device string) may land anywhere, so it counts as
    the same device as every op; job, replica and task only differ when both
    strings give them. Used to keep a swap-in's trigger on its consumer's
    device, so each tower of a multi-tower model starts its own swap-ins.
    """
    if not a or not b or a == b:
        return True
    ka, kb = _device_key(a), _device_key(b)
    for x, y in zip(ka[:3], kb[:3]):
        if x is not None and y is not None and x != y:
            return False
    return ka[3:] == kb[3:]


def compute_devices(index, target=None):
    """The distinct devices the step's ops are placed on that `target`
    (a `target.Target`; default: ``Target()``) manages: one device string
    per device (the first op's spelling, in op order), leaving out the
    host and unplaced ops.

    A step of a tf.distribute strategy holds every replica's ops, each
    replica on its own device; one plan per device gives each replica its
    own device's budget (`tflms.tf.lms_function` plans so when this names two
    or more devices).
    """
    target = (target or Target()).replace(device=None)
    found = {}
    for device in index.devices:
        if not device or not target.manages(device):
            continue
        found.setdefault(_device_key(device), device)
    return tuple(found.values())


def _learning_phase_switches(index):
    """Switch ops whose predicate is Keras' learning-phase placeholder."""
    switches = []
    seen = set()
    stack = [i for i, (name, t) in enumerate(zip(index.names, index.types))
             if t == "PlaceholderWithDefault"
             and name.endswith("keras_learning_phase")]
    while stack:
        op = stack.pop()
        for c in index.fanouts[op]:
            if c in seen:
                continue
            seen.add(c)
            if index.types[c] == "Identity":
                stack.append(c)
            elif index.types[c] in ("Switch", "RefSwitch"):
                switches.append(c)
    return sorted(switches)


def inactive_ops(index, is_training=True, maybe_dead=None):
    """Ops that do not run in the given learning mode.

    Fused batch-norm ops whose ``is_training`` attribute differs from the
    mode are inactive when they sit in a v1 conditional (or downstream of
    one, like their gradients), and so are the ops of the branch of each
    Keras learning-phase ``cond`` (v1 Switch/Merge) that the mode does not
    take. A batch norm outside any conditional always runs: a frozen batch
    norm (``is_training=False``) in a training graph, as in fine-tuning, is
    active. Inactivity then flows forward: an op is inactive when it has an
    inactive input and all its other inputs are constants, variables or
    inactive. Merge and Switch ops stop the flow (a Merge has a live input
    from the taken branch).

    Args:
      index: a `GraphIndex`.
      is_training: the learning mode.
      maybe_dead: `maybe_dead_ops(index)` if already computed.
    """
    inactive = set()
    conditional = None
    for i, flag in enumerate(index.bn_is_training):
        if flag is None or flag == is_training:
            continue
        if conditional is None:
            conditional = (maybe_dead_ops(index) if maybe_dead is None
                           else maybe_dead)
        if index.in_v1_cond[i] or i in conditional:
            inactive.add(i)
    untaken = 0 if is_training else 1  # Switch output 0 is the false branch
    for s in _learning_phase_switches(index):
        for consumer, _ in index.consumers[s][untaken]:
            inactive.add(consumer)
    if not inactive:
        return frozenset()
    for level in index.ops_by_level:
        for op in level:
            if op in inactive or index.types[op] in ("Merge", "Switch"):
                continue
            preds = index.predecessors(op)
            if not any(p in inactive for p in preds):
                continue
            if all(p in inactive or index.types[p] in _SOURCELESS_TYPES
                   for p in preds):
                inactive.add(op)
    return frozenset(inactive)


def constant_ops(index):
    """Ops whose value is known before the step runs.

    Constants, shape queries and zeros/ones-like of statically shaped
    tensors, and stateless ops fed only by those. Grappler folds them into
    constants, so a swap of one of their outputs would be optimized away (and
    never needs doing).
    """
    const = set()
    for level in index.ops_by_level:
        for op in level:
            t = index.types[op]
            if t == "Const":
                const.add(op)
                continue
            if t in _STATIC_WHEN_SHAPED_TYPES:
                shapes = [index.output_shapes[p][o]
                          for p, o in index.inputs[op]]
                if all(s is not None and None not in s for s in shapes):
                    const.add(op)
                continue
            if index.is_stateful[op] or t in NEVER_SWAPPED_TYPES - {
                    "Identity"}:
                continue
            preds = index.predecessors(op)
            if preds and all(p in const for p in preds):
                const.add(op)
    return frozenset(const)


def maybe_dead_ops(index):
    """Ops that may receive a dead tensor: downstream of a v1 Switch.

    In v1 control flow the untaken output of a Switch is *dead*, and
    deadness flows through every op except Merge. Gradients of ops in a
    ``tf.cond`` branch are built outside the cond's context, so only this
    dataflow view finds them. A dead op used as a swap-in trigger would make
    the swapped tensor dead too, and a Merge fed by it would pick the wrong
    input, so these ops never start or hold back a swap-in. A Merge ends the
    flow: one of its inputs is live whenever its cond's predicate is.

    The Switch of a ``tf.while_loop`` (predicate: the loop's LoopCond) is
    no source of deadness outside the loop: its untaken output feeds the
    loop's Exit, which hands the final, live value to the ops after the
    loop. (The ops inside the loop are never triggers anyway.)
    """
    dead = set()
    seeds = set()
    for op, t in enumerate(index.types):
        if t in ("Switch", "RefSwitch"):
            pred = (index.inputs[op][1][0] if len(index.inputs[op]) > 1
                    else None)
            if pred is None or index.types[pred] != "LoopCond":
                seeds.add(op)
    for level in index.ops_by_level:
        for op in level:
            t = index.types[op]
            if t in ("Merge", "RefMerge"):
                continue
            if any(p in seeds or p in dead for p in index.predecessors(op)):
                dead.add(op)
    return frozenset(dead)


def ops_matching(index, scopes, types, what):
    """Ops whose name starts with one of `scopes` or whose type is in `types`.

    Args:
      index: a `GraphIndex`.
      scopes: iterable of name prefixes given by the user.
      types: iterable of op types given by the user.
      what: the name of the user's setting, for error messages.

    Returns:
      A frozenset of op ids.

    Raises:
      ValueError: if a scope or a type matches no op in the graph.
    """
    matched = set()
    for scope in sorted(scopes):
        hits = [i for i, name in enumerate(index.names)
                if name.startswith(scope)]
        if not hits:
            raise ValueError(
                "%s: no operation in the graph is in scope %r; check the "
                "spelling against the op names (e.g. %r)"
                % (what, scope, index.names[-1] if index.names else ""))
        matched.update(hits)
    types = set(types)
    found = set()
    for i, t in enumerate(index.types):
        if t in types:
            matched.add(i)
            found.add(t)
    missing = sorted(types - found)
    if missing:
        raise ValueError(
            "%s: no operation in the graph has type %s; op types are "
            "case-sensitive names such as 'Conv2D' or 'MatMul'"
            % (what, ", ".join(repr(m) for m in missing)))
    return frozenset(matched)


def collective_ops(index):
    """Ops that take part in a collective: `graph_index.COLLECTIVE_TYPES`
    (collectives get no role; the reason is there), and function
    calls (``If``, ``PartitionedCall``...) whose functions contain one
    (`GraphIndex.calls_collective`)."""
    return frozenset(i for i, t in enumerate(index.types)
                     if t in gi.COLLECTIVE_TYPES or index.calls_collective[i])


def classify_ops(index, target=None, is_training=True, filters=None):
    """Decide which ops LMS may use as sources, sinks, triggers and waiters.

    Collectives (`collective_ops`) get no role: LMS leaves their inputs,
    outputs and control edges as they are.

    Args:
      index: a `GraphIndex`.
      target: the `target.Target` of the step (default: ``Target()``):
        the devices managed (`Target.manages`) and the fusion rules that
        apply (`Target.grappler_groups`, `Target.onednn_cpu`).
      is_training: learning mode whose ops run.
      filters: dict with optional frozensets of op ids under the keys
        'incl_sources', 'excl_sources', 'incl_sinks', 'excl_sinks' (from
        `ops_matching`).

    Returns:
      An `OpRoles`.
    """
    target = target or Target()
    filters = filters or {}
    maybe_dead = maybe_dead_ops(index)
    inactive = inactive_ops(index, is_training, maybe_dead)
    constant = constant_ops(index)
    n = index.num_ops
    device_ops = frozenset(i for i in range(n)
                           if target.manages(index.devices[i]))
    has_loops = any(index.in_v1_loop) or any(
        t in ("While", "StatelessWhile") for t in index.types)

    collective = collective_ops(index)

    def usable(i):
        return (i in device_ops and i not in inactive
                and i not in collective)

    sources, sinks, triggers, waiters = set(), set(), set(), set()
    for i in range(n):
        if not usable(i):
            continue
        t = index.types[i]
        in_loop = index.in_v1_loop[i]
        if not in_loop and i not in maybe_dead and t not in (
                gi.CONTROL_FLOW_V1_TYPES):
            waiters.add(i)
        # A cond's Switch hands its input to the branch that runs; in v1
        # control flow the gradient of a batch norm in a learning-phase cond
        # reads the forward activation through it, so it is the tensor to
        # swap. (When its branch does not run, the swap ops get the dead
        # tensor and do nothing, like the consumer.)
        # An op the graph optimizer reduces to an identity of its input
        # (StopGradient, x * 1.0) has no buffer of its own at run time:
        # its swap-out would copy its input's buffer, and after the
        # optimizer it equals the input's own swap-out, which TensorFlow
        # then merges with it (so it never runs). The input is the tensor
        # to swap; its buffer lives until the alias's readers are done.
        if (t not in NEVER_SWAPPED_TYPES
                and index.forwards_input[i] is None
                and (t not in gi.CONTROL_FLOW_V1_TYPES or t == "Switch")
                and not in_loop and i not in constant):
            sources.add(i)
        # A loop's Enter reads its input in the enclosing frame, so it may
        # read a swap-in like any op outside the loop.
        if (t not in NEVER_SWAPPED_TYPES and t not in SHAPE_ONLY_TYPES
                and (not in_loop or t == "Enter")):
            sinks.add(i)
        if (t not in _NEVER_TRIGGER_TYPES and not in_loop
                and not index.in_v1_cond[i] and i not in maybe_dead):
            triggers.add(i)

    # Ops Grappler merges with a neighbour only while they have one reader
    # and no control edge (`fusions.grappler_groups`): where the target
    # says so (a tf.function's step), LMS leaves them so.
    if target.grappler_groups:
        groups = fusions.grappler_groups(index, target.onednn_cpu)
        sources -= groups.inner
        sinks -= groups.direct_readers
        triggers -= groups.members
        waiters -= groups.members
        removed = frozenset(fusions.broadcast_gradients(index))
        triggers -= removed
        waiters -= removed

    if filters.get("incl_sources"):
        sources &= filters["incl_sources"]
    sources -= filters.get("excl_sources", frozenset())
    if filters.get("incl_sinks"):
        sinks &= filters["incl_sinks"]
    sinks -= filters.get("excl_sinks", frozenset())
    return OpRoles(device_ops=device_ops, inactive=inactive,
                   sources=frozenset(sources), sinks=frozenset(sinks),
                   triggers=frozenset(triggers), waiters=frozenset(waiters),
                   has_loops=has_loops,
                   fused_with=fusions.fusion_partners(index))


def ancestors_within(index, op_id, min_level, extra_preds=None,
                     data_only=False):
    """Ancestors of `op_id` whose level is at least `min_level`.

    Walks data and control inputs backwards (only data inputs with
    `data_only`) and stops at `min_level`, so the cost is bounded by the ops
    in that window of levels.
    """
    levels = index.levels
    seen = set()
    stack = [op_id]
    while stack:
        v = stack.pop()
        preds = index.fanins[v] if data_only else index.predecessors(v)
        if extra_preds and v in extra_preds:
            preds = tuple(preds) + tuple(extra_preds[v])
        for p in preds:
            if p not in seen and levels[p] >= min_level:
                seen.add(p)
                stack.append(p)
    return seen


def has_training_ops(index):
    """True if the graph computes gradients (ops in a ``gradients`` name
    scope, as ``tf.gradients`` and the optimizers make them, or in the
    ``gradient_tape`` scope of a `tf.GradientTape` traced by `tf.function`)
    or updates variables with an optimizer (``Apply*`` ops)."""
    for name, t in zip(index.names, index.types):
        if t.startswith(gi.APPLY_PREFIXES):
            return True
        if in_gradient_scope(name):
            return True
    return False


def in_gradient_scope(name):
    """True if the op named `name` is in a ``gradients`` name scope (as
    ``tf.gradients`` and the optimizers make them) or in the
    ``gradient_tape`` scope of a `tf.GradientTape` traced by
    `tf.function`."""
    return any(part.startswith(("gradients", "gradient_tape"))
               for part in name.split("/")[:-1])


def learning_parameter_bytes(index):
    """Bytes of the graph's trainable variables (static shapes), as
    `build_index` read them from its ``trainable_variables`` collection."""
    return sum(index.trainable_bytes)


def op_bytes(index, op_id, batch_size=None):
    """Bytes of an op's inputs and outputs; unknown sizes count as 0."""
    total = 0
    for producer, out in index.inputs[op_id]:
        total += gi.tensor_bytes(index, producer, out, batch_size) or 0
    for out in range(len(index.output_shapes[op_id])):
        total += gi.tensor_bytes(index, op_id, out, batch_size) or 0
    return total


def largest_device_op(index, device_ops, batch_size=None, excluded=()):
    """(op id, bytes) of the device op with the most input+output bytes,
    ignoring the `excluded` op ids."""
    best, best_bytes = None, -1
    excluded = frozenset(excluded)
    for i in sorted(device_ops - excluded):
        b = op_bytes(index, i, batch_size)
        if b > best_bytes:
            best, best_bytes = i, b
    return best, max(best_bytes, 0)
