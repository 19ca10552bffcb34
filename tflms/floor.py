"""The floor: device memory no plan can bring one step below.

Swapping and recomputing move a tensor off the device between its uses,
never while an op reads or writes it. So for every op that computes, its
inputs and its outputs are on the device at once, on top of what stays
there for the whole step (variables, optimizer slots, constants: the
simulator's resident bytes). The largest such sum over the step's device
ops is a lower bound of the peak of every plan the simulator replays
(swap-ins bring a copy of the same size, a recompute's clone makes an
output of the same size), and the op that sets it is what to look at when
nothing fits: a smaller batch, a larger GPU or a different model.

What is counted, per op:

* its inputs: the distinct device buffers it reads (a tensor read through
  two slots, or two aliases of one buffer, once), device copies of host
  tensors included;
* its outputs: the device buffers it makes. An element-wise op that may
  write its output into an input's buffer (`tflms.inplace`: an input of
  the output's size and element size, read through one slot) is given the
  benefit of the doubt: its output counts as that input's buffer whatever
  the levels, because a plan may let it do so (control edges, or a
  swap-in of the input that it alone reads, which the simulator lets it
  write over: a softmax gradient's ``g * y``);
* nothing for kernel scratch space (cuDNN workspaces), which the
  simulator does not model either.

Ops that only hand a buffer on (`Identity`, `IdentityN`, `Reshape`, v1
control flow, `x * 1.0`: the simulator's aliases) compute nothing and
never set the floor: Keras' optimizers pass every gradient through one
`IdentityN`, which reads them all, but no kernel needs them together
there. Ops that only initialize variables do not run in a step.

Pure: reads a `simulator.SimulationModel` (its index, roles and buffers).
"""

import dataclasses

from tflms import simulator
from tflms.inplace import inplace_candidates
from tflms.simulator import buffers as buffers_mod

__all__ = ["StepFloor", "step_floor", "floor_of", "forwards_only"]

_GIB = float(1 << 30)
_MIB = float(1 << 20)


@dataclasses.dataclass(frozen=True)
class StepFloor:
    """The floor of one step (`step_floor`).

    Attributes:
      floor_bytes: device bytes no plan goes below: ``resident_bytes +
        input_bytes + output_bytes``.
      resident_bytes: variables, optimizer slots and constants on the
        device for the whole step.
      op_name, op_type: the op that sets the floor ("" when the step has
        no device op that computes).
      input_bytes, output_bytes: its inputs' and outputs' device bytes.
    """

    floor_bytes: int
    resident_bytes: int
    op_name: str = ""
    op_type: str = ""
    input_bytes: int = 0
    output_bytes: int = 0

    def describe(self):
        """One sentence: the floor, the op and what stays resident."""
        return "%s: %s" % (_size(self.floor_bytes), self.reason())

    def reason(self):
        """Why the floor is where it is: the op and what stays resident."""
        if not self.op_name:
            return "the variables and constants that stay on the device"
        resident = ""
        if self.resident_bytes:
            resident = (", plus %s of variables, optimizer slots and "
                        "constants that stay there"
                        % _size(self.resident_bytes))
        return ("%s (%s) needs its inputs (%s) and outputs (%s) on the "
                "device at once%s; kernel workspace not counted"
                % (self.op_name, self.op_type, _size(self.input_bytes),
                   _size(self.output_bytes), resident))

    def as_dict(self):
        return dataclasses.asdict(self)


def _size(nbytes):
    if abs(nbytes) < 1024:
        return "%d bytes" % nbytes
    if abs(nbytes) < _MIB:
        return "%.1f KiB" % (nbytes / 1024.0)
    if abs(nbytes) < _GIB:
        return "%.1f MiB" % (nbytes / _MIB)
    return "%.3f GiB" % (nbytes / _GIB)


def forwards_only(index, op):
    """True if `op` hands an input's buffer on as its output 0 and
    computes nothing (the simulator's aliases)."""
    inputs = index.inputs[op]
    if not inputs:
        return False
    slot = buffers_mod.alias_slot(index.types[op], 0, inputs, (),
                                  index.forwards_input[op])
    return slot is not None


def step_floor(model):
    """The `StepFloor` of the step `model` replays.

    Args:
      model: a `simulator.SimulationModel` (of the step as given, or of a
        planning index: the floor is the same, as control edges change no
        buffer the floor counts).

    Returns:
      A `StepFloor`.
    """
    index, roles = model.index, model.roles
    buf_bytes = model.buf_bytes
    on_device = model.buf_space == buffers_mod.DEVICE
    reads = {}
    for b, op in zip(model.use_buf.tolist(), model.use_node.tolist()):
        if on_device[b]:
            reads.setdefault(op, set()).add(b)
    skipped = roles.inactive | model.initializer_ops
    best = (0, -1, 0, 0)  # (bytes, op, inputs, outputs)
    for op in sorted(roles.device_ops - skipped):
        if forwards_only(index, op):
            continue
        read = reads.get(op, set())
        inputs = int(buf_bytes[list(read)].sum()) if read else 0
        outputs = 0
        for k in range(len(index.output_shapes[op])):
            b = model.buffer_of(op, k)
            if b < 0 or not on_device[b] or b in read:
                continue
            if k == 0 and _may_write_in_place(model, op):
                continue
            outputs += int(buf_bytes[b])
        if inputs + outputs > best[0]:
            best = (inputs + outputs, op, inputs, outputs)
    resident = int(model.resident_device_bytes)
    total, op, inputs, outputs = best
    if op < 0:
        return StepFloor(floor_bytes=resident, resident_bytes=resident)
    return StepFloor(floor_bytes=resident + total, resident_bytes=resident,
                     op_name=index.names[op], op_type=index.types[op],
                     input_bytes=inputs, output_bytes=outputs)


def floor_of(index, roles, batch_size=None):
    """The `StepFloor` of `index` (with its `OpRoles` and batch size),
    through a `SimulationModel` made for it."""
    return step_floor(simulator.SimulationModel(index, roles, batch_size))


def _may_write_in_place(model, op):
    """True if `op` may write its output 0 into an input's device buffer
    under some order of the step's ops (`tflms.inplace`): a candidate
    input of the output's bytes and element size, read through one
    slot."""
    index = model.index
    inputs = index.inputs[op]
    slots = inplace_candidates(index.types[op], len(inputs))
    if not slots:
        return False
    size = model.tensor_size(op, 0)
    itemsize = index.output_itemsizes[op][0]
    for slot in slots:
        p, pk = inputs[slot]
        b = model.buffer_of(p, pk)
        if (b >= 0 and model.buf_space[b] == buffers_mod.DEVICE
                and model.tensor_size(p, pk) == size
                and index.output_itemsizes[p][pk] == itemsize
                and inputs.count((p, pk)) == 1):
            return True
    return False

