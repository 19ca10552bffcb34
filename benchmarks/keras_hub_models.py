"""KerasHub's transformers built from configs with random weights (no
downloads) and compiled as the benchmarks train them: the one builder of
`transformer_plans`, `transformer_plan_time` (and `remat_side_by_side`
through it) and `offload_llama` (TensorFlow 2.16+ with Keras 3 and
KerasHub).

A config is a dict: ``vocab``, ``layers``, ``heads``, ``hidden``,
``intermediate``, for Llama and Gemma ``kv_heads``, and optionally
``dropout`` (0.1 unless given) and, for Llama, ``tie``
(``tie_word_embeddings``; KerasHub's default unless given). `config_of`
makes one at any size, `sized` at `transformer_plan_time`'s ``--size``.
Every model is compiled with AdamW (1e-4) and sparse cross-entropy from
logits, without XLA, and its optimizer's slots built.
"""

# Depth and width of GPT-2 small (12 layers, 768 wide) for every family,
# with each family's own vocabulary and attention layout: Llama's
# grouped-query attention (4 key-value heads for 12 query heads) and
# SwiGLU, Gemma's single key-value head and 256k vocabulary, BERT base's
# masked LM. `max_sequence_length` (GPT-2, BERT) is the traced length.
FAMILIES = {
    "gpt2": dict(vocab=50257, intermediate=3072),
    "llama": dict(vocab=32000, intermediate=2048, kv_heads=4),
    "gemma": dict(vocab=256000, intermediate=6144, kv_heads=1),
    "bert": dict(vocab=30522, intermediate=3072),
}
SIZES = {
    "small": dict(layers=12, heads=12, hidden=768),
    "tiny": dict(layers=2, heads=2, hidden=64),
}
TINY_VOCAB = 1000
MASKED = 20  # BERT's masked positions per sequence (mask_positions)


def config_of(family, layers=12, heads=12, hidden=768, intermediate=None,
              vocab=None):
    """The config of `family` at the given size: its own vocabulary and
    intermediate width unless given, its key-value heads (Llama, Gemma)
    at most `heads`."""
    if family not in FAMILIES:
        raise ValueError("family must be one of %s; got %r"
                         % (", ".join(FAMILIES), family))
    own = FAMILIES[family]
    config = dict(vocab=vocab or own["vocab"], layers=layers, heads=heads,
                  hidden=hidden,
                  intermediate=intermediate or own["intermediate"])
    if "kv_heads" in own:
        config["kv_heads"] = min(own["kv_heads"], heads)
    return config


def sized(family, size="small"):
    """The config of `family` at `SIZES[size]`: the intermediate width
    scaled with the hidden one, the vocabulary `TINY_VOCAB` at ``tiny``."""
    shape = SIZES[size]
    return config_of(
        family, intermediate=(FAMILIES[family]["intermediate"]
                              * shape["hidden"] // 768),
        vocab=None if size == "small" else TINY_VOCAB, **shape)


def build(family, seq, config, seed=0):
    """The compiled KerasHub model of `family` and `config`, built for
    sequences of `seq` tokens (GPT-2's and BERT's position embeddings),
    its weights drawn after ``keras.utils.set_random_seed(seed)``."""
    import keras
    import keras_hub
    keras.utils.set_random_seed(seed)
    models = keras_hub.models
    common_args = dict(vocabulary_size=config["vocab"],
                       num_layers=config["layers"],
                       hidden_dim=config["hidden"],
                       intermediate_dim=config["intermediate"],
                       dropout=config.get("dropout", 0.1))
    heads = config["heads"]
    if family == "gpt2":
        model = models.GPT2CausalLM(models.GPT2Backbone(
            num_heads=heads, max_sequence_length=seq, **common_args),
            preprocessor=None)
    elif family == "llama":
        if "tie" in config:
            common_args["tie_word_embeddings"] = config["tie"]
        model = models.LlamaCausalLM(models.LlamaBackbone(
            num_query_heads=heads, num_key_value_heads=config["kv_heads"],
            **common_args), preprocessor=None)
    elif family == "gemma":
        model = models.GemmaCausalLM(models.GemmaBackbone(
            num_query_heads=heads, num_key_value_heads=config["kv_heads"],
            head_dim=config["hidden"] // heads, **common_args),
            preprocessor=None)
    elif family == "bert":
        model = models.BertMaskedLM(models.BertBackbone(
            num_heads=heads, max_sequence_length=seq, **common_args),
            preprocessor=None)
    else:
        raise ValueError("family must be one of %s; got %r"
                         % (", ".join(FAMILIES), family))
    model.compile(optimizer=keras.optimizers.AdamW(1e-4),
                  loss=keras.losses.SparseCategoricalCrossentropy(
                      from_logits=True),
                  jit_compile=False)
    model.optimizer.build(model.trainable_variables)
    return model


def signature(family, seq, batch):
    """The ``(x, y)`` `tf.TensorSpec` structure of one batch of `batch`
    sequences of `seq` tokens (BERT's: `MASKED` positions each)."""
    import tensorflow as tf
    tokens = tf.TensorSpec([batch, seq], tf.int32)
    x = {"token_ids": tokens,
         "padding_mask": tf.TensorSpec([batch, seq], tf.int32)}
    if family == "bert":
        x["segment_ids"] = tokens
        x["mask_positions"] = tf.TensorSpec([batch, MASKED], tf.int32)
        return x, tf.TensorSpec([batch, MASKED], tf.int32)
    return x, tokens


def trace(model, family, seq, batch):
    """The concrete function of `model`'s ``train_step`` traced by
    ``tf.function`` (no XLA) for one batch (`signature`)."""
    import tensorflow as tf
    return tf.function(model.train_step, jit_compile=False) \
        .get_concrete_function(signature(family, seq, batch))


def step(family, seq, batch, config, seed=0):
    """``(concrete function, model)``: `build`, then `trace`."""
    model = build(family, seq, config, seed)
    return trace(model, family, seq, batch), model
