"""Caches checked against the input, empty sequences, and lengths beyond a fixed maximum: each a
clear error naming the argument (or a right, empty answer), never an internal TensorFlow error."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_attn

WIDTH = 8
FAMILIES = {
    "MultiHeadAttention": lambda: keras_attn.MultiHeadAttention(2, 4),
    "MultiHeadAttention(hard)": lambda: keras_attn.MultiHeadAttention(2, 4, hard=True),
    "LSHSelfAttention": lambda: keras_attn.LSHSelfAttention(2, 4, num_buckets=2, chunk_size=4),
    "LinformerSelfAttention": lambda: keras_attn.LinformerSelfAttention(2, 4, max_length=8, projected_length=4),
    "LinearAttention(elu)": lambda: keras_attn.LinearAttention(2, 4),
    "LinearAttention(favor)": lambda: keras_attn.LinearAttention(2, 4, feature_map="favor"),
    "LinearAttention(causal elu)": lambda: keras_attn.LinearAttention(2, 4, causal=True),
    "LinearAttention(causal favor)": lambda: keras_attn.LinearAttention(2, 4, causal=True, feature_map="favor"),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_an_empty_sequence_gives_an_empty_output(family):
    layer = FAMILIES[family]()
    empty = np.zeros((2, 0, WIDTH), "float32")
    output = layer(empty, empty) if isinstance(layer, keras_attn.MultiHeadAttention) else layer(empty)
    assert tuple(output.shape) == (2, 0, WIDTH)
    # The same layer still attends over a real sequence afterwards.
    tokens = np.random.default_rng(0).normal(size=(2, 3, WIDTH)).astype("float32")
    again = layer(tokens, tokens) if isinstance(layer, keras_attn.MultiHeadAttention) else layer(tokens)
    assert np.all(np.isfinite(again)) and tuple(again.shape) == (2, 3, WIDTH)


def test_a_key_value_cache_of_another_batch_is_refused():
    layer = keras_attn.MultiHeadAttention(2, 4)
    query = np.zeros((2, 1, WIDTH), "float32")
    cache = np.zeros((3, 2, 5, 2, 4), "float32")
    with pytest.raises(ValueError, match=r"`cache` must have the batch size of `query`.*cache.shape=\(3, 2, 5, 2, 4\)"):
        layer(query, query, cache=cache, cache_update_index=0)


@pytest.mark.parametrize(
    "make_state",
    [
        lambda layer: layer.initial_cache(2)[0],  # one tensor, not the pair
        lambda layer: (layer.initial_cache(2)[0][:, :1], layer.initial_cache(2)[1][:, :1]),  # one head
        lambda layer: layer.initial_cache(3),  # another batch
        lambda layer: (layer.initial_cache(2)[0],),  # a one-tuple
    ],
    ids=["tensor", "heads", "batch", "one_part"],
)
def test_a_malformed_linear_attention_state_is_refused(make_state):
    layer = keras_attn.LinearAttention(2, 4, causal=True)
    tokens = np.zeros((2, 1, WIDTH), "float32")
    layer(tokens)  # built
    with pytest.raises(ValueError, match="`cache` must be the recurrent state"):
        layer(tokens, cache=make_state(layer))
    _, state = layer(tokens, cache=layer.initial_cache(2))  # the right state still decodes
    assert [tuple(part.shape) for part in state] == [tuple(part.shape) for part in layer.initial_cache(2)]


def test_initial_self_attention_cache_before_build_says_what_to_build():
    decoder = keras_attn.TransformerDecoder(16, 2)
    with pytest.raises(ValueError, match=r"needs a built decoder.*build\(decoder_sequence_shape\)"):
        decoder.initial_self_attention_cache(2, 8)
    decoder.build((2, 8, WIDTH))
    assert tuple(decoder.initial_self_attention_cache(2, 8).shape) == (2, 2, 8, 2, 4)


def test_linformer_refuses_a_dynamic_length_beyond_max_length_in_a_graph():
    layer = keras_attn.LinformerSelfAttention(2, 4, max_length=8, projected_length=4)
    layer(np.zeros((1, 8, WIDTH), "float32"))
    call = tf.function(layer, input_signature=[tf.TensorSpec((None, None, WIDTH))])
    assert tuple(call(tf.zeros((1, 5, WIDTH))).shape) == (1, 5, WIDTH)
    # The assertion's data: the length received, then max_length.
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"(?s)longer than `max_length=8`.*\[12\].*\[8\]"):
        call(tf.zeros((1, 12, WIDTH)))


def test_linformer_names_max_length_when_a_functional_model_is_called_eagerly_on_more_tokens():
    """Built for any length (a Functional model's `None`), then called eagerly on 13 tokens: the length
    is known now, and the error names `max_length` and the length received (it was TensorFlow's
    "Expected dimension 13 at axis 0 of the input shaped [8,4]" from an einsum)."""
    inputs = keras.Input((None, WIDTH))
    layer = keras_attn.LinformerSelfAttention(2, 4, max_length=8, projected_length=4)
    model = keras.Model(inputs, layer(inputs))
    with pytest.raises(ValueError, match=r"longer than `max_length=8`.*Received: a sequence of length 13"):
        model(np.zeros((1, 13, WIDTH), "float32"))
    with pytest.raises(ValueError, match=r"longer than `max_length=8`.*Received: a sequence of length 13"):
        model.predict(np.zeros((1, 13, WIDTH), "float32"), verbose=0)
    tokens = np.random.default_rng(0).normal(size=(1, 8, WIDTH)).astype("float32")
    np.testing.assert_allclose(np.asarray(model(tokens)), np.asarray(layer(tokens)), atol=1e-6)


@pytest.mark.parametrize("sliding_window", [None, 3])
@pytest.mark.parametrize("chunks", [(1,) * 6, (3, 1, 2)], ids=["tokens", "prefill"])
def test_a_full_length_cache_without_a_causal_mask_attends_over_the_tokens_written_so_far(sliding_window, chunks):
    """Each step of a call with a full-length cache and no causal mask gives the rows of the full
    (non-causal) pass over the tokens written so far: the slots not written yet hold the initial zeros,
    which took weight from every query (2.49 from the full pass) while the ring buffer refuses such a call."""
    rng = np.random.default_rng(1)
    length = sum(chunks)
    tokens = rng.normal(size=(2, length, WIDTH)).astype("float32")
    layer = keras_attn.MultiHeadAttention(2, 4, sliding_window=sliding_window)
    # Full length (with a window too: not the ring buffer of `initial_cache`), two slots never written.
    cache = np.zeros((2, 2, length + 2, 2, 4), "float32")
    start = 0
    for size in chunks:
        new = tokens[:, start : start + size]
        output, cache = layer(new, new, cache=cache, cache_update_index=start)
        prefix = tokens[:, : start + size]
        expected = np.asarray(layer(prefix, prefix))[:, start:]
        np.testing.assert_allclose(np.asarray(output), expected, atol=1e-5)
        start += size
