"""The Keras 2 fit entry point (graph mode): `Keras2Fit`.

Keras 2 in graph mode (``tf.keras`` on TensorFlow 2.15; tf-keras on 2.16+
with ``tf.compat.v1.disable_eager_execution()``) trains a graph: the
callback rewrites the train function's step in the default graph once it
exists (made here if Keras has not made it yet) and the batch size is
known (`LMS.set_params` takes it from Keras' parameters), then gives
Keras a session that sees the edits (`rewrite.Rewrites.session_graph`,
`keras2_session.renew_keras_session`).
"""

import tensorflow as tf

from tflms.results import EagerModeError
from tflms.tf import compat
from tflms.tf import reader
from tflms.tf.adapters.fit_adapter import FitAdapter
from tflms.tf.adapters.session import EAGER_MESSAGE

__all__ = ["Keras2Fit"]


class Keras2Fit(FitAdapter):
    """Keras 2 ``fit(callbacks=[lms])``, ``fit_generator`` and
    ``predict`` in graph mode."""

    @classmethod
    def accepts(cls, model):
        return not compat.is_keras3_model(model)

    def set_model(self):
        if tf.executing_eagerly():
            raise EagerModeError(EAGER_MESSAGE)
        settings = self.rewrites.settings
        if settings.autotune_requested and settings.batch_size is None:
            # fit() calls set_params with the batch size right after this.
            return
        self._rewrite()

    def set_params(self, params):
        """The fit's parameters are known (`LMS.set_params` took the batch
        size from them): the step is rewritten."""
        self._rewrite()

    def _rewrite(self):
        model, rewrites = self.model, self.rewrites
        if tf.executing_eagerly():
            raise EagerModeError(EAGER_MESSAGE)
        # Only a compiled model being trained gets a train function:
        # predict() with the callback must not add a whole training graph.
        if (rewrites.settings.is_training
                and getattr(model, "train_function", None) is None
                and getattr(model, "optimizer", None) is not None
                and hasattr(model, "_make_train_function")):
            rewrites.log.info("Making the Keras train function before "
                              "editing", level=1)
            model._make_train_function()
        graph = tf.compat.v1.get_default_graph()
        # A new rewrite gets Keras a session that sees it, with the
        # variables' values.
        rewrites.session_graph(
            graph, fetches=reader.keras_train_fetches(graph, model),
            renew_keras=True, model=model)
