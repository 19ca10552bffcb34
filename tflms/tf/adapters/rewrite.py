"""The two ways down from `LMS` to a rewritten graph, and the one record of
what was rewritten.

* `rewrite_session_graph(graph, settings, log, fetches)`: a graph-mode
  `tf.Graph` (``lms.run(graph)``, the Estimator hook, Keras 2's graph,
  `tflms plan` of a saved graph), served by the first of
  `SESSION_ADAPTERS` that accepts it (`session.SessionGraph`).
* `rewrite_function_graph(graph, settings, log, target)`: a function
  graph (``lms.function``, Keras 3's train step, `tflms plan` of a Keras 3
  model), served by the first of `FUNCTION_ADAPTERS` that accepts it.

Both take what planning needs (the settings, a `Logger`, the target when
the caller decides it) and nothing of `LMS`; they plan with Python's
cyclic garbage collector paused (`tflms._gc`). Callers that plan without
rewriting (the capacity search, `tflms plan`'s report when nothing fits)
read the step through the same adapters: `session_graph_step` and
`function_graph_step` give the `(index, target)` each rewrite plans.

`Rewrites` is the one owner of "already rewritten" for an `LMS` object:
the graph it planned before gets the same answer (`earlier`), and only a
rewrite made by the latest call is new (`is_new`: a Keras session is
renewed for it). A graph that already holds LMS's swap ops for these
devices, rewritten by another object or saved after a rewrite, says so
itself (`rewriter.is_rewritten`, asked by `graph_step.plan_and_rewrite`).
"""

import time

from tflms import _gc
from tflms._logging import Logger
from tflms.tf import distributed
from tflms.tf import keras2_session
from tflms.tf.adapters import multi_worker_step
from tflms.tf.adapters import session
from tflms.tf.adapters import tf_function

__all__ = ["rewrite_session_graph", "rewrite_function_graph",
           "session_graph_step", "function_graph_step",
           "SESSION_ADAPTERS", "FUNCTION_ADAPTERS", "Rewrites",
           "logger_of"]

# The adapters of each route, asked in this order (a subclass before the
# adapter it specialises); adapters.GRAPH_ADAPTERS is both.
SESSION_ADAPTERS = (
    # A graph-mode tf.Graph: run(graph), the Estimator hook, Keras 2.
    session.SessionGraph,
)
FUNCTION_ADAPTERS = (
    # A step on one worker of a MultiWorkerMirroredStrategy.
    multi_worker_step.MultiWorkerStep,
    # A tf.function's graph (lms.function, Keras 3's train step); a
    # strategy's replicas in it are planned device by device.
    tf_function.FunctionStep,
)


def logger_of(settings):
    """The `Logger` of `settings` (``debug``, ``debug_level``)."""
    return Logger(settings.debug, settings.debug_level)


def rewrite_session_graph(graph, settings, log=None, fetches=None,
                          start=None, target=None):
    """Plan and rewrite the graph-mode `graph` (None: the default graph)
    in place with `settings`, logging to `log` (None: `logger_of`
    `settings`): the `RunResult`.
    `fetches` as `LMS.run` takes them; `start`: the `time.perf_counter()`
    the reported time counts from; `target`: the `target.Target` to plan
    for (a plan for a GPU made on a machine without one:
    ``graph_step.step_target(settings, here=False)``); None: the one the
    step runs on here.

    Raises:
      EagerModeError: eager mode without a graph, or a function graph.
      ValueError: a graph LMS cannot edit (finalized, not a tf.Graph).
    """
    start = time.perf_counter() if start is None else start
    log = logger_of(settings) if log is None else log
    graph = session.graph_to_edit(graph)
    with _gc.paused():
        return _adapter(graph, SESSION_ADAPTERS)(
            graph, settings, log, fetches, target).rewrite(start)


def rewrite_function_graph(graph, settings, log=None, target=None,
                           start=None):
    """Plan and rewrite the function graph `graph` in place with
    `settings`, logging to `log` (None: `logger_of` `settings`), without
    building a function of it: the `RunResult`. `target`: the
    `target.Target` to plan for (a plan for a GPU made on a machine
    without one:
    ``graph_step.step_target(settings, here=False)``); None: the one
    the step runs on here."""
    start = time.perf_counter() if start is None else start
    log = logger_of(settings) if log is None else log
    with _gc.paused():
        return _adapter(graph, FUNCTION_ADAPTERS)(
            graph, settings, log, target=target).rewrite(start)


def session_graph_step(graph, settings, fetches=None, target=None):
    """``(index, target)`` of the training step of the graph-mode `graph`,
    as `rewrite_session_graph` plans it with `target`; nothing is
    edited."""
    adapter = _adapter(graph, SESSION_ADAPTERS)(
        graph, settings, logger_of(settings), fetches, target)
    found = adapter.find_step()
    return adapter.index(found), adapter.target(found)


def function_graph_step(graph, settings, target=None):
    """``(index, target)`` of the training step of the function graph
    `graph`, as `rewrite_function_graph` plans it with `target`;
    nothing is edited."""
    adapter = _adapter(graph, FUNCTION_ADAPTERS)(
        graph, settings, logger_of(settings), target=target)
    found = adapter.find_step()
    return adapter.index(found), adapter.target(found)


def _adapter(graph, adapters):
    """The first of `adapters` (one route's) that accepts `graph`."""
    for adapter in adapters:
        if adapter.accepts(graph):
            return adapter
    if adapters is FUNCTION_ADAPTERS:
        raise ValueError("graph must be a tf.function's graph (a "
                         "FuncGraph); got %r. Rewrite a graph-mode "
                         "tf.Graph with lms.run(graph)" % (graph,))
    raise ValueError("graph must be a graph-mode tf.Graph; got %r. "
                     "Rewrite a tf.function's step with "
                     "lms.function(step_fn)" % (graph,))


class Rewrites:
    """What one `LMS` object rewrote (see the module docstring).

    `settings_of` returns the settings as they are now: an `LMS`'s
    properties can change them until a rewrite starts, so each rewrite
    reads them then.

    Attributes:
      last_run: the `RunResult` of the latest rewrite or answer, Session
        or function graph (`LMS.last_run`).
    """

    def __init__(self, settings_of):
        self._settings_of = settings_of
        self.last_run = None
        # (graph, graph.version after the rewrite, RunResult) of the
        # latest Session graph that was planned: a second call for the
        # same graph (Keras calls set_model and then set_params) answers
        # with the same result instead of analysing it again, unless
        # tuning found LMS unneeded and the graph has changed since.
        self._decided = None
        # The result the latest call made (None: answered from _decided).
        self._made = None

    @property
    def settings(self):
        """The settings now."""
        return self._settings_of()

    @property
    def log(self):
        """A `Logger` of the settings now."""
        return logger_of(self.settings)

    def earlier(self, graph):
        """The `RunResult` this object decided for `graph` before, if it
        still holds: the graph is unchanged since, or was rewritten (a
        graph LMS rewrote stays rewritten when ops are added later);
        else None."""
        decided = self._decided
        if decided is None or decided[0] is not graph:
            return None
        if decided[1] == graph.version or decided[2].rewritten:
            return decided[2]
        return None

    def is_new(self, result):
        """True if `result` rewrote its graph in the latest call (not an
        earlier answer given again)."""
        return result.rewritten and result is self._made

    def session_graph(self, graph=None, fetches=None, renew_keras=False,
                      model=None):
        """`rewrite_session_graph` of `graph`, or the earlier answer for
        it; with `renew_keras`, a Keras 2 session on the graph (of `model`
        when given) is renewed after a new rewrite. Every rank of a
        multi-process job then checks that the others decided alike
        (`distributed.check_ranks_agree`)."""
        start = time.perf_counter()
        graph = session.graph_to_edit(graph)
        log = self.log
        result = self.earlier(graph)
        if result is not None:
            log.info("LMS has already planned this graph: %s."
                     % result.outcome.value, 1)
            self._made = None
        else:
            result = rewrite_session_graph(graph, self.settings, log,
                                           fetches, start)
            if result.planned is not None:
                self._decided = (graph, graph.version, result)
            self._made = result
        self.last_run = result
        if renew_keras and self.is_new(result):
            if model is None:
                log.info("run(keras=True): the graph's Keras session, if "
                         "it has one, is renewed to see LMS's edits")
            keras2_session.renew_keras_session(graph, log, model)
        # Every rank of a multi-process job reaches this line whatever it
        # decided, so a rank that decided otherwise is an error here
        # rather than a hang at the first collective.
        distributed.check_ranks_agree(graph, result.outcome.value,
                                      result.rewrite)
        return result

    def function_graph(self, graph, start=None):
        """`rewrite_function_graph` of `graph` on the target it runs on
        here (`LMSFunction` keeps each concrete function's result)."""
        result = rewrite_function_graph(graph, self.settings, self.log,
                                        start=start)
        self._made = result
        self.last_run = result
        return result
