"""`explain_imdb`: a run's classifier reloaded, the review's probability, tokens and attention maps.

The run is `tiny_imdb_run` (tests/imdb_fixtures.py), the in-memory classifier the oracle.
"""

import io
import re
import shutil
from contextlib import redirect_stdout

import numpy as np
import pytest
import tensorflow as tf

from keras_attn.visualization import attention_weights
from keras_attn.visualization.explorer import decode_weights
from keras_attn.visualization.explorer import embedded_data
from models import imdb_text
from pipelines import explain_imdb
from pipelines import resumable_training
from tests.test_visualization_figures import assert_png

REVIEW = "A wonderful, moving film<br />but the plot was zzzunknown and thin."


def test_reloaded_classifier_gives_the_same_probability_and_maps(tiny_imdb_run):
    directory, model, vectorizer, config = tiny_imdb_run
    printed = io.StringIO()
    with redirect_stdout(printed):
        explained = explain_imdb.main(["--run", str(directory), "--top", "3", REVIEW])

    ids = imdb_text.dense_token_ids([REVIEW], vectorizer, config.max_tokens)
    assert explained.probability == pytest.approx(float(model(ids)[0, 0]), abs=1e-6)
    assert printed.getvalue().splitlines()[0] == f"p(positive) = {explained.probability:.4f}"
    assert len(printed.getvalue().splitlines()) == 1 + 3
    words = "a wonderful moving film but the plot was zzzunknown and thin".split()
    assert explained.tokens == [w if w in vectorizer.get_vocabulary() else "[UNK]" for w in words]
    expected = attention_weights(model, ids)
    assert (
        [m.name for m in explained.maps] == list(expected) == ["encoder_0/self_attention", "encoder_1/self_attention"]
    )
    for attention_map, weights in zip(explained.maps, expected.values()):
        np.testing.assert_allclose(attention_map.weights, weights[0], atol=1e-6)
    np.testing.assert_allclose(explained.received.sum(), 1.0, atol=1e-5)
    assert explained.top_tokens(1)[0][1] == pytest.approx(explained.received.max())


def test_explain_writes_an_offline_page_and_a_png(tiny_imdb_run, tmp_path):
    directory, *_ = tiny_imdb_run
    page_path, png_path = tmp_path / "review.html", tmp_path / "review.png"
    with redirect_stdout(io.StringIO()):
        explained = explain_imdb.main(["--run", str(directory), "--output", str(page_path), REVIEW])
        explain_imdb.main(["--run", str(directory), "--output", str(png_path), REVIEW])
    page = page_path.read_text()
    assert "://" not in page and f"p(positive) = {explained.probability:.4f}" in page
    assert page.count('class="token"') == len(explained.tokens)
    layers = embedded_data(page)["layers"]
    for layer, attention_map in zip(layers, explained.maps, strict=True):
        np.testing.assert_array_equal(decode_weights(layer), attention_map.weights)
    assert_png(png_path, 800, 840)


def test_bad_output_suffix_and_missing_run_are_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        explain_imdb.main(["--run", str(tmp_path), "--output", "x.pdf", "good"])
    assert "--output must end in .html or .png, got 'x.pdf'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:  # a user's error: one line, exit 2 (--debug shows it)
        explain_imdb.main(["--run", str(tmp_path), "good"])
    assert exit_info.value.code == 2 and "holds no summary.json" in capsys.readouterr().err
    with pytest.raises(ValueError, match="no summary.json"):
        explain_imdb.main(["--run", str(tmp_path), "--debug", "good"])


def test_a_non_utf8_review_on_stdin_is_read_as_bytes_like_the_saved_model(tiny_imdb_run, tmp_path, monkeypatch):
    directory, model, vectorizer, config = tiny_imdb_run
    review = b"A wonderful \xff\xfe film, moving \xe9 and thin."  # not UTF-8
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(review)))
    with redirect_stdout(io.StringIO()):
        explained = explain_imdb.main(["--run", str(directory), "--output", str(tmp_path / "review.html")])
    ids = imdb_text.dense_token_ids(tf.constant([review]), vectorizer, config.max_tokens)  # the serving path
    assert explained.probability == pytest.approx(float(model(ids)[0, 0]), abs=1e-6)


def test_a_corrupt_checkpoint_or_summary_is_named_with_what_to_do(tiny_imdb_run, tmp_path, capsys):
    directory, *_ = tiny_imdb_run
    broken = tmp_path / "run"
    shutil.copytree(directory, broken)
    (broken / resumable_training.BEST_WEIGHTS).write_bytes(b"not an h5 file")
    with pytest.raises(SystemExit):
        explain_imdb.main(["--run", str(broken), "good"])
    error = capsys.readouterr().err.strip()
    assert (
        error.count("\n") == 0
        and str(broken / resumable_training.BEST_WEIGHTS) in error
        and "train the classifier again" in error
    )
    (broken / "summary.json").write_text("{")
    with pytest.raises(SystemExit):
        explain_imdb.main(["--run", str(broken), "good"])
    assert str(broken / "summary.json") in capsys.readouterr().err


def test_a_cut_vocabulary_is_refused_naming_the_file_and_both_sizes(tiny_imdb_run, tmp_path, capsys):
    directory, _, vectorizer, config = tiny_imdb_run
    broken = shutil.copytree(directory, tmp_path / "run")
    tokens = (broken / "vocabulary.txt").read_text(encoding="utf-8").splitlines()
    (broken / "vocabulary.txt").write_text("".join(f"{token}\n" for token in tokens[: len(tokens) // 2]))
    with pytest.raises(SystemExit):
        explain_imdb.main(["--run", str(broken), "good"])
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and str(broken / "vocabulary.txt") in error
    assert f"gives {len(tokens) // 2 + 2} token ids, the model takes {vectorizer.vocabulary_size()}" in error
    assert config.vocabulary_size == vectorizer.vocabulary_size() == len(tokens) + 2


def test_a_corrupt_training_state_is_named_with_how_to_start_over(tmp_path):
    state = tmp_path / resumable_training.BACKUP_DIR / resumable_training.TRAINING_STATE
    state.parent.mkdir()
    state.write_text('{"epochs": ')
    with pytest.raises(ValueError, match=re.escape(str(state)) + r".*delete .* to train from the start"):
        resumable_training.read_training_state(tmp_path)
