"""`compat.keras3_message`: the fix it names depends on what is installed.

On TensorFlow 2.16+ without tf-keras it says to install it; with tf-keras
importable it says to use it (TF_USE_LEGACY_KERAS=1 or `import tf_keras`)
and not to install it again. Both stacks run this with a stand-in
TensorFlow version and Keras 2 module.
"""

import types

from tflms.tf import compat


def _message(monkeypatch, keras2):
    monkeypatch.setattr(compat, "TF_VERSION", (2, 21, 0))
    monkeypatch.setattr(compat, "keras2", lambda: keras2)
    return compat.keras3_message("The LMS Keras callback")


def test_with_tf_keras_importable_it_is_not_installed_again(monkeypatch):
    message = _message(monkeypatch,
                       types.SimpleNamespace(__version__="2.21.0"))
    assert "pip install" not in message
    assert ("To use LMS, use the tf-keras 2.21.0 that is installed: either "
            "set the environment variable TF_USE_LEGACY_KERAS=1 before "
            "Python starts (then tf.keras is Keras 2) or build the model "
            "with `import tf_keras as keras`; then call "
            "tf.compat.v1.disable_eager_execution()") in message


def test_without_tf_keras_it_says_how_to_install_it(monkeypatch):
    message = _message(monkeypatch, None)
    assert ("To use LMS, install Keras 2 with `pip install tf-keras~=2.21.0` "
            "(or `pip install 'tflms[tf]'`)") in message
