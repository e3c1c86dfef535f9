import keras
import numpy as np
import pytest

from keras_attn import MultiHeadAttention
from keras_attn import TokenAndPositionEmbedding
from keras_attn import TransformerEncoder
from keras_attn.patterns import BlockLocal
from keras_attn.patterns import GlobalTokens
from keras_attn.patterns import SlidingWindow
from keras_attn.patterns import Strided
from tests import layer_checks
from tests import reference
from tests.dispatch_rule import prefer_kernel
from tests.layer_checks import run_layer_test

BATCH, LENGTH, HIDDEN = 3, 6, 8
PADDING = np.arange(LENGTH)[None, :] < np.array([LENGTH, 4, 1])[:, None]  # (batch, seq)


def random_inputs(seed=0):
    return np.random.default_rng(seed).standard_normal((BATCH, LENGTH, HIDDEN)).astype("float32")


def built_encoder(seed=0, **kwargs):
    """An encoder with every weight random (biases and norms included), so each one matters."""
    kwargs = {"intermediate_dim": 16, "num_heads": 2, **kwargs}
    encoder = TransformerEncoder(**kwargs)
    encoder.build((None, None, HIDDEN))
    rng = np.random.default_rng(seed)
    encoder.set_weights([rng.normal(0.0, 0.5, w.shape) + (w.path.endswith("gamma")) for w in encoder.weights])
    return encoder


def numpy_weights(layer):
    return [np.asarray(w, np.float64) for w in layer.get_weights()]


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("masks", ["none", "padding", "padding+attention"])
def test_matches_numpy_reference(norm_first, masks):
    inputs = random_inputs()
    encoder = built_encoder(norm_first=norm_first)
    padding = None if masks == "none" else PADDING
    attention = None
    if masks == "padding+attention":
        attention = np.random.default_rng(1).random((BATCH, LENGTH, LENGTH)) < 0.7
    got = encoder(inputs, padding_mask=padding, attention_mask=attention)
    mask = reference.padding_attention_mask(padding, padding)
    if attention is not None:
        mask = mask & attention[:, None]
    expected = reference.transformer_encoder(
        numpy_weights(encoder), inputs, mask=mask, norm_first=norm_first, padding=padding
    )
    np.testing.assert_allclose(keras.ops.convert_to_numpy(got), expected, atol=1e-5)


def test_grouped_query_heads_sliding_window_and_key_dim_match_reference():
    inputs = random_inputs(2)
    encoder = built_encoder(num_heads=4, num_key_value_heads=2, key_dim=3, sliding_window=2, norm_first=True)
    expected = reference.transformer_encoder(
        numpy_weights(encoder),
        inputs,
        mask=reference.padding_attention_mask(PADDING, PADDING),
        norm_first=True,
        sliding_window=2,
        padding=PADDING,
    )
    got = encoder(inputs, padding_mask=PADDING)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(got), expected, atol=1e-5)


@pytest.mark.parametrize("norm_first", [False, True])
def test_padded_positions_never_change_real_outputs(norm_first):
    encoder = built_encoder(norm_first=norm_first)
    inputs = random_inputs(3)
    polluted = np.where(PADDING[..., None], inputs, 100.0 * random_inputs(4)).astype("float32")
    clean = keras.ops.convert_to_numpy(encoder(inputs, padding_mask=PADDING))
    dirty = keras.ops.convert_to_numpy(encoder(polluted, padding_mask=PADDING))
    # The block reads padded rows as zeros: no output depends on what they held (issue #40).
    np.testing.assert_allclose(dirty, clean, atol=1e-6)


def keras_masked_model(norm_first=False, **kwargs):
    ids = keras.Input((None,), dtype="int32")
    embedded = TokenAndPositionEmbedding(20, 16, HIDDEN, embeddings_initializer="random_normal")(ids)
    encoded = TransformerEncoder(16, 2, norm_first=norm_first, **kwargs)(embedded)
    return keras.Model(ids, [embedded, encoded])


TOKEN_IDS = np.where(PADDING, np.arange(1, LENGTH + 1)[None, :], 0).astype("int32")


def test_keras_mask_is_the_padding_mask_and_is_kept():
    model = keras_masked_model()
    embedded, encoded = model(TOKEN_IDS)
    encoder = model.layers[-1]
    explicit = encoder(embedded, padding_mask=PADDING)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(encoded), keras.ops.convert_to_numpy(explicit), atol=1e-6)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(encoded._keras_mask), PADDING)
    # An explicit padding mask wins over the Keras mask.
    all_real = np.ones_like(PADDING)
    overridden = encoder(embedded, padding_mask=all_real)
    unmasked = encoder(keras.ops.convert_to_tensor(keras.ops.convert_to_numpy(embedded)))
    np.testing.assert_allclose(keras.ops.convert_to_numpy(overridden), keras.ops.convert_to_numpy(unmasked), atol=1e-6)


def test_return_attention_scores_never_attend_to_padding():
    encoder = built_encoder()
    output, scores = encoder(random_inputs(), padding_mask=PADDING, return_attention_scores=True)
    scores = keras.ops.convert_to_numpy(scores)
    assert output.shape == (BATCH, LENGTH, HIDDEN) and scores.shape == (BATCH, 2, LENGTH, LENGTH)
    np.testing.assert_array_equal(scores * ~reference.padding_attention_mask(PADDING, PADDING), 0.0)
    np.testing.assert_allclose(scores.sum(-1)[np.broadcast_to(PADDING[:, None], (BATCH, 2, LENGTH))], 1.0, atol=1e-6)


def test_dropout_only_when_training():
    encoder = built_encoder(dropout=0.3)
    inputs = random_inputs()
    expected = reference.transformer_encoder(numpy_weights(encoder), inputs)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(encoder(inputs, training=False)), expected, atol=1e-5)
    assert not np.allclose(keras.ops.convert_to_numpy(encoder(inputs, training=True)), expected, atol=1e-3)


def classifier_factory(norm_first=False):
    def factory():
        ids = keras.Input((None,), dtype="int32")
        embedded = TokenAndPositionEmbedding(20, 16, HIDDEN)(ids)
        encoded = TransformerEncoder(16, 2, norm_first=norm_first, dropout=0.1)(embedded)
        return keras.Model(ids, keras.layers.Dense(2)(keras.layers.GlobalAveragePooling1D()(encoded)))

    return factory


@pytest.mark.parametrize("norm_first", [False, True])
def test_serialization_mixed_precision_jit_with_masks(norm_first):
    factory = classifier_factory(norm_first)
    layer_checks.assert_serialization_round_trip(factory, TOKEN_IDS)
    layer_checks.assert_mixed_precision_close(factory, TOKEN_IDS)
    layer_checks.assert_jit_matches_eager(factory(), TOKEN_IDS, training=False)
    layer_checks.assert_config_round_trip(
        TransformerEncoder(
            8,
            4,
            key_dim=3,
            dropout=0.1,
            attention_dropout=0.2,
            activation="gelu",
            layer_norm_epsilon=1e-6,
            norm_first=True,
            sliding_window=3,
            num_key_value_heads=2,
            kernel_initializer="he_normal",
            bias_initializer="ones",
        )
    )


def test_gradients_match_finite_differences_and_fit():
    inputs = random_inputs()[:2, :4, :4]
    layer_checks.assert_gradients_match_finite_differences(
        lambda: TransformerEncoder(6, 2, activation="gelu"), inputs, padding_mask=PADDING[:2, :4]
    )
    layer_checks.assert_fit_one_step(
        classifier_factory(norm_first=True)(), TOKEN_IDS, np.zeros((BATCH, 2), "float32"), unchanged_ok=("key/bias",)
    )


def test_bad_arguments_name_the_value():
    with pytest.raises(ValueError, match="hidden size=8, num_heads=3"):
        TransformerEncoder(16, 3)(random_inputs())
    with pytest.raises(ValueError, match="num_heads=0"):
        TransformerEncoder(16, 0)
    with pytest.raises(ValueError, match="intermediate_dim=-4"):
        TransformerEncoder(-4, 2)
    with pytest.raises(ValueError, match="attention_dropout=1.0"):
        TransformerEncoder(16, 2, attention_dropout=1.0)
    with pytest.raises(ValueError, match=r"inputs.shape=\(3, 6\)"):
        TransformerEncoder(16, 2)(np.zeros((3, 6), "float32"))
    with pytest.raises(ValueError, match=r"padding_mask.shape=\(3, 6, 1\)"):
        TransformerEncoder(16, 2)(random_inputs(), padding_mask=PADDING[..., None])


@pytest.mark.parametrize("return_attention_scores", [False, True])
def test_blockwise_attention_runs_where_auto_takes_it_unless_scores_are_asked(
    monkeypatch, tmp_path, return_attention_scores
):
    import keras_attn.kernels.blockwise

    calls = []
    blockwise = keras_attn.kernels.blockwise.blockwise_attention

    def spy(*args, **kwargs):
        calls.append(1)
        return blockwise(*args, **kwargs)

    monkeypatch.setattr(keras_attn.kernels.blockwise, "blockwise_attention", spy)  # the name its `attend` calls
    prefer_kernel(monkeypatch, tmp_path / "blockwise", "blockwise")
    encoder = TransformerEncoder(intermediate_dim=8, num_heads=2)
    inputs = np.random.default_rng(0).normal(size=(1, 16, 4)).astype("float32")
    result = encoder(inputs, return_attention_scores=return_attention_scores)
    assert len(calls) == (0 if return_attention_scores else 1)
    output = result[0] if return_attention_scores else result
    prefer_kernel(monkeypatch, tmp_path / "dense", "dense")
    dense = encoder(inputs)  # the dense path without scores, same weights: an independent pass
    assert len(calls) == (0 if return_attention_scores else 1)
    np.testing.assert_allclose(output, dense, atol=1e-5)


def test_layer_contract():
    rng = np.random.default_rng(19)
    run_layer_test(
        TransformerEncoder,
        dict(intermediate_dim=16, num_heads=2, attention_pattern=BlockLocal(2) | GlobalTokens(1)),
        rng.standard_normal((2, 5, 8)).astype("float32"),
        unchanged_ok=("key/bias",),
    )


def test_attention_pattern_matches_reference_with_the_pattern_as_mask():
    inputs = random_inputs(3)
    encoder = built_encoder(attention_pattern=Strided(3) | SlidingWindow(2), sliding_window=4)
    positions = np.arange(LENGTH)
    allowed = reference.pattern_allowed(("or", ("strided", 3), ("window", 2)), positions, positions)
    expected = reference.transformer_encoder(
        numpy_weights(encoder),
        inputs,
        mask=reference.padding_attention_mask(PADDING, PADDING) & allowed,
        sliding_window=4,
        padding=PADDING,
    )
    np.testing.assert_allclose(keras.ops.convert_to_numpy(encoder(inputs, padding_mask=PADDING)), expected, atol=1e-5)
    rebuilt = TransformerEncoder.from_config(encoder.get_config())
    assert repr(rebuilt.attention_pattern) == repr(Strided(3) | SlidingWindow(2))


@keras.saving.register_keras_serializable(package="keras_attn_tests")
class MeanAttention(MultiHeadAttention):
    """A non-softmax family through the hook: the plain mean of the values of the allowed keys."""

    def _compute_attention(self, query, key, value, attention_mask=None, training=None, return_attention_scores=False):
        batch, query_len, key_len = keras.ops.shape(query)[0], keras.ops.shape(query)[1], keras.ops.shape(key)[1]
        allowed = keras.ops.ones((batch, self.num_heads, query_len, key_len), "bool")
        if attention_mask is not None:
            allowed = keras.ops.logical_and(allowed, attention_mask)  # (batch, heads, query_len, key_len)
        allowed = keras.ops.cast(allowed, value.dtype)
        count = keras.ops.maximum(keras.ops.sum(allowed, axis=-1, keepdims=True), 1)  # (b, h, q, 1)
        weights = allowed / count  # (batch, heads, query_len, key_len); rows without keys are 0
        value = keras.ops.repeat(value, self.num_heads // self.num_key_value_heads, axis=2)
        output = keras.ops.einsum("bhqk,bkhd->bqhd", weights, value)  # (batch, query_len, heads, value_dim)
        return output, (weights if return_attention_scores else None)


class MeanEncoder(TransformerEncoder):
    def _attention(self, name, hidden_dim, **options):
        softmax_attention = super()._attention(name, hidden_dim, **options)
        return MeanAttention.from_config(softmax_attention.get_config())


def test_a_non_softmax_family_plugs_in_through_the_compute_attention_hook():
    inputs = random_inputs(4)
    encoder = MeanEncoder(intermediate_dim=16, num_heads=2, num_key_value_heads=1, attention_pattern=Strided(2))
    output, scores = encoder(inputs, padding_mask=PADDING, return_attention_scores=True)
    positions = np.arange(LENGTH)
    allowed = reference.pattern_allowed(("strided", 2), positions, positions)
    allowed = reference.padding_attention_mask(PADDING, PADDING) & allowed  # (batch, 1, seq, seq)
    counts = allowed.sum(-1, keepdims=True)
    expected_weights = np.divide(allowed, counts, out=np.zeros(allowed.shape), where=counts > 0)
    np.testing.assert_allclose(np.asarray(scores), np.broadcast_to(expected_weights, scores.shape), atol=1e-6)
    attention = encoder.self_attention
    wq, bq, wk, bk, wv, bv, wo, bo = numpy_weights(attention)
    values = np.repeat(np.einsum("btf,fhd->bthd", inputs, wv) + bv, 2, axis=2)  # (batch, seq, heads, dim)
    attended = np.einsum("bhqk,bkhd->bqhd", np.broadcast_to(expected_weights, scores.shape), values)
    np.testing.assert_allclose(
        np.asarray(attention(inputs, inputs, value_mask=PADDING, query_mask=PADDING)),
        np.einsum("bthd,hdo->bto", attended, wo) + bo,
        atol=1e-5,
    )
    assert np.isfinite(np.asarray(output)).all()
