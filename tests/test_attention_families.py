"""Every attention family of the registry through the one call convention (issue #23, items 1-2).

Parametrised over `keras_attn.attention_families.FAMILIES` and what each family's `capabilities`
declare: every family x {self, cross where supported, causal where supported} x {padding mask,
none} x {float32, mixed_float16}. Each case builds the family by name, calls it the Keras way with
`return_attention_scores=True` and checks the output and the scores against the family's float64
NumPy reference (scores over the allowed keys summing to 1, zero elsewhere, the output equal to the
scores times the values); then puts it in `TransformerEncoder` (self) or `TransformerDecoder`
(causal) against the float64 wiring of the block around that reference, and round-trips the block
through a `.keras` file; the scores also eager = graph = XLA. Cached decoding (issue #23 item 3) is not
covered here.
"""

import keras
import numpy as np
import pytest

import keras_attn
from keras_attn import attention_families
from keras_attn.attention_families import FAMILIES
from keras_attn.layers.capabilities import AttentionCapabilities
from tests import reference
from tests.layer_checks import MIXED_PRECISION_TOLERANCES
from tests.layer_checks import assert_jit_matches_eager
from tests.layer_checks import assert_serialization_round_trip
from tests.test_linear_attention import _reference as linear_reference
from tests.test_linformer_attention import _reference as linformer_reference
from tests.test_lsh_attention import _reference as lsh_reference

HEADS, HIDDEN, LENGTH, CONTEXT = 2, 6, 9, 5
ARGUMENTS = {  # beyond num_heads and key_dim; nothing says causal: that is the call's use_causal_mask
    "dense": dict(),
    "lsh": dict(num_buckets=4, num_hashes=2, chunk_size=3, seed=5),
    "linformer": dict(max_length=12, projected_length=5, seed=3),
    "linear": dict(chunk_size=4, seed=7),
}
QUERY_PADDING = np.arange(LENGTH)[None, :] < np.array([[LENGTH], [6]])
CONTEXT_PADDING = np.arange(CONTEXT)[None, :] < np.array([[3], [CONTEXT]])
ATOL = {"float32": 1e-4, **MIXED_PRECISION_TOLERANCES}


def _modes(name):
    capabilities = FAMILIES[name].capabilities
    return ["self"] + ["cross"] * capabilities.cross + ["causal"] * capabilities.causal


CASES = [
    (name, mode, padded, policy)
    for name in FAMILIES
    for mode in _modes(name)
    for padded in (True, False)
    for policy in ("float32", "mixed_float16")
]


def _family(name, policy="float32"):
    return attention_families.build(
        name, num_heads=HEADS, key_dim=4, bias_initializer="random_normal", dtype=policy, **ARGUMENTS[name]
    )


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((2, LENGTH, HIDDEN)).astype("float32"), rng.standard_normal((2, CONTEXT, 5)).astype(
        "float32"
    )


def _float64_reference(name, layer, query, padding, causal, context=None, context_padding=None):
    """`(output, scores)` of the family in float64 NumPy from `layer`'s weights."""
    if name == "dense":
        key_padding = padding if context is None else context_padding
        return reference.multi_head_attention(
            layer.get_weights(),
            query,
            query if context is None else context,
            mask=reference.padding_attention_mask(padding, key_padding),
            is_causal=causal,
        )
    if name == "lsh":
        return lsh_reference(layer, query, padding, is_causal=causal, return_weights=True)
    if name == "linformer":
        return linformer_reference(layer, query, padding, return_weights=True)
    return linear_reference(layer, query, padding, is_causal=causal, return_weights=True)


def _allowed(scores_shape, query_real, key_real, causal):
    """Which entries of `(batch, heads, query, key)` scores may be non-zero."""
    allowed = query_real[:, None, :, None] & key_real[:, None, None, :]
    if causal:
        allowed = allowed & np.tril(np.ones(scores_shape[-2:], bool))
    return np.broadcast_to(allowed, scores_shape)


def test_registry_builds_each_family_by_name_with_its_declared_capabilities():
    assert set(FAMILIES) == {"dense", "lsh", "linformer", "linear"}
    for name, family in FAMILIES.items():
        assert isinstance(family.capabilities, AttentionCapabilities) and family.capabilities.scores
        assert type(_family(name)) is family
    with pytest.raises(ValueError, match=r"`name` must be one of .* Received: name='nope'"):
        attention_families.build("nope")


def test_the_families_guide_shows_the_declared_capabilities():
    guide = keras_attn.__file__.rsplit("/", 2)[0] + "/docs/guides/attention_families.md"
    with open(guide, encoding="utf-8") as handle:
        assert attention_families.capabilities_table() in handle.read()


@pytest.mark.parametrize("name,mode,padded,policy", CASES)
def test_family_through_the_one_convention(name, mode, padded, policy):
    x, context = _inputs()
    causal, cross = mode == "causal", mode == "cross"
    padding = QUERY_PADDING if padded else None
    context_padding = CONTEXT_PADDING if padded and cross else None
    layer = _family(name, policy)
    masks = dict(query_mask=padding, value_mask=context_padding if cross else padding)
    output, scores = layer(x, context if cross else None, use_causal_mask=causal, return_attention_scores=True, **masks)
    expected, expected_scores = _float64_reference(
        name,
        layer,
        x.astype(np.float64),
        padding,
        causal,
        context.astype(np.float64) if cross else None,
        context_padding,
    )
    output, scores = (np.asarray(keras.ops.convert_to_numpy(t), np.float64) for t in (output, scores))
    np.testing.assert_allclose(output, expected, atol=ATOL[policy], err_msg="output")
    np.testing.assert_allclose(scores, expected_scores, atol=ATOL[policy], err_msg="scores")

    # Scores: zero outside the allowed keys, each real row summing to 1 (LSH: over its buckets).
    query_real = np.ones((2, LENGTH), bool) if padding is None else padding
    key_len = scores.shape[-1]
    key_real = (
        np.ones((2, key_len), bool) if name == "linformer" or masks["value_mask"] is None else masks["value_mask"]
    )
    allowed = _allowed(scores.shape, query_real, key_real, causal)
    assert np.all(scores[~allowed] == 0)
    sums = scores.sum(-1)  # (batch, heads, query)
    np.testing.assert_allclose(sums[np.broadcast_to(query_real[:, None], sums.shape)], 1.0, atol=ATOL[policy])


@pytest.mark.parametrize("name,causal", [(n, m == "causal") for n in FAMILIES for m in _modes(n) if m != "cross"])
def test_output_is_the_scores_times_the_values(name, causal):
    """What `return_attention_scores` returns is what the output is made of: `W (scores @ V) + b`, 0 on padded rows."""
    x, _ = _inputs(1)
    layer = _family(name)
    output, scores = layer(
        x, query_mask=QUERY_PADDING, value_mask=QUERY_PADDING, use_causal_mask=causal, return_attention_scores=True
    )
    weights = {w.path.split("/", 1)[1]: np.asarray(w.numpy(), np.float64) for w in layer.weights}
    value = reference.project_heads(x, weights["value/kernel"], weights["value/bias"])  # (batch, seq, heads, value_dim)
    if name == "linformer":  # the values projected along the length, real tokens first
        value = np.stack(
            [
                weights["value_length_projection"][: QUERY_PADDING[b].sum()].T
                @ value[b, QUERY_PADDING[b]].reshape(QUERY_PADDING[b].sum(), -1)
                for b in range(2)
            ]
        ).reshape(2, -1, HEADS, value.shape[-1])
    attended = np.einsum("bhqk,bkhd->bqhd", np.asarray(scores, np.float64), value)
    kernel = weights["attention_output/kernel"]
    expected = reference.merge_heads(attended, kernel, weights["attention_output/bias"], rows=QUERY_PADDING)
    np.testing.assert_allclose(np.asarray(output), expected, atol=2e-5)


@pytest.mark.parametrize("name,causal", [(n, m == "causal") for n in FAMILIES for m in _modes(n) if m != "cross"])
def test_scores_are_the_same_eager_in_a_graph_and_under_xla(name, causal):
    x, _ = _inputs(3)
    layer = _family(name)
    assert_jit_matches_eager(
        layer,
        x,
        query_mask=QUERY_PADDING,
        value_mask=QUERY_PADDING,
        use_causal_mask=causal,
        return_attention_scores=True,
    )


def _random_block(block, seed=0):
    rng = np.random.default_rng(seed)
    for weight in block.trainable_weights:
        weight.assign(rng.normal(0.0, 0.5, weight.shape) + weight.path.endswith("gamma"))
    return block


def _block_reference(name, block, x, padding, causal):
    """The post-norm block in float64 around the family's float64 reference."""
    norm1, ffn, norm2 = (lambda w: (w[:2], w[2:6], w[6:]))(
        [np.asarray(w, np.float64) for w in block.get_weights()[-8:]]
    )
    attention = type(block.self_attention).from_config(block.self_attention.get_config())  # its weight paths unnested
    attention.build(x.shape)
    attention.set_weights(block.self_attention.get_weights())
    attend = lambda h: _float64_reference(name, attention, h, padding, causal)[0]  # noqa: E731
    h = reference.residual_block(reference.without_padding(x, padding), attend, *norm1, 1e-5, False)
    return reference.residual_block(h, lambda h: reference.feed_forward(h, *ffn), *norm2, 1e-5, False)


BLOCK_CASES = [case for case in CASES if case[1] != "cross"]


@pytest.mark.parametrize("name,mode,padded,policy", BLOCK_CASES)
def test_family_in_its_block_against_float64_and_through_a_keras_file(name, mode, padded, policy):
    x, _ = _inputs(2)
    causal = mode == "causal"
    padding = QUERY_PADDING if padded else None
    block_class = keras_attn.TransformerDecoder if causal else keras_attn.TransformerEncoder
    block = block_class(16, HEADS, self_attention=_family(name), dtype=policy)
    block.build((None, None, HIDDEN))
    _random_block(block)
    assert type(block.self_attention) is FAMILIES[name]
    mask_argument = "decoder_padding_mask" if causal else "padding_mask"
    output = block(x, **{mask_argument: padding})
    expected = _block_reference(name, block, x, padding, causal)
    np.testing.assert_allclose(np.asarray(output, np.float64), expected, atol=10 * ATOL[policy])

    inputs = keras.Input((None, HIDDEN))
    mask = keras.Input((None,), dtype="bool")
    model = keras.Model([inputs, mask], block(inputs, **{mask_argument: mask}))
    real = np.ones((2, LENGTH), bool) if padding is None else padding
    assert_serialization_round_trip(model, [x, real], atol=1e-6 if policy == "float32" else 1e-3)


def test_each_family_refuses_what_its_capabilities_exclude_naming_it():
    x, context = _inputs()
    for name, family in FAMILIES.items():
        capabilities, layer = family.capabilities, _family(name)
        if not capabilities.cross:
            with pytest.raises(
                ValueError, match=rf"{family.__name__} does not support cross .*value.shape=\(2, 5, 5\)"
            ):
                layer(x, context)
        if not capabilities.attention_mask:
            with pytest.raises(ValueError, match=rf"{family.__name__} does not support attention_mask"):
                layer(x, attention_mask=np.ones((2, LENGTH, LENGTH), bool))
        if not capabilities.causal:
            with pytest.raises(ValueError, match=rf"{family.__name__} does not support causal .* cannot be causal"):
                layer(x, use_causal_mask=True)
        if capabilities.cache is None:
            with pytest.raises(ValueError, match=rf"{family.__name__} does not support cache"):
                layer(x, cache=(np.zeros((2, 1)),))


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_keras_mask_reaches_every_family_and_propagates(name):
    """The Keras mask of `query` is the padding mask when none is given, and the output keeps it."""
    tokens = np.array([[3, 4, 5, 6, 0, 0], [1, 2, 0, 0, 0, 0]])
    embedded = keras.layers.Embedding(8, HIDDEN, mask_zero=True)(tokens)
    layer = _family(name)
    implicit = layer(embedded)
    explicit = layer(keras.ops.copy(embedded), query_mask=tokens != 0, value_mask=tokens != 0)
    np.testing.assert_allclose(implicit, explicit, atol=1e-6)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(implicit._keras_mask), tokens != 0)
