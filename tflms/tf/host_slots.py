"""Keras 3 optimizer slots moved to the host, for ``offload_optimizer``
on a `tf.function` step (Keras 3 ``fit``, ``lms.function``).

A Keras 3 optimizer makes its slots (Adam's moments, momentum...) when
it is built, before the step is traced, on whatever device the program
was on. Inside the traced step each slot is a captured resource handle,
and TensorFlow places every op that reads or writes a resource where the
resource lives: LMS cannot place them by editing the graph, as it does in
a Session graph. So the slots themselves move: each Keras variable found
to be a slot is given a new `tf.Variable` on the host (``cpu_device``)
holding its value, under its own name, and the step is traced again so
that it captures the new one. The Keras variable object stays the one
the optimizer and the user's checkpoints know: only the `tf.Variable`
behind it (``_value``, which Keras 3's TensorFlow backend reads for every
use, checkpoints included) changes, so a checkpoint written with offload
restores without it and the other way round.

This module changes Python objects (the optimizer's variables), never a
graph: `tflms.tf.offload_rewrite` edits the step.
"""

import tensorflow as tf

from tflms import devices
from tflms import offload as offload_rules

__all__ = ["keras_variables_of", "move_to_host", "on_host"]


def on_host(variable, host):
    """True if the `tf.Variable` `variable` lives on `host`."""
    return devices.same_device(variable.device, host)


def keras_variables_of(optimizer, variables):
    """The Keras variables of `optimizer` behind the `tf.Variable`s
    `variables`, in their order.

    Raises:
      OffloadUnsupportedError: a variable the optimizer does not hold (a
        slot made by other code than a Keras 3 optimizer's).
    """
    owners = {}
    for kv in getattr(optimizer, "variables", ()):
        inner = getattr(kv, "_value", None)
        if inner is not None:
            owners[id(inner)] = kv
    found = []
    for v in variables:
        kv = owners.get(id(v))
        if kv is None:
            raise offload_rules.OffloadUnsupportedError(
                "offload_optimizer=True: the slot %r the step updates is not "
                "a variable of the optimizer %r given to LMS, so LMS cannot "
                "move it to the host. Pass the Keras 3 optimizer that makes "
                "the step's updates (lms.function(step, optimizer=...)), or "
                "set offload_optimizer=False"
                % (v.name, type(optimizer).__name__))
        found.append(kv)
    return found


def move_to_host(keras_variables, host):
    """Give each Keras variable a `tf.Variable` on `host` holding its
    value (module docstring). Returns their paths."""
    moved = []
    for kv in keras_variables:
        old = kv._value
        if on_host(old, host):
            continue
        with tf.init_scope(), tf.device(host):
            # Same name, dtype and value; an optimizer's slot is never
            # trained.
            kv._value = tf.Variable(
                old.read_value(), name=old.name.split(":")[0],
                trainable=old.trainable, dtype=old.dtype,
                aggregation=old.aggregation,
                synchronization=old.synchronization)
        moved.append(getattr(kv, "path", kv.name))
    return moved
