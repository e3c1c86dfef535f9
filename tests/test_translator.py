import io
import json
import warnings
from contextlib import redirect_stdout

import keras
import numpy as np
import pytest

from models.translator import TokenAccuracy
from models.translator import Translator
from models.translator import build_translator
from models.translator import translation_loss
from pipelines import train_translator
from pipelines import translate
from tests import reference
from tests.translation_fixtures import require_data
from tests.translation_fixtures import tiny_config
from tests.translation_fixtures import tiny_vectorizers


def _batch(vectorizers, seed=0):
    rng = np.random.default_rng(seed)
    source = rng.integers(1, vectorizers.source_vocabulary_size, (3, 9)).astype("int32")
    target = rng.integers(1, vectorizers.target_vocabulary_size, (3, 7)).astype("int32")
    source[0, 5:] = 0
    target[1, 4:] = 0
    return source, target


def test_logits_shape_config_round_trip_and_saved_model_file(tmp_path):
    vectorizers = tiny_vectorizers()
    model = build_translator(tiny_config(vectorizers))
    source, target = _batch(vectorizers)
    logits = model((source, target))
    assert tuple(logits.shape) == (3, 7, vectorizers.target_vocabulary_size)
    assert Translator.from_config(model.get_config()).get_config() == model.get_config()
    model.save(tmp_path / "translator.keras")
    reloaded = keras.saving.load_model(tmp_path / "translator.keras")
    np.testing.assert_allclose(reloaded((source, target)), logits, atol=1e-6)


def test_tied_projection_reuses_the_target_embedding():
    vectorizers = tiny_vectorizers()
    tied = build_translator(tiny_config(vectorizers, tie_embeddings=True))
    untied = build_translator(tiny_config(vectorizers, tie_embeddings=False))
    embedding_dim = tied.embedding_dim
    assert untied.count_params() - tied.count_params() == vectorizers.target_vocabulary_size * embedding_dim
    # The tied logits are the decoder output times the transposed embedding table, plus a bias.
    hidden = np.random.default_rng(0).normal(size=(2, 3, embedding_dim)).astype("float32")
    table = keras.ops.convert_to_numpy(tied.target_embedding.token_embedding.embeddings).astype(np.float64)
    normalized = keras.ops.convert_to_numpy(tied.decoder_norm(hidden)).astype(np.float64)
    expected = normalized @ table.T + keras.ops.convert_to_numpy(tied.output_bias)
    np.testing.assert_allclose(tied.project(hidden), expected, atol=1e-4)


def test_source_and_target_padding_do_not_change_real_positions():
    vectorizers = tiny_vectorizers()
    model = build_translator(tiny_config(vectorizers))
    source, target = _batch(vectorizers)
    logits = keras.ops.convert_to_numpy(model((source, target)))
    wider_source = np.pad(source, ((0, 0), (0, 4)))
    longer_target = np.pad(target, ((0, 0), (0, 3)))
    np.testing.assert_allclose(model((wider_source, target)), logits, atol=1e-5)
    real = target != 0
    padded_logits = keras.ops.convert_to_numpy(model((source, longer_target)))[:, : target.shape[1]]
    np.testing.assert_allclose(padded_logits[real], logits[real], atol=1e-5)


def test_loss_and_token_accuracy_ignore_padding():
    rng = np.random.default_rng(1)
    y_true = np.array([[5, 7, 3, 0, 0], [4, 3, 0, 0, 0]])
    logits = rng.normal(size=(2, 5, 9)).astype("float32")
    real = y_true != 0
    expected_loss = -np.mean(np.take_along_axis(reference.log_softmax(logits), y_true[..., None], -1)[..., 0][real])
    np.testing.assert_allclose(float(translation_loss()(y_true, logits)), expected_loss, rtol=1e-5)
    # Label smoothing: (1 - e) of the target's and e of the vocabulary's mean -log p, over real tokens.
    log_probs = reference.log_softmax(logits)
    target = -np.take_along_axis(log_probs, y_true[..., None], -1)[..., 0]
    smoothed = 0.9 * target - 0.1 * log_probs.mean(-1)
    np.testing.assert_allclose(float(translation_loss(0.1)(y_true, logits)), smoothed[real].mean(), rtol=1e-5)
    unreduced = translation_loss(0.1)
    unreduced.reduction = None  # what the multi-worker step weighs by the global count of real tokens
    np.testing.assert_allclose(unreduced(y_true, logits), np.where(real, smoothed, 0.0), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="label_smoothing"):
        translation_loss(1.0)
    metric = TokenAccuracy()
    metric.update_state(y_true, logits)
    metric.update_state(y_true[:1], logits[:1])  # accumulates over batches, token-weighted
    hits = (logits.argmax(-1) == y_true) & real
    expected_accuracy = (hits.sum() + hits[0].sum()) / (real.sum() + real[0].sum())
    np.testing.assert_allclose(float(metric.result()), expected_accuracy, rtol=1e-6)


def test_bad_width_raises_value_error():
    with pytest.raises(ValueError, match="embedding_dim"):
        Translator(10, 10, embedding_dim=30, num_heads=4)


def test_smoke_training_writes_a_run_that_translates(tmp_path, capsys):
    require_data()
    output = tmp_path / "run"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        summary = train_translator.main(["--smoke", "--epochs", "1", "--output-dir", str(output)])
    # A normal run shows its steps from the first epoch and no framework warnings.
    assert "/Unknown" not in capsys.readouterr().out
    framework = [
        str(w.message) for w in caught if "shuffle=True" in str(w.message) or "ran out of data" in str(w.message)
    ]
    assert framework == []
    for name in ("split.json", "source_vocabulary.txt", "target_vocabulary.txt", "translator.keras", "run_config.json"):
        assert (output / name).is_file(), name
    recorded = json.loads((output / "summary.json").read_text())
    assert recorded["epochs_run"] == 1 and recorded["bleu_sentences"] == train_translator.SMOKE_DATA["max_test"]
    assert 0.0 < recorded["test_token_accuracy"] < 1.0  # BLEU is checked against a re-scoring below
    assert recorded["data"]["train"] + recorded["data"]["validation"] + recorded["data"]["test"] == 1_500
    assert summary["test_bleu"] == recorded["test_bleu"]
    # The split is by source; the headline is beam search's multi-reference BLEU, greedy beside it.
    assert recorded["split"] == {"method": "source", "seed": 1337, "test_sources_in_training": 0}
    assert recorded["test_set"]["sources"] == recorded["bleu_sentences"]
    assert recorded["beam"]["beam_size"] == recorded["beam_size"] == 4 and recorded["greedy"]["beam_size"] == 1
    assert recorded["test_bleu"] == recorded["beam"]["bleu"] and recorded["test_chrf"] == recorded["beam"]["chrf"]
    for search in ("greedy", "beam"):
        assert {"bleu", "bleu_single_reference", "chrf", "chrf_single_reference"} <= set(recorded[search])
    assert_translator_report(output / "report.html", recorded, output)
    # --evaluate-only scores the run's own data and direction, whatever the flags say.
    evaluation = train_translator.main(
        ["--smoke", "--evaluate-only", "--output-dir", str(output), "--source", "en", "--target", "es"]
    )
    assert evaluation["test_bleu"] == recorded["test_bleu"]
    assert evaluation["bleu_sentences"] == recorded["bleu_sentences"]
    # The `translate` command prints one line per sentence, as translate_with_run returns them.
    sentences = ["Tengo hambre.", "¿Dónde está Tom?"]
    printed = io.StringIO()
    with redirect_stdout(printed):
        translate.main(["--run", str(output), *sentences])
    assert printed.getvalue().splitlines() == translate.translate_with_run(str(output), sentences)


def assert_translator_report(path, summary, run_dir):
    """The run's report: its BLEU, curves inline, each example's alignments equal to `alignment_maps`'."""
    from keras_attn.visualization.explorer import decode_weights
    from keras_attn.visualization.explorer import embedded_data
    from models.decoding import make_decoder
    from models.translator_attention import alignment_maps
    from models.translator_run import load_run

    page = path.read_text()
    assert "://" not in page.replace("data:image/png;base64,", "")
    assert f"{summary['test_bleu']} on {summary['bleu_sentences']:,} sentences" in page
    assert page.count("data:image/png;base64,") == 1
    model, vectorizers, _ = load_run(run_dir)
    decoder = make_decoder(model, vectorizers, beam_size=summary["beam_size"], length_penalty=summary["length_penalty"])
    layers = embedded_data(page)["layers"]
    expected = []
    for number, example in enumerate(summary["examples"], start=1):
        target_ids = decoder(vectorizers.source_ids([example["source"]])).numpy()[0]
        expected += [
            (f"{number}. {example['source']} | {m.name}", m)
            for m in alignment_maps(model, vectorizers, example["source"], target_ids)
        ]
    assert [layer["name"] for layer in layers] == [name for name, _ in expected]
    for layer, (_, attention_map) in zip(layers, expected):
        np.testing.assert_allclose(decode_weights(layer), attention_map.weights, atol=1e-6)
