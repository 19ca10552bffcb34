"""Optimizer state on the host (``offload_optimizer``): which updates move
there, and the step as the planner sees it once they have.

Every plan keeps the variables and the optimizer's slots on the device for
the whole step (`tflms.floor`'s resident bytes). With ``offload_optimizer``
each trainable variable whose update is one fused kernel of
`APPLY_INPUTS` (``ResourceApplyAdam``, ``ResourceApplyMomentum``...) has
that update and its slots moved to the host (``cpu_device``): the
gradient goes out once it is made, the update runs where the slots live,
on a host copy of the weights, and the new weights are written back to
the device variable (`tflms.tf.offload_rewrite` makes the ops). A
variable updated by element-wise ops instead (a Keras 3 optimizer in a
traced step: `tflms.offload_elementwise`) has its slots and those ops
moved; the write of its new value stays on the device and reads the value
the host computed.

The host is ``cpu_device``; every other device the step computes on is
managed, a logical ``/cpu:1`` included, so an update placed anywhere but
on the host is offloaded.

`find_updates` reads the updates from a `GraphIndex` and `planning_index`
gives the index the planner plans on: the slots and updates placed on the
host, each update holding the host copy of its weights. The simulator then
counts the slots and copies in host memory and the floor without them,
with no code of its own for offloading. `planning_step` does both and
sets the target's ``offload``, as every caller plans the step. Pure: no
TensorFlow.
"""

import dataclasses

from tflms import devices
from tflms import graph_index as gi
from tflms import offload_elementwise
from tflms.errors import LMSError

__all__ = ["APPLY_INPUTS", "Update", "Offload", "OffloadUnsupportedError",
           "find_updates", "planning_index", "planning_step",
           "write_back_buffers"]

# Fused update kernels: op type -> (input slots of the optimizer's slots,
# input slot of the gradient), in the order of their op definitions (input
# 0 is the variable; tests/test_offload.py checks every entry against
# TensorFlow's registry).
APPLY_INPUTS = {
    "ResourceApplyMomentum": ((1,), 3),
    "ResourceApplyKerasMomentum": ((1,), 3),
    "ResourceApplyAdam": ((1, 2), 9),
    "ResourceApplyAdamWithAmsgrad": ((1, 2, 3), 10),
    "ResourceApplyAdaMax": ((1, 2), 8),
    "ResourceApplyRMSProp": ((1, 2), 7),
    "ResourceApplyCenteredRMSProp": ((1, 2, 3), 8),
    "ResourceApplyAdagrad": ((1,), 3),
    "ResourceApplyAdagradV2": ((1,), 4),
    "ResourceApplyAdadelta": ((1, 2), 6),
    "ResourceApplyFtrl": ((1, 2), 3),
    "ResourceApplyFtrlV2": ((1, 2), 3),
}

# Ops that hold a resource variable (the variable and each slot must be
# one, so the rewriter can place it).
_HANDLE_TYPES = frozenset({"VarHandleOp"})


class OffloadUnsupportedError(LMSError, ValueError):
    """``offload_optimizer`` asked of a step LMS cannot offload (yet)."""


@dataclasses.dataclass(frozen=True)
class Update:
    """One variable's update, to run on the host (op ids of the index).

    Attributes:
      apply: the fused update op; for an element-wise update, the op that
        writes the variable's new value (it stays on the device and reads
        the value the host computed).
      variable: the variable's handle op (stays on the device).
      slots: the handle ops of its optimizer slots (moved to the host).
      gradient: ``(producer, output)`` of the gradient it reads.
      host_ops: an element-wise update's ops that run on the host (the
        slots' reads and writes, the arithmetic:
        `offload_elementwise`); empty for a fused kernel.
      reads_weights: whether the host needs the variable's weights: a
        fused kernel's host copy, or an element-wise update that reads
        the variable.
    """

    apply: int
    variable: int
    slots: tuple
    gradient: tuple
    host_ops: tuple = ()
    reads_weights: bool = True

    @property
    def fused(self):
        """True for one fused kernel (`APPLY_INPUTS`)."""
        return not self.host_ops

    @property
    def moved_ops(self):
        """The ops that run on the host: the fused kernel, or the
        element-wise update's `host_ops`."""
        return (self.apply,) if self.fused else self.host_ops


@dataclasses.dataclass(frozen=True)
class Offload:
    """The updates `find_updates` found, and what moving them costs.

    Attributes:
      host: the device they run on (``cpu_device``).
      updates: `Update` per offloaded variable, in op id order.
      slot_bytes: bytes of their slots, now in host memory.
      weight_bytes: bytes of their variables: the new weights each
        update writes back to the device per step (and the host copies the
        fused updates work on).
      gradient_bytes: bytes of the gradients copied to the host per step
        (None where a gradient's size is unknown).
      left: update ops of managed variables that stay on the device (a
        sparse or unfused update, by name; an element-wise update LMS
        cannot tell apart, the variable's name and why), for the log.
      weights_out_bytes: bytes of the weights copied to the host per step:
        those of the updates that read them (`Update.reads_weights`);
        None (the default): `weight_bytes`, every update's.
    """

    host: str
    updates: tuple
    slot_bytes: int
    weight_bytes: int
    gradient_bytes: object
    left: tuple = ()
    weights_out_bytes: object = None

    def __post_init__(self):
        if self.weights_out_bytes is None:
            object.__setattr__(self, "weights_out_bytes", self.weight_bytes)

    def moved_bytes(self):
        """Bytes crossing the link per step: gradients out, weights out
        (`weights_out_bytes`) and the new weights back in (None if a
        gradient's size is unknown)."""
        if self.gradient_bytes is None:
            return None
        return (self.gradient_bytes + self.weights_out_bytes
                + self.weight_bytes)

    def link_seconds(self, link):
        """Seconds the offload's copies take per step at least on `link`
        (a `hardware.Interconnect`): gradients and weights out, weights
        back, the two directions at once; None if a size is unknown."""
        if self.gradient_bytes is None:
            return None
        out = ((self.gradient_bytes + self.weights_out_bytes)
               / link.d2h_bytes_per_s)
        back = self.weight_bytes / link.h2d_bytes_per_s
        return max(out, back)

    def describe(self):
        """One log line: what moved and what it costs per step."""
        mib = float(1 << 20)
        moved = self.moved_bytes()
        return (
            "Optimizer offload: the updates of %d variables and their %d "
            "slots (%.1f MiB) run on %s; per step %s cross the link "
            "(gradients out, %s)%s" % (
                len(self.updates), sum(len(u.slots) for u in self.updates),
                self.slot_bytes / mib, self.host,
                "an unknown size" if moved is None
                else "%.1f MiB" % (moved / mib),
                "weights out and back"
                if self.weights_out_bytes == self.weight_bytes
                else "%.1f MiB of weights out, new weights back"
                % (self.weights_out_bytes / mib),
                "" if not self.left else
                "; %d updates stay on the device (not an update LMS "
                "can move: %s)" % (len(self.left),
                                   ", ".join(self.left[:3]))))


def _on_host(device, host):
    return devices.same_device(device, host)


def _ref_type(op_type):
    """The fused kernel of reference variables (``ApplyAdam``), whose
    slots LMS cannot place apart from the variable."""
    return "Resource" + op_type in APPLY_INPUTS


def find_updates(index, host, managed=None):
    """The `Offload` of the step in `index`, with `host` as the host:
    the fused updates of `APPLY_INPUTS`, then the element-wise updates of
    the other trainable variables (`offload_elementwise.find_elementwise`),
    in the order of their `Update.apply`.

    `managed`: ``managed(device string) -> bool``, the devices whose
    variables' updates move (`target.Target.manages`);
    default: every device but the host.

    Raises:
      OffloadUnsupportedError: when the step updates a reference variable
        (``tf.compat.v1.disable_resource_variables``) with an optimizer's
        fused kernel: its slots cannot leave the variable's device.
    """
    if managed is None:
        def managed(device):
            return not _on_host(device, host)
    updates, left = [], []
    for op in range(index.num_ops):
        op_type = index.types[op]
        if _ref_type(op_type) and not _on_host(index.devices[op], host):
            raise OffloadUnsupportedError(
                "offload_optimizer=True cannot move the update %r (%s): it "
                "updates a reference variable, whose slots TensorFlow keeps "
                "on the variable's device. Use resource variables (do not "
                "call tf.compat.v1.disable_resource_variables() or "
                "disable_v2_behavior()), or set offload_optimizer=False"
                % (index.names[op], op_type))
        if op_type not in APPLY_INPUTS or _on_host(index.devices[op], host):
            continue
        slots, grad = APPLY_INPUTS[op_type]
        inputs = index.inputs[op]
        handles = [inputs[0][0]] + [inputs[s][0] for s in slots]
        if not (managed(index.devices[handles[0]])
                and managed(index.devices[op])):
            continue  # not a variable of a managed device's
        if any(index.types[h] not in _HANDLE_TYPES for h in handles):
            left.append(index.names[op])
            continue
        updates.append(Update(apply=op, variable=handles[0],
                              slots=tuple(handles[1:]),
                              gradient=tuple(inputs[grad])))
    # Variables a kernel updates (fused, left or sparse) are not looked at
    # again for an element-wise update.
    skip = set()
    for op in range(index.num_ops):
        op_type = index.types[op]
        if op_type in APPLY_INPUTS or op_type.startswith(
                "ResourceSparseApply"):
            skip.add(index.inputs[op][0][0])
        if (op_type.startswith("ResourceSparseApply")
                and not _on_host(index.devices[op], host)):
            left.append(index.names[op])
    found, unclear = offload_elementwise.find_elementwise(index, managed,
                                                          skip)
    updates.extend(Update(**dataclasses.asdict(f)) for f in found)
    updates.sort(key=lambda u: u.apply)
    left.extend(unclear)
    gradient_bytes = 0
    for u in updates:
        nbytes = gi.tensor_bytes(index, *u.gradient)
        if nbytes is None:
            gradient_bytes = None
            break
        gradient_bytes += nbytes
    return Offload(
        host=host, updates=tuple(updates),
        slot_bytes=sum(index.variable_bytes[s] for u in updates
                       for s in u.slots),
        weight_bytes=sum(index.variable_bytes[u.variable] for u in updates),
        gradient_bytes=gradient_bytes, left=tuple(left),
        weights_out_bytes=sum(index.variable_bytes[u.variable]
                              for u in updates if u.reads_weights))


def planning_index(index, offload):
    """`index` as the planner sees it after `offload`: the slots' handles
    and the updates' `Update.moved_ops` placed on the host, each fused
    update holding the bytes of the host copy of its weights
    (`variable_bytes`; an element-wise update has no host copy: the
    weights it reads arrive as a tensor), so the simulator counts them in
    host memory and the floor leaves them out. An element-wise update's
    write of the variable stays on the device."""
    if not offload.updates:
        return index
    placed = list(index.devices)
    held = list(index.variable_bytes)
    for u in offload.updates:
        for op in u.moved_ops:
            placed[op] = offload.host
        if u.fused:
            held[u.apply] = index.variable_bytes[u.variable]
        for s in u.slots:
            placed[s] = offload.host
    return dataclasses.replace(index, devices=tuple(placed),
                               variable_bytes=tuple(held))


def planning_step(index, target, host, managed=None):
    """The step in `index` as the planner sees it with its updates on
    `host`: ``(planning index, target, offload)``, where `offload` is the
    `Offload` `find_updates` finds (`host` and `managed` as there), the
    planning index is `planning_index`'s with it, and `target` (a
    `target.Target`) has it as its ``offload``.

    Raises:
      OffloadUnsupportedError: as `find_updates`.
    """
    found = find_updates(index, host, managed)
    return (planning_index(index, found), target.replace(offload=found),
            found)


def write_back_buffers(offload, index):
    """The device buffer each update of `offload` adds: its new weights,
    copied from the host, land in a buffer of the variable's size before
    the write-back puts them in the variable (whose own buffer is there
    all along). ``(update op, bytes, name)`` per update, for
    `simulator.SimulationModel`'s ``landings``: counted at the update's
    level, where the planning index has the update and the write-back
    that follows it (`planning_index` has no op of its own for it).
    None of them without `offload`."""
    if offload is None:
        return ()
    return tuple(
        (u.apply, index.variable_bytes[u.variable],
         "%s (new weights from the host)" % index.names[u.variable])
        for u in offload.updates)
