"""`tflms.tf.keras_models`: what a saved file says about itself, and TF2
optimizers turned into their graph-mode namesakes."""

import json
import zipfile

import pytest

from tflms.tf import compat
from tflms.tf import keras_models


# The Keras 2 each stack carries: run on both (tools/run_tests.sh).
pytestmark = pytest.mark.both_stacks


def test_saved_keras_version_of_a_keras_archive(tmp_path):
    path = tmp_path / "model.keras"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("metadata.json",
                         json.dumps({"keras_version": "3.5.0"}))
    assert keras_models.saved_keras_version(path) == "3.5.0"
    broken = tmp_path / "broken.keras"
    with zipfile.ZipFile(broken, "w") as archive:
        archive.writestr("config.json", "{}")
    assert keras_models.saved_keras_version(broken) is None
    assert keras_models.saved_keras_version(tmp_path) is None


def test_saved_keras_version_of_an_h5_file(tmp_path):
    h5py = pytest.importorskip("h5py")
    path = tmp_path / "model.h5"
    with h5py.File(path, "w") as f:
        f.attrs["keras_version"] = "2.15.0"
    assert keras_models.saved_keras_version(path) == "2.15.0"


def test_files_that_cannot_be_models_say_why(tmp_path):
    pytest.importorskip("h5py")
    fake_h5 = tmp_path / "model.h5"
    fake_h5.write_text("not hdf5")
    assert keras_models.not_a_model_file(fake_h5) == (
        "%s is not an HDF5 file (it does not start with the HDF5 signature), "
        "so it is no model saved by Keras' model.save(); check the path, or "
        "save the model again" % fake_h5)
    fake_keras = tmp_path / "model.keras"
    fake_keras.write_text("not a zip")
    assert keras_models.not_a_model_file(fake_keras).startswith(
        "%s is not a zip archive" % fake_keras)
    assert keras_models.not_a_model_file(tmp_path) is None  # a folder
    assert keras_models.not_a_model_file(tmp_path / "absent.h5") is None


def test_tf2_optimizer_becomes_its_legacy_namesake():
    keras = compat.keras2()
    adam = keras.optimizers.Adam(learning_rate=0.003, beta_1=0.8)
    legacy = keras_models.graph_mode_optimizer(adam)
    assert type(legacy) is keras.optimizers.legacy.Adam
    config = legacy.get_config()
    assert config["learning_rate"] == pytest.approx(0.003)
    assert config["beta_1"] == pytest.approx(0.8)
    already = keras.optimizers.legacy.SGD(0.1)
    assert keras_models.graph_mode_optimizer(already) is already


def test_tf2_only_setting_is_refused():
    keras = compat.keras2()
    with pytest.raises(compat.UnsupportedStackError,
                       match="weight_decay=...\\), a setting the graph-mode "
                       "optimizer"):
        keras_models.graph_mode_optimizer(
            keras.optimizers.SGD(0.1, weight_decay=0.01))
