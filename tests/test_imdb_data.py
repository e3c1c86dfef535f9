import re
import string
import tarfile
from collections import Counter

import numpy as np
import pytest
import tensorflow as tf

from models import imdb_text
from pipelines import imdb_data
from tests.imdb_fixtures import PER_CLASS


def archive_reviews(archive):
    """Oracle: `{split: Counter((text, label))}` read straight from the tar file."""
    reviews = {"train": Counter(), "test": Counter()}
    with tarfile.open(archive) as tar:
        for member in tar:
            match = re.match(r"aclImdb/(train|test)/(pos|neg)/", member.name)
            if match and member.isfile():
                text = tar.extractfile(member).read().decode("utf-8")
                reviews[match.group(1)][(text, int(match.group(2) == "pos"))] += 1
    return reviews


def dataset_reviews(dataset):
    return Counter((text.decode("utf-8"), int(label)) for text, label in dataset.as_numpy_iterator())


def python_standardize(text):
    """Oracle: ASCII lowercase, `<br />` -> space, ASCII punctuation removed."""
    text = "".join(chr(ord(c) + 32) if "A" <= c <= "Z" else c for c in text).replace("<br />", " ")
    return "".join(c for c in text if c not in string.punctuation)


def python_tokens(text):
    return [token for token in re.split("[ \t\n\v\f\r]+", python_standardize(text)) if token]


# --- where the data comes from ------------------------------------------------------------


def test_explicit_path_wins_over_environment(small_imdb_archive, tmp_path):
    other = tmp_path / "imdb"
    other.mkdir()
    (other / "aclImdb_v1.tar.gz").write_bytes(b"")
    archive, looked = imdb_data.locate_archive(small_imdb_archive, {"KERAS_ATTN_DATA": str(tmp_path)})
    assert archive == small_imdb_archive
    assert looked == [f"--data={small_imdb_archive}"]


def test_environment_variable_and_directory_forms(small_imdb_archive):
    directory = small_imdb_archive.parent
    for name in imdb_data.DATA_ENV_VARS:
        assert imdb_data.locate_archive(None, {name: str(directory)})[0] == small_imdb_archive
    # a data root holding imdb/<archive>, like ../shared/data
    nested = directory / "root"
    (nested / "imdb").mkdir(parents=True)
    (nested / "imdb" / small_imdb_archive.name).symlink_to(small_imdb_archive)
    assert imdb_data.locate_archive(nested, {})[0] == nested / "imdb" / small_imdb_archive.name


def test_shared_data_is_the_fallback(monkeypatch, tmp_path):
    monkeypatch.setattr(imdb_data, "SHARED_DATA_DIR", tmp_path)
    archive, looked = imdb_data.locate_archive(None, {})
    assert archive is None
    assert str(tmp_path) in looked


@pytest.mark.parametrize("origin", ["--data", "$KERAS_ATTN_DATA", "$IMDB_DATA_DIR"])
def test_explicit_location_without_archive_is_an_error(origin, tmp_path):
    missing = tmp_path / "nowhere"
    data = str(missing) if origin == "--data" else None
    environ = {} if origin == "--data" else {origin[1:]: str(missing)}
    with pytest.raises(imdb_data.ImdbDataError, match=re.escape(f"{origin}='{missing}'")):
        imdb_data.locate_archive(data, environ)


def test_nothing_local_and_no_download_says_where_it_looked(monkeypatch, tmp_path):
    monkeypatch.setattr(imdb_data, "SHARED_DATA_DIR", tmp_path / "shared")
    for name in imdb_data.DATA_ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(imdb_data.ImdbDataError) as error:
        imdb_data.load_cache(cache_dir=tmp_path / "cache", allow_download=False)
    message = str(error.value)
    assert str(tmp_path / "shared") in message and "--data" in message and "$KERAS_ATTN_DATA" in message


def test_corrupt_archive_is_one_clear_error(small_imdb_archive, tmp_path):
    truncated = tmp_path / "aclImdb_v1_labeled.tar.gz"
    truncated.write_bytes(small_imdb_archive.read_bytes()[: small_imdb_archive.stat().st_size // 2])
    with pytest.raises(imdb_data.ImdbDataError, match=f"{re.escape(str(truncated))} is corrupt"):
        imdb_data.load_cache(truncated, tmp_path / "cache")
    assert not list(tmp_path.rglob("*.tfrecord"))  # no half-written cache left


def test_archive_without_negative_reviews_is_incomplete(small_imdb_archive, tmp_path):
    partial = tmp_path / "aclImdb_v1_labeled.tar.gz"
    with tarfile.open(small_imdb_archive) as reader, tarfile.open(partial, "w:gz") as writer:
        for member in reader:
            if "/neg/" not in member.name:
                writer.addfile(member, reader.extractfile(member))
    with pytest.raises(imdb_data.ImdbDataError, match="incomplete"):
        imdb_data.load_cache(partial, tmp_path / "cache")


# --- the decode-once cache ------------------------------------------------------------------


def test_cache_holds_exactly_the_archive_reviews(small_imdb_archive, imdb_cache_dir):
    cache = imdb_data.load_cache(small_imdb_archive, imdb_cache_dir)
    expected = archive_reviews(small_imdb_archive)
    assert cache.counts == {"train": 2 * PER_CLASS["train"], "test": 2 * PER_CLASS["test"]}
    for split in imdb_data.SPLITS:
        assert dataset_reviews(cache.records(split)) == expected[split]


def test_cache_is_decoded_once_and_reused(small_imdb_archive, imdb_cache_dir):
    first = imdb_data.load_cache(small_imdb_archive, imdb_cache_dir)
    stamp = (first.directory / "train.tfrecord").stat().st_mtime_ns
    second = imdb_data.load_cache(small_imdb_archive, imdb_cache_dir)
    assert second.directory == first.directory
    assert (second.directory / "train.tfrecord").stat().st_mtime_ns == stamp
    assert not [p for p in first.directory.parent.iterdir() if p.name.startswith(".")]  # no staging left


def test_splits_are_disjoint_and_fixed(small_imdb_archive, imdb_cache_dir):
    cache = imdb_data.load_cache(small_imdb_archive, imdb_cache_dir)
    splits = imdb_data.split_reviews(cache, validation_size=60, max_test=100)
    train, validation = dataset_reviews(splits.train), dataset_reviews(splits.validation)
    assert splits.counts == {"train": 240, "validation": 60, "test": 100}
    assert sum(train.values()) == 240 and sum(validation.values()) == 60
    assert train + validation == dataset_reviews(cache.records("train"))
    assert dataset_reviews(splits.test) <= archive_reviews(small_imdb_archive)["test"]
    again = imdb_data.split_reviews(cache, validation_size=60)
    assert dataset_reviews(again.validation) == validation
    with pytest.raises(ValueError, match="validation_size=300"):
        imdb_data.split_reviews(cache, validation_size=300)


# --- tokenisation ---------------------------------------------------------------------------


def test_standardize_matches_the_documented_rules(small_imdb_archive, imdb_cache_dir):
    cache = imdb_data.load_cache(small_imdb_archive, imdb_cache_dir)
    texts = [text.decode("utf-8") for text, _ in cache.records("test").as_numpy_iterator()]
    texts += ["Great<br /><br />MOVIE!!! It's ÉLAN, 10/10.", "tab\there\u00a0nbsp", ""]
    got = [t.decode("utf-8") for t in imdb_text.standardize(tf.constant(texts)).numpy()]
    assert got == [python_standardize(text) for text in texts]
    assert "<br />" not in " ".join(got) and not any(c in " ".join(got) for c in "!.,'/")


def test_vocabulary_comes_from_training_split_only(small_imdb_archive, imdb_cache_dir, tmp_path):
    cache = imdb_data.load_cache(small_imdb_archive, imdb_cache_dir)
    splits = imdb_data.split_reviews(cache, validation_size=60)
    vectorizer = imdb_text.adapt_review_vectorizer(splits.train.map(lambda text, label: text), vocabulary_size=50_000)
    train_counts = Counter(t for text, _ in splits.train.as_numpy_iterator() for t in python_tokens(text.decode()))
    vocabulary = vectorizer.get_vocabulary(include_special_tokens=False)
    assert set(vocabulary) == set(train_counts)  # every training token, nothing from validation/test
    counts = [train_counts[token] for token in vocabulary]
    assert counts == sorted(counts, reverse=True)  # most frequent first

    path = imdb_text.save_review_vocabulary(vectorizer, tmp_path / "vocabulary.txt")
    reloaded = imdb_text.review_vectorizer(vectorizer.vocabulary_size(), vocabulary=str(path))
    texts = tf.constant([text for text, _ in splits.test.take(20).as_numpy_iterator()])
    np.testing.assert_array_equal(reloaded(texts).to_tensor().numpy(), vectorizer(texts).to_tensor().numpy())


def test_batches_are_bucketed_and_keep_every_token(small_imdb_archive, imdb_cache_dir):
    cache = imdb_data.load_cache(small_imdb_archive, imdb_cache_dir)
    splits = imdb_data.split_reviews(cache, validation_size=60)
    vectorizer = imdb_text.adapt_review_vectorizer(splits.train.map(lambda text, label: text), vocabulary_size=500)
    ids = imdb_data.token_ids(splits.train, vectorizer, sequence_length=150)
    expected = sorted(
        (tuple(np.asarray(vectorizer(tf.constant([text])).flat_values)[:150]), int(label))
        for text, label in splits.train.as_numpy_iterator()
    )
    got, widths = [], set()
    for batch_ids, labels in imdb_data.batched(ids, batch_size=16, sequence_length=150, shuffle=True, seed=3):
        widths.add(batch_ids.shape[1])
        assert batch_ids.shape[0] <= 16 and batch_ids.dtype == tf.int32
        for row, label in zip(batch_ids.numpy(), labels.numpy()):
            got.append((tuple(row[row != 0]), int(label)))
    assert widths <= {64, 128, 150}
    assert sorted(got) == [(tuple(t for t in row if t != 0), label) for row, label in expected]
