"""MultiHeadAttention against keras.layers.MultiHeadAttention (same weights) and the float64 reference."""

import re

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_attn.dispatch.attention import scaled_dot_product_attention
from keras_attn.keras_internals import attention_takes
from keras_attn.layers.multi_head_attention import MultiHeadAttention
from keras_attn.patterns import BlockLocal
from keras_attn.patterns import Causal
from keras_attn.patterns import GlobalTokens
from keras_attn.patterns import SlidingWindow
from keras_attn.patterns import Strided
from tests import reference
from tests.keras_versions import KERAS_VERSION
from tests.keras_versions import skip_before_keras
from tests.keras_versions import skip_unless_keras_takes
from tests.layer_checks import assert_config_round_trip
from tests.layer_checks import assert_fit_one_step
from tests.layer_checks import assert_gradients_match_finite_differences
from tests.layer_checks import assert_jit_matches_eager
from tests.layer_checks import assert_mixed_precision_close
from tests.layer_checks import assert_serialization_round_trip
from tests.layer_checks import run_layer_test

ATOL = 1e-5
BATCH, QUERY_LEN, KEY_LEN, QUERY_DIM, VALUE_DIM, KEY_FEATURES = 2, 5, 7, 8, 6, 10


def _normal(rng, *shape):
    return rng.standard_normal(shape).astype("float32")


def _padding(lengths, max_len):
    return np.arange(max_len)[None, :] < np.asarray(lengths)[:, None]  # (batch, max_len)


def _allowed(
    query_len, key_len, query_mask=None, value_mask=None, attention_mask=None, causal=False, sliding_window=None
):
    """NumPy `(batch, query_len, key_len)` mask of what each query may attend to."""
    rows, cols = np.arange(query_len)[:, None], np.arange(key_len)[None, :]
    allowed = np.ones((BATCH, query_len, key_len), bool)
    if query_mask is not None:
        allowed &= query_mask[:, :, None]
    if value_mask is not None:
        allowed &= value_mask[:, None, :]
    if attention_mask is not None:
        allowed &= attention_mask
    if causal:
        allowed &= cols <= rows
    if sliding_window is not None:
        allowed &= np.abs(rows - cols) < sliding_window
    return allowed


def _twin_layers(inputs, **config):
    """A Keras layer and ours with the same config, ours holding a copy of Keras's weights."""
    keras_layer = keras.layers.MultiHeadAttention(**config)
    ours = MultiHeadAttention(**config)
    keras_layer(*inputs)
    ours(*inputs)
    ours.set_weights(keras_layer.get_weights())
    return keras_layer, ours


KERAS_CASES = {
    "self": (dict(num_heads=2, key_dim=4), dict(cross=False), {}),
    "cross": (dict(num_heads=2, key_dim=4), dict(cross=True), {}),
    "key_not_value": (dict(num_heads=2, key_dim=4), dict(cross=True, separate_key=True), {}),
    "causal": (dict(num_heads=2, key_dim=4), dict(cross=False), dict(use_causal_mask=True)),
    "causal_cross": (dict(num_heads=2, key_dim=4), dict(cross=True), dict(use_causal_mask=True)),
    "padding": (dict(num_heads=2, key_dim=4), dict(cross=True, padding=True), {}),
    "padding_causal": (dict(num_heads=3, key_dim=4), dict(cross=False, padding=True), dict(use_causal_mask=True)),
    "attention_mask": (dict(num_heads=2, key_dim=4), dict(cross=True, attention_mask=True), {}),
    "attention_mask_2d": (dict(num_heads=2, key_dim=4), dict(cross=True, attention_mask="2d"), {}),
    "sliding_window": (dict(num_heads=2, key_dim=4, sliding_window=2), dict(cross=False), {}),
    "window_causal": (dict(num_heads=2, key_dim=4, sliding_window=3), dict(cross=True), dict(use_causal_mask=True)),
    "gate": (dict(num_heads=2, key_dim=4, use_gate=True), dict(cross=False), {}),
    "gate_cross": (dict(num_heads=2, key_dim=4, value_dim=3, use_gate=True), dict(cross=True), {}),
    "output_shape": (dict(num_heads=2, key_dim=4, value_dim=3, output_shape=12), dict(cross=True), {}),
    "no_bias": (dict(num_heads=4, key_dim=2, use_bias=False), dict(cross=True, padding=True), {}),
}


def _keras_case(rng, cross=False, separate_key=False, padding=False, attention_mask=False):
    query = _normal(rng, BATCH, QUERY_LEN, QUERY_DIM)
    value = _normal(rng, BATCH, KEY_LEN, VALUE_DIM) if cross else query
    key = _normal(rng, BATCH, KEY_LEN, KEY_FEATURES) if separate_key else None
    key_len = value.shape[1]
    masks = {}
    if padding:
        masks["query_mask"] = _padding([QUERY_LEN, 2], QUERY_LEN)
        masks["value_mask"] = _padding([key_len - 1, 3], key_len)
    if attention_mask == "2d":  # Keras broadcasts a (query_len, key_len) mask over the batch
        masks["attention_mask"] = rng.random((QUERY_LEN, key_len)) < 0.7
        masks["attention_mask"][1] = False  # one fully masked query row
    elif attention_mask:
        masks["attention_mask"] = rng.random((BATCH, QUERY_LEN, key_len)) < 0.7
        masks["attention_mask"][0, 1] = False  # one fully masked query row
    return query, value, key, masks


@pytest.mark.parametrize("case", sorted(KERAS_CASES))
def test_matches_keras_with_the_same_weights(case):
    config, input_options, call_options = KERAS_CASES[case]
    skip_unless_keras_takes(config)
    rng = np.random.default_rng(0)
    query, value, key, masks = _keras_case(rng, **input_options)
    inputs = (query, value) if key is None else (query, value, key)
    keras_layer, ours = _twin_layers(inputs, **config)
    allowed = _allowed(
        query.shape[1],
        value.shape[1],
        causal=call_options.get("use_causal_mask", False),
        sliding_window=config.get("sliding_window"),
        **masks,
    )
    # Keras reads query/value masks from the inputs' Keras masks; the merged 3-D mask is the same.
    keras_mask = allowed if masks else None
    expected, expected_scores = keras_layer(
        *inputs, attention_mask=keras_mask, return_attention_scores=True, **call_options
    )
    expected_output_only = keras_layer(*inputs, attention_mask=keras_mask, **call_options)
    output, scores = ours(*inputs, return_attention_scores=True, **masks, **call_options)
    output_only = ours(*inputs, **masks, **call_options)

    rows = allowed.any(-1)  # (batch, query_len): Keras gives uniform weights to the others
    for got, want in ((output, expected), (output_only, expected_output_only)):
        np.testing.assert_allclose(got.numpy()[rows], want.numpy()[rows], atol=ATOL)
    scores, expected_scores = scores.numpy(), expected_scores.numpy()
    np.testing.assert_allclose(
        scores.transpose(0, 2, 1, 3)[rows], expected_scores.transpose(0, 2, 1, 3)[rows], atol=ATOL
    )
    assert np.all(scores.transpose(0, 2, 1, 3)[~rows] == 0)


def _float64_layer(inputs, **config):
    layer = MultiHeadAttention(dtype="float64", bias_initializer="random_normal", **config)
    layer(*inputs)
    return layer


@pytest.mark.parametrize(
    "config, cross, use_causal_mask",
    [
        (dict(num_heads=4, key_dim=3), False, False),
        (dict(num_heads=4, key_dim=3), True, True),
        (dict(num_heads=4, key_dim=3, num_key_value_heads=2), True, False),
        (dict(num_heads=4, key_dim=3, num_key_value_heads=1, sliding_window=2), False, True),
        (dict(num_heads=6, key_dim=2, value_dim=5, num_key_value_heads=3, output_shape=7), True, True),
    ],
    ids=["self", "cross_causal", "gqa", "mqa_window", "gqa_value_dim_output_shape"],
)
def test_matches_float64_reference(config, cross, use_causal_mask):
    rng = np.random.default_rng(1)
    query = rng.standard_normal((BATCH, QUERY_LEN, QUERY_DIM))
    value = rng.standard_normal((BATCH, KEY_LEN, VALUE_DIM)) if cross else query
    key_len = value.shape[1]
    query_mask, value_mask = _padding([QUERY_LEN, 3], QUERY_LEN), _padding([key_len, 2], key_len)
    bias = rng.standard_normal((1, config["num_heads"], QUERY_LEN, key_len))
    layer = _float64_layer((query, value), **config)
    output, scores = layer(
        query,
        value,
        query_mask=query_mask,
        value_mask=value_mask,
        attention_bias=bias,
        use_causal_mask=use_causal_mask,
        return_attention_scores=True,
    )
    mask = query_mask[:, None, :, None] & value_mask[:, None, None, :]  # (batch, 1, q, k)
    expected, expected_scores = reference.multi_head_attention(
        layer.get_weights(),
        query,
        value,
        mask=mask,
        bias=bias,
        is_causal=use_causal_mask,
        sliding_window=config.get("sliding_window"),
    )
    np.testing.assert_allclose(output, expected, atol=1e-10)
    np.testing.assert_allclose(scores, expected_scores, atol=1e-10)


@pytest.mark.parametrize("use_causal_mask", [False, True])
def test_blockwise_implementation_matches_float64_reference(use_causal_mask):
    rng = np.random.default_rng(11)
    query, value = rng.standard_normal((BATCH, QUERY_LEN, QUERY_DIM)), rng.standard_normal((BATCH, KEY_LEN, VALUE_DIM))
    config = dict(num_heads=4, key_dim=3, num_key_value_heads=2, sliding_window=3, implementation="blockwise")
    layer = _float64_layer((query, value), **config)
    value_mask = _padding([KEY_LEN, 0], KEY_LEN)  # batch 1 attends to nothing: exact zeros
    bias = rng.standard_normal((1, 4, QUERY_LEN, KEY_LEN))
    output = layer(query, value, value_mask=value_mask, attention_bias=bias, use_causal_mask=use_causal_mask)
    expected, _ = reference.multi_head_attention(
        layer.get_weights(),
        query,
        value,
        mask=value_mask[:, None, None, :],
        bias=bias,
        is_causal=use_causal_mask,
        sliding_window=3,
    )
    np.testing.assert_allclose(output, expected, atol=1e-10)


def _spy_on_fused_path(layer, monkeypatch):
    calls = []
    fused = layer._fused_qkv

    def counting(inputs):
        calls.append(1)
        return fused(inputs)

    monkeypatch.setattr(layer, "_fused_qkv", counting)
    return calls


@pytest.mark.parametrize(
    "config",
    [dict(num_heads=2, key_dim=4), dict(num_heads=4, key_dim=3, value_dim=5, num_key_value_heads=2, use_bias=False)],
    ids=["mha", "gqa_no_bias"],
)
def test_fused_qkv_path_equals_separate_projections(config, monkeypatch):
    rng = np.random.default_rng(2)
    x = tf.constant(_normal(rng, BATCH, QUERY_LEN, QUERY_DIM))
    layer = MultiHeadAttention(**config, bias_initializer="random_normal")
    layer(x, tf.identity(x))
    calls = _spy_on_fused_path(layer, monkeypatch)
    separate, separate_scores = layer(x, tf.identity(x), return_attention_scores=True, use_causal_mask=True)
    assert not calls
    fused, fused_scores = layer(x, x, return_attention_scores=True, use_causal_mask=True)
    assert calls, "query is value is key must take the fused QKV path"
    np.testing.assert_allclose(fused, separate, atol=ATOL)
    np.testing.assert_allclose(fused_scores, separate_scores, atol=ATOL)


def test_causal_outputs_never_depend_on_future_tokens():
    rng = np.random.default_rng(3)
    layer = MultiHeadAttention(num_heads=2, key_dim=4)
    x = _normal(rng, BATCH, 6, QUERY_DIM)
    reference_output = layer(x, x, use_causal_mask=True).numpy()
    for position in range(6):
        changed = x.copy()
        changed[:, position:] = _normal(rng, BATCH, 6 - position, QUERY_DIM)
        output = layer(changed, changed, use_causal_mask=True).numpy()
        np.testing.assert_allclose(output[:, :position], reference_output[:, :position], atol=ATOL)
        assert not np.allclose(output[:, position:], reference_output[:, position:], atol=ATOL)


@pytest.mark.parametrize("cross", [False, True])
def test_padded_content_never_changes_unpadded_outputs(cross):
    rng = np.random.default_rng(4)
    layer = MultiHeadAttention(num_heads=2, key_dim=4)
    query = _normal(rng, BATCH, QUERY_LEN, QUERY_DIM)
    value = _normal(rng, BATCH, KEY_LEN, VALUE_DIM) if cross else query
    query_mask = _padding([QUERY_LEN - 1, 2], QUERY_LEN)
    value_mask = _padding([KEY_LEN - 2, 3], KEY_LEN) if cross else query_mask
    before = layer(query, value, query_mask=query_mask, value_mask=value_mask).numpy()
    noisy_query = np.where(query_mask[..., None], query, 100 * _normal(rng, *query.shape))
    noisy_value = np.where(value_mask[..., None], value, 100 * _normal(rng, *value.shape))
    after = layer(noisy_query, noisy_value if cross else noisy_query, query_mask=query_mask, value_mask=value_mask)
    np.testing.assert_allclose(after.numpy()[query_mask], before[query_mask], atol=ATOL)


def test_fully_masked_rows_have_zero_weights_and_zero_output():
    rng = np.random.default_rng(5)
    layer = MultiHeadAttention(num_heads=2, key_dim=4, bias_initializer="random_normal")
    query, value = _normal(rng, BATCH, QUERY_LEN, QUERY_DIM), _normal(rng, BATCH, KEY_LEN, VALUE_DIM)
    attention_mask = rng.random((BATCH, QUERY_LEN, KEY_LEN)) < 0.6
    attention_mask[0, [0, 2]] = False
    attention_mask[1] = False
    output, scores = layer(query, value, attention_mask=attention_mask, return_attention_scores=True)
    dead = ~attention_mask.any(-1)  # (batch, query_len)
    assert np.all(scores.numpy().transpose(0, 2, 1, 3)[dead] == 0)
    assert np.all(output.numpy()[dead] == 0)  # not the output projection's bias (issue #40)
    assert np.all(output.numpy()[~dead] != 0)


def test_self_attention_is_permutation_equivariant():
    rng = np.random.default_rng(6)
    layer = MultiHeadAttention(num_heads=2, key_dim=4)
    x = _normal(rng, BATCH, 6, QUERY_DIM)
    permutation = rng.permutation(6)
    output = layer(x, x).numpy()
    permuted_output = layer(x[:, permutation], x[:, permutation]).numpy()
    np.testing.assert_allclose(permuted_output, output[:, permutation], atol=ATOL)


def _token_model(layer_class, use_causal_mask=False):
    tokens = keras.Input((None,), dtype="int32")
    embedded = keras.layers.Embedding(20, QUERY_DIM, mask_zero=True)(tokens)
    attended = layer_class(num_heads=2, key_dim=4)(embedded, embedded, use_causal_mask=use_causal_mask)
    return keras.Model(tokens, attended)


@pytest.mark.parametrize("use_causal_mask", [False, True])
def test_keras_masks_from_embedding_match_keras_and_propagate(use_causal_mask):
    tokens = np.array([[3, 5, 7, 2, 0, 0], [4, 9, 0, 0, 0, 0]], "int32")
    keras_model = _token_model(keras.layers.MultiHeadAttention, use_causal_mask)
    ours_model = _token_model(MultiHeadAttention, use_causal_mask)
    ours_model.set_weights(keras_model.get_weights())
    unpadded = tokens != 0
    np.testing.assert_allclose(ours_model(tokens).numpy()[unpadded], keras_model(tokens).numpy()[unpadded], atol=ATOL)
    embedded = ours_model.layers[1](tokens)
    output = ours_model.layers[2](embedded, embedded, use_causal_mask=use_causal_mask)
    np.testing.assert_array_equal(output._keras_mask, unpadded)


def test_explicit_masks_are_honoured_eagerly_in_graphs_and_over_keras_masks():
    rng = np.random.default_rng(7)
    layer = MultiHeadAttention(num_heads=2, key_dim=4)
    query, value = _normal(rng, BATCH, QUERY_LEN, QUERY_DIM), _normal(rng, BATCH, KEY_LEN, VALUE_DIM)
    value_mask = _padding([3, 5], KEY_LEN)
    layer(query, value)
    expected = reference.multi_head_attention(layer.get_weights(), query, value, mask=value_mask[:, None, None, :])[0]
    np.testing.assert_allclose(layer(query, value, value_mask=value_mask), expected, atol=ATOL)
    graph = tf.function(lambda q, v, m: layer(q, v, value_mask=m))
    np.testing.assert_allclose(graph(query, value, value_mask), expected, atol=ATOL)
    # An explicit mask wins over the Keras mask carried by the input.
    masked_value = keras.layers.Masking(mask_value=123.0)(value)
    assert masked_value._keras_mask.numpy().all()
    np.testing.assert_allclose(layer(query, masked_value, value_mask=value_mask), expected, atol=ATOL)


def _cross_model(**config):
    query = keras.Input((None, QUERY_DIM))
    value = keras.Input((None, VALUE_DIM))
    query_mask = keras.Input((None,), dtype="bool")
    value_mask = keras.Input((None,), dtype="bool")
    output = MultiHeadAttention(**config)(
        query, value, query_mask=query_mask, value_mask=value_mask, use_causal_mask=True
    )
    return keras.Model([query, value, query_mask, value_mask], output)


GENERIC_CONFIG = dict(
    num_heads=4,
    key_dim=3,
    value_dim=5,
    num_key_value_heads=2,
    sliding_window=4,
    use_gate=True,
    output_shape=9,
    bias_initializer="random_normal",
    kernel_regularizer="l2",
    activity_regularizer="l1",
    scale=0.8,
    attention_pattern=GlobalTokens(1) | Strided(2),
)


def _cross_inputs(seed=8, query_len=QUERY_LEN, key_len=KEY_LEN):
    rng = np.random.default_rng(seed)
    return [
        _normal(rng, BATCH, query_len, QUERY_DIM),
        _normal(rng, BATCH, key_len, VALUE_DIM),
        _padding([query_len, 2], query_len),
        _padding([key_len - 1, 3], key_len),
    ]


def test_serialization_round_trip():
    reloaded = assert_serialization_round_trip(lambda: _cross_model(**GENERIC_CONFIG), _cross_inputs())
    layer = reloaded.layers[-1]
    assert isinstance(layer, MultiHeadAttention)
    for name, value in GENERIC_CONFIG.items():
        if name not in (
            "bias_initializer",
            "kernel_regularizer",
            "activity_regularizer",
            "output_shape",
            "attention_pattern",
        ):
            assert getattr(layer, name) == value, name
    assert repr(layer.attention_pattern) == repr(GENERIC_CONFIG["attention_pattern"])
    # As in Keras, the activity regulariser applies to the projections' outputs.
    assert layer._activity_regularizer is not None and layer._query_dense.activity_regularizer is not None
    assert layer._kernel_regularizer is not None and layer._query_dense.kernel_regularizer is not None


def test_config_accepts_keras_config_and_round_trips():
    window = dict(sliding_window=2) if attention_takes("sliding_window") else {}  # a Keras < 3.15 config has none
    keras_layer = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4, value_dim=3, output_shape=(5,), **window)
    ours = MultiHeadAttention.from_config(keras_layer.get_config())
    assert (ours.num_heads, ours.key_dim, ours.value_dim, ours.sliding_window) == (
        2,
        4,
        3,
        window.get("sliding_window"),
    )
    assert_config_round_trip(ours)
    assert_config_round_trip(MultiHeadAttention(**GENERIC_CONFIG))


def test_mixed_precision_close_to_float32_with_masks():
    config = dict(GENERIC_CONFIG)
    if KERAS_VERSION < (3, 14):  # Keras's L1 multiplied float16 activations by a float32 factor (its layers fail too)
        del config["activity_regularizer"]
    assert_mixed_precision_close(lambda: _cross_model(**config), _cross_inputs())


def test_jit_matches_eager():
    layer = MultiHeadAttention(**GENERIC_CONFIG)
    query, value, query_mask, value_mask = _cross_inputs()
    layer(query, value)
    assert_jit_matches_eager(
        layer,
        (query, value),
        query_mask=query_mask,
        value_mask=value_mask,
        use_causal_mask=True,
        return_attention_scores=True,
    )


def test_gradients_match_finite_differences():
    query, value, query_mask, value_mask = _cross_inputs(query_len=3, key_len=4)
    assert_gradients_match_finite_differences(
        lambda: MultiHeadAttention(
            num_heads=2, key_dim=2, num_key_value_heads=1, use_gate=True, bias_initializer="random_normal"
        ),
        (query[:, :, :4], value[:, :, :3]),
        query_mask=query_mask,
        value_mask=value_mask,
        use_causal_mask=True,
    )


def test_fit_one_step_moves_every_weight():
    config = dict(GENERIC_CONFIG, dropout=0.1)
    inputs = _cross_inputs()
    target = np.random.default_rng(9).standard_normal((BATCH, QUERY_LEN, 9))
    # The key bias adds a per-row constant to the logits: its gradient is exactly zero.
    assert_fit_one_step(_cross_model(**config), inputs, target, unchanged_ok=("key/bias",))


def _query_value():
    rng = np.random.default_rng(10)
    return _normal(rng, BATCH, QUERY_LEN, QUERY_DIM), _normal(rng, BATCH, KEY_LEN, VALUE_DIM)


@pytest.mark.parametrize(
    "arguments, message",
    [
        (dict(num_heads=0), "num_heads=0"),
        (dict(num_heads=2.0), "num_heads=2.0"),
        (dict(key_dim=-1), "key_dim=-1"),
        (dict(value_dim=0), "value_dim=0"),
        (dict(dropout=1.0), "dropout=1.0"),
        (dict(dropout=-0.5), "dropout=-0.5"),
        (dict(output_shape=0), "output_shape=0"),
        (dict(sliding_window=0), "sliding_window=0"),
        (dict(num_key_value_heads=3), "num_key_value_heads=3"),
        (dict(num_key_value_heads=0), "num_key_value_heads=0"),
        (dict(scale=0), "scale=0"),
        (dict(scale=-1.5), "scale=-1.5"),
        (dict(scale=float("inf")), "scale=inf"),
        (dict(scale=True), "scale=True"),
        (dict(hard="yes"), "hard='yes'"),
    ],
)
def test_bad_constructor_arguments(arguments, message):
    config = dict(num_heads=4, key_dim=2)
    config.update(arguments)
    with pytest.raises(ValueError, match=re.escape(message)):
        MultiHeadAttention(**config)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda q, v: (q[0], v), "query.shape=(5, 8)"),
        (lambda q, v: (q, v[..., None]), "value.shape=(2, 7, 6, 1)"),
        (lambda q, v: (q, v, v[:, :4]), "key.shape=(2, 4, 6)"),
        (lambda q, v: (q, v, None, dict(query_mask=np.ones((2, 5, 1), bool))), "query_mask.shape=(2, 5, 1)"),
        (lambda q, v: (q, v, None, dict(value_mask=np.ones((7,), bool))), "value_mask.shape=(7,)"),
        (lambda q, v: (q, v, None, dict(value_mask=np.ones((2, 6), bool))), "value_mask.shape=(2, 6)"),
        (lambda q, v: (q, v, None, dict(query_mask=np.ones((2, 4), bool))), "query_mask.shape=(2, 4)"),
        (lambda q, v: (q, v, None, dict(attention_mask=np.ones((7,), bool))), "attention_mask.shape=(7,)"),
        (lambda q, v: (q, v, None, dict(attention_mask=np.ones((2, 4, 7), bool))), "attention_mask.shape=(2, 4, 7)"),
        (
            lambda q, v: (q, v, None, dict(attention_mask=np.ones((2, 3, 5, 7), bool))),
            "attention_mask.shape=(2, 3, 5, 7)",
        ),
        (lambda q, v: (q, v, None, dict(attention_bias=np.ones((2, 3, 5, 7)))), "attention_bias.shape=(2, 3, 5, 7)"),
        (lambda q, v: (q, v, None, dict(cache=np.zeros((2, 2, 7, 2, 3)))), "cache.shape=(2, 2, 7, 2, 3)"),
        (lambda q, v: (q, v, None, dict(cache_update_index=3)), "cache_update_index=3"),
    ],
    ids=[
        "query_rank",
        "value_rank",
        "key_value_lengths",
        "query_mask_rank",
        "value_mask_rank",
        "value_mask_length",
        "query_mask_length",
        "attention_mask_rank",
        "attention_mask_shape",
        "attention_mask_heads",
        "bias_heads",
        "cache_shape",
        "index_without_cache",
    ],
)
def test_bad_call_arguments(call, message):
    arguments = call(*_query_value())
    query, value, key = (arguments + (None,))[:3]
    options = arguments[3] if len(arguments) > 3 else {}
    layer = MultiHeadAttention(num_heads=2, key_dim=4)
    with pytest.raises(ValueError, match=re.escape(message)):
        layer(query, value, key, **options)


def _self_attention_model(layer_class, **config):
    inputs = keras.Input((6, 8))
    return keras.Model(inputs, layer_class(name="attention", **config)(inputs, inputs))


def _cross_attention_model(layer_class, **config):
    query, value = keras.Input((6, 8)), keras.Input((5, 7))
    return keras.Model([query, value], layer_class(name="attention", **config)(query, value))


def _quantized_cases():
    """Every mode x projection path x config. The int8 cases are the slow ones: `make test` keeps
    each path and each config once in int8, `make test-slow` the other two."""
    configs = {
        "config0": dict(num_heads=2, key_dim=4),
        "config1": dict(num_heads=3, key_dim=4, use_gate=True, use_bias=False),
    }
    paths = {"fused": _self_attention_model, "separate": _cross_attention_model}
    kept_int8 = {("config0", "separate"), ("config1", "fused")}
    for config_id, config in configs.items():
        for path_id, build_model in paths.items():
            for mode in ("int8", "float8"):
                slow = mode == "int8" and (config_id, path_id) not in kept_int8
                yield pytest.param(
                    mode,
                    build_model,
                    config,
                    id=f"{config_id}-{path_id}-{mode}",
                    marks=[pytest.mark.slow] if slow else [],
                )


@pytest.mark.parametrize("mode, build_model, config", list(_quantized_cases()))
def test_quantized_model_matches_quantized_keras(mode, build_model, config):
    """`Model.quantize` on the fused and the separate projection paths gives Keras's quantized outputs."""
    skip_unless_keras_takes(config)
    keras_model, ours = (
        build_model(keras.layers.MultiHeadAttention, **config),
        build_model(MultiHeadAttention, **config),
    )
    ours.set_weights(keras_model.get_weights())
    rng = np.random.default_rng(3)
    inputs = [_normal(rng, 2, *tensor.shape[1:]) for tensor in keras_model.inputs]
    float_output = keras_model.predict(inputs, verbose=0)
    keras_model.quantize(mode)
    ours.quantize(mode)
    layer = ours.get_layer("attention")
    for projection in (layer._query_dense, layer._key_dense, layer._value_dense, layer._output_dense):
        assert projection.quantization_mode == mode
    expected = keras_model.predict(inputs, verbose=0)
    assert np.abs(expected - float_output).max() > 1e-6  # quantization did change the outputs
    np.testing.assert_allclose(ours.predict(inputs, verbose=0), expected, atol=1e-5, rtol=1e-5)


def test_functional_model_returns_scores_and_cache_symbolically():
    layer = MultiHeadAttention(num_heads=2, key_dim=4)
    query = keras.Input((3, 8))
    cache = keras.Input((2, 5, 2, 4))
    output, scores = layer(query, query, return_attention_scores=True)
    assert (tuple(output.shape), tuple(scores.shape)) == ((None, 3, 8), (None, 2, 3, 3))
    model = keras.Model(query, [output, scores])
    rng = np.random.default_rng(0)
    x = _normal(rng, 2, 3, 8)
    eager_output, eager_scores = layer(x, x, return_attention_scores=True)
    got_output, got_scores = model(x)
    np.testing.assert_allclose(got_output, eager_output, atol=1e-6)
    np.testing.assert_allclose(got_scores, eager_scores, atol=1e-6)
    cached = layer(query, query, cache=cache, cache_update_index=1, return_attention_scores=True)
    assert [tuple(t.shape) for t in cached] == [(None, 3, 8), (None, 2, 3, 5), (None, 2, 5, 2, 4)]


@pytest.mark.parametrize(
    "shape, attention_axes",
    [
        ((2, 3, 4, 8), (1, 2)),  # a feature map's two spatial axes
        ((2, 3, 4, 8), (2,)),  # one of them, the other a batch axis
        ((2, 3, 4, 8), -2),
        ((2, 3, 2, 4, 8), (1, 3)),  # not contiguous
        ((2, 3, 2, 4, 8), (3, 1)),  # in reverse: Keras's scores follow the order given
    ],
)
def test_attention_axes_run_our_kernel_as_keras_computes_them(shape, attention_axes, monkeypatch):
    """Attention over several axes, or another one than the sequence, flattened into one sequence on
    our kernel: outputs, scores (Keras's layout) and gradients as Keras's layer with the same weights."""
    from keras_attn.layers import multi_head_attention

    if attention_axes == -2:  # Keras 3.10's own layer broadcasts its mask wrongly for a negative axis
        skip_before_keras((3, 15), "negative attention_axes in its own MultiHeadAttention (the oracle)")

    kernel_calls = []

    def spy(*args, **kwargs):
        kernel_calls.append(kwargs)
        return scaled_dot_product_attention(*args, **kwargs)

    monkeypatch.setattr(multi_head_attention, "scaled_dot_product_attention", spy)
    rng = np.random.default_rng(len(shape) + sum(np.atleast_1d(attention_axes)))
    query, value = _normal(rng, *shape), _normal(rng, *shape)
    axes = [axis % len(shape) for axis in np.atleast_1d(attention_axes)]
    attended = [shape[axis] for axis in axes]
    mask = rng.random((shape[0], *attended, *attended)) < 0.7  # Keras's (batch, <query axes>, <key axes>)
    positions = int(np.prod(attended))
    # Every query sees a key: where none, Keras outputs its bias, ours zeros (test_reported_causes, S3).
    mask.reshape(shape[0], positions, positions)[:, np.arange(positions), np.arange(positions)] = True
    keras_layer, ours = _twin_layers([query, value], num_heads=2, key_dim=4, attention_axes=attention_axes)
    expected, expected_scores = keras_layer(query, value, attention_mask=mask, return_attention_scores=True)
    kernel_calls.clear()
    output, scores = ours(query, value, attention_mask=mask, return_attention_scores=True)
    assert len(kernel_calls) == 1
    np.testing.assert_allclose(output, expected, atol=1e-5)
    assert scores.shape == expected_scores.shape
    np.testing.assert_allclose(scores, expected_scores, atol=1e-5)

    def gradients(layer):
        inputs = [tf.constant(query), tf.constant(value)]
        with tf.GradientTape() as tape:
            tape.watch(inputs)
            loss = tf.reduce_sum(layer(*inputs, attention_mask=mask) * np.linspace(-1, 1, shape[-1]))
        return tape.gradient(loss, inputs + layer.trainable_variables)

    for got, want in zip(gradients(ours), gradients(keras_layer)):
        np.testing.assert_allclose(got, want, atol=1e-5)


def test_rank4_fully_masked_query_gets_zero_weights():
    rng = np.random.default_rng(5)
    query = _normal(rng, 1, 2, 3, 8)
    mask = np.ones((1, 2, 3, 2, 3), bool)
    mask[0, 1, 2] = False  # query position (1, 2) may attend to nothing
    _, scores = MultiHeadAttention(num_heads=2, key_dim=4, attention_axes=(1, 2))(
        query, query, attention_mask=mask, return_attention_scores=True
    )  # (batch, heads, 2, 3, 2, 3)
    np.testing.assert_array_equal(np.asarray(scores)[0, :, 1, 2], 0.0)
    np.testing.assert_allclose(np.asarray(scores)[0, :, 0, 0].sum(axis=(-2, -1)), 1.0, atol=1e-6)


def test_a_gate_over_two_attention_axes_is_the_gate_over_their_flattened_sequence():
    """Keras's einsum path with `use_gate` (whose gate this layer builds where Keras < 3.15 has none)
    against the sequence path, with the same weights, on the attended axes flattened into one."""
    rng = np.random.default_rng(6)
    query, value = _normal(rng, 2, 3, 4, 8), _normal(rng, 2, 3, 4, 6)
    config = dict(num_heads=2, key_dim=4, value_dim=3, use_gate=True, bias_initializer="random_normal")
    grid, flat = MultiHeadAttention(attention_axes=(1, 2), **config), MultiHeadAttention(**config)
    flat_query, flat_value = query.reshape(2, 12, 8), value.reshape(2, 12, 6)
    grid(query, value), flat(flat_query, flat_value)
    for name in ("_query_dense", "_key_dense", "_value_dense", "_gate_dense", "_output_dense"):
        getattr(flat, name).set_weights(getattr(grid, name).get_weights())
    expected = np.asarray(flat(flat_query, flat_value)).reshape(2, 3, 4, 8)
    np.testing.assert_allclose(np.asarray(grid(query, value)), expected, atol=1e-5)


def test_overridden_compute_attention_is_called_with_every_mask_merged():
    seen = {}

    class Temperature(MultiHeadAttention):
        def _compute_attention(
            self, query, key, value, attention_mask=None, training=None, return_attention_scores=False
        ):
            seen["mask"] = np.asarray(attention_mask)
            return super()._compute_attention(
                query * 2.0, key, value, attention_mask, training, return_attention_scores
            )

    rng = np.random.default_rng(6)
    x = _normal(rng, BATCH, 5, 8)
    padding = _padding([5, 3], 5)
    layer = Temperature(num_heads=2, key_dim=4, sliding_window=2)
    output = layer(x, x, value_mask=padding, use_causal_mask=True)
    plain = MultiHeadAttention(num_heads=2, key_dim=4, sliding_window=2)
    plain(x, x)
    plain.set_weights(layer.get_weights())
    expected = plain(x, x, value_mask=padding, use_causal_mask=True)
    assert not np.allclose(output, expected, atol=1e-4)  # the override ran
    allowed = _allowed(5, 5, value_mask=padding, causal=True, sliding_window=2)[:, None]  # (batch, 1, q, k)
    np.testing.assert_array_equal(np.broadcast_to(seen["mask"], allowed.shape), allowed)


@pytest.mark.parametrize(
    "init_kwargs, call_kwargs",
    [
        (dict(num_heads=2, key_dim=4, num_key_value_heads=1, use_gate=True), dict(use_causal_mask=True)),
        (
            dict(
                num_heads=2,
                key_dim=3,
                value_dim=5,
                output_shape=6,
                scale=0.7,
                attention_pattern=BlockLocal(2) | GlobalTokens(1),
            ),
            dict(return_attention_scores=True),
        ),
    ],
)
def test_layer_contract(init_kwargs, call_kwargs):
    rng = np.random.default_rng(9)
    run_layer_test(
        MultiHeadAttention,
        init_kwargs,
        (_normal(rng, 2, 5, 8), _normal(rng, 2, 4, 6)),
        call_kwargs,
        expected_num_trainable_weights=10 if init_kwargs.get("use_gate") else 8,
        unchanged_ok=("key/bias",),  # softmax is shift-invariant along the keys: zero gradient
    )


@pytest.mark.parametrize(
    "init_kwargs, shape, message",
    [
        (dict(attention_axes=2), (2, 5, 8), "attention_axes=\\(2,\\)"),
        (dict(attention_axes=-1), (2, 5, 8), "attention_axes=\\(-1,\\)"),
        (dict(attention_axes=0), (2, 3, 4, 8), "attention_axes=\\(0,\\)"),
        (dict(sliding_window=2), (2, 3, 4, 8), "sliding_window=2"),
        (dict(implementation="chunked"), (2, 3, 4, 8), "implementation='chunked'"),
        (dict(num_key_value_heads=1), (2, 3, 4, 8), "num_key_value_heads=1"),
        (dict(hard=True), (2, 3, 4, 8), "hard=True"),
        (dict(attention_pattern=Causal()), (2, 3, 4, 8), "attention_pattern=Causal()"),
    ],
)
def test_options_that_cannot_apply_to_these_inputs_raise(init_kwargs, shape, message):
    layer = MultiHeadAttention(num_heads=2, key_dim=4, **init_kwargs)
    with pytest.raises(ValueError, match=message):
        layer.build(shape, shape)


def test_sequence_axis_given_negatively_takes_the_fast_path():
    rng = np.random.default_rng(10)
    x = _normal(rng, 2, 5, 8)
    negative, default = MultiHeadAttention(num_heads=2, key_dim=4, attention_axes=-2), MultiHeadAttention(2, 4)
    negative(x, x)
    default(x, x)
    negative.set_weights(default.get_weights())
    assert negative._sequence_attention
    np.testing.assert_allclose(negative(x, x, use_causal_mask=True), default(x, x, use_causal_mask=True), atol=1e-6)


def test_output_shape_sizes_must_be_positive():
    with pytest.raises(ValueError, match=r"output_shape=\(4, -5\)"):
        MultiHeadAttention(num_heads=2, key_dim=4, output_shape=(4, -5))


def test_attention_pattern_must_be_a_pattern():
    with pytest.raises(TypeError, match="attention_pattern='causal'"):
        MultiHeadAttention(num_heads=2, key_dim=4, attention_pattern="causal")


def _projected(layer, query, value):
    """The float64 projections `(batch, seq, heads, dim)` of a built layer (bias included)."""
    wq, bq, wk, bk, wv, bv, wo, bo = (np.asarray(w, np.float64) for w in layer.get_weights())
    project = lambda x, w, b: np.einsum("btf,fhd->bthd", x, w) + b  # noqa: E731
    return project(query, wq, bq), project(value, wk, bk), project(value, wv, bv), (wo, bo)


@pytest.mark.parametrize("hard", [False, True])
def test_scale_hard_and_pattern_match_the_float64_reference(hard):
    rng = np.random.default_rng(21)
    query, value = _normal(rng, BATCH, 6, QUERY_DIM), _normal(rng, BATCH, 6, VALUE_DIM)
    padding = _padding([6, 4], 6)
    pattern = Causal() & (SlidingWindow(2) | Strided(3))
    layer = MultiHeadAttention(num_heads=2, key_dim=4, scale=0.35, hard=hard, attention_pattern=pattern)
    output, scores = layer(query, value, value_mask=padding, return_attention_scores=True)
    q, k, v, (wo, bo) = _projected(layer, query, value)
    positions = np.arange(6)
    allowed = reference.pattern_allowed(
        ("and", ("causal",), ("or", ("window", 2), ("strided", 3))), positions, positions
    )
    mask = allowed[None, None] & padding[:, None, None, :]  # (batch, 1, q, k)
    attend = reference.hard_attention if hard else reference.attention
    attended, weights = attend(q, k, v, mask=mask, scale=0.35)
    np.testing.assert_allclose(np.asarray(scores), weights, atol=ATOL)
    np.testing.assert_allclose(np.asarray(output), np.einsum("bthd,hdo->bto", attended, wo) + bo, atol=ATOL)
    # the op with the same pattern on the layer's projections
    op = scaled_dot_product_attention(
        *(t.astype("float32") for t in (q, k, v)),
        mask=padding[:, None, None, :],
        pattern=pattern,
        scale=0.35,
        hard=hard,
    )
    np.testing.assert_allclose(np.asarray(op), attended, atol=ATOL)


def test_default_scale_is_keras_inverse_sqrt_key_dim():
    rng = np.random.default_rng(22)
    x = _normal(rng, BATCH, 5, 8)
    default, explicit = MultiHeadAttention(2, 4), MultiHeadAttention(2, 4, scale=0.5)  # 1 / sqrt(4)
    default(x, x)
    explicit(x, x)
    explicit.set_weights(default.get_weights())
    np.testing.assert_array_equal(np.asarray(default(x, x)), np.asarray(explicit(x, x)))
    sharper = MultiHeadAttention(2, 4, scale=2.0)
    sharper(x, x)
    sharper.set_weights(default.get_weights())
    assert not np.allclose(np.asarray(sharper(x, x)), np.asarray(default(x, x)), atol=1e-3)


def test_pattern_with_a_cache_equals_the_full_pass():
    rng = np.random.default_rng(23)
    x = _normal(rng, BATCH, 6, 8)
    layer = MultiHeadAttention(num_heads=2, key_dim=4, attention_pattern=Strided(2) | SlidingWindow(2))
    full = np.asarray(layer(x, x, use_causal_mask=True))
    cache = np.zeros((BATCH, 2, 6, 2, 4), "float32")
    steps = []
    for index in range(6):
        token = x[:, index : index + 1]
        output, cache = layer(token, token, use_causal_mask=True, cache=cache, cache_update_index=index)
        steps.append(np.asarray(output))
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=ATOL)
    unpatterned = MultiHeadAttention(num_heads=2, key_dim=4)
    unpatterned(x, x)
    unpatterned.set_weights(layer.get_weights())
    assert not np.allclose(np.asarray(unpatterned(x, x, use_causal_mask=True)), full, atol=1e-3)  # the pattern acts


def test_hard_attention_layer_is_jit_stable_mixed_precision_finite_and_trains():
    rng = np.random.default_rng(24)
    x = _normal(rng, BATCH, 6, 8)
    padding = _padding([6, 3], 6)
    layer = MultiHeadAttention(num_heads=2, key_dim=4, hard=True, attention_pattern=Causal())
    _, scores = layer(x, x, query_mask=padding, value_mask=padding, return_attention_scores=True)
    scores = np.asarray(scores)
    assert set(np.unique(scores)) <= {0.0, 1.0}
    np.testing.assert_array_equal(scores.sum(-1), np.broadcast_to(padding[:, None, :], scores.shape[:-1]))
    assert_jit_matches_eager(layer, (x, x), query_mask=padding, value_mask=padding, return_attention_scores=True)
    for policy in ("mixed_float16", "mixed_bfloat16"):
        half = MultiHeadAttention(num_heads=2, key_dim=4, hard=True, attention_pattern=Causal(), dtype=policy)
        half(x, x)
        half.set_weights(layer.get_weights())
        assert np.isfinite(np.asarray(half(x, x, query_mask=padding, value_mask=padding), np.float32)).all()
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(layer(x, x, value_mask=padding) ** 2)
    gradients = dict(zip((w.path for w in layer.trainable_weights), tape.gradient(loss, layer.trainable_weights)))
    for path in ("query/kernel", "key/kernel", "value/kernel"):  # straight-through: the logits learn too
        assert np.abs(np.asarray(next(g for p, g in gradients.items() if p.endswith(path)))).max() > 0, path


def test_pattern_and_hard_survive_a_keras_file_round_trip():
    def model():
        inputs = keras.Input((6, 8))
        layer = MultiHeadAttention(
            num_heads=2, key_dim=4, hard=True, scale=0.9, attention_pattern=Causal() & (SlidingWindow(2) | Strided(3))
        )
        return keras.Model(inputs, layer(inputs, inputs))

    reloaded = assert_serialization_round_trip(model, _normal(np.random.default_rng(25), BATCH, 6, 8))
    layer = reloaded.layers[-1]
    assert (layer.hard, layer.scale) == (True, 0.9)
    assert repr(layer.attention_pattern) == repr(Causal() & (SlidingWindow(2) | Strided(3)))


def test_onnx_export_of_hard_patterned_attention_equals_keras(tmp_path):
    import onnxruntime  # noqa: PLC0415 (only this test needs the export stack)
    import tf2onnx  # noqa: PLC0415

    from export.onnx_conversion import OPSET  # noqa: PLC0415 (the project's opset)

    inputs, mask = keras.Input((None, 8)), keras.Input((None,), dtype="bool")
    layer = MultiHeadAttention(
        num_heads=2, key_dim=4, hard=True, scale=0.9, attention_pattern=Causal() & (SlidingWindow(2) | Strided(3))
    )
    model = keras.Model([inputs, mask], layer(inputs, inputs, query_mask=mask, value_mask=mask))
    signature = [
        tf.TensorSpec([None, None, 8], tf.float32, name="x"),
        tf.TensorSpec([None, None], tf.bool, name="mask"),
    ]
    predict = tf.function(lambda x, m: model([x, m], training=False), input_signature=signature)
    path = str(tmp_path / "attention.onnx")
    tf2onnx.convert.from_function(predict, input_signature=signature, opset=OPSET, output_path=path)
    session = onnxruntime.InferenceSession(path)
    rng = np.random.default_rng(26)
    for length in (7, 3):  # dynamic batch and length
        x = _normal(rng, 2, length, 8)
        padding = _padding([length, 2], length)
        got = session.run(None, {"x": x, "mask": padding})[0]
        np.testing.assert_allclose(got, np.asarray(model([x, padding])), atol=1e-6)
