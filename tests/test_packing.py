"""keras_attn.packing: documents packed into fixed-length rows in tf.data, and back.

The oracle is the documents themselves: every document in comes out exactly once (read back from
the rows by its own segment id), in the row a plain-Python first-fit or best-fit assigns it.
"""

import warnings
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_attn import MaskedGlobalPooling
from keras_attn import MultiHeadAttention
from keras_attn import causal_mask
from keras_attn import packing
from keras_attn.patterns import document_mask
from tests.markdown_examples import python_examples
from tests.markdown_examples import run_example

PACKING_GUIDE = Path(__file__).resolve().parents[1] / "docs" / "guides" / "packing_sequences.md"
RAN_OUT = "Your input ran out of data"


def random_documents(seed, count=40, longest=12):
    rng = np.random.default_rng(seed)
    return [rng.integers(1, 100, size=rng.integers(1, longest + 1)).tolist() for _ in range(count)]


def dataset_of(documents, **features):
    return tf.data.Dataset.from_tensor_slices({"tokens": tf.ragged.constant(documents, dtype=tf.int32), **features})


def rows_of(dataset):
    return list(dataset.as_numpy_iterator())


def documents_in(row, name="tokens"):
    """`{segment id: its tokens}` of a row, read token by token."""
    found = {}
    for token, segment in zip(row[name], row[f"{name}_segment_ids"]):
        if segment:
            found.setdefault(int(segment), []).append(int(token))
    return found


def python_packing(lengths, row_length, max_documents, strategy, window):
    """Rows as lists of document indices, packing each window of documents greedily (the oracle)."""
    rows = []
    for start in range(0, len(lengths), window):
        fills, members = [], []
        for index in range(start, min(start + window, len(lengths))):
            fits = [
                r
                for r in range(len(fills))
                if fills[r] + lengths[index] <= row_length and len(members[r]) < max_documents
            ]
            if not fits:
                fills.append(0)
                members.append([])
                fits = [len(fills) - 1]
            chosen = (
                fits[0] if strategy == "first_fit" else min(fits, key=lambda r: row_length - fills[r] - lengths[index])
            )
            fills[chosen] += lengths[index]
            members[chosen].append(index)
        rows += members
    return rows


@pytest.mark.parametrize("strategy", packing.STRATEGIES)
def test_every_document_comes_out_exactly_once_in_the_row_a_greedy_packing_gives_it(strategy):
    documents = random_documents(0)
    rows = rows_of(
        packing.pack(
            dataset_of(documents, index=np.arange(len(documents))),
            row_length=16,
            max_documents=3,
            strategy=strategy,
            window=16,
        )
    )
    expected = python_packing([len(d) for d in documents], 16, 3, strategy, window=16)
    assert [row["index"][row["document_mask"]].tolist() for row in rows] == expected
    for row in rows:
        found = documents_in(row)
        real = int(row["document_mask"].sum())
        assert sorted(found) == list(range(1, real + 1))  # ids 1..k, in the order of the slots
        for segment, tokens in found.items():
            assert tokens == documents[row["index"][segment - 1]]
        assert not row["document_mask"][real:].any() and not row["index"][real:].any()  # zeros after the last


@pytest.mark.parametrize("strategy", packing.STRATEGIES)
def test_place_puts_each_document_where_a_greedy_packing_does_after_the_ones_before_it(strategy):
    lengths = [len(document) for document in random_documents(seed=3)]
    rows, offsets = packing.place(lengths, row_length=16, strategy=strategy)
    members = python_packing(lengths, 16, max_documents=len(lengths), strategy=strategy, window=len(lengths))
    for row, documents in enumerate(members):
        assert [int(rows[index]) for index in documents] == [row] * len(documents)
        assert [int(offsets[index]) for index in documents] == list(
            np.cumsum([0] + [lengths[i] for i in documents])[:-1]
        )
    with pytest.raises(ValueError, match=r"`lengths` must be <= 16. Received: lengths holding 17"):
        packing.place([3, 17], row_length=16)  # known lengths: refused before any op runs
    with pytest.raises(tf.errors.InvalidArgumentError, match="row_length`=16"):
        tf.function(lambda lengths: packing.place(lengths, row_length=16))(tf.constant([3, 17]))


def test_segment_ids_are_contiguous_runs_and_positions_restart_at_each_document():
    rows = rows_of(packing.pack(dataset_of(random_documents(1)), row_length=20, max_documents=4))
    for row in rows:
        segment_ids = row["tokens_segment_ids"]
        real = segment_ids[segment_ids > 0]
        assert (np.diff(real) >= 0).all() and (segment_ids[len(real) :] == 0).all()  # packed left, in order
        expected_positions = np.zeros_like(segment_ids)
        for segment in np.unique(real):
            expected_positions[segment_ids == segment] = np.arange((segment_ids == segment).sum())
        np.testing.assert_array_equal(row["tokens_positions"], expected_positions)


def test_a_dataset_of_plain_tensors_gives_tokens_segment_ids_positions_and_the_document_mask():
    documents = random_documents(2, count=10)
    rows = packing.pack(tf.data.Dataset.from_tensor_slices(tf.ragged.constant(documents)), row_length=12)
    assert set(rows.element_spec) == {"tokens", "segment_ids", "positions", "document_mask"}
    assert rows.element_spec["tokens"].shape == (12,) and rows.element_spec["document_mask"].shape == (12,)
    out = []
    for row in rows_of(rows):
        out += documents_in({"tokens": row["tokens"], "tokens_segment_ids": row["segment_ids"]}).values()
    assert sorted(out) == sorted(documents)


def test_aligned_token_features_keep_each_document_under_one_segment_id_in_every_feature():
    rng = np.random.default_rng(3)
    inputs = [rng.integers(1, 50, size=rng.integers(1, 9)).tolist() for _ in range(30)]
    targets = [rng.integers(1, 50, size=rng.integers(1, 7)).tolist() for _ in range(30)]
    dataset = tf.data.Dataset.from_tensor_slices(
        {"inputs": tf.ragged.constant(inputs), "targets": tf.ragged.constant(targets), "index": np.arange(30)}
    )
    rows = rows_of(packing.pack(dataset, {"inputs": 10, "targets": 8}, max_documents=4, strategy="best_fit"))
    seen = []
    for row in rows:
        assert row["inputs"].shape == (10,) and row["targets"].shape == (8,)
        source, target = documents_in(row, "inputs"), documents_in(row, "targets")
        for segment in range(1, int(row["document_mask"].sum()) + 1):
            index = row["index"][segment - 1]
            assert source[segment] == inputs[index] and target[segment] == targets[index]
            seen.append(index)
    assert sorted(seen) == list(range(30))


def test_token_features_of_a_fixed_length_and_string_features_per_document_pack_too():
    dataset = tf.data.Dataset.from_tensor_slices({"pair": [[1, 2], [3, 4], [5, 6]], "name": ["a", "b", "c"]})
    first, last = rows_of(packing.pack(dataset, {"pair": 5}, max_documents=3))
    assert first["pair"].tolist() == [1, 2, 3, 4, 0] and first["pair_segment_ids"].tolist() == [1, 1, 2, 2, 0]
    assert first["name"].tolist() == [b"a", b"b", b""]
    assert last["pair"].tolist() == [5, 6, 0, 0, 0] and last["name"].tolist() == [b"c", b"", b""]


def test_a_document_longer_than_its_row_stops_the_dataset_naming_row_length_unless_truncated():
    documents = [[1, 2], [3, 4, 5, 6, 7, 8], [9]]
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"`row_length`=5.*`truncate=True`"):
        rows_of(packing.pack(dataset_of(documents), row_length=5))
    rows = rows_of(packing.pack(dataset_of(documents), row_length=5, truncate=True))
    assert sorted(d for row in rows for d in documents_in(row).values()) == [[1, 2], [3, 4, 5, 6, 7], [9]]


def test_the_packer_is_graph_only_and_runs_inside_a_tf_function():
    rows = packing.pack(dataset_of(random_documents(4, count=20)), row_length=16).batch(3)
    graph = rows._as_serialized_graph().numpy()
    assert b"PyFunc" not in graph  # no py_function / numpy_function anywhere in the pipeline

    @tf.function
    def real_tokens():
        total = tf.constant(0)
        for batch in rows:
            total += tf.reduce_sum(tf.cast(batch["tokens_segment_ids"] > 0, tf.int32))
        return total

    assert int(real_tokens()) == sum(len(d) for d in random_documents(4, count=20))


def test_unpack_gives_each_documents_tokens_and_vectors_in_row_order():
    documents = random_documents(5, count=12)
    batch = next(iter(packing.pack(dataset_of(documents, index=np.arange(12)), row_length=16).batch(100)))
    order = tf.boolean_mask(batch["index"], batch["document_mask"]).numpy()
    tokens = packing.unpack(batch["tokens"], batch["document_mask"], batch["tokens_segment_ids"])
    assert tokens.to_list() == [documents[i] for i in order]
    features = tf.stack([batch["tokens"], 2 * batch["tokens"]], axis=-1)  # per-token vectors (batch, length, 2)
    vectors = packing.unpack(features, batch["document_mask"], batch["tokens_segment_ids"])
    assert vectors.to_list() == [[[t, 2 * t] for t in documents[i]] for i in order]
    np.testing.assert_array_equal(packing.unpack(batch["index"], batch["document_mask"]), order)


@pytest.mark.parametrize(
    "arguments,match",
    [
        ({"row_length": 0}, r"`row_length` must be a positive integer.*Received: row_length=0"),
        ({"row_length": 8, "strategy": "worst_fit"}, r"`strategy` must be one of .*Received: strategy='worst_fit'"),
        ({"row_length": 8, "window": 0}, r"`window` must be a positive integer.*Received: window=0"),
        ({"row_length": 8, "max_documents": -1}, r"`max_documents` must be a positive integer.*max_documents=-1"),
        ({"row_length": 8, "truncate": "yes"}, r"`truncate` must be True or False.*Received: truncate='yes'"),
        ({"row_length": {"targets": 8}}, r"`row_length` names features the dataset does not have: \['targets'\]"),
        ({"row_length": {"label": 8}}, r"Token feature 'label' must be 1-D"),
    ],
)
def test_bad_arguments_are_refused_naming_the_argument(arguments, match):
    with pytest.raises(ValueError, match=match):
        packing.pack(dataset_of([[1, 2]], label=[0]), **arguments)


def test_a_dataset_of_tuples_is_refused_with_the_way_to_name_its_parts():
    pairs = tf.data.Dataset.from_tensor_slices((tf.ragged.constant([[1, 2], [3]]), [0, 1]))
    with pytest.raises(ValueError, match=r"a dict of features.*Received: dataset.element_spec=\("):
        packing.pack(pairs, row_length=4)


def test_a_per_document_feature_named_document_mask_is_refused():
    with pytest.raises(ValueError, match="may not be named 'document_mask'"):
        packing.pack(dataset_of([[1, 2]], document_mask=[1]), row_length=4)


class Encoder:
    """Embedding, learnt positions and self-attention within each document (by the mask of its segment ids)."""

    def __init__(self, vocabulary, dim, seed):
        keras.utils.set_random_seed(seed)
        self.layers = [
            keras.layers.Embedding(vocabulary, dim),
            keras.layers.Embedding(32, dim),
            MultiHeadAttention(num_heads=2, key_dim=4),
        ]

    def __call__(self, tokens, positions, segment_ids, causal):
        tokens_embedding, positions_embedding, attention = self.layers
        x = tokens_embedding(tokens) + positions_embedding(positions)
        mask = document_mask(segment_ids)  # (batch, 1, length, length)
        if causal:
            mask = tf.logical_and(mask, causal_mask(x.shape[1], x.shape[1]))
        return x + attention(x, x, attention_mask=mask)


def one_per_row(documents, row_length):
    """The documents padded one per row, as unpacked training sees them: tokens, segment ids (1), positions."""
    tokens = np.zeros((len(documents), row_length), "int32")
    for row, document in enumerate(documents):
        tokens[row, : len(document)] = document
    segment_ids = (np.arange(row_length)[None] < np.array([len(d) for d in documents])[:, None]).astype("int32")
    return tokens, segment_ids, np.where(segment_ids > 0, np.arange(row_length)[None], 0)


def all_rows(rows):
    return {name: tf.constant(value) for name, value in next(iter(rows.batch(1000).as_numpy_iterator())).items()}


def gradients_of(loss_fn, variables):
    with tf.GradientTape() as tape:
        loss = loss_fn()
    return loss, tape.gradient(loss, variables)


def assert_same_loss_and_gradients(packed_loss, unpacked_loss, variables):
    packed, packed_gradients = gradients_of(packed_loss, variables)
    unpacked, unpacked_gradients = gradients_of(unpacked_loss, variables)
    np.testing.assert_allclose(float(packed), float(unpacked), rtol=1e-5)
    for got, want in zip(packed_gradients, unpacked_gradients):
        np.testing.assert_allclose(tf.convert_to_tensor(got), tf.convert_to_tensor(want), rtol=1e-4, atol=1e-6)


def test_a_classifier_has_the_same_loss_and_gradients_on_packed_rows_as_on_the_documents_unpacked():
    documents = random_documents(6, count=24, longest=10)
    labels = np.random.default_rng(7).integers(0, 3, size=len(documents))
    rows = all_rows(packing.pack(dataset_of(documents, label=labels), row_length=16, max_documents=4))
    encode = Encoder(100, 8, seed=0)
    pooling = MaskedGlobalPooling("mean", max_documents=4)
    classify = keras.layers.Dense(3)
    cross_entropy = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)

    def packed_loss():
        x = encode(rows["tokens"], rows["tokens_positions"], rows["tokens_segment_ids"], causal=False)
        logits = classify(pooling(x, segment_ids=rows["tokens_segment_ids"]))  # (rows, max_documents, 3)
        return packing.mean_over_documents(cross_entropy(rows["label"], logits), rows["document_mask"])

    tokens, segment_ids, positions = one_per_row(documents, 16)

    def unpacked_loss():
        x = encode(tokens, positions, segment_ids, causal=False)
        return tf.reduce_mean(cross_entropy(labels, classify(MaskedGlobalPooling("mean")(x, mask=segment_ids > 0))))

    packed_loss()  # builds the layers
    assert len(rows["tokens"]) < len(documents) / 2  # the rows do hold several documents each
    assert_same_loss_and_gradients(packed_loss, unpacked_loss, trainable_variables(*encode.layers, classify))

    # In model.fit: sample_weight=document_mask with a loss that divides by the weights' sum.
    keras_loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="mean_with_sample_weight")
    x = encode(rows["tokens"], rows["tokens_positions"], rows["tokens_segment_ids"], causal=False)
    logits = classify(pooling(x, segment_ids=rows["tokens_segment_ids"]))
    np.testing.assert_allclose(
        float(keras_loss(rows["label"], logits, sample_weight=rows["document_mask"])), float(unpacked_loss()), rtol=1e-5
    )


def test_a_language_model_has_the_same_token_loss_and_gradients_on_packed_rows_as_unpacked():
    documents = random_documents(8, count=20, longest=11)
    documents = [d + [7] if len(d) == 1 else d for d in documents]  # at least one next token to predict
    shifted = tf.data.Dataset.from_tensor_slices(
        {
            "inputs": tf.ragged.constant([d[:-1] for d in documents]),
            "targets": tf.ragged.constant([d[1:] for d in documents]),
        }
    )
    rows = all_rows(packing.pack(shifted, row_length=12, max_documents=6, strategy="best_fit"))
    encode = Encoder(100, 8, seed=1)
    predict = keras.layers.Dense(100)
    cross_entropy = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)

    def packed_loss():
        x = encode(rows["inputs"], rows["inputs_positions"], rows["inputs_segment_ids"], causal=True)
        losses = cross_entropy(rows["targets"], predict(x))  # (rows, length)
        return packing.mean_over_tokens(losses, rows["targets_segment_ids"])

    inputs, segment_ids, positions = one_per_row([d[:-1] for d in documents], 12)
    targets, _, _ = one_per_row([d[1:] for d in documents], 12)

    def unpacked_loss():
        losses = cross_entropy(targets, predict(encode(inputs, positions, segment_ids, causal=True)))
        return tf.reduce_sum(losses * segment_ids) / tf.reduce_sum(tf.cast(segment_ids, tf.float32))

    packed_loss()
    np.testing.assert_array_equal(rows["inputs_segment_ids"], rows["targets_segment_ids"])  # aligned features
    assert len(rows["inputs"]) < len(documents) / 2
    assert_same_loss_and_gradients(packed_loss, unpacked_loss, trainable_variables(*encode.layers, predict))


def trainable_variables(*layers):
    return [variable for layer in layers for variable in layer.trainable_variables]


def _warnings_of(function):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        function()
    return [str(warning.message) for warning in caught]


def test_the_packing_guides_classifier_fits_on_packed_rows_without_keras_running_out_of_data():
    (code,) = [code for name, code in python_examples(PACKING_GUIDE) if name.startswith("per-document-pooling")]
    assert "steps_per_epoch" in code
    assert not [message for message in _warnings_of(lambda: run_example(code, PACKING_GUIDE)) if RAN_OUT in message]


def test_fitting_on_the_rows_themselves_makes_keras_warn_at_each_epoch_as_packs_docstring_says():
    rows = packing.pack(dataset_of(random_documents(0)), row_length=16)
    assert rows.cardinality() == tf.data.UNKNOWN_CARDINALITY
    model = keras.Sequential([keras.Input((16,), dtype="int32"), keras.layers.Embedding(100, 4), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    batches = rows.map(lambda row: (row["tokens"], row["tokens_segment_ids"] > 0)).batch(8)
    messages = _warnings_of(lambda: model.fit(batches, epochs=2, verbose=0))
    assert len([message for message in messages if RAN_OUT in message]) == 2
