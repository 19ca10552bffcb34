"""Helpers shared by the distributed job scripts."""

from tflms import analysis
from tflms import graph_index as gi


def collective_contacts(graph, result):
    """(number of collective ops, swap ops wired to one of them).

    A swap op is wired to a collective when it reads one's output, feeds
    one, or has one as a control input (a swap-in trigger). LMS must never
    do any of these.
    """
    index = gi.build_index(graph)
    collectives = {index.names[i] for i in analysis.collective_ops(index)}
    contacts = []
    names = () if result is None else (
        tuple(result.swapout_ops) + tuple(result.swapin_ops))
    for name in names:
        op = graph.get_operation_by_name(name)
        touched = [t.op.name for t in op.inputs]
        touched += [c.name for c in op.control_inputs]
        touched += [c.name for t in op.outputs for c in t.consumers()]
        contacts += ["%s <-> %s" % (name, t) for t in touched
                     if t in collectives]
    return len(collectives), contacts
