"""The dropout noise of KerasHub's GPT-2 (a small config, dropout 0.1)
deferred (`planner.deferral_edges`, counter-based random ops): without the
deferral every layer's noise is made in the first levels, beside each
other; with it each is made just before its layer.

Keras 3 traces in eager mode, which the test process has off: the step is
traced in a subprocess (this file run as a script, `_keras3.result_of`).
"""

import os

import pytest

import _keras3

BATCH, SEQ = 4, 256
SIZE = dict(layers=2, heads=2, hidden=64, intermediate=128, vocab=100)


def _main():
    import json
    import sys
    sys.path.insert(0, _keras3.ROOT)
    from benchmarks.transformer_plans import gpt2_step
    from tflms import context, planner, simulator
    from tflms.settings import Settings
    from tflms.tf.adapters import graph_step, tf_function
    concrete, _ = gpt2_step(SEQ, BATCH, **SIZE)
    _, index = tf_function.step_of(concrete.graph)
    settings = Settings(batch_size=BATCH)
    roles = context.classify(index, settings, graph_step.step_target(
        settings, here=False))
    deferral = planner.deferral_edges(index, roles)
    model = simulator.SimulationModel(index, roles, BATCH)
    peaks = []
    for edges in ((), deferral):
        # The most aggressive swaps: what no parameter set goes below.
        plan = planner.make_plan(index, roles, planner.SwapParams(1, 1, 0, 0),
                                 batch_size=BATCH, deferral=edges)
        peaks.append(model.replay(plan).peak_device_bytes)
    print("RESULT " + json.dumps(dict(
        deferred=sorted(index.names[op] for _, op in deferral),
        noise=[index.names[op] for op in range(index.num_ops)
               if index.types[op] == "StatelessRandomUniformV2"],
        peaks=peaks)))


@_keras3.needs_keras3
def test_gpt2_dropout_noise_is_made_just_before_its_layer():
    pytest.importorskip("keras_hub")
    r, log = _keras3.result_of(os.path.abspath(__file__))
    # Every layer's noise (the attention probabilities', the attention
    # output's and the MLP output's) is delayed; the embeddings' is read
    # in the levels right after it is made, and stays.
    layers = sorted(n for n in r["noise"] if "transformer_layer" in n)
    assert len(layers) == 6, (r["noise"], log[-3000:])
    assert [n for n in r["deferred"] if n in r["noise"]] == layers
    # Beside them, the accuracy's mask of the logits (an op on inputs held
    # anyway) waits for the rest of its NaN check.
    assert [n for n in r["deferred"] if n not in r["noise"]] == ["Equal"]
    # The layers' noise no longer beside each other at the step's start:
    # the most aggressive plan's peak is lower. (By how much depends on
    # where the rest of the step puts that peak: by more than one layer's
    # attention noise, [4, 2, 256, 256] floats, before the Grappler groups
    # kept GELU's powers and folded transposes off swap-ins; by 0.8 MB
    # since.)
    before, after = r["peaks"]
    assert after < before, r


if __name__ == "__main__":
    _main()
