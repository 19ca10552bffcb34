"""benchmarks/keras_hub_models.py: the configs KerasHub's transformers are
built from (the builds are the other benchmarks' tests:
test_bench_transformer_plan_time.py, test_bench_offload_llama.py,
test_bench_transformer_plans.py)."""

import pytest

from benchmarks import keras_hub_models as hub


def test_each_family_keeps_its_own_vocabulary_width_and_kv_heads():
    assert hub.config_of("gpt2") == dict(vocab=50257, layers=12, heads=12,
                                         hidden=768, intermediate=3072)
    assert hub.config_of("llama")["kv_heads"] == 4
    assert hub.config_of("llama", heads=2)["kv_heads"] == 2
    gemma = hub.config_of("gemma", intermediate=128)
    assert (gemma["vocab"], gemma["intermediate"], gemma["kv_heads"]) == \
        (256000, 128, 1)


def test_the_tiny_size_scales_the_intermediate_width_and_the_vocabulary():
    assert hub.sized("bert", "tiny") == dict(
        vocab=hub.TINY_VOCAB, layers=2, heads=2, hidden=64,
        intermediate=256)
    assert hub.sized("llama") == hub.config_of("llama")


def test_an_unknown_family_is_named():
    with pytest.raises(ValueError, match="gpt2, llama, gemma, bert; got "
                       "'t5'"):
        hub.config_of("t5")
