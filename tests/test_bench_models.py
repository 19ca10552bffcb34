"""benchmarks/models.py: the BERT step runs the update it names."""

import pytest


@pytest.mark.parametrize("optimizer,precision", [
    ("adam-weight-decay", "mixed_float16"), ("adam-weight-decay", "float32"),
    ("accumulate", "float32"), ("adam", "float16")])
def test_bert_step_runs_the_update_it_names(optimizer, precision):
    """A tiny BERT's step with NVIDIA's fine-tuning update moves every
    trainable variable; with accumulation it moves none and fills the
    accumulators (step_time's pretraining and SQuAD graphs)."""
    import numpy as np
    import tensorflow as tf
    from benchmarks import models
    built = models.bert(layers=1, hidden=16, heads=2, seq=8, batch=2,
                        vocab=50, predictions=2, precision=precision,
                        head="squad" if optimizer != "accumulate"
                        else "pretraining", optimizer=optimizer)
    v1 = tf.compat.v1
    # The SQuAD head's bias is added to every position before a softmax
    # over positions, so its gradient is zero in exact arithmetic: float
    # rounding decides whether it moves (with oneDNN on it does not), and
    # its Adam slots stay zero with it.
    with built.graph.as_default():
        params = [v for v in v1.trainable_variables()
                  if v.op.name != "bert/squad/bias"]
        others = [v for v in v1.global_variables()
                  if v not in params and "squad_bias" not in v.op.name
                  and v.op.name != "bert/squad/bias"]
    with v1.Session(graph=built.graph) as sess:
        sess.run(built.init_op)
        before = sess.run(params)
        sess.run(built.train_op, built.make_feed())
        after, state = sess.run([params, others])
    moved = [not np.array_equal(b, a) for b, a in zip(before, after)]
    assert all(moved) if optimizer != "accumulate" else not any(moved)
    assert others and all(np.any(s != 0) for s in state)
