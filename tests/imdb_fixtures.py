"""The IMDB fixtures: a small archive cut from the real one, the session's tiny trained
classifier, and a tiny classifier's run directory, for the pipeline, export, explanation and
report tests.

`small_imdb_archive` copies a few hundred real reviews (both splits, both labels, the original
member paths) into a tar.gz under pytest's temporary directory, once per session. It never
downloads: without the real archive (`../shared/data`, `$KERAS_ATTN_DATA`, `$IMDB_DATA_DIR`)
the tests that need it are skipped. `trained_imdb` is the one tiny classifier trained on it in a
session: trained once (by whichever xdist worker asks first), saved, loaded by every worker that
reads it. `tiny_imdb_run` is an untrained two-block classifier written as a training run (what
`explain_imdb --run` reads), built in a second from four sentences, no data needed. The fixtures
are registered for every module by `pytest_plugins` in tests/conftest.py.
`interrupted_after_first_epoch` stops the training commands after their first committed epoch.
"""

import contextlib
import dataclasses
import io
import json
import os
import re
import shutil
import tarfile
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from appkit.files import write_json_atomic
from models import imdb_text
from models.sentiment_classifier import SentimentClassifierConfig
from models.sentiment_classifier import adapt_ngram_weights
from models.sentiment_classifier import build_sentiment_classifier
from models.sentiment_classifier import fit_ensemble
from models.sentiment_classifier import training_model
from pipelines import imdb_data
from pipelines import resumable_training
from tests.shared_data import missing_shared_data

# Reviews per (split, label) in the small archive.
PER_CLASS = {"train": 150, "test": 80}
# The classifier `trained_imdb` trains: one encoder block, small enough to export in seconds.
TINY_CLASSIFIER = SentimentClassifierConfig(
    vocabulary_size=800,
    max_tokens=160,
    sequence_length=96,
    embedding_dim=16,
    num_layers=1,
    num_heads=2,
    intermediate_dim=32,
    bigram_buckets=512,
)
_MEMBER = re.compile(r"^aclImdb/(train|test)/(pos|neg)/\d+_\d+\.txt$")


def smoke_args(archive, cache_dir, output_dir, *extra):
    """The command line of a `--smoke` training or main job on `archive`, never downloading."""
    return [
        "--smoke",
        "--data",
        str(archive),
        "--cache-dir",
        str(cache_dir),
        "--no-download",
        "--output-dir",
        str(output_dir),
        *extra,
    ]


def real_archive():
    archive, _ = imdb_data.locate_archive()
    if archive is None:
        missing_shared_data("the real IMDB archive is not available (../shared/data or $KERAS_ATTN_DATA)")
    return archive


def copy_reviews(source, target, per_class):
    """Writes `target` (tar.gz) with the first `per_class[split]` reviews of each split/label."""
    taken = {(split, label): 0 for split in per_class for label in ("pos", "neg")}
    with tarfile.open(source, "r:gz") as reader, tarfile.open(target, "w:gz") as writer:
        for member in reader:
            match = _MEMBER.match(member.name)
            if not match or taken[match.groups()] >= per_class[match.group(1)]:
                continue
            taken[match.groups()] += 1
            writer.addfile(member, io.BytesIO(reader.extractfile(member).read()))
            if all(count >= per_class[split] for (split, _), count in taken.items()):
                break
    return target


@pytest.fixture(scope="session")
def small_imdb_archive(tmp_path_factory):
    """Path of a tar.gz with 300 training and 160 test reviews from the real archive."""
    target = tmp_path_factory.mktemp("imdb") / "aclImdb_v1_labeled.tar.gz"
    return copy_reviews(real_archive(), target, PER_CLASS)


@pytest.fixture(scope="session")
def imdb_cache_dir(tmp_path_factory):
    """A decoded-data cache shared by the tests (never the user's ~/.cache)."""
    return tmp_path_factory.mktemp("imdb_cache")


@dataclasses.dataclass
class Trained:
    model: keras.Model
    vectorizer: keras.layers.TextVectorization
    vocabulary: Path  # the vocabulary.txt the vectoriser's vocabulary was saved to
    test_reviews: list
    validation: tuple  # (reviews, labels): the int8 model's accuracy check


def train_small(config, archive, cache_dir, run_dir):
    """A small classifier of `config` after a few steps on real reviews (parity needs no accuracy)."""
    keras.utils.set_random_seed(7)
    cache = imdb_data.load_cache(archive, cache_dir)
    splits = imdb_data.split_reviews(cache, validation_size=60)
    vectorizer = imdb_text.adapt_review_vectorizer(splits.train.map(lambda text, label: text), config.vocabulary_size)
    vocabulary = imdb_text.save_review_vocabulary(vectorizer, run_dir / "vocabulary.txt")
    model = build_sentiment_classifier(config)
    model.compile(optimizer=keras.optimizers.Adam(3e-3), loss="binary_crossentropy")
    batches = imdb_data.batched(imdb_data.token_ids(splits.train, vectorizer, config.max_tokens), 32, config.max_tokens)
    adapt_ngram_weights(model, batches)
    model.fit(batches, epochs=1, verbose=0)
    fit_ensemble(model, batches.take(2))  # weights other than the initial mean
    test_reviews = [text.decode("utf-8") for text, _ in splits.test.as_numpy_iterator()]
    validation = [(text.decode("utf-8"), int(label)) for text, label in splits.validation.as_numpy_iterator()]
    return Trained(model, vectorizer, vocabulary, test_reviews, tuple(map(list, zip(*validation))))


# The files `save_trained` writes beside train_small's vocabulary.txt.
_CLASSIFIER, _VECTORIZER, _REVIEWS = "classifier.keras", "vectorizer.json", "reviews.json"


def save_trained(trained, directory):
    """Writes `trained` into `directory` (where its vocabulary.txt is): the whole model as a `.keras`
    file, the vectoriser in Keras's own terms (its serialised layer and vocabulary) and the reviews."""
    trained.model.save(directory / _CLASSIFIER)
    vectorizer = {
        "layer": keras.saving.serialize_keras_object(trained.vectorizer),
        "vocabulary": trained.vectorizer.get_vocabulary(),
    }
    write_json_atomic(directory / _VECTORIZER, vectorizer)
    write_json_atomic(directory / _REVIEWS, {"test": trained.test_reviews, "validation": trained.validation})


def load_trained(directory):
    """The `Trained` that `save_trained` wrote, reloaded with Keras alone."""
    reviews, vectorizer_files = (json.loads((directory / name).read_text()) for name in (_REVIEWS, _VECTORIZER))
    vectorizer = keras.saving.deserialize_keras_object(vectorizer_files["layer"])
    vectorizer.set_vocabulary(vectorizer_files["vocabulary"][2:])  # without padding and OOV, as `adapt` leaves them
    model = keras.saving.load_model(directory / _CLASSIFIER)
    return Trained(model, vectorizer, directory / "vocabulary.txt", reviews["test"], tuple(reviews["validation"]))


def built_once_per_session(tmp_path_factory, name, build):
    """The directory `name`, filled by `build(directory)` once in the whole test session.

    pytest-xdist's recipe for session data: its workers are processes, each with its own session
    fixtures, so the first to get here builds under a file lock in the directory all of them share
    (the parent of their temporary directories) and the others wait, then read what it wrote.
    Without xdist the session's own temporary directory is that directory.
    """
    from filelock import FileLock  # the apps' tests only (tests/conftest.py loads this module everywhere)

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    directory, done = root / name, root / f"{name}.done"
    with FileLock(str(root / f"{name}.lock")):
        if not done.exists():  # a build that failed (or skipped) left no mark: build again
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir()
            build(directory)
            done.touch()
    return directory


@pytest.fixture(scope="session")
def trained_imdb(tmp_path_factory, request):
    """`Trained`: `TINY_CLASSIFIER` after one epoch on the small archive's reviews, trained once per
    session and loaded from where it was saved (the same model in every worker); never modify it."""

    def train(directory):
        archive, cache_dir = (request.getfixturevalue(name) for name in ("small_imdb_archive", "imdb_cache_dir"))
        save_trained(train_small(TINY_CLASSIFIER, archive, cache_dir, directory), directory)

    return load_trained(built_once_per_session(tmp_path_factory, "trained_imdb", train))


# Four reviews for `tiny_imdb_run`'s vocabulary and ensemble fit, and for the report's examples.
TINY_RUN_TEXTS = [
    "A wonderful film, moving and wonderfully acted.",
    "Dull, slow and far too long; the acting is wooden.",
    "I loved the music but the plot was thin.",
    "One of the worst films I have seen.",
]


@pytest.fixture(scope="session")
def tiny_imdb_run(tmp_path_factory):
    """`(run directory, classifier, vectorizer, config)`: an untrained two-block classifier (its
    n-gram branch and ensemble fitted on `TINY_RUN_TEXTS`), written with the functions training
    uses; the in-memory classifier is the oracle of what is read back from the directory."""
    directory = tmp_path_factory.mktemp("imdb_run")
    keras.utils.set_random_seed(5)
    vectorizer = imdb_text.adapt_review_vectorizer(tf.data.Dataset.from_tensor_slices(TINY_RUN_TEXTS), 100)
    config = SentimentClassifierConfig(
        vocabulary_size=vectorizer.vocabulary_size(),
        max_tokens=32,
        sequence_length=16,
        embedding_dim=8,
        num_heads=2,
        intermediate_dim=16,
        num_layers=2,
        bigram_buckets=64,
    )
    model = build_sentiment_classifier(config)
    ids = imdb_text.dense_token_ids(TINY_RUN_TEXTS, vectorizer, config.max_tokens)
    model.get_layer("ngram_bag").adapt(np.asarray(ids), labels=np.array([1, 0, 1, 0]))
    ensemble = fit_ensemble(model, tf.data.Dataset.from_tensor_slices((ids, [1, 0, 1, 0])).batch(4))
    imdb_text.save_review_vocabulary(vectorizer, directory / "vocabulary.txt")
    training_model(model).save_weights(str(directory / resumable_training.BEST_WEIGHTS))
    write_json_atomic(directory / "summary.json", {"model": config.to_dict(), "ensemble_weights": ensemble})
    return directory, model, vectorizer, config


class Interrupt(Exception):
    """What `interrupted_after_first_epoch` raises in a training run."""


class _InterruptAfterFirstEpoch(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        if epoch == 1:
            raise Interrupt


@contextlib.contextmanager
def interrupted_after_first_epoch():
    """Inside the block, every `model.fit` with `resumable_training.training_callbacks` raises
    `Interrupt` as its second epoch begins: the first epoch is committed, as after a kill there."""
    make_callbacks = resumable_training.training_callbacks
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(
            resumable_training,
            "training_callbacks",
            lambda *a, **k: make_callbacks(*a, **k) + [_InterruptAfterFirstEpoch()],
        )
        yield
