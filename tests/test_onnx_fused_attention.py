"""`export.onnx_fused_attention`: our exported attention as ONNX Runtime's fused MultiHeadAttention.

Models are converted as the exports convert them (tf2onnx, `export.imdb.onnx_bundle.write_float_model`
or `export.onnx_conversion.convert`), rewritten, and run in onnxruntime; the oracle is the Keras
model with the same weights, on padded batches that include a row of padding only (every key of
its attention masked).
"""

import re

import keras
import numpy as np
import onnx
import onnxruntime
import pytest
import tensorflow as tf

from export.imdb.onnx_bundle import write_float_model
from export.imdb.onnx_bundle import write_fused_attention_model
from export.onnx_conversion import convert
from export.onnx_fused_attention import fuse_attention
from export.onnx_fused_attention import fused_attention_count
from export.onnx_fused_attention import write_fused_model
from keras_attn import LinearAttention
from keras_attn import MultiHeadAttention
from keras_attn import TokenAndPositionEmbedding
from keras_attn import TransformerEncoder
from models.sentiment_classifier import SentimentClassifierConfig
from models.sentiment_classifier import build_sentiment_classifier
from tests.layer_checks import padded_token_ids

ATOL = 1e-4  # the parity bound; measured differences are about 1e-7
VOCABULARY = 50
CLASSIFIER = SentimentClassifierConfig(
    vocabulary_size=VOCABULARY,
    max_tokens=24,
    sequence_length=16,
    embedding_dim=8,
    num_layers=2,
    num_heads=2,
    intermediate_dim=8,
    bigram_buckets=64,
)
LENGTHS = ([24, 9, 1, 0], 24)  # full, padded, one token, padding only


def token_ids(lengths, width, seed=3):
    return padded_token_ids(np.random.default_rng(seed), lengths, width, VOCABULARY)


def run_onnx(model, ids):
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: ids})[0]


def with_random_weights(model, seed=0):
    """`model` with weights of unit scale, so attention is far from uniform and a masking error shows."""
    rng = np.random.default_rng(seed)
    model.set_weights([rng.normal(0.0, 1.0, weight.shape).astype(weight.dtype) for weight in model.get_weights()])
    return model


def converted(model, path):
    """`model` (token ids in) as tf2onnx converts it, loaded."""
    signature = [tf.TensorSpec([None, None], tf.int32, name="token_ids")]
    convert(tf.function(lambda ids: model(ids, training=False), input_signature=signature), path)
    return onnx.load(path)


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    keras.utils.set_random_seed(5)
    model = build_sentiment_classifier(CLASSIFIER)
    directory = tmp_path_factory.mktemp("fused")
    fused = write_fused_model(write_float_model(model, directory / "model.onnx"), directory / "model.fused.onnx")
    return model, onnx.load(directory / "model.onnx"), fused


def test_the_classifier_gets_one_fused_node_per_attention_layer_and_no_softmax_left(classifier):
    _, unfused, fused = classifier
    assert fused_attention_count(unfused) == 0
    assert fused_attention_count(fused) == CLASSIFIER.num_layers
    assert [node.op_type for node in fused.graph.node].count("Softmax") == 0
    onnx.checker.check_model(fused)


def test_the_fused_classifier_matches_keras_on_padded_batches(classifier):
    model, unfused, fused = classifier
    for lengths, width in (LENGTHS, ([5, 3], 5)):
        ids = token_ids(lengths, width)
        expected = np.asarray(model(ids, training=False))
        np.testing.assert_allclose(run_onnx(fused, ids), expected, atol=ATOL, err_msg=f"lengths {lengths}")
        np.testing.assert_allclose(run_onnx(fused, ids), run_onnx(unfused, ids), atol=1e-6)


@pytest.mark.parametrize("mask_zero", [True, False], ids=["padding_masked", "unmasked"])
def test_the_fused_encoder_states_match_keras_at_every_position(mask_zero, tmp_path):
    """The hidden states themselves, every position (padding included), after two encoder blocks
    of unit-scale weights: a masked key given weight, or a padded row not zeroed, shows here;
    unmasked, the logits go to the fused node without a bias."""
    keras.utils.set_random_seed(6)
    ids_input = keras.Input((None,), dtype="int32")
    hidden = TokenAndPositionEmbedding(VOCABULARY, 24, 8, mask_zero=mask_zero)(ids_input)
    for _ in range(2):
        hidden = TransformerEncoder(16, num_heads=2)(hidden)
    model = with_random_weights(keras.Model(ids_input, hidden))
    fused = fuse_attention(converted(model, tmp_path / "encoder.onnx"))
    assert fused_attention_count(fused) == 2
    ids = token_ids(*LENGTHS)
    got, expected = run_onnx(fused, ids), np.asarray(model(ids, training=False))
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, expected, atol=ATOL)


def test_a_softmax_outside_attention_is_refused_by_name(tmp_path):
    ids_input = keras.Input((None,), dtype="int32")
    pooled = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(VOCABULARY, 4)(ids_input))
    model = keras.Model(ids_input, keras.layers.Dense(3, activation="softmax")(pooled))
    graph = converted(model, tmp_path / "softmax.onnx")
    softmax = next(node.name for node in graph.graph.node if node.op_type == "Softmax")
    # Its logits are the dense layer's MatMul of the pooled embeddings, not of transposed queries and keys.
    with pytest.raises(
        ValueError, match=re.escape(f"Softmax node {softmax!r}: the query operand of the scores is not a Transpose")
    ):
        fuse_attention(graph)


def test_attention_whose_weights_are_also_an_output_is_refused(tmp_path):
    """Returned attention scores read the softmax outside the core: fusing would drop them."""
    ids_input = keras.Input((None,), dtype="int32")
    embedded = keras.layers.Embedding(VOCABULARY, 8, mask_zero=True)(ids_input)
    attended, scores = MultiHeadAttention(num_heads=2, key_dim=4)(embedded, embedded, return_attention_scores=True)
    graph = converted(keras.Model(ids_input, [attended, scores]), tmp_path / "scores.onnx")
    with pytest.raises(
        ValueError, match="cannot fuse the attention at Softmax node .*also read outside the attention core"
    ):
        fuse_attention(graph)


def test_the_bundle_writes_no_fused_model_for_attention_the_rewrite_does_not_match(tmp_path):
    ids_input = keras.Input((None,), dtype="int32")
    embedded = keras.layers.Embedding(VOCABULARY, 8, mask_zero=True)(ids_input)
    model = keras.Model(ids_input, LinearAttention(num_heads=2, key_dim=4)(embedded, embedded))  # no softmax
    write_float_model(model, tmp_path / "model.onnx")
    assert write_fused_attention_model(tmp_path / "model.onnx", tmp_path / "model.fused.onnx") is None
    assert not (tmp_path / "model.fused.onnx").exists()


def test_a_graph_without_attention_or_a_non_model_is_refused(classifier):
    _, unfused, _ = classifier
    empty = onnx.helper.make_model(onnx.helper.make_graph([], "empty", [], []))
    with pytest.raises(ValueError, match="holds no Softmax"):
        fuse_attention(empty)
    with pytest.raises(ValueError, match="`model` must be an onnx.ModelProto. Received: model=str"):
        fuse_attention("model.onnx")
    assert fused_attention_count(unfused) == 0  # the input model is left as it was
