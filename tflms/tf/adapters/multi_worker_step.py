"""The entry point of a step on one worker of a
`MultiWorkerMirroredStrategy`: `MultiWorkerStep`.

A custom loop under that strategy gives ``lms.function`` the tf.function
that calls ``strategy.run``; each worker traces it into a function graph
that holds its own replicas. LMS manages this worker's replica devices
(its CPUs too, on a worker without an accelerator) and puts the swap ops
on the worker's own host (`worker_devices.WorkerDevices`). Every worker
must make the same rewrite, or the collectives of the first step would
wait for ever: right after the rewrite, the workers compare theirs
(`multi_worker.check_workers_agree`) and raise together if they differ.
"""

from tflms.tf import multi_worker
from tflms.tf.adapters.tf_function import FunctionStep

__all__ = ["MultiWorkerStep"]


class MultiWorkerStep(FunctionStep):
    """The function graph of a step on one worker of a multi-worker
    strategy (see the module docstring); `target` as `FunctionStep` takes
    it, planned with this worker's devices."""

    # Each worker's slots are the strategy's variables: not moved yet.
    offload_supported = False
    offload_instead = (
        "keep the step's optimizer state on the device "
        "(offload_optimizer=False): a multi-worker strategy's step cannot "
        "offload it yet")

    @classmethod
    def accepts(cls, graph):
        if not FunctionStep.accepts(graph):
            return False
        strategy = multi_worker.strategy_of(graph)
        return strategy is not None and multi_worker.is_multi_worker(strategy)

    def __init__(self, graph, settings, log, fetches=None, target=None):
        super().__init__(graph, settings, log, fetches, target)
        self._strategy, self._worker = multi_worker.worker_of(
            graph, settings.cpu_device)

    def worker(self):
        return self._worker

    def rewrite(self, start=None):
        result = super().rewrite(start)
        multi_worker.check_workers_agree(self._strategy, self._worker,
                                         self.graph, result)
        return result
