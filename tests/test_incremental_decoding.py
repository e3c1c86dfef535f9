"""Incremental decoding through TransformerDecoder stacks, token by token, for every causal family.

Each family decodes a sequence in chunks (a prefill, single tokens, a chunk longer than the
window) through a stack of decoders with caches, and every output must equal the full-sequence
recompute of the same layers (the issue's oracle) to 1e-5; the softmax families with a bias or a
pattern are also checked against the float64 NumPy decoder of `tests.reference` with the mask and
bias built from their definitions. Window caches are ring buffers of `WINDOW` slots: the sequence
is longer than the window, so the buffer wraps several times.
"""

import numpy as np
import pytest
import tensorflow as tf

from keras_attn import ALiBi
from keras_attn import LinearAttention
from keras_attn import MultiHeadAttention
from keras_attn import RelativePositionBias
from keras_attn import TransformerDecoder
from keras_attn.attention_families import FAMILIES as REGISTERED_FAMILIES
from keras_attn.patterns import BlockLocal
from keras_attn.patterns import Causal
from keras_attn.patterns import SlidingWindow
from keras_attn.patterns import Strided
from tests import reference

BATCH, LENGTH, HIDDEN, HEADS, WINDOW = 2, 13, 8, 2, 4
CHUNKS = (3, 1, 1, 5, 1, 2)  # a prefill, tokens, a chunk longer than the window; sums to LENGTH
ATOL = 1e-5


def _alibi():
    return {"position_bias": ALiBi(HEADS)}


def _t5():
    return {"position_bias": RelativePositionBias(HEADS, num_buckets=8, max_distance=10, bidirectional=False)}


# name: (decoder arguments made fresh for each layer, NumPy oracle spec or None)
FAMILIES = {
    "dense": (dict, ("causal",)),
    "window": (lambda: {"sliding_window": WINDOW}, ("window", WINDOW)),
    "window_alibi": (lambda: {"sliding_window": WINDOW, **_alibi()}, ("window", WINDOW)),
    "window_t5": (lambda: {"sliding_window": WINDOW, **_t5()}, ("window", WINDOW)),
    "window_block_local": (
        lambda: {"sliding_window": 6, "attention_pattern": BlockLocal(4)},
        ("and", ("window", 6), ("block", 4)),
    ),
    "causal_strided": (
        lambda: {"attention_pattern": Causal() & (SlidingWindow(3) | Strided(3))},
        ("or", ("window", 3), ("strided", 3)),
    ),
    "dense_t5": (_t5, ("causal",)),
    "hard": (lambda: {"self_attention": MultiHeadAttention(HEADS, HIDDEN // HEADS, hard=True)}, None),
    "window_hard": (
        lambda: {"self_attention": MultiHeadAttention(HEADS, HIDDEN // HEADS, hard=True, sliding_window=WINDOW)},
        None,
    ),
    "linear": (lambda: {"self_attention": LinearAttention(HEADS, HIDDEN // HEADS, causal=True)}, None),
    "linear_favor": (
        lambda: {"self_attention": LinearAttention(HEADS, HIDDEN // HEADS, feature_map="favor", causal=True)},
        None,
    ),
}


def decoder_stack(arguments, num_layers=2, seed=0):
    """`num_layers` built decoders with every weight random (biases, norms and bias tables included)."""
    rng = np.random.default_rng(seed)
    stack = []
    for _ in range(num_layers):
        decoder = TransformerDecoder(intermediate_dim=16, num_heads=HEADS, **arguments())
        decoder.build((None, None, HIDDEN))
        decoder.set_weights([_random_like(w, rng) for w in decoder.weights])
        stack.append(decoder)
    return stack


def _random_like(weight, rng):
    if "favor" in weight.path or "random_features" in weight.path:
        return np.asarray(weight)  # FAVOR+'s drawn features keep their distribution
    return rng.normal(0.0, 0.5, weight.shape) + weight.path.endswith("gamma")


def sequence(seed=1):
    return np.random.default_rng(seed).standard_normal((BATCH, LENGTH, HIDDEN)).astype("float32")


def full_pass(stack, x):
    for decoder in stack:
        x = decoder(x)
    return x.numpy()


def cached_pass(stack, x, chunks=CHUNKS, step=None):
    """Feeds `x` through the stack in `chunks`, each layer with its cache; the outputs and the caches' shapes."""
    step = step or (lambda decoder, *args, **kwargs: decoder(*args, **kwargs))
    caches = [decoder.initial_self_attention_cache(BATCH, LENGTH) for decoder in stack]
    first_shapes = _shapes(caches)
    outputs, start = [], 0
    for length in chunks:
        h = x[:, start : start + length]
        for i, decoder in enumerate(stack):
            h, caches[i] = step(
                decoder, h, self_attention_cache=caches[i], self_attention_cache_update_index=tf.constant(start)
            )
        assert _shapes(caches) == first_shapes  # no cache grows with the position
        outputs.append(h.numpy())
        start += length
    return np.concatenate(outputs, axis=1), first_shapes


def _shapes(caches):
    return [tuple(tuple(t.shape) for t in tf.nest.flatten(cache)) for cache in caches]


def numpy_stack(stack, x, spec):
    """The float64 NumPy decoder stack: the mask from the pattern's definition, the bias from the paper's formula."""
    positions = np.arange(x.shape[1])
    mask = reference.pattern_allowed(("and", ("causal",), spec), positions, positions)[None, None]
    x = np.asarray(x, np.float64)
    for decoder in stack:
        position_bias = decoder.self_attention.position_bias
        x = reference.transformer_decoder(
            [
                np.asarray(w, np.float64)
                for w in decoder.weights
                if position_bias is None or w.path not in _paths(position_bias)
            ],
            x,
            self_mask=mask,
            self_bias=_numpy_bias(position_bias, positions),
        )
    return x


def _paths(layer):
    return {w.path for w in layer.weights}


def _numpy_bias(position_bias, positions):
    if position_bias is None:
        return None
    if isinstance(position_bias, ALiBi):
        return reference.alibi_bias(HEADS, positions, positions)
    return reference.relative_position_bias(
        position_bias.weights[0].numpy(), positions, positions, bidirectional=False, max_distance=10
    )


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_cached_decoding_equals_the_full_recompute_token_by_token(family):
    arguments, spec = FAMILIES[family]
    stack, x = decoder_stack(arguments), sequence()
    full = full_pass(stack, x)
    cached, _ = cached_pass(stack, x)
    np.testing.assert_allclose(cached, full, atol=ATOL)
    if spec is not None:
        np.testing.assert_allclose(full, numpy_stack(stack, x, spec), atol=ATOL)


@pytest.mark.parametrize("family", ["window", "window_alibi", "window_t5", "window_block_local", "window_hard"])
def test_a_window_cache_is_a_ring_buffer_whose_size_does_not_grow(family):
    stack = decoder_stack(FAMILIES[family][0])
    window = stack[0].self_attention.sliding_window
    for max_length in (LENGTH, 256, 8192):
        cache = stack[0].initial_self_attention_cache(BATCH, max_length)
        assert tuple(cache.shape) == (BATCH, 2, window, HEADS, HIDDEN // HEADS)
    _, shapes = cached_pass(stack, sequence())
    assert shapes == [((BATCH, 2, window, HEADS, HIDDEN // HEADS),)] * len(stack)


def test_a_window_cache_from_tensor_sizes_in_a_graph_has_the_window_slots():
    """Beam search makes its caches inside a graph, from a batch known only when it runs."""
    decoder = decoder_stack(FAMILIES["window"][0], num_layers=1)[0]
    make = tf.function(lambda batch, length: decoder.initial_self_attention_cache(batch * 1, length * 1))
    cache = make(tf.constant(BATCH), tf.constant(8192))
    assert tuple(cache.shape) == (BATCH, 2, WINDOW, HEADS, HIDDEN // HEADS)


def test_linear_attention_state_does_not_depend_on_max_length():
    stack = decoder_stack(FAMILIES["linear"][0])
    shapes = {_shapes([stack[0].initial_self_attention_cache(BATCH, n)])[0] for n in (LENGTH, 8192)}
    assert len(shapes) == 1


def test_the_ring_buffer_holds_each_slot_newest_position():
    """After decoding every token, slot `p % W` holds the key and value of the newest position `p` of its class."""
    x = sequence(2)
    layer = MultiHeadAttention(HEADS, HIDDEN // HEADS, sliding_window=WINDOW)
    layer(x, use_causal_mask=True)
    cache, start = layer.initial_cache(BATCH, LENGTH), 0
    for length in CHUNKS:
        _, cache = layer(x[:, start : start + length], use_causal_mask=True, cache=cache, cache_update_index=start)
        start += length
    keys, values = layer.key_dense(x).numpy(), layer.value_dense(x).numpy()  # (batch, length, heads, key_dim)
    for position in range(LENGTH - WINDOW, LENGTH):
        np.testing.assert_allclose(cache[:, 0, position % WINDOW], keys[:, position], atol=1e-6)
        np.testing.assert_allclose(cache[:, 1, position % WINDOW], values[:, position], atol=1e-6)


@pytest.mark.parametrize("family", ["window_alibi", "window_block_local"])
def test_window_decoding_compiled_with_xla_and_a_tensor_index(family):
    stack, x = decoder_stack(FAMILIES[family][0]), sequence(3)
    compiled = {id(decoder): tf.function(decoder.__call__, jit_compile=True) for decoder in stack}
    cached, _ = cached_pass(
        stack, x, chunks=(1,) * LENGTH, step=lambda decoder, *a, **k: compiled[id(decoder)](*a, **k)
    )
    np.testing.assert_allclose(cached, full_pass(stack, x), atol=ATOL)


@pytest.mark.parametrize("name", sorted(REGISTERED_FAMILIES))
def test_a_family_that_cannot_decode_incrementally_says_why(name):
    capabilities = REGISTERED_FAMILIES[name].capabilities
    assert capabilities.cache in ("key_value", "recurrent") or capabilities.why_not("cache")
    if capabilities.cache is None and capabilities.causal:  # a decoder asking it for a cache quotes the reason
        decoder = TransformerDecoder(
            16, HEADS, self_attention=REGISTERED_FAMILIES[name](HEADS, HIDDEN // HEADS, causal=True)
        )
        decoder.build((None, None, HIDDEN))
        with pytest.raises(ValueError, match=rf"does not support cache .*{capabilities.why_not('cache')[:20]}"):
            decoder.initial_self_attention_cache(BATCH, LENGTH)


def _window_layer():
    x = sequence(4)
    layer = MultiHeadAttention(HEADS, HIDDEN // HEADS, sliding_window=WINDOW)
    layer(x, use_causal_mask=True)
    return layer, x[:, :1], layer.initial_cache(BATCH, LENGTH)


@pytest.mark.parametrize(
    "arguments, message",
    [
        ({"use_causal_mask": False}, r"use_causal_mask=False"),
        ({"value_mask": np.ones((BATCH, 7), bool)}, r"value_mask.shape=\(2, 7\)"),
        ({"cache_update_index": -1}, r"cache_update_index=-1"),
        ({"cache_update_index": 2.0}, r"cache_update_index=2.0"),
    ],
)
def test_bad_window_cache_calls_raise_naming_the_argument(arguments, message):
    layer, token, cache = _window_layer()
    call = {"use_causal_mask": True, "cache": cache, "cache_update_index": 5, **arguments}
    with pytest.raises(ValueError, match=message):
        layer(token, **call)


@pytest.mark.parametrize(
    "shape",
    [
        (BATCH + 1, 2, WINDOW, HEADS, HIDDEN // HEADS),
        (BATCH, 2, WINDOW, HEADS + 1, HIDDEN // HEADS),
        (BATCH, 2, WINDOW, HEADS),
    ],
)
def test_a_window_cache_of_the_wrong_shape_is_refused(shape):
    layer, token, _ = _window_layer()
    with pytest.raises(ValueError, match=r"cache.shape=" + re_shape(shape)):
        layer(token, use_causal_mask=True, cache=np.zeros(shape, "float32"), cache_update_index=5)


def re_shape(shape):
    return r"\(" + ", ".join(map(str, shape)) + r"\)"


@pytest.mark.parametrize("name, value", [("batch_size", 0), ("max_length", -3), ("max_length", 2.5)])
def test_initial_cache_names_a_bad_size(name, value):
    layer, _, _ = _window_layer()
    sizes = {"batch_size": BATCH, "max_length": LENGTH, name: value}
    with pytest.raises(ValueError, match=rf"{name}={value}"):
        layer.initial_cache(**sizes)
