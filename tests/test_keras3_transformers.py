"""KerasHub's transformers trained with ``fit(callbacks=[LMS(...)])`` as
without it: bit for bit.

GPT-2, Llama (rotary embeddings, grouped-query attention, SwiGLU), Gemma
and BERT's masked language model, each built from a small config with
random weights (nothing is downloaded), dropout on, AdamW, fit from the
same seed without LMS and with fixed parameters that swap nearly every
activation (``swapout_threshold=1``); the losses and every weight must be
equal (with oneDNN on, Llama's and Gemma's weights to rounding:
`ROUNDING_WITH_ONEDNN` says why), and every swap op must be in the
partition graphs TensorFlow ran.
GPT-2 once more under the ``mixed_bfloat16`` policy.

What these tests guard (`fusions.grappler_groups`): Keras fits with whole
batches of an unknown size, so the gradient of every addition reads its
operands' shapes; Grappler folds those readers away and then makes one
AddN of a layer normalization's additions, which LMS must leave whole
(the shape readers had split the group, and GPT-2, Gemma and BERT
rounded differently); and Grappler folds the transpose of GPT-2's tied
embedding into the products that read it, so those read no swap-in (a
structural rule: at this size the folded and unfolded products happen
to round alike); and it turns GELU's ``x ** 3`` (and its gradient's
``x ** 2``) into products that join the chain of multiplications around
them, which it reorders, so a Pow or Square read by a Mul is not swapped
either. `test_each_cause_turned_back_on_changes_the_numbers` puts the
first and the last back, each alone.

Keras 3 trains in eager mode and this test process has eager execution
off (conftest.py): each model runs this file as a script in a subprocess
with one inter-op thread, which prints one JSON line.
"""

import json
import os
import sys

import pytest

from _keras3 import (onednn, result_of, swaps_not_run,
                     weights_compared)

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)

SEED = 1
BATCH = 2
STEPS = 2
SEQUENCE = 16
VOCABULARY = 101
# Swaps nearly every activation: every tensor read one level or more after
# it is made, each swap-in started one level before its reader.
FIXED = dict(swapout_threshold=1, swapin_ahead=1, swapin_groupby=0)
DUMP_FILTER = "multi_step_on_iterator"
MODELS = ("gpt2", "llama", "gemma", "bert")


# ---- the script (runs in the subprocess) -------------------------------

def _build(keras, keras_hub, family):
    """A small `family` model with dropout, compiled with AdamW."""
    models = keras_hub.models
    small = dict(vocabulary_size=VOCABULARY, num_layers=2, hidden_dim=32,
                 intermediate_dim=64, dropout=0.1)
    if family == "gpt2":
        backbone = models.GPT2Backbone(num_heads=2,
                                       max_sequence_length=SEQUENCE, **small)
        model = models.GPT2CausalLM(backbone, preprocessor=None)
    elif family == "llama":
        backbone = models.LlamaBackbone(num_query_heads=4,
                                        num_key_value_heads=2, **small)
        model = models.LlamaCausalLM(backbone, preprocessor=None)
    elif family == "gemma":
        backbone = models.GemmaBackbone(num_query_heads=2,
                                        num_key_value_heads=1, head_dim=16,
                                        **small)
        model = models.GemmaCausalLM(backbone, preprocessor=None)
    else:
        backbone = models.BertBackbone(num_heads=2,
                                       max_sequence_length=SEQUENCE, **small)
        model = models.BertMaskedLM(backbone, preprocessor=None)
    model.compile(optimizer=keras.optimizers.AdamW(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(
                      from_logits=True),
                  weighted_metrics=[], jit_compile=False)
    return model


def _data(np, family):
    """``(x, y)``: `STEPS` batches of random tokens, labels for every
    position (a causal model) or for three masked positions (BERT)."""
    rng = np.random.RandomState(0)
    n = STEPS * BATCH
    tokens = rng.randint(1, VOCABULARY, (n, SEQUENCE)).astype("int32")
    x = {"token_ids": tokens,
         "padding_mask": np.ones_like(tokens, dtype=bool)}
    if family == "bert":
        x["segment_ids"] = np.zeros_like(tokens)
        x["mask_positions"] = np.tile(np.array([[1, 3, 5]], "int32"),
                                      (n, 1))
        return x, rng.randint(1, VOCABULARY, (n, 3)).astype("int32")
    return x, rng.randint(1, VOCABULARY, (n, SEQUENCE)).astype("int32")


def _fit(keras, keras_hub, np, family, lms=None):
    """Losses and weights after `STEPS` steps of `family` from `SEED`."""
    keras.backend.clear_session()  # the same layer (and op) names each time
    keras.utils.set_random_seed(SEED)
    model = _build(keras, keras_hub, family)
    x, y = _data(np, family)
    history = model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False,
                        verbose=0, callbacks=[lms] if lms else [])
    return history.history["loss"], [v.numpy() for v in model.weights]


def _main(family, dump_dir, mode, policy):
    sys.path.insert(0, _ROOT)
    import numpy as np
    import tensorflow as tf
    import keras
    import keras_hub
    from tflms import LMS, fusions
    tf.config.threading.set_inter_op_parallelism_threads(1)
    keras.mixed_precision.set_global_policy(policy)
    if mode == "shape-readers":
        # Readers of a shape alone split a group, as before.
        readers = fusions._readers_of

        def with_shape_readers(index, tensor):
            found = readers(index, tensor)
            producer, output = tensor
            return found + [c for c, _ in index.consumers[producer][output]
                            if index.types[c] in ("Shape", "ShapeN", "Size",
                                                  "Rank")]
        fusions._readers_of = with_shape_readers
    elif mode == "pow-apart":
        # Pow and Square swapped out of the Mul chains they join, as before.
        for kind in ("Pow", "Square"):
            fusions._MERGED_INTO.pop(kind)
    prefix = os.environ.pop("TF_DUMP_GRAPH_PREFIX")
    base_losses, base_weights = _fit(keras, keras_hub, np, family)
    os.environ["TF_DUMP_GRAPH_PREFIX"] = prefix
    lms = LMS(**FIXED)
    losses, weights = _fit(keras, keras_hub, np, family, lms)
    result = lms.last_run
    missing, off_cpu = swaps_not_run(result, dump_dir)
    print("RESULT " + json.dumps(dict(
        outcome=result.outcome.value, swapouts=len(result.swapout_ops),
        base_losses=base_losses, losses=losses,
        missing=missing, off_cpu=off_cpu,
        **weights_compared(base_weights, weights))))


# ---- the tests -----------------------------------------------------------

def _new_stack():
    from tflms.tf import compat
    return compat.TF_VERSION >= (2, 16, 0)


pytestmark = [pytest.mark.numerics, pytest.mark.skipif(
    not _new_stack(), reason="KerasHub needs Keras 3, TensorFlow 2.16+; on "
    "2.15 keras is Keras 2")]


def _run(family, tmp_path, mode="as-is", policy="float32"):
    dump = tmp_path / "dump"
    dump.mkdir()
    return result_of(os.path.abspath(__file__), family, dump, mode, policy,
                     timeout=900, TF_DUMP_GRAPH_PREFIX=str(dump),
                     TF_DUMP_GRAPH_NAME_FILTER=DUMP_FILTER)[0]


# With oneDNN on, Llama and Gemma train to rounding only (weights within
# 6e-7 after two steps, losses equal), for two causes not yet fixed: LMS
# swaps the sines and cosines of the rotary embedding, which Grappler
# folds into constants without LMS (the positions follow from the static
# sequence length) and which oneDNN's _MklEinsum computes otherwise at
# run time; and Llama's SiLU is left as a Sigmoid and a Mul instead of one
# _MklSwish. GPT-2 and BERT are exact with oneDNN on too.
ROUNDING_WITH_ONEDNN = ("llama", "gemma")


def _assert_trained_the_same(r, exact=True):
    assert r["outcome"] == "rewritten"
    assert r["swapouts"] > 50
    assert r["missing"] == [] and r["off_cpu"] == []
    assert r["num_weights"] > 0
    assert r["losses"] == r["base_losses"]
    if exact:
        assert r["different"] == 0, r["largest_difference"]
    else:
        assert r["largest_difference"] < 1e-5


# CI trains each family in one oneDNN mode (tools/run_tests.sh): Llama
# and Gemma with it off (the Python 3.13 pass, marked `onednn_off_pass`),
# where they are exact, GPT-2 and BERT with it on, where they are exact
# too; the causes below need it off. Before CI split them, every family
# trained in both modes (GPT-2 and BERT bit for bit with it on on
# 2026-11-29, Llama and Gemma to rounding on 2026-11-30); to check them so
# by hand, run this file with TF_ENABLE_ONEDNN_OPTS=1, then 0, and -m "".
ONEDNN_OFF_PASS = ("llama", "gemma")


@pytest.mark.parametrize("family", [
    pytest.param(f, marks=pytest.mark.onednn_off_pass)
    if f in ONEDNN_OFF_PASS else f for f in MODELS])
def test_transformers_train_the_same_with_nearly_everything_swapped(
        family, tmp_path):
    _assert_trained_the_same(
        _run(family, tmp_path),
        exact=onednn() == "0" or family not in ROUNDING_WITH_ONEDNN)


def test_gpt2_in_mixed_bfloat16_trains_the_same(tmp_path):
    _assert_trained_the_same(_run("gpt2", tmp_path, policy="mixed_bfloat16"))


@pytest.mark.onednn_off_pass
@pytest.mark.parametrize("family,mode", [
    ("gpt2", "shape-readers"), ("gemma", "pow-apart")])
def test_each_cause_turned_back_on_changes_the_numbers(family, mode,
                                                       tmp_path):
    """The causes, each turned back on alone, oneDNN off: with Shape
    readers counted, a layer normalization's additions are no group and
    LMS swaps into them, so Grappler leaves them unmerged and GPT-2 rounds
    differently; with GELU's ``x ** 3`` and its gradient's ``x ** 2``
    swapped, Grappler multiplies Gemma's ``0.044715 * x * x * x`` in
    another order."""
    if onednn() == "1":
        pytest.skip("exact comparisons need oneDNN off: this test runs in "
                    "the suite's passes with it off (tools/run_tests.sh)")
    r = _run(family, tmp_path, mode=mode)
    assert r["outcome"] == "rewritten" and r["missing"] == []
    assert r["different"] > 0


if __name__ == "__main__":
    _main(*sys.argv[1:])
