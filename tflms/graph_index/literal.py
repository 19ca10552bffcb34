"""`from_edges`: an index of a literal graph (names, types, edges, facts),
with no `tf.Graph` behind it, for the tests and for any caller without
TensorFlow; every bad entry is named with how to write it.
"""

import numbers

from tflms.devices import parse_device
from tflms.graph_index.build import Columns, OpFacts, assemble
from tflms.graph_index.index import (DEFAULT_DEVICE,
                                     GRAPPLER_IDENTITY_TYPES)


# Facts `from_edges` takes per op, with their defaults.
_LITERAL_FACTS = {
    "device": None,  # None: from_edges' default_device
    "outputs": None,  # None: max(1, outputs the edges read), no bytes
    "variable_bytes": 0,
    "trainable": False,
    "stateful": False,
    "bn_is_training": None,
    "in_v1_cond": False,
    "in_v1_loop": False,
    "forwards_input": None,
    "calls_collective": False,
    "flops": 0,  # int, or a (fixed, per_example) pair
}
_BOOL_FACTS = ("trainable", "stateful", "in_v1_cond", "in_v1_loop",
               "calls_collective")


def from_edges(ops, edges=(), control_edges=(),
               default_device=DEFAULT_DEVICE, fetches=()):
    """Index a literal graph: names, types and edges, no `tf.Graph`.

    The index is the kind `reader.build_index` makes (same fields,
    levels by the same code), with ``ops=None``: the analysis, the planner
    and the simulator work on it; the rewriter refuses it. Example, a 1 KiB
    tensor read by two ops::

        index = from_edges(
            [("x", "Placeholder", {"outputs": [1024]}),
             ("a", "Relu", {"outputs": [1024]}),
             ("b", "AddV2")],
            edges=[("x", "a"), ("x", "b"), ("a", "b")])

    Args:
      ops: sequence of ``(name, type)`` or ``(name, type, facts)``; op ids
        are positions in it. `facts` is a dict with any of:
        ``device`` (str, default `default_device`);
        ``outputs``: one entry per output, each either an int ``n`` (a
        tensor of ``n`` bytes, of shape ``(1, n)`` and 1-byte elements, so
        rank 2 and swappable) or a pair ``(shape, itemsize)`` with `shape`
        None (unknown rank) or a tuple of dims (None: unknown, the batch
        dimension; itemsize 0 for a tensor with no buffer of its own, such
        as a resource handle or a v1 ref variable's reference). Default: as
        many outputs as `edges` read (at least one), of unknown shape and no
        bytes;
        ``variable_bytes`` (int, bytes of the variable the op holds);
        ``trainable`` (bool: its `variable_bytes` are learning parameters);
        ``stateful``, ``in_v1_cond``, ``in_v1_loop``, ``calls_collective``
        (bool); ``bn_is_training`` (bool or None); ``forwards_input``
        (the input slot the op is an identity of, default 0 for
        `GRAPPLER_IDENTITY_TYPES` with an input, else None); ``flops``: an
        int (the op's floating-point operations) or a ``(fixed,
        per_example)`` pair of ints (``fixed + per_example * batch_size``),
        default 0. See `GraphIndex`.
      edges: data edges ``(tensor, consumer)``: `tensor` is ``'op'``
        (output 0) or ``'op:k'``; each consumer's input slots are numbered
        in the order its edges appear here.
      control_edges: ``(from_op, to_op)`` name pairs.
      default_device: device of ops whose facts give none.
      fetches: names of the training step's fetch ops: the index holds
        their fan-in only, renumbered in the order of `ops`, as
        `reader.build_index` holds a graph's step. Empty: every op.

    Returns:
      A `GraphIndex` with ``ops=None``.

    Raises:
      ValueError: naming the bad entry and how to write it.
      dag_levels.GraphCycleError: if the edges close a cycle.
    """
    specs, id_of = _literal_specs(ops)
    inputs, read = _literal_edges(edges, id_of, len(specs))
    control_inputs = _literal_control_edges(control_edges, id_of, len(specs))
    cols = Columns()
    for i, (name, op_type, facts) in enumerate(specs):
        where = "ops[%d] (%r)" % (i, name)
        shapes, itemsizes = _literal_outputs(facts["outputs"], read[i], where)
        _check_literal_flags(facts, where)
        variable_bytes = _literal_variable_bytes(facts["variable_bytes"],
                                                 where)
        cols.add(OpFacts(
            name=name, type=op_type,
            device=_literal_device(facts["device"], default_device, where),
            inputs=tuple(inputs[i]),
            control_inputs=tuple(sorted(control_inputs[i])),
            output_shapes=shapes, output_itemsizes=itemsizes,
            variable_bytes=variable_bytes,
            is_stateful=facts["stateful"],
            bn_is_training=facts["bn_is_training"],
            forwards_input=(
                _literal_slot(facts["forwards_input"], len(inputs[i]), where)
                if facts["forwards_input"] is not None
                else 0 if op_type in GRAPPLER_IDENTITY_TYPES and inputs[i]
                else None),
            in_v1_cond=facts["in_v1_cond"], in_v1_loop=facts["in_v1_loop"],
            calls_collective=facts["calls_collective"],
            trainable_bytes=variable_bytes if facts["trainable"] else 0,
            flops=_literal_flops(facts["flops"], where)))
    if isinstance(fetches, str):
        fetches = (fetches,)
    roots = [_literal_op_id(name, id_of, "fetches[%d]" % k)
             for k, name in enumerate(fetches)]
    return assemble(None, cols, id_of, roots,
                     "the fetches %s" % ", ".join(fetches) if roots
                     else "the whole graph")


def _literal_specs(ops):
    """`from_edges`' `ops` -> ``[(name, type, facts with defaults)]`` and
    ``{name: op id}``."""
    specs = []
    id_of = {}
    for k, spec in enumerate(ops):
        if (not isinstance(spec, (tuple, list)) or len(spec) not in (2, 3)
                or not all(isinstance(x, str) and x for x in spec[:2])):
            raise ValueError(
                "ops[%d] must be a (name, type) or (name, type, facts) "
                "tuple with non-empty strings; got %r" % (k, spec))
        name = spec[0]
        if name in id_of:
            raise ValueError(
                "ops[%d]: op name %r is already ops[%d]; names must be "
                "unique" % (k, name, id_of[name]))
        id_of[name] = k
        if len(spec) == 3 and not isinstance(spec[2], dict):
            raise ValueError(
                "ops[%d] (%r): facts must be a dict such as {'outputs': "
                "[1024]}; got %r" % (k, name, spec[2]))
        facts = dict(spec[2]) if len(spec) == 3 else {}
        unknown = sorted(set(facts) - set(_LITERAL_FACTS))
        if unknown:
            raise ValueError(
                "ops[%d] (%r): unknown fact %r; the facts are %s"
                % (k, name, unknown[0], ", ".join(sorted(_LITERAL_FACTS))))
        specs.append((name, spec[1], dict(_LITERAL_FACTS, **facts)))
    return specs, id_of


def _literal_edges(edges, id_of, num_ops):
    """`from_edges`' `edges` -> per op its inputs ``[(producer, output)]``
    in slot order, and per op how many outputs the edges read."""
    inputs = [[] for _ in range(num_ops)]
    read = [0] * num_ops  # outputs each op must have
    for k, edge in enumerate(edges):
        if not isinstance(edge, (tuple, list)) or len(edge) != 2:
            raise ValueError("edges[%d] must be a (tensor, consumer) pair "
                             "such as ('a:0', 'b'); got %r" % (k, edge))
        producer, out = _literal_tensor(edge[0], id_of, "edges[%d]" % k)
        consumer = _literal_op_id(edge[1], id_of, "edges[%d]" % k)
        inputs[consumer].append((producer, out))
        read[producer] = max(read[producer], out + 1)
    return inputs, read


def _literal_control_edges(control_edges, id_of, num_ops):
    """`from_edges`' `control_edges` -> per op the set of its control
    inputs."""
    control_inputs = [set() for _ in range(num_ops)]
    for k, edge in enumerate(control_edges):
        if not isinstance(edge, (tuple, list)) or len(edge) != 2:
            raise ValueError("control_edges[%d] must be a (from_op, to_op) "
                             "pair of names; got %r" % (k, edge))
        a = _literal_op_id(edge[0], id_of, "control_edges[%d]" % k)
        b = _literal_op_id(edge[1], id_of, "control_edges[%d]" % k)
        control_inputs[b].add(a)
    return control_inputs


def _check_literal_flags(facts, where):
    for flag in _BOOL_FACTS:
        if not isinstance(facts[flag], bool):
            raise ValueError("%s: %s must be True or False; got %r"
                             % (where, flag, facts[flag]))
    if facts["bn_is_training"] not in (None, True, False):
        raise ValueError("%s: bn_is_training must be None, True or "
                         "False; got %r" % (where, facts["bn_is_training"]))


def _literal_variable_bytes(variable_bytes, where):
    if (not isinstance(variable_bytes, numbers.Integral)
            or isinstance(variable_bytes, bool) or variable_bytes < 0):
        raise ValueError("%s: variable_bytes must be an int >= 0; got %r"
                         % (where, variable_bytes))
    return int(variable_bytes)


def _literal_device(device, default_device, where):
    if device is None:
        device = default_device
    if not isinstance(device, str):
        raise ValueError("%s: device must be a string such as "
                         "'/device:GPU:0' ('' for unplaced); got %r"
                         % (where, device))
    try:
        parse_device(device)
    except ValueError as e:
        raise ValueError("%s: %s" % (where, e)) from None
    return device


def _literal_slot(slot, num_inputs, where):
    if slot is None:
        return None
    if (not isinstance(slot, numbers.Integral) or isinstance(slot, bool)
            or not 0 <= slot < num_inputs):
        raise ValueError("%s: forwards_input must be None or an input slot "
                         "below %d; got %r" % (where, num_inputs, slot))
    return int(slot)


def _literal_flops(flops, where):
    """`from_edges`' ``flops`` fact -> ``(fixed, per_example)``."""
    def count(v):
        return (isinstance(v, numbers.Integral) and not isinstance(v, bool)
                and v >= 0)
    if count(flops):
        return (int(flops), 0)
    if isinstance(flops, (tuple, list)) and len(flops) == 2 and all(
            count(v) for v in flops):
        return (int(flops[0]), int(flops[1]))
    raise ValueError(
        "%s: flops must be an int >= 0 or a (fixed, per_example) pair of "
        "ints >= 0 such as (0, 2048); got %r" % (where, flops))


def _literal_op_id(name, id_of, where):
    op_id = id_of.get(name) if isinstance(name, str) else None
    if op_id is None:
        raise ValueError("%s: no op named %r; edges name ops of `ops`"
                         % (where, name))
    return op_id


def _literal_tensor(tensor, id_of, where):
    """``'op'`` or ``'op:k'`` -> (op id, k)."""
    if isinstance(tensor, str) and tensor not in id_of and ":" in tensor:
        name, _, out = tensor.rpartition(":")
        if not out.isdigit():
            raise ValueError(
                "%s: tensor %r must be 'op' or 'op:k' with k an int >= 0"
                % (where, tensor))
        return _literal_op_id(name, id_of, where), int(out)
    return _literal_op_id(tensor, id_of, where), 0


def _literal_outputs(outputs, read, where):
    """`from_edges`' ``outputs`` fact -> (output shapes, item sizes)."""
    if outputs is None:
        count = max(1, read)
        return (None,) * count, (0,) * count
    if isinstance(outputs, (str, bytes)) or not hasattr(outputs, "__iter__"):
        raise ValueError("%s: outputs must be a list with one entry per "
                         "output, e.g. [1024]; got %r" % (where, outputs))
    outputs = list(outputs)
    if len(outputs) < read:
        raise ValueError(
            "%s: the edges read output %d but outputs lists %d; list one "
            "entry per output" % (where, read - 1, len(outputs)))
    shapes, itemsizes = [], []
    for k, entry in enumerate(outputs):
        if isinstance(entry, numbers.Integral) and not isinstance(
                entry, bool) and entry >= 0:
            shapes.append((1, int(entry)))
            itemsizes.append(1)
            continue
        if (isinstance(entry, (tuple, list)) and len(entry) == 2
                and _is_literal_shape(entry[0])
                and isinstance(entry[1], numbers.Integral)
                and not isinstance(entry[1], bool) and entry[1] >= 0):
            shape = None if entry[0] is None else tuple(entry[0])
            shapes.append(shape)
            itemsizes.append(int(entry[1]))
            continue
        raise ValueError(
            "%s: outputs[%d] must be a byte count (int >= 0) or a (shape, "
            "itemsize) pair such as ((None, 128), 4); got %r"
            % (where, k, entry))
    return tuple(shapes), tuple(itemsizes)


def _is_literal_shape(shape):
    if shape is None:
        return True
    return isinstance(shape, (tuple, list)) and all(
        d is None or (isinstance(d, numbers.Integral)
                      and not isinstance(d, bool) and d >= 0)
        for d in shape)
