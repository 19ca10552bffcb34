"""The ops that only initialize variables, and those initialization reads.

They run once, in the initializer's own `Session.run`, not in a training
step: the simulator and the step-time model leave them out, and LMS's
serialization edges never make them wait on a training op. Pure, like
`tflms.analysis`: every function takes a `GraphIndex`.
"""

__all__ = ["initializer_seeds", "initializer_only_ops", "initializer_inputs"]


# The assignments that initialize a variable (`<variable>/Assign`).
_INITIALIZER_ASSIGN_TYPES = frozenset({"Assign", "AssignVariableOp"})


def initializer_seeds(index):
    """Ops that initialize variables: ops under an ``/Initializer/`` scope
    and the ``<variable>/Assign`` ops."""
    return frozenset(
        i for i, name in enumerate(index.names)
        if "/Initializer/" in name
        or (index.types[i] in _INITIALIZER_ASSIGN_TYPES
            and name.endswith("/Assign")))


def initializer_only_ops(index):
    """Ops that only serve variable initialization.

    They run once, in the initializer's own `Session.run`, not in training
    steps. An op joins the initializer seeds when every op it feeds (data
    or control) has joined.
    """
    found = set(initializer_seeds(index))
    for level_ops in reversed(index.ops_by_level):
        for i in level_ops:
            if i in found:
                continue
            succ = index.successors(i)
            if succ and all(c in found for c in succ):
                found.add(i)
    return frozenset(found)


def initializer_inputs(index):
    """The initializer seeds and everything they read, directly or not.

    Unlike `initializer_only_ops` this includes ops that training reads
    too: none of them may wait on a training op, or initialization would
    need the training inputs.
    """
    seen = set(initializer_seeds(index))
    stack = list(seen)
    while stack:
        v = stack.pop()
        for p in index.predecessors(v):
            if p not in seen:
                seen.add(p)
                stack.append(p)
    return frozenset(seen)
