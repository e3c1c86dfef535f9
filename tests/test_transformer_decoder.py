import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_attn import TokenAndPositionEmbedding
from keras_attn import TransformerDecoder
from keras_attn.blocks.transformer_decoder import compute_cross_attention_cache
from keras_attn.patterns import BlockLocal
from keras_attn.patterns import GlobalTokens
from keras_attn.patterns import SlidingWindow
from keras_attn.patterns import Strided
from tests import layer_checks
from tests import reference
from tests.layer_checks import run_layer_test

BATCH, TARGET, SOURCE, HIDDEN, ENCODER_HIDDEN = 3, 6, 5, 8, 12
TARGET_PADDING = np.arange(TARGET)[None, :] < np.array([TARGET, 4, 1])[:, None]
SOURCE_PADDING = np.arange(SOURCE)[None, :] < np.array([2, SOURCE, 3])[:, None]


def random_sequences(seed=0):
    rng = np.random.default_rng(seed)
    target = rng.standard_normal((BATCH, TARGET, HIDDEN)).astype("float32")
    source = rng.standard_normal((BATCH, SOURCE, ENCODER_HIDDEN)).astype("float32")
    return target, source


def built_decoder(cross=True, seed=0, **kwargs):
    """A decoder with every weight random (biases and norms included), so each one matters."""
    kwargs = {"intermediate_dim": 16, "num_heads": 2, **kwargs}
    decoder = TransformerDecoder(**kwargs)
    decoder.build((None, None, HIDDEN), (None, None, ENCODER_HIDDEN) if cross else None)
    rng = np.random.default_rng(seed)
    decoder.set_weights([rng.normal(0.0, 0.5, w.shape) + (w.path.endswith("gamma")) for w in decoder.weights])
    return decoder


def numpy_weights(layer):
    return [np.asarray(w, np.float64) for w in layer.get_weights()]


def to_numpy(tensor):
    return keras.ops.convert_to_numpy(tensor)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("cross", [False, True])
@pytest.mark.parametrize("masks", ["none", "padding", "padding+attention"])
def test_matches_numpy_reference(norm_first, cross, masks):
    target, source = random_sequences()
    decoder = built_decoder(cross, norm_first=norm_first)
    target_padding = None if masks == "none" else TARGET_PADDING
    source_padding = None if masks == "none" else SOURCE_PADDING
    rng = np.random.default_rng(1)
    self_extra = rng.random((BATCH, TARGET, TARGET)) < 0.8 if masks == "padding+attention" else None
    cross_extra = rng.random((BATCH, TARGET, SOURCE)) < 0.8 if masks == "padding+attention" else None
    got = decoder(
        target,
        source if cross else None,
        decoder_padding_mask=target_padding,
        decoder_attention_mask=self_extra,
        encoder_padding_mask=source_padding if cross else None,
        encoder_attention_mask=cross_extra if cross else None,
    )
    self_mask = reference.padding_attention_mask(target_padding, target_padding)
    cross_mask = reference.padding_attention_mask(target_padding, source_padding)
    if self_extra is not None:
        self_mask, cross_mask = self_mask & self_extra[:, None], cross_mask & cross_extra[:, None]
    expected = reference.transformer_decoder(
        numpy_weights(decoder),
        target,
        source if cross else None,
        self_mask,
        cross_mask,
        norm_first,
        padding=target_padding,
    )
    np.testing.assert_allclose(to_numpy(got), expected, atol=1e-5)


def test_non_causal_matches_reference():
    target, source = random_sequences(1)
    decoder = built_decoder()
    got = decoder(target, source, use_causal_mask=False)
    expected = reference.transformer_decoder(numpy_weights(decoder), target, source, is_causal=False)
    np.testing.assert_allclose(to_numpy(got), expected, atol=1e-5)


@pytest.mark.parametrize("norm_first", [False, True])
def test_future_tokens_never_change_earlier_outputs(norm_first):
    target, source = random_sequences(2)
    decoder = built_decoder(norm_first=norm_first)
    reference_output = to_numpy(decoder(target, source))
    for t in range(TARGET - 1):
        changed = target.copy()
        changed[:, t + 1 :] = 50.0 * np.random.default_rng(t).standard_normal(changed[:, t + 1 :].shape)
        output = to_numpy(decoder(changed, source))
        np.testing.assert_allclose(output[:, : t + 1], reference_output[:, : t + 1], atol=1e-6)
        assert not np.allclose(output[:, t + 1 :], reference_output[:, t + 1 :])


def test_padding_content_never_changes_real_outputs():
    target, source = random_sequences(3)
    noisy_target, noisy_source = (100.0 * s for s in random_sequences(4))
    decoder = built_decoder()
    masks = {"decoder_padding_mask": TARGET_PADDING, "encoder_padding_mask": SOURCE_PADDING}
    clean = to_numpy(decoder(target, source, **masks))
    dirty_target = np.where(TARGET_PADDING[..., None], target, noisy_target).astype("float32")
    dirty_source = np.where(SOURCE_PADDING[..., None], source, noisy_source).astype("float32")
    np.testing.assert_allclose(
        to_numpy(decoder(dirty_target, source, **masks))[TARGET_PADDING], clean[TARGET_PADDING], atol=1e-6
    )
    np.testing.assert_allclose(to_numpy(decoder(target, dirty_source, **masks)), clean, atol=1e-6)
    unmasked = to_numpy(decoder(target, dirty_source, decoder_padding_mask=TARGET_PADDING))
    assert not np.allclose(unmasked, clean, atol=1e-3)  # without the source mask it does leak


TARGET_IDS = np.where(TARGET_PADDING, np.arange(1, TARGET + 1)[None, :], 0).astype("int32")
SOURCE_IDS = np.where(SOURCE_PADDING, np.arange(3, SOURCE + 3)[None, :], 0).astype("int32")


def translator_factory(norm_first=False, **kwargs):
    def factory():
        target_ids = keras.Input((None,), dtype="int32", name="target")
        source_ids = keras.Input((None,), dtype="int32", name="source")
        target = TokenAndPositionEmbedding(20, 16, HIDDEN, name="target_embedding")(target_ids)
        source = TokenAndPositionEmbedding(20, 16, ENCODER_HIDDEN, name="source_embedding")(source_ids)
        decoded = TransformerDecoder(16, 2, norm_first=norm_first, **kwargs)(target, source)
        return keras.Model([target_ids, source_ids], keras.layers.Dense(20)(decoded))

    return factory


def test_keras_masks_are_the_padding_masks_and_are_kept():
    model = translator_factory()()
    target_embedding, source_embedding = model.get_layer("target_embedding"), model.get_layer("source_embedding")
    decoder = next(layer for layer in model.layers if isinstance(layer, TransformerDecoder))
    target, source = target_embedding(TARGET_IDS), source_embedding(SOURCE_IDS)
    automatic = decoder(target, source)
    np.testing.assert_array_equal(to_numpy(automatic._keras_mask), TARGET_PADDING)
    plain_target, plain_source = (keras.ops.convert_to_tensor(to_numpy(t)) for t in (target, source))
    explicit = decoder(
        plain_target, plain_source, decoder_padding_mask=TARGET_PADDING, encoder_padding_mask=SOURCE_PADDING
    )
    np.testing.assert_allclose(to_numpy(automatic), to_numpy(explicit), atol=1e-6)
    overridden = decoder(target, source, encoder_padding_mask=np.ones_like(SOURCE_PADDING))
    ignoring_source_padding = decoder(plain_target, plain_source, decoder_padding_mask=TARGET_PADDING)
    np.testing.assert_allclose(to_numpy(overridden), to_numpy(ignoring_source_padding), atol=1e-6)


def decode_step_by_step(decoder, target, source, chunks, step=None):
    """Feeds `target` through the caches in `chunks` (lengths); returns the concatenated outputs."""
    step = step or (lambda *args, **kwargs: decoder(*args, **kwargs))
    cache = decoder.initial_self_attention_cache(target.shape[0], target.shape[1])
    cross = None if source is None else decoder.compute_cross_attention_cache(source)
    outputs, start = [], 0
    for length in chunks:
        kwargs = {} if cross is None else {"cross_attention_cache": cross}
        results = step(
            target[:, start : start + length],
            source,
            self_attention_cache=cache,
            self_attention_cache_update_index=tf.constant(start),
            **kwargs,
        )
        outputs.append(to_numpy(results[0]))
        cache = results[1]
        if cross is not None:
            np.testing.assert_array_equal(to_numpy(results[2]), to_numpy(cross))
        start += length
    return np.concatenate(outputs, axis=1)


@pytest.mark.parametrize(
    "cross, kwargs",
    [
        (True, {}),
        (True, {"norm_first": True, "num_key_value_heads": 1}),
        (False, {"norm_first": True}),
        (False, {"sliding_window": 2, "num_heads": 4, "num_key_value_heads": 2}),
        (False, {"attention_pattern": Strided(2) | SlidingWindow(2)}),
        (True, {"attention_pattern": BlockLocal(2) | GlobalTokens(1), "norm_first": True}),
    ],
)
def test_cached_decoding_equals_full_pass(cross, kwargs):
    target, source = random_sequences(5)
    source = source if cross else None
    decoder = built_decoder(cross, **kwargs)
    full = to_numpy(decoder(target, source))
    one_by_one = decode_step_by_step(decoder, target, source, [1] * TARGET)
    assert np.max(np.abs(one_by_one - full)) <= 1e-5
    prefill_then_steps = decode_step_by_step(decoder, target, source, [3, 1, 2])
    assert np.max(np.abs(prefill_then_steps - full)) <= 1e-5


def test_cached_decoding_compiled_with_xla_and_masks():
    target, source = random_sequences(6)
    decoder = built_decoder()
    masks = {"decoder_padding_mask": TARGET_PADDING, "encoder_padding_mask": SOURCE_PADDING}
    full = to_numpy(decoder(target, source, **masks))
    cache = decoder.initial_self_attention_cache(BATCH, TARGET)
    cross = decoder.compute_cross_attention_cache(source)
    step = tf.function(
        lambda x, padding, cache, index: decoder(
            x,
            source,
            decoder_padding_mask=padding,
            encoder_padding_mask=SOURCE_PADDING,
            self_attention_cache=cache,
            self_attention_cache_update_index=index,
            cross_attention_cache=cross,
        ),
        jit_compile=True,
    )
    outputs = []
    for t in range(TARGET):
        output, cache, _ = step(target[:, t : t + 1], TARGET_PADDING[:, t : t + 1], cache, tf.constant(t))
        outputs.append(to_numpy(output))
    assert np.max(np.abs(np.concatenate(outputs, axis=1) - full)) <= 1e-5


def test_cached_decoding_from_keras_masked_embeddings():
    """Embedded target tokens carry a (batch, 1) Keras mask at each step; real outputs still match."""
    embedding = TokenAndPositionEmbedding(20, 16, HIDDEN)
    target, source = embedding(TARGET_IDS), random_sequences(7)[1]
    decoder = built_decoder()
    full = to_numpy(decoder(target, source))
    cache = decoder.initial_self_attention_cache(BATCH, TARGET)
    cross = decoder.compute_cross_attention_cache(source)
    outputs = []
    for t in range(TARGET):
        step_tokens = embedding(TARGET_IDS[:, t : t + 1], start_index=t)
        output, cache, cross = decoder(
            step_tokens,
            source,
            self_attention_cache=cache,
            self_attention_cache_update_index=t,
            cross_attention_cache=cross,
        )
        outputs.append(to_numpy(output))
    np.testing.assert_allclose(np.concatenate(outputs, axis=1)[TARGET_PADDING], full[TARGET_PADDING], atol=1e-5)


def test_cached_cross_attention_needs_no_encoder_sequence():
    """A translator projects the encoder once; later steps pass only the cache and the mask."""
    target, source = random_sequences(10)
    decoder = built_decoder()
    full = to_numpy(decoder(target, source, encoder_padding_mask=SOURCE_PADDING))
    cache = decoder.initial_self_attention_cache(BATCH, TARGET)
    cross = compute_cross_attention_cache(decoder, source)
    outputs = []
    for t in range(TARGET):
        output, cache, cross = decoder(
            target[:, t : t + 1],
            encoder_padding_mask=SOURCE_PADDING,
            self_attention_cache=cache,
            self_attention_cache_update_index=t,
            cross_attention_cache=cross,
        )
        outputs.append(to_numpy(output))
    assert np.max(np.abs(np.concatenate(outputs, axis=1) - full)) <= 1e-5


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_cached_decoding_under_mixed_precision(policy):
    target, source = random_sequences(8)
    reference_decoder = built_decoder()
    keras.config.set_dtype_policy(policy)
    decoder = built_decoder()
    decoder.set_weights(reference_decoder.get_weights())
    cached = decode_step_by_step(decoder, target, source, [2, 1, 1, 2])
    assert np.all(np.isfinite(cached))
    full = to_numpy(reference_decoder(target, source))
    np.testing.assert_allclose(cached, full, atol=layer_checks.MIXED_PRECISION_TOLERANCES[policy] * np.abs(full).max())


@pytest.mark.parametrize("norm_first", [False, True])
def test_serialization_mixed_precision_jit_with_masks(norm_first):
    factory = translator_factory(norm_first, dropout=0.1)
    inputs = [TARGET_IDS, SOURCE_IDS]
    layer_checks.assert_serialization_round_trip(factory, inputs)
    layer_checks.assert_mixed_precision_close(factory, inputs)
    layer_checks.assert_jit_matches_eager(factory(), inputs, training=False)
    layer_checks.assert_config_round_trip(
        TransformerDecoder(
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


def test_decoder_only_serialization():
    def factory():
        ids = keras.Input((None,), dtype="int32")
        decoded = TransformerDecoder(16, 2)(TokenAndPositionEmbedding(20, 16, HIDDEN)(ids))
        return keras.Model(ids, keras.layers.Dense(20)(decoded))

    layer_checks.assert_serialization_round_trip(factory, TARGET_IDS)


def test_gradients_match_finite_differences_and_fit():
    target, source = random_sequences(9)
    layer_checks.assert_gradients_match_finite_differences(
        lambda: TransformerDecoder(6, 2, norm_first=True),
        (target[:2, :3], source[:2, :4]),
        decoder_padding_mask=TARGET_PADDING[:2, :3],
        encoder_padding_mask=SOURCE_PADDING[:2, :4],
    )
    layer_checks.assert_fit_one_step(
        translator_factory()(),
        [TARGET_IDS, SOURCE_IDS],
        np.zeros((BATCH, TARGET, 20), "float32"),
        unchanged_ok=("key/bias",),
    )


def test_bad_arguments_name_the_value():
    target, source = random_sequences()
    with pytest.raises(ValueError, match="hidden size=8, num_heads=3"):
        TransformerDecoder(16, 3)(target)
    with pytest.raises(ValueError, match=r"decoder_sequence.shape=\(3, 6\)"):
        TransformerDecoder(16, 2)(target[..., 0])
    with pytest.raises(ValueError, match=r"encoder_sequence.shape=\(3, 5\)"):
        TransformerDecoder(16, 2)(target, source[..., 0])
    with pytest.raises(ValueError, match="dropout=-0.1"):
        TransformerDecoder(16, 2, dropout=-0.1)
    decoder = built_decoder()
    with pytest.raises(ValueError, match="built with cross-attention.*encoder_sequence=None"):
        decoder(target)
    with pytest.raises(ValueError, match=r"encoder_padding_mask.shape=\(3,\)"):
        decoder(target, source, encoder_padding_mask=SOURCE_PADDING[:, 0])
    with pytest.raises(ValueError, match=r"cross_attention_cache=None"):
        decoder(
            target,
            source,
            self_attention_cache=decoder.initial_self_attention_cache(BATCH, TARGET),
            self_attention_cache_update_index=0,
        )
    decoder_only = built_decoder(cross=False)
    with pytest.raises(ValueError, match=r"built without cross-attention.*encoder_sequence=\(3, 5, 12\)"):
        decoder_only(target, source)
    with pytest.raises(ValueError, match="no cross-attention"):
        decoder_only.compute_cross_attention_cache(source)


def test_layer_contract():
    rng = np.random.default_rng(20)
    inputs = (rng.standard_normal((2, 5, 8)).astype("float32"), rng.standard_normal((2, 4, 8)).astype("float32"))
    run_layer_test(TransformerDecoder, dict(intermediate_dim=16, num_heads=2), inputs, unchanged_ok=("key/bias",))


def test_attention_pattern_restricts_self_attention_only():
    target, source = random_sequences(6)
    pattern = Strided(2) | SlidingWindow(2)
    decoder = built_decoder(True, attention_pattern=pattern)
    positions = np.arange(TARGET)
    allowed = reference.pattern_allowed(("or", ("strided", 2), ("window", 2)), positions, positions)
    expected = reference.transformer_decoder(numpy_weights(decoder), target, source, self_mask=allowed[None, None])
    np.testing.assert_allclose(to_numpy(decoder(target, source)), expected, atol=1e-5)
    assert decoder.cross_attention.attention_pattern is None
    assert repr(TransformerDecoder.from_config(decoder.get_config()).attention_pattern) == repr(pattern)
