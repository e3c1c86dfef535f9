"""The translator on packed rows (`--pack`): several sentence pairs per row, the same logits and loss as unpacked."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from export.translator import verified_export
from models.decoding import translate_ids
from models.translator import build_translator
from models.translator import translation_loss
from models.translator_run import held_out_sources
from models.translator_run import load_run
from pipelines import train_translator
from pipelines import translation_data
from tests.translation_fixtures import require_data
from tests.translation_fixtures import spanish_english_slice
from tests.translation_fixtures import tiny_config
from tests.translation_fixtures import tiny_vectorizers


def _pairs(count, offset=0):
    """`count` real pairs as `[(source, target_in, target_out)]` int32 arrays, unpadded."""
    vectorizers = tiny_vectorizers()
    sources, targets = spanish_english_slice()
    dataset = translation_data.teacher_forcing_pairs(vectorizers, sources[offset:], targets[offset:])
    return [(s.numpy(), t_in.numpy(), t_out.numpy()) for (s, t_in), t_out in dataset.take(count)]


def _padded(pairs):
    """The pairs as one zero-padded unpacked batch `((source, target_in), target_out)`."""
    width = max(max(len(s), len(t)) for s, t, _ in pairs)
    rows = [[np.pad(a, (0, width - len(a))) for a in pair] for pair in pairs]
    source, target_in, target_out = (np.stack(side).astype("int32") for side in zip(*rows))
    return (source, target_in), target_out


def _packed_by_hand(pairs, rows, row_length):
    """Pair `i` goes whole to row `i % rows`, as the next segment of both its encoder and decoder row."""
    arrays = {name: np.zeros((rows, row_length), "int32") for name in ("source", "in", "out", "sseg", "tseg")}
    fill = {"source": [0] * rows, "target": [0] * rows}
    for index, (source, target_in, target_out) in enumerate(pairs):
        row, segment = index % rows, index // rows + 1
        at = fill["source"][row]
        arrays["source"][row, at : at + len(source)] = source
        arrays["sseg"][row, at : at + len(source)] = segment
        fill["source"][row] += len(source)
        at = fill["target"][row]
        arrays["in"][row, at : at + len(target_in)] = target_in
        arrays["out"][row, at : at + len(target_in)] = target_out
        arrays["tseg"][row, at : at + len(target_in)] = segment
        fill["target"][row] += len(target_in)
    assert max(fill["source"] + fill["target"]) <= row_length
    return (arrays["source"], arrays["in"], arrays["sseg"], arrays["tseg"]), arrays["out"]


def _model(**overrides):
    keras.utils.set_random_seed(5)
    return build_translator(tiny_config(tiny_vectorizers(), **overrides))


@pytest.mark.parametrize(
    "options", [{"tie_embeddings": True}, {"tie_embeddings": False}, {"attention": "window", "attention_window": 3}]
)
def test_a_packed_batch_has_each_pairs_logits_and_the_loss_of_the_unpacked_batch(options):
    pairs = _pairs(7)
    model = _model(**options)
    unpacked_inputs, unpacked_out = _padded(pairs)
    packed_inputs, packed_out = _packed_by_hand(pairs, rows=2, row_length=4 * tiny_vectorizers().sequence_length)
    unpacked_logits = keras.ops.convert_to_numpy(model(unpacked_inputs))
    packed_logits = keras.ops.convert_to_numpy(model(packed_inputs))
    # Every pair's target tokens get, packed, the logits they get alone in the padded batch.
    for index, (_, target_in, _) in enumerate(pairs):
        row, segment = index % 2, index // 2 + 1
        in_row = packed_logits[row][packed_inputs[3][row] == segment]
        np.testing.assert_allclose(in_row, unpacked_logits[index, : len(target_in)], atol=2e-5)
    loss = translation_loss(label_smoothing=0.1)
    np.testing.assert_allclose(
        float(loss(packed_out, packed_logits)), float(loss(unpacked_out, unpacked_logits)), rtol=1e-6
    )


def test_packed_gradients_equal_the_unpacked_ones():
    pairs = _pairs(6, offset=100)
    model = _model()
    loss = translation_loss(label_smoothing=0.1)

    def gradients(inputs, target_out):
        with tf.GradientTape() as tape:
            value = loss(target_out, model(inputs))
        return [keras.ops.convert_to_numpy(g) for g in tape.gradient(value, model.trainable_variables)]

    unpacked = gradients(*_padded(pairs))
    packed = gradients(*_packed_by_hand(pairs, rows=2, row_length=3 * tiny_vectorizers().sequence_length))
    for variable, expected, got in zip(model.trainable_variables, unpacked, packed):
        np.testing.assert_allclose(got, expected, atol=1e-5, err_msg=variable.path)


def test_packed_inputs_of_another_arity_are_refused():
    model = _model()
    source = np.ones((1, 4), "int32")
    with pytest.raises(ValueError, match="packed rows"):
        model((source, source, source))


def test_the_packed_dataset_holds_every_pair_once_in_step_and_keeps_the_unpacked_loss():
    vectorizers = tiny_vectorizers()
    sources, targets = spanish_english_slice()
    sources, targets = sources[:40], targets[:40]
    row_length = 2 * vectorizers.sequence_length
    batches = translation_data.make_packed_dataset(
        vectorizers, sources, targets, row_length=row_length, tokens_per_batch=100 * row_length
    )
    ((packed_inputs, packed_out),) = list(batches)  # one batch holds every row
    source, target_in, source_segments, target_segments = (keras.ops.convert_to_numpy(x) for x in packed_inputs)
    packed_out = keras.ops.convert_to_numpy(packed_out)
    assert source.shape == target_in.shape == packed_out.shape == (len(source), row_length)
    found = []
    for row in range(len(source)):
        segments = set(source_segments[row][source_segments[row] > 0])
        assert segments == set(target_segments[row][target_segments[row] > 0])  # pair i is segment i on both sides
        for segment in sorted(segments):
            on_target = target_segments[row] == segment
            found.append(
                (
                    tuple(source[row][source_segments[row] == segment]),
                    tuple(target_in[row][on_target]),
                    tuple(packed_out[row][on_target]),
                )
            )
    pairs = _pairs(len(sources))
    assert sorted(found) == sorted((tuple(s), tuple(t_in), tuple(t_out)) for s, t_in, t_out in pairs)
    assert len(source) < len(pairs)  # several pairs share a row
    model = _model()
    loss = translation_loss(label_smoothing=0.1)
    unpacked_inputs, unpacked_out = _padded(pairs)
    np.testing.assert_allclose(
        float(loss(packed_out, model(packed_inputs))), float(loss(unpacked_out, model(unpacked_inputs))), rtol=1e-6
    )


def _greedy_by_full_passes(model, source_ids, start_id, end_id):
    """Greedy decoding one sentence per row by whole teacher-forced passes of `model` (no cache)."""
    tokens = np.zeros((len(source_ids), model.sequence_length), "int32")
    tokens[:, 0] = start_id
    done = np.zeros(len(source_ids), bool)
    for step in range(1, model.sequence_length):
        logits = keras.ops.convert_to_numpy(model((source_ids, tokens[:, :step])))
        chosen = np.where(done, 0, logits[:, -1].argmax(-1))
        tokens[:, step] = chosen
        done |= chosen == end_id
    return tokens


@pytest.mark.slow
def test_pack_trains_end_to_end_and_the_model_translates_and_exports_one_sentence_per_row(tmp_path):
    require_data()
    run_dir = tmp_path / "run"
    summary = train_translator.main(
        ["--smoke", "--pack", "--epochs", "1", "--beam-size", "1", "--max-test", "8", "--output-dir", str(run_dir)]
    )
    assert (
        summary["packed_row_length"]
        == train_translator.PACKED_ROW_SENTENCES * train_translator.SMOKE_MODEL.sequence_length
    )
    assert 0.0 < summary["test_token_accuracy"] < 1.0 and summary["bleu_sentences"] == 8
    model, vectorizers, _ = load_run(run_dir)
    sentences = held_out_sources(run_dir, 6)
    source_ids = keras.ops.convert_to_numpy(vectorizers.source_ids(sentences))
    cached = keras.ops.convert_to_numpy(translate_ids(model, source_ids, vectorizers.start_id, vectorizers.end_id))
    expected = _greedy_by_full_passes(model, source_ids, vectorizers.start_id, vectorizers.end_id)
    np.testing.assert_array_equal(cached, expected)
    _, report = verified_export.export_translator(model, vectorizers, str(tmp_path / "export"), sentences)
    assert report == {"sentences": len(sentences), "saved_model_matches": True, "onnx_matches": True}


def _tokens(batches):
    """`(token slots, real tokens)` of the source and target-input sides of teacher-forcing batches."""
    sides = [keras.ops.convert_to_numpy(side) for inputs, _ in batches for side in inputs[:2]]
    return sum(side.size for side in sides), sum(int((side != 0).sum()) for side in sides)


def test_every_layout_holds_the_same_tokens_and_packing_pads_least():
    vectorizers = tiny_vectorizers()
    sources, targets = spanish_english_slice()
    row_length = 2 * vectorizers.sequence_length
    counts = {
        layout: _tokens(
            translation_data.layout_batches(layout, vectorizers, sources[:300], targets[:300], 512, row_length)
        )
        for layout in translation_data.LAYOUTS
    }
    assert len({real for _, real in counts.values()}) == 1
    padding = {layout: 1 - real / slots for layout, (slots, real) in counts.items()}
    assert padding["packed"] < padding["bucketed"] < padding["padded"]
    with pytest.raises(ValueError, match="layout='ragged'"):
        translation_data.layout_batches("ragged", vectorizers, sources, targets, 512, row_length)
    with pytest.raises(ValueError, match="row_length=8"):
        translation_data.make_packed_dataset(vectorizers, sources, targets, row_length=8)


def test_shuffled_packed_epochs_have_the_same_batches_in_number_and_pairs_in_another_order():
    vectorizers = tiny_vectorizers()
    sources, targets = spanish_english_slice()
    batches = translation_data.make_packed_dataset(
        vectorizers, sources[:400], targets[:400], 2 * vectorizers.sequence_length, 256, shuffle=True, seed=3
    )
    epochs = []
    for _ in range(2):  # one dataset, iterated twice, as fit iterates it each epoch
        epochs.append([keras.ops.convert_to_numpy(inputs[0]) for inputs, _ in batches])
    assert len(epochs[0]) == len(epochs[1])
    flat = [np.concatenate(epoch) for epoch in epochs]
    assert sorted(map(tuple, flat[0])) == sorted(map(tuple, flat[1]))  # the same rows
    assert not np.array_equal(flat[0], flat[1])  # in another order
