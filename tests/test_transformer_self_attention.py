"""TransformerEncoder / TransformerDecoder with another self-attention layer (`self_attention=`).

The oracle: the same layer, standalone, with the block's weights copied in, wired by hand into
the block's float64 residual / layer-norm / feed-forward reference (`tests/reference.py`).
"""

import keras
import numpy as np
import pytest

from keras_attn import LinearAttention
from keras_attn import LinformerSelfAttention
from keras_attn import LSHSelfAttention
from keras_attn import MultiHeadAttention
from keras_attn import TokenAndPositionEmbedding
from keras_attn import TransformerDecoder
from keras_attn import TransformerEncoder
from tests import layer_checks
from tests import reference
from tests.layer_checks import run_layer_test

BATCH, LENGTH, HIDDEN, HEADS = 2, 9, 8, 2
PADDING = np.arange(LENGTH)[None, :] < np.array([LENGTH, 5])[:, None]  # (batch, seq)
TOKEN_IDS = np.where(PADDING, np.arange(1, LENGTH + 1)[None, :], 0).astype("int32")


def lsh(causal=False):
    return LSHSelfAttention(HEADS, 4, num_buckets=2, num_hashes=2, chunk_size=3, causal=causal, seed=3)


def linformer():
    return LinformerSelfAttention(HEADS, 4, max_length=16, projected_length=4, seed=3)


def linear(feature_map="elu", causal=False):
    return LinearAttention(HEADS, 4, feature_map=feature_map, causal=causal, chunk_size=4, seed=3)


ENCODER_FAMILIES = {
    "lsh": lsh,
    "linformer": linformer,
    "linear_elu": linear,
    "favor": lambda: linear("favor"),
}
DECODER_FAMILIES = {
    "lsh_causal": lambda: lsh(causal=True),
    "linear_elu_causal": lambda: linear(causal=True),
    "favor_causal": lambda: linear("favor", causal=True),
}


def random_inputs(seed=0, length=LENGTH):
    return np.random.default_rng(seed).standard_normal((BATCH, length, HIDDEN)).astype("float32")


def built_block(block_class, prototype, seed=0, build_shapes=((None, None, HIDDEN),), **kwargs):
    """A block around `prototype` with every trainable weight random (biases and norms included)."""
    block = block_class(intermediate_dim=16, num_heads=HEADS, self_attention=prototype, **kwargs)
    block.build(*build_shapes)
    rng = np.random.default_rng(seed)
    for weight in block.trainable_weights:
        weight.assign(rng.normal(0.0, 0.5, weight.shape) + weight.path.endswith("gamma"))
    return block


def by_hand(block, prototype, x, padding, norm_first):
    """The block's float64 wiring around a standalone copy of `prototype` holding the block's attention weights."""
    attention = type(prototype).from_config(prototype.get_config())
    attention.build(x.shape)
    attention.set_weights(block.self_attention.get_weights())
    weights = [np.asarray(w, np.float64) for w in block.get_weights()[-8:]]
    norm1, ffn, norm2 = weights[:2], weights[2:6], weights[6:]

    def attend(h):
        return np.asarray(attention(h.astype("float32"), query_mask=padding, value_mask=padding), np.float64)

    h = reference.residual_block(reference.without_padding(x, padding), attend, *norm1, 1e-5, norm_first)
    return reference.residual_block(h, lambda h: reference.feed_forward(h, *ffn), *norm2, 1e-5, norm_first)


# Float32 attention inside a float64 wiring; LSH runs post-norm only: its hashing of a float32 and
# a float64 layer norm of the same input could differ.
@pytest.mark.parametrize(
    "family,norm_first",
    [(name, nf) for name in ENCODER_FAMILIES for nf in (False, True) if (name, nf) != ("lsh", True)],
)
def test_encoder_equals_the_layer_wired_by_hand(family, norm_first):
    x = random_inputs(1)
    prototype = ENCODER_FAMILIES[family]()
    encoder = built_block(TransformerEncoder, prototype, norm_first=norm_first)
    assert type(encoder.self_attention) is type(prototype) and encoder.self_attention is not prototype
    got = encoder(x, padding_mask=PADDING)
    np.testing.assert_allclose(got, by_hand(encoder, prototype, x, PADDING, norm_first), atol=1e-4)


@pytest.mark.parametrize("family", sorted(DECODER_FAMILIES))
def test_decoder_equals_the_causal_layer_wired_by_hand(family):
    x = random_inputs(2)
    prototype = DECODER_FAMILIES[family]()
    decoder = built_block(TransformerDecoder, prototype, seed=1)
    np.testing.assert_allclose(
        decoder(x, decoder_padding_mask=PADDING), by_hand(decoder, prototype, x, PADDING, False), atol=1e-4
    )
    changed = x.copy()
    changed[:, 6:] = 50.0  # future tokens never change earlier outputs
    np.testing.assert_allclose(decoder(changed)[:, :6], decoder(x)[:, :6], atol=1e-5)


def test_each_block_has_its_own_weights_and_the_block_dtype():
    prototype = linear("favor")
    first, second = (
        TransformerEncoder(16, HEADS, self_attention=prototype),
        TransformerEncoder(16, HEADS, self_attention=prototype),
    )
    first.build((None, None, HIDDEN)), second.build((None, None, HIDDEN))
    assert first.self_attention is not second.self_attention
    kernels = [block.self_attention.query_dense.kernel.numpy() for block in (first, second)]
    assert not np.allclose(*kernels)  # unseeded initializers: each copy draws its own
    # The prototype's seed is copied: the same random features in every block (documented).
    np.testing.assert_array_equal(first.self_attention.random_features, second.self_attention.random_features)
    assert not prototype.built  # the prototype itself is never built nor used
    keras.config.set_dtype_policy("mixed_bfloat16")
    mixed = TransformerEncoder(16, HEADS, self_attention=prototype)
    mixed.build((None, None, HIDDEN))
    assert mixed.self_attention.dtype_policy.name == "mixed_bfloat16"


@pytest.mark.parametrize("family", sorted(ENCODER_FAMILIES) + sorted(DECODER_FAMILIES))
def test_padded_content_and_appended_padding_never_change_real_outputs(family):
    families = {**ENCODER_FAMILIES, **DECODER_FAMILIES}
    block_class = TransformerDecoder if family in DECODER_FAMILIES else TransformerEncoder
    block = built_block(block_class, families[family](), norm_first=True)
    x = random_inputs(3)
    clean = np.asarray(
        block(x, PADDING) if block_class is TransformerEncoder else block(x, decoder_padding_mask=PADDING)
    )
    polluted = np.where(PADDING[..., None], x, 40.0).astype("float32")
    longer = np.concatenate([x, np.ones((BATCH, 3, HIDDEN), "float32")], axis=1)
    longer_padding = np.concatenate([PADDING, np.zeros((BATCH, 3), bool)], axis=1)
    if block_class is TransformerEncoder:
        dirty, appended = block(polluted, PADDING), block(longer, longer_padding)
    else:
        dirty, appended = (
            block(polluted, decoder_padding_mask=PADDING),
            block(longer, decoder_padding_mask=longer_padding),
        )
    np.testing.assert_allclose(np.asarray(dirty)[PADDING], clean[PADDING], atol=1e-5)
    np.testing.assert_allclose(np.asarray(appended)[:, :LENGTH][PADDING], clean[PADDING], atol=1e-5)


def masked_model(prototype, block_class=TransformerEncoder):
    ids = keras.Input((None,), dtype="int32")
    embedded = TokenAndPositionEmbedding(20, 16, HIDDEN, embeddings_initializer="random_normal")(ids)
    encoded = block_class(16, HEADS, self_attention=prototype, dropout=0.1)(embedded)
    pooled = keras.layers.GlobalAveragePooling1D()(encoded)
    return keras.Model(ids, [embedded, encoded, keras.layers.Dense(2)(pooled)])


@pytest.mark.parametrize("family", sorted(ENCODER_FAMILIES))
def test_keras_mask_is_the_padding_mask_and_the_model_round_trips(family):
    model = masked_model(ENCODER_FAMILIES[family]())
    embedded, encoded, _ = model(TOKEN_IDS)
    explicit = model.layers[2](embedded, padding_mask=PADDING)
    np.testing.assert_allclose(encoded, explicit, atol=1e-6)
    np.testing.assert_array_equal(encoded._keras_mask, PADDING)
    reloaded = layer_checks.assert_serialization_round_trip(model, TOKEN_IDS)
    block = reloaded.layers[2]
    assert type(block.self_attention) is type(model.layers[2].self_attention)
    assert block.get_config()["self_attention"] == model.layers[2].get_config()["self_attention"]


def test_decoder_round_trips_and_decodes_with_the_recurrent_state():
    model = masked_model(linear("favor", causal=True), TransformerDecoder)
    layer_checks.assert_serialization_round_trip(model, TOKEN_IDS)
    # With cross-attention: the recurrent state is the self-attention cache, step by step.
    decoder = built_block(TransformerDecoder, linear(causal=True), seed=2, build_shapes=((None, None, HIDDEN),) * 2)
    target, source = random_inputs(4), random_inputs(5, length=4)
    full = decoder(target, source)
    cache = decoder.initial_self_attention_cache(BATCH, max_length=LENGTH)
    cross = decoder.compute_cross_attention_cache(source)
    shapes = keras.tree.map_structure(lambda c: tuple(c.shape), cache)
    steps = []
    for start, stop in ((0, 4), (4, 5), (5, LENGTH)):  # a prompt, one token, the rest
        output, cache, cross = decoder(target[:, start:stop], self_attention_cache=cache, cross_attention_cache=cross)
        steps.append(np.asarray(output))
        assert keras.tree.map_structure(lambda c: tuple(c.shape), cache) == shapes  # constant memory
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=1e-5)


def test_multi_head_attention_prototype_keeps_every_call_option():
    default = TransformerEncoder(16, HEADS)
    given = TransformerEncoder(16, HEADS, self_attention=MultiHeadAttention(HEADS, HIDDEN // HEADS))
    x = random_inputs(6)
    default(x), given(x)
    given.set_weights(default.get_weights())
    attention_mask = np.tril(np.ones((LENGTH, LENGTH), bool))[None]
    expected = default(x, padding_mask=PADDING, attention_mask=attention_mask, return_attention_scores=True)
    got = given(x, padding_mask=PADDING, attention_mask=attention_mask, return_attention_scores=True)
    layer_checks.assert_outputs_close(got, expected, atol=1e-6)


def test_decoder_refuses_a_family_that_cannot_be_causal_saying_why():
    with pytest.raises(
        ValueError, match=r"LinformerSelfAttention does not support causal .*cannot be causal: each of its"
    ):
        TransformerDecoder(16, HEADS, self_attention=linformer())


@pytest.mark.parametrize("prototype", [lambda causal: linear(causal=causal), lambda causal: lsh(causal=causal)])
def test_decoder_makes_a_family_built_non_causal_causal_by_use_causal_mask(prototype):
    """The decoder calls every family with `use_causal_mask=True`: one built `causal=False` runs causally."""
    x = random_inputs(3)
    given, built_causal = (built_block(TransformerDecoder, prototype(causal), seed=2) for causal in (False, True))
    np.testing.assert_allclose(
        given(x, decoder_padding_mask=PADDING), built_causal(x, decoder_padding_mask=PADDING), atol=1e-6
    )


def test_unsupported_options_raise_naming_them():
    x = random_inputs()
    with pytest.raises(TypeError, match="self_attention="):
        TransformerEncoder(16, HEADS, self_attention=LinearAttention)
    with pytest.raises(ValueError, match=r"num_heads=4, LinearAttention.num_heads=2"):
        TransformerEncoder(16, 4, self_attention=linear())
    with pytest.raises(ValueError, match="`sliding_window`"):
        TransformerDecoder(16, HEADS, sliding_window=4, self_attention=linear(causal=True))
    with pytest.raises(ValueError, match="`key_dim`"):
        TransformerEncoder(16, HEADS, key_dim=4, self_attention=linear())
    encoder = TransformerEncoder(16, HEADS, self_attention=linear())
    with pytest.raises(
        ValueError,
        match=r"LinearAttention does not support attention_mask .* Received: attention_mask.shape=\(2, 9, 9\)",
    ):
        encoder(x, attention_mask=np.ones((BATCH, LENGTH, LENGTH), bool))
    decoder = TransformerDecoder(16, HEADS, self_attention=lsh(causal=True))
    with pytest.raises(ValueError, match="LSHSelfAttention was built causal.*use_causal_mask=False"):
        decoder(x, use_causal_mask=False)
    with pytest.raises(ValueError, match="LSHSelfAttention does not support cache .*capabilities declare cache=None"):
        decoder.initial_self_attention_cache(BATCH, LENGTH)


LAYER_TESTS = {
    "encoder_lsh": (TransformerEncoder, lsh, 1),
    "encoder_linformer": (TransformerEncoder, linformer, 0),
    "encoder_linear_elu": (TransformerEncoder, linear, 0),
    "encoder_favor": (TransformerEncoder, lambda: linear("favor"), 1),
    "decoder_lsh_causal": (TransformerDecoder, lambda: lsh(causal=True), 1),
    "decoder_linear_elu_causal": (TransformerDecoder, lambda: linear(causal=True), 0),
}


@pytest.mark.parametrize("name", sorted(LAYER_TESTS))
def test_layer_contract(name):
    block_class, prototype, non_trainable = LAYER_TESTS[name]
    run_layer_test(
        block_class,
        dict(intermediate_dim=16, num_heads=HEADS, self_attention=prototype()),
        random_inputs(7, length=6),
        expected_num_non_trainable_weights=non_trainable,
    )
