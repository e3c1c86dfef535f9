import hashlib
import json
import zipfile

import numpy as np
import pytest
import tensorflow as tf

from models import parallel_text
from models import translation_text
from models import translator_run
from pipelines import translation_data
from pipelines.batching import bucket_boundaries
from tests.translation_fixtures import require_data
from tests.translation_fixtures import spanish_english_slice
from tests.translation_fixtures import tiny_vectorizers


def _write_pairs(path, lines):
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return path


def test_reads_first_two_columns_of_plain_and_zipped_files_and_skips_macosx(tmp_path):
    lines = ["Go.\tVe.\tCC-BY 2.0 (France) Attribution: tatoeba.org", "", "Hi.\tHola.", "Run!\t¡Corre!"]
    plain = _write_pairs(tmp_path / "pairs.txt", lines)
    archive = tmp_path / "pairs.zip"
    with zipfile.ZipFile(archive, "w") as handle:
        handle.write(plain, "spa-eng/spa.txt")
        handle.writestr("__MACOSX/spa-eng/._spa.txt", "\x00\x05binary\tjunk" * 100)
        handle.writestr("spa-eng/_about.txt", "about\tthis")
    expected = (["Go.", "Hi.", "Run!"], ["Ve.", "Hola.", "¡Corre!"])
    assert parallel_text.read_pairs(str(plain)) == expected
    assert parallel_text.read_pairs(str(archive)) == expected


def test_real_zip_has_the_documented_pair_count():
    english, spanish = parallel_text.read_pairs(require_data())
    assert len(english) == len(spanish) == 118_964
    assert (english[0], spanish[0]) == ("Go.", "Ve.")


def test_bad_files_and_language_codes_raise_value_errors(tmp_path):
    with pytest.raises(ValueError, match="path"):
        parallel_text.read_pairs(str(tmp_path / "missing.txt"))
    with pytest.raises(ValueError, match="line 2"):
        parallel_text.read_pairs(str(_write_pairs(tmp_path / "bad.txt", ["a\tb", "no tab here"])))
    columns = (["Hi."], ["Hola."])
    with pytest.raises(ValueError, match="source"):
        parallel_text.orient_pairs(columns, ("en", "es"), "fr", "en")
    with pytest.raises(ValueError, match="differ"):
        parallel_text.orient_pairs(columns, ("en", "es"), "en", "en")


def test_direction_follows_the_language_codes():
    columns = (["Hi."], ["Hola."])
    assert parallel_text.orient_pairs(columns, ("en", "es"), "es", "en") == (["Hola."], ["Hi."])
    assert parallel_text.orient_pairs(columns, ("en", "es"), "en", "es") == (["Hi."], ["Hola."])


def test_split_is_seeded_disjoint_and_complete(tmp_path):
    split = translation_data.split_indices(1_000, seed=5, validation_fraction=0.1, test_fraction=0.2)
    again = translation_data.split_indices(1_000, seed=5, validation_fraction=0.1, test_fraction=0.2)
    other = translation_data.split_indices(1_000, seed=6, validation_fraction=0.1, test_fraction=0.2)
    assert {name: len(indices) for name, indices in split.items()} == {"train": 700, "validation": 100, "test": 200}
    assert np.array_equal(np.sort(np.concatenate(list(split.values()))), np.arange(1_000))
    assert all(np.array_equal(split[name], again[name]) for name in split)
    assert not np.array_equal(split["test"], other["test"])
    data = _write_pairs(tmp_path / "pairs.txt", ["a\tb"])
    translator_run.write_split(tmp_path / "split.json", split, str(data), seed=5, method="pair")
    recorded = json.loads((tmp_path / "split.json").read_text())
    assert recorded["seed"] == 5 and recorded["sizes"]["test"] == 200 and recorded["method"] == "pair"
    assert recorded["sha256"] == hashlib.sha256(data.read_bytes()).hexdigest()
    reread, method = translator_run.read_split(tmp_path / "split.json")
    assert all(np.array_equal(reread[name], split[name]) for name in split) and method == "pair"
    del recorded["method"]  # a split.json written before splits had a method was split by pair
    (tmp_path / "split.json").write_text(json.dumps(recorded))
    assert translator_run.read_split(tmp_path / "split.json")[1] == "pair"
    with pytest.raises(ValueError, match="test_fraction"):
        translation_data.split_indices(10, seed=0, test_fraction=0.7)


def test_split_by_source_keeps_every_pair_of_a_source_on_one_side():
    rng = np.random.default_rng(0)
    sources = [f"frase {number}" for number in rng.integers(0, 600, size=1_000)]  # many repeated
    split = translation_data.split_pairs(sources, "source", seed=5, validation_fraction=0.1, test_fraction=0.2)
    assert np.array_equal(np.sort(np.concatenate(list(split.values()))), np.arange(1_000))
    sides = {name: {sources[i] for i in indices} for name, indices in split.items()}
    assert not sides["train"] & sides["test"] and not sides["train"] & sides["validation"]
    assert not sides["validation"] & sides["test"]
    distinct = len(set(sources))
    assert len(sides["test"]) == round(0.2 * distinct) and len(sides["validation"]) == round(0.1 * distinct)
    again = translation_data.split_pairs(sources, "source", seed=5, validation_fraction=0.1, test_fraction=0.2)
    assert all(np.array_equal(split[name], again[name]) for name in split)
    by_pair = translation_data.split_pairs(sources, "pair", seed=5, validation_fraction=0.1, test_fraction=0.2)
    leaked = {sources[i] for i in by_pair["test"]} & {sources[i] for i in by_pair["train"]}
    assert leaked  # the old split puts other pairs of a test source in training
    with pytest.raises(ValueError, match="method"):
        translation_data.split_pairs(sources, "sentence", seed=5)


def test_the_real_corpus_split_by_source_shares_no_test_source_with_training():
    english, spanish = parallel_text.read_pairs(require_data())
    split = translation_data.split_pairs(spanish, "source", seed=1337, validation_fraction=0.05, test_fraction=0.1)
    training = {spanish[i] for i in split["train"]}
    assert not any(spanish[i] in training for i in split["test"])
    old = translation_data.split_pairs(spanish, "pair", seed=1337, validation_fraction=0.05, test_fraction=0.1)
    old_training = {spanish[i] for i in old["train"]}
    assert sum(spanish[i] in old_training for i in old["test"]) == 895  # the count on the old split


def test_standardisation_keeps_accents_splits_punctuation_and_lowercases_unicode():
    text = tf.constant(["¿Dónde está el BAÑO?  ¡ÉSTA es Ñandú, l'eau!"])
    lowered = translation_text.standardize_lowercase(text).numpy()[0].decode()
    cased = translation_text.standardize_keep_case(text).numpy()[0].decode()
    assert lowered == "¿ dónde está el baño ? ¡ ésta es ñandú , l'eau !"
    assert cased == "¿ Dónde está el BAÑO ? ¡ ÉSTA es Ñandú , l'eau !"


def test_detokenize_reattaches_punctuation():
    tokens = [["¿", "Dónde", "está", "?"], ["I", "don", "'", "t", "know", ",", "Tom", "."]]
    assert translation_text.detokenize(tokens) == ["¿Dónde está?", "I don't know, Tom."]


def test_vocabularies_reserve_start_and_end_and_round_trip(tmp_path):
    vectorizers = tiny_vectorizers()
    assert vectorizers.target.get_vocabulary()[:4] == ["", "[UNK]", "[start]", "[end]"]
    assert (vectorizers.start_id, vectorizers.end_id) == (2, 3)
    vectorizers.save(tmp_path)
    reloaded = translation_text.TranslationVectorizers.load(tmp_path, vectorizers.sequence_length)
    assert reloaded.source.get_vocabulary() == vectorizers.source.get_vocabulary()
    assert reloaded.target.get_vocabulary() == vectorizers.target.get_vocabulary()
    with pytest.raises(ValueError, match="target_vocabulary"):
        translation_text.TranslationVectorizers(["a"], ["b", "c"], 8)


def test_teacher_forcing_batches_shift_targets_and_bucket_lengths():
    vectorizers = tiny_vectorizers()
    sources, targets = spanish_english_slice()
    dataset = translation_data.make_dataset(vectorizers, sources, targets, tokens_per_batch=256)
    padded_lengths = {boundary - 1 for boundary in bucket_boundaries(vectorizers.sequence_length, width=4)}
    pairs = 0
    for (source_ids, target_in), target_out in dataset:
        assert source_ids.shape[1] == target_in.shape[1] in padded_lengths
        assert source_ids.shape[0] * source_ids.shape[1] <= 256
        target_in, target_out = target_in.numpy(), target_out.numpy()
        assert (target_in[:, 0] == vectorizers.start_id).all()
        # target_out is target_in shifted left by one; it ends with [end] where target_in ends.
        shifted = np.where(target_out[:, :-1] == vectorizers.end_id, 0, target_out[:, :-1])
        assert np.array_equal(target_in[:, 1:], shifted)
        real = target_out != 0
        last = real.sum(axis=1) - 1
        assert (target_out[np.arange(len(last)), last] == vectorizers.end_id).all()
        pairs += len(target_out)
    source_lengths = vectorizers.source(tf.constant(sources)).row_lengths().numpy()
    target_lengths = vectorizers.target(tf.constant(targets)).row_lengths().numpy() + 2  # [start], [end]
    length = vectorizers.sequence_length
    assert pairs == np.sum((source_lengths <= length) & (target_lengths <= length + 1)) > 0


def test_long_pairs_are_dropped_for_training_and_truncated_for_evaluation():
    vectorizers = tiny_vectorizers()
    long_source = " ".join(["hola"] * 40)
    kept = translation_data.make_dataset(vectorizers, [long_source], ["Tom."], drop_long=True)
    assert sum(1 for _ in kept) == 0
    (((source_ids, target_in), target_out),) = translation_data.make_dataset(
        vectorizers, [long_source], ["Tom."], drop_long=False
    )
    assert source_ids.shape == (1, vectorizers.sequence_length)
    words = vectorizers.target.get_vocabulary()
    assert target_out.numpy()[0].tolist()[:3] == [words.index("Tom"), words.index("."), vectorizers.end_id]
