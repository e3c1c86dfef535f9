"""The causes a probe of packed rows, pooling, positions and packing found (issue 45), one test each,
against an independent oracle (NumPy) where the input is valid and a `ValueError` naming the argument
where it is not. What a document is: `keras_attn.core.segments.DOCUMENTS`."""

import numpy as np
import pytest

import keras_attn
from keras_attn import packing
from tests.keras_versions import skip_unless_input_spec_error_names_it

IDS = np.array([[1, 1, 2, 2, 0, 0], [1, 1, 1, 2, 2, 2]], "int32")
X = np.random.default_rng(0).normal(size=(2, 6, 4)).astype("float32")
HEADS = np.random.default_rng(1).normal(size=(2, 6, 2, 4)).astype("float32")
OTHER_BATCH = IDS[:1]


def _negative(ids):
    ids = ids.copy()
    ids[0, 0] = -1
    return ids


# Every surface that takes segment ids: a function of (segment-id argument name, ids).
SEGMENT_SURFACES = {
    "scaled_dot_product_attention": lambda ids: keras_attn.scaled_dot_product_attention(
        HEADS, HEADS, HEADS, segment_ids=ids
    ),
    "scaled_dot_product_attention (query/key)": lambda ids: keras_attn.scaled_dot_product_attention(
        HEADS, HEADS, HEADS, query_segment_ids=ids, key_segment_ids=IDS
    ),
    "MultiHeadAttention": lambda ids: keras_attn.MultiHeadAttention(2, 2)(X, X, segment_ids=ids),
    "MultiHeadAttention (query/key)": lambda ids: keras_attn.MultiHeadAttention(2, 2)(
        X, X, query_segment_ids=ids, key_segment_ids=IDS
    ),
    "LinearAttention": lambda ids: keras_attn.LinearAttention(2, 2, causal=True)(X, segment_ids=ids),
    "LSHSelfAttention": lambda ids: keras_attn.LSHSelfAttention(2, 2, num_buckets=2, chunk_size=2)(X, segment_ids=ids),
    "MaskedGlobalPooling": lambda ids: keras_attn.MaskedGlobalPooling(max_documents=2)(X, segment_ids=ids),
    "AttentionPooling": lambda ids: keras_attn.AttentionPooling(2, 2, max_documents=2)(X, segment_ids=ids),
    "TransformerEncoder": lambda ids: keras_attn.TransformerEncoder(4, 2)(X, segment_ids=ids),
    "TransformerDecoder": lambda ids: keras_attn.TransformerDecoder(4, 2)(X, decoder_segment_ids=ids),
    "PositionEmbedding": lambda ids: keras_attn.PositionEmbedding(8)(X, segment_ids=ids),
    "SinusoidalPositionEncoding": lambda ids: keras_attn.SinusoidalPositionEncoding()(X, segment_ids=ids),
    "RotaryEmbedding": lambda ids: keras_attn.RotaryEmbedding()(HEADS, segment_ids=ids),
    "TokenAndPositionEmbedding": lambda ids: keras_attn.TokenAndPositionEmbedding(10, 8, 4)(IDS + 1, segment_ids=ids),
    "document_positions": lambda ids: keras_attn.document_positions(ids),
    "packing.unpack": lambda ids: packing.unpack(X, np.ones((2, 2), bool), ids),
    "packing.mean_over_tokens": lambda ids: packing.mean_over_tokens(X[..., 0], ids),
}
SEGMENT_NAME = r"`(segment_ids|query_segment_ids|decoder_segment_ids)`"


@pytest.mark.parametrize("surface", sorted(SEGMENT_SURFACES))
@pytest.mark.parametrize("bad", ["negative", "float"])
def test_cause_1_negative_and_float_ids_are_refused_on_every_surface(surface, bad):
    ids = _negative(IDS) if bad == "negative" else IDS.astype("float32")
    SEGMENT_SURFACES[surface](IDS)  # valid ids are taken
    with pytest.raises(ValueError, match=SEGMENT_NAME):
        SEGMENT_SURFACES[surface](ids)


def test_cause_2_linear_attention_refuses_an_id_that_reappears_and_chunk_size_never_changes_its_output():
    x = np.random.default_rng(2).normal(size=(1, 12, 4)).astype("float32")
    valid = np.array([[1] * 4 + [2] * 4 + [3] * 4], "int32")
    first = keras_attn.LinearAttention(2, 2, causal=True, chunk_size=2)
    first(x, segment_ids=valid)
    outputs = []
    for chunk_size in (2, 3, 12):
        layer = keras_attn.LinearAttention(2, 2, causal=True, chunk_size=chunk_size)
        layer(x, segment_ids=valid)
        layer.set_weights(first.get_weights())
        outputs.append(np.asarray(layer(x, segment_ids=valid)))
        with pytest.raises(ValueError, match="`segment_ids` must give each document one contiguous run"):
            layer(x, segment_ids=np.array([[1] * 4 + [2] * 4 + [1] * 4], "int32"))
    np.testing.assert_allclose(outputs[0], outputs[1], atol=1e-5)
    np.testing.assert_allclose(outputs[0], outputs[2], atol=1e-5)


def _unpack_oracle(values, document_mask, segment_ids):
    """Document `s` of each row: its tokens with id `s`, in row order; the rows', then the ids' order."""
    return [
        [values[row][t] for t in range(len(segment_ids[row])) if segment_ids[row][t] == slot + 1]
        for row in range(len(values))
        for slot in range(len(document_mask[row]))
        if document_mask[row][slot]
    ]


@pytest.mark.parametrize(
    "segment_ids",
    [[[2, 2, 2, 1, 0]], [[1, 2, 1, 2, 0]], [[1, 1, 2, 2, 0]], [[0, 2, 2, 1, 1]]],
    ids=["decreasing", "interleaved", "in order", "padding first"],
)
def test_cause_2_unpack_takes_a_document_as_its_equal_ids(segment_ids):
    values, document_mask = [[10, 11, 20, 21, 30]], [[True, True]]
    unpacked = packing.unpack(values, document_mask, segment_ids).to_list()
    assert unpacked == _unpack_oracle(values, document_mask, segment_ids)


@pytest.mark.parametrize("surface", ["LSHSelfAttention", "document_positions", "PositionEmbedding", "RotaryEmbedding"])
def test_cause_2_surfaces_reading_documents_as_runs_refuse_an_id_that_reappears(surface):
    ids = np.array([[1, 1, 2, 2, 1, 1], [1, 1, 1, 2, 2, 2]], "int32")
    with pytest.raises(ValueError, match="one contiguous run"):
        SEGMENT_SURFACES[surface](ids)


def test_cause_2_pooling_honours_an_id_that_reappears():
    ids = np.array([[1, 1, 2, 2, 1, 1], [1, 1, 1, 2, 2, 2]], "int32")
    pooled = np.asarray(keras_attn.MaskedGlobalPooling(max_documents=2)(X, segment_ids=ids))
    expected = [[X[row][ids[row] == doc].astype("float64").mean(axis=0) for doc in (1, 2)] for row in range(2)]
    np.testing.assert_allclose(pooled, np.array(expected), atol=1e-6)


def test_cause_3_losses_outside_the_mask_are_selected_away_not_multiplied():
    assert float(packing.mean_over_tokens([[1.0, 3.0, np.nan]], [[1, 1, 0]])) == 2.0
    assert float(packing.mean_over_documents([[1.0, np.inf]], [[True, False]])) == 1.0
    assert float(packing.mean_over_documents([[np.nan, 5.0]], [[0, 1]])) == 5.0


@pytest.mark.parametrize("lengths", [[3, -1, 2], [3.0, 2.0], [1.5, 2.0], [2**40]], ids=str)
def test_cause_4_place_refuses_negative_float_and_huge_lengths(lengths):
    lengths = np.array(lengths, "int64") if lengths == [2**40] else lengths
    with pytest.raises(ValueError, match="`lengths` must"):
        packing.place(lengths, row_length=5)


BUILT = {
    "PositionEmbedding": (lambda: keras_attn.PositionEmbedding(8), (1, 4, 8)),
    "SinusoidalPositionEncoding": (lambda: keras_attn.SinusoidalPositionEncoding(), (1, 4, 8)),
    "MaskedGlobalPooling": (lambda: keras_attn.MaskedGlobalPooling(), (1, 4, 8)),
    "AttentionPooling": (lambda: keras_attn.AttentionPooling(2, 2), (1, 4, 8)),
    "TransformerEncoder": (lambda: keras_attn.TransformerEncoder(4, 2), (1, 4, 8)),
    "FeedForward": (lambda: keras_attn.FeedForward(4), (1, 4, 8)),
    "RotaryEmbedding": (lambda: keras_attn.RotaryEmbedding(), (1, 4, 2, 8)),
}
# Another width where the layer's weights fix it; another rank everywhere; each also at batch 2.
AFTER_BUILD = [
    (name, shape)
    for name, (_, built) in BUILT.items()
    for shape in (
        [(batch, 4, 6) for batch in (1, 2)]
        if name not in ("MaskedGlobalPooling", "SinusoidalPositionEncoding", "RotaryEmbedding")
        else []
    )
    + [(batch, 4) for batch in (1, 2)]
]


@pytest.mark.parametrize("name, shape", AFTER_BUILD, ids=[f"{n}-{s}" for n, s in AFTER_BUILD])
def test_cause_5_a_built_layer_checks_its_input_at_every_call(name, shape):
    make, built = BUILT[name]
    layer = make()
    layer(np.zeros(built, "float32"))
    with pytest.raises(ValueError) as error:
        layer(np.zeros(shape, "float32"))
    if "inputs" not in str(error.value):
        skip_unless_input_spec_error_names_it(error.value)
    assert "inputs" in str(error.value), str(error.value)


@pytest.mark.parametrize("surface", sorted(set(SEGMENT_SURFACES) - {"document_positions"}))  # it has no other input
def test_cause_7_segment_ids_of_another_batch_are_refused_naming_them(surface):
    with pytest.raises(ValueError, match=SEGMENT_NAME) as error:
        SEGMENT_SURFACES[surface](OTHER_BATCH)
    message = str(error.value).split("Arguments received by")[0]  # Keras lists every argument after it
    assert "attention_mask" not in message, message


def test_cause_7_document_positions_of_a_rank_1_input_names_segment_ids():
    with pytest.raises(ValueError, match=r"`segment_ids` must have rank 2"):
        keras_attn.document_positions([1, 1, 2])


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: packing.unpack(X, np.ones((3, 2), bool), IDS), "values"),
        (lambda: packing.unpack(X, np.ones((2, 5), bool)), "document_mask"),
        (lambda: packing.unpack(X[:, :5], np.ones((2, 2), bool), IDS), "segment_ids"),
        (lambda: packing.mean_over_documents(X[:, :2, 0], np.ones((2, 3), bool)), "document_mask"),
        (lambda: packing.mean_over_documents(X[:, :2, 0], np.ones((1, 2), bool)), "document_mask"),
        (lambda: packing.mean_over_tokens(X[..., 0], IDS[:, :5]), "segment_ids"),
    ],
    ids=["unpack batch", "unpack per-document", "unpack length", "mean documents", "mean batch", "mean tokens"],
)
def test_cause_7_mismatched_shapes_in_packing_name_the_argument(call, name):
    with pytest.raises(ValueError, match=f"`{name}`"):
        call()
