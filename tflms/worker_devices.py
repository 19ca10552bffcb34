"""Where one worker of a multi-worker job computes, and where its swap ops
go. Standard library only.

In one process LMS manages every op not placed on the host, ``cpu_device``
(``'/cpu:0'``), where its swap ops go (`target.Target.manages`; unplaced
ops included: TensorFlow puts them on the GPU, or on the only CPU of a
machine without one). Under
`tf.distribute.MultiWorkerMirroredStrategy` the strategy places each
replica's ops on the worker's replica device by its full name,
``/job:worker/replica:0/task:N/device:GPU:0``, or on a machine without an
accelerator ``/job:worker/replica:0/task:N/device:CPU:0``. Read with the
single-process rule, the second is "the host", and LMS would plan nothing.
So for a worker, the replica devices the strategy names are what LMS
manages, CPUs among them too (`compute_cpus`), compared by full name
(job, replica, task, type and index): a CPU op of another task, or one the
user pinned with a bare ``'/cpu:0'``, is not one of them. The swap ops go
to the worker's own host CPU (`host`): ``cpu_device``'s type and index under
the worker's job, replica and task, never a bare ``'/cpu:0'`` that could
name the CPU of another task.
"""

import dataclasses

from tflms import devices

__all__ = ["WorkerDevices", "for_worker", "full_key"]


def full_key(device):
    """(job, replica, task, device type, device index) of a device string;
    the index of a type given without one counts as 0."""
    spec = devices.parse_device(device)
    return (spec.job, spec.replica, spec.task, spec.device_type,
            spec.device_index or 0)


@dataclasses.dataclass(frozen=True)
class WorkerDevices:
    """One worker's devices, as LMS plans for them.

    Attributes:
      task: the worker's task, ``'/job:worker/replica:0/task:1'``.
      task_index: its index among the job's workers (for messages).
      replica_devices: the full names of the devices the strategy runs
        this worker's replicas on.
      compute_cpus: those of them that are CPUs (a worker without an
        accelerator): LMS manages their ops as it manages a GPU's.
      host: the full name of the worker's host CPU, where the swap ops go.
    """

    task: str
    task_index: int
    replica_devices: tuple
    compute_cpus: tuple
    host: str

    def computes_on(self, device):
        """True if `device` is one of `compute_cpus` (full names
        compared)."""
        if not device or not self.compute_cpus:
            return False
        key = full_key(device)
        return any(key == full_key(c) for c in self.compute_cpus)

    def describe(self):
        """A line for the log: what LMS manages on this worker and where
        the swap ops go."""
        if self.compute_cpus:
            managed = ("its CPU %s (the worker has no accelerator, so its "
                       "replica computes there, as unplaced ops do on a "
                       "machine without a GPU)" % ", ".join(self.compute_cpus))
        else:
            managed = "its replica devices %s" % ", ".join(
                self.replica_devices)
        return ("Worker %d (%s) of a multi-worker strategy: LMS plans for %s; "
                "swap operations go to %s" % (self.task_index, self.task,
                                              managed, self.host))


def for_worker(replica_devices, cpu_device):
    """The `WorkerDevices` of a worker whose strategy runs its replicas on
    `replica_devices` (full names, all of one task), with the swap ops'
    device type and index from the `cpu_device` setting.

    Raises:
      ValueError: if `replica_devices` is empty, or its devices do not all
        name the same job, replica and task in full.
    """
    replica_devices = tuple(replica_devices)
    if not replica_devices:
        raise ValueError("replica_devices must name at least one device; "
                         "got none")
    tasks = {full_key(d)[:3] for d in replica_devices}
    if len(tasks) != 1 or None in next(iter(tasks)):
        raise ValueError(
            "replica_devices must be full names of one worker's devices, "
            "such as '/job:worker/replica:0/task:1/device:CPU:0'; got %r"
            % (replica_devices,))
    job, replica, task = next(iter(tasks))
    host_spec = devices.parse_device(cpu_device)
    prefix = "/job:%s/replica:%d/task:%d" % (job, replica, task)
    return WorkerDevices(
        task=prefix, task_index=task, replica_devices=replica_devices,
        compute_cpus=tuple(d for d in replica_devices
                           if devices.is_cpu_device(d)),
        host="%s/device:CPU:%d" % (prefix, host_spec.device_index or 0))
