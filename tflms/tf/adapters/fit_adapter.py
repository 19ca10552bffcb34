"""The protocol of an entry point that attaches LMS to a Keras fit.

Keras calls the callback (the `LMS` object itself): ``set_model``,
``set_params``, ``on_train_begin``, ``on_train_end``. `LMS` hands each
call to the fit adapter that accepts the model (`tflms.tf.adapters`,
``FIT_ADAPTERS``); the adapter finds the graph or the function of the
training step and has it rewritten through its `rewrite.Rewrites` (the
settings as they are now, a logger, the one record of what was
rewritten). A method an adapter does not need does nothing.
"""

__all__ = ["FitAdapter"]


class FitAdapter:
    """One Keras fit entry point; see the module docstring."""

    def __init__(self, rewrites, model):
        self.rewrites = rewrites
        self.model = model

    @classmethod
    def accepts(cls, model):
        """True if this adapter serves the fit of `model`."""
        raise NotImplementedError

    def set_model(self):
        """Keras gave the callback the model."""

    def set_params(self, params):
        """Keras gave the callback the fit's parameters."""

    def train_begin(self):
        """The fit begins."""

    def train_end(self):
        """The fit ended (or failed)."""
