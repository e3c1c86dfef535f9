"""IMDB reviews: where the archive is, a decode-once cache, and the `tf.data` pipelines.

Where the data comes from, in this order (the first that applies wins):

1. an explicit path (`--data PATH`): the archive itself, or a directory holding
   `aclImdb_v1_labeled.tar.gz` / `aclImdb_v1.tar.gz` (directly or under `imdb/`);
2. the environment variable `KERAS_ATTN_DATA` (or `IMDB_DATA_DIR`), same forms;
3. `../shared/data` next to the repository (the data shipped with the project);
4. only then TFDS `imdb_reviews`, which downloads (for users who are online).

An explicit path or environment variable that holds no usable archive is an error (it never
falls through to a download); so is a corrupt archive. The error says every place looked at.

The archive is decoded once into TFRecord files under the cache directory (`--cache-dir`,
`$KERAS_ATTN_CACHE`, default `~/.cache/keras_attn`), keyed by the archive's SHA-256, written
atomically (temporary directory + rename). Records are stored in a fixed, seeded shuffled order,
so the validation slice (the first records of the training split) is the same on every run. The
test split is only read for the final evaluation.
"""

import dataclasses
import json
import os
import re
import shutil
import tarfile
import tempfile
import zlib
from pathlib import Path

import numpy as np
import tensorflow as tf

from models.export_manifest import file_sha256
from pipelines.batching import bucket_boundaries
from pipelines.batching import pack_documents

DATA_ENV_VARS = ("KERAS_ATTN_DATA", "IMDB_DATA_DIR")
CACHE_ENV_VAR = "KERAS_ATTN_CACHE"
ARCHIVE_NAMES = ("aclImdb_v1_labeled.tar.gz", "aclImdb_v1.tar.gz")
SHARED_DATA_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "data"
SPLITS = ("train", "test")
_MEMBER = re.compile(r"^aclImdb/(train|test)/(pos|neg)/(\d+)_(\d+)\.txt$")
_SHUFFLE_SEED = 20110619  # fixed: the stored order (and so the validation slice) never changes
_CACHE_VERSION = 1


class ImdbDataError(ValueError):
    """The IMDB data could not be found or read; the message lists every place looked at."""


@dataclasses.dataclass(frozen=True)
class ImdbCache:
    """The decoded IMDB splits on disk: one TFRecord file per split and the counts."""

    directory: Path
    source: str
    counts: dict

    def records(self, split):
        """`tf.data.Dataset` of `(text, label)`: a `tf.string` scalar and an int32 (1 = positive)."""
        if split not in SPLITS:
            raise ValueError(f"`split` must be one of {SPLITS}. Received: split={split!r}")
        features = {
            "text": tf.io.FixedLenFeature([], tf.string),
            "label": tf.io.FixedLenFeature([], tf.int64),
        }

        def parse(serialized):
            example = tf.io.parse_single_example(serialized, features)
            return example["text"], tf.cast(example["label"], tf.int32)

        return tf.data.TFRecordDataset(str(self.directory / f"{split}.tfrecord")).map(parse)


def _archive_in(path):
    """The archive at `path` (a file, or a directory holding one), or `None`."""
    path = Path(path).expanduser()
    if path.is_file():
        return path
    for folder in (path, path / "imdb"):
        for name in ARCHIVE_NAMES:
            if (folder / name).is_file():
                return folder / name
    return None


def locate_archive(data=None, environ=None):
    """Finds the IMDB archive following the lookup order of this module.

    Args:
        data: explicit path (archive file or directory), or `None`.
        environ: mapping of environment variables (defaults to `os.environ`).

    Returns:
        `(archive_path_or_None, places_looked)`; `None` means "no local data: use TFDS".

    Raises:
        ImdbDataError: an explicit path or environment variable names no archive.
    """
    environ = os.environ if environ is None else environ
    explicit = [("--data", data)] if data is not None else []
    explicit += [(f"${name}", environ[name]) for name in DATA_ENV_VARS if environ.get(name)]
    if explicit:
        origin, path = explicit[0]
        archive = _archive_in(path)
        if archive is None:
            raise ImdbDataError(
                f"No IMDB archive ({' or '.join(ARCHIVE_NAMES)}) at {origin}={str(path)!r} "
                f"(looked for the file itself, then {path}/<name> and {path}/imdb/<name>)."
            )
        return archive, [f"{origin}={path}"]
    looked = ["--data (not given)", f"${' / $'.join(DATA_ENV_VARS)} (not set)", str(SHARED_DATA_DIR)]
    return _archive_in(SHARED_DATA_DIR), looked


def _read_archive(archive):
    """`{split: [(text, label), ...]}` from an aclImdb tar.gz; raises ImdbDataError if unusable."""
    reviews = {split: [] for split in SPLITS}
    try:
        with tarfile.open(archive, "r:*") as tar:
            for member in tar:
                match = _MEMBER.match(member.name)
                if not match or not member.isfile():
                    continue
                split, sentiment = match.group(1), match.group(2)
                text = tar.extractfile(member).read().decode("utf-8")
                reviews[split].append((text, int(sentiment == "pos")))
    except (tarfile.TarError, EOFError, OSError, UnicodeDecodeError, zlib.error) as error:
        raise ImdbDataError(f"The IMDB archive {archive} is corrupt or unreadable: {error}") from error
    for split, rows in reviews.items():
        labels = {label for _, label in rows}
        if labels != {0, 1}:
            raise ImdbDataError(
                f"The IMDB archive {archive} is incomplete: aclImdb/{split}/pos and "
                f"aclImdb/{split}/neg must both hold reviews (found {len(rows)} {split} reviews)."
            )
    return reviews


def _read_tfds(data_dir):
    """`{split: [(text, label), ...]}` from TFDS `imdb_reviews` (downloads when not cached)."""
    import tensorflow_datasets as tfds

    reviews = {}
    for split in SPLITS:
        dataset = tfds.load("imdb_reviews", split=split, as_supervised=True, data_dir=str(data_dir))
        reviews[split] = [(text.decode("utf-8"), int(label)) for text, label in tfds.as_numpy(dataset)]
    return reviews


def _write_records(path, rows, rng):
    with tf.io.TFRecordWriter(str(path)) as writer:
        for index in rng.permutation(len(rows)):
            text, label = rows[index]
            features = {
                "text": tf.train.Feature(bytes_list=tf.train.BytesList(value=[text.encode("utf-8")])),
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
            }
            writer.write(tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString())


def _write_cache(target, reviews, source):
    """Writes the splits atomically: a temporary directory beside `target`, then a rename."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        rng = np.random.default_rng(_SHUFFLE_SEED)
        for split in SPLITS:
            _write_records(staging / f"{split}.tfrecord", reviews[split], rng)
        counts = {split: len(rows) for split, rows in reviews.items()}
        meta = {"version": _CACHE_VERSION, "source": source, "counts": counts}
        (staging / "meta.json").write_text(json.dumps(meta, indent=2))
        try:
            os.rename(staging, target)
        except OSError:
            if not (target / "meta.json").is_file():  # not a concurrent writer that won the race
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def default_cache_dir():
    return Path(os.environ.get(CACHE_ENV_VAR) or Path.home() / ".cache" / "keras_attn")


def load_cache(data=None, cache_dir=None, allow_download=True, environ=None):
    """Finds the data, decodes it once into the cache and returns the `ImdbCache`.

    Args:
        data: explicit archive path or directory (`--data`); see the module docstring.
        cache_dir: where decoded splits live; defaults to `default_cache_dir()`.
        allow_download: whether TFDS may download when no local archive exists.
        environ: environment mapping (defaults to `os.environ`).

    Raises:
        ImdbDataError: with every place looked at, when the data is missing or corrupt.
    """
    cache_root = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    archive, looked = locate_archive(data, environ)
    if archive is not None:
        target = cache_root / "imdb" / f"v{_CACHE_VERSION}-{file_sha256(archive)[:16]}"
        if not (target / "meta.json").is_file():
            _write_cache(target, _read_archive(archive), source=str(archive))
    else:
        if not allow_download:
            raise ImdbDataError(
                "No IMDB archive found; looked at: "
                + "; ".join(looked)
                + ". Downloading through TFDS is disabled. Pass --data PATH to the "
                f"{ARCHIVE_NAMES[0]} archive or set ${DATA_ENV_VARS[0]}."
            )
        target = cache_root / "imdb" / f"v{_CACHE_VERSION}-tfds-imdb_reviews"
        if not (target / "meta.json").is_file():
            try:
                reviews = _read_tfds(cache_root / "tfds")
            except Exception as error:  # noqa: BLE001 - any TFDS failure becomes one clear error
                raise ImdbDataError(
                    "No IMDB archive found; looked at: "
                    + "; ".join(looked)
                    + f"; TFDS imdb_reviews failed too: {error}"
                ) from error
            _write_cache(target, reviews, source="tfds:imdb_reviews")
    meta = json.loads((target / "meta.json").read_text())
    return ImdbCache(directory=target, source=meta["source"], counts=meta["counts"])


@dataclasses.dataclass(frozen=True)
class ImdbSplits:
    """Raw `(text, label)` datasets of the three splits and their sizes."""

    train: tf.data.Dataset
    validation: tf.data.Dataset
    test: tf.data.Dataset
    counts: dict
    source: str


def split_reviews(cache, validation_size, max_train=None, max_test=None):
    """Train / held-out validation (the first `validation_size` training records) / test.

    Args:
        cache: an `ImdbCache`.
        validation_size: number of training reviews held out for validation.
        max_train: optional cap on the training reviews (after the validation slice).
        max_test: optional cap on the test reviews.
    """
    available = cache.counts["train"]
    if not 0 < validation_size < available:
        raise ValueError(f"`validation_size` must be in (0, {available}). Received: validation_size={validation_size}")
    train_count = available - validation_size
    train_count = train_count if max_train is None else min(max_train, train_count)
    test_count = cache.counts["test"] if max_test is None else min(max_test, cache.counts["test"])
    train_records = cache.records("train")
    return ImdbSplits(
        train=train_records.skip(validation_size).take(train_count),
        validation=train_records.take(validation_size),
        test=cache.records("test").take(test_count),
        counts={"train": train_count, "validation": validation_size, "test": test_count},
        source=cache.source,
    )


def token_ids(reviews, vectorizer, sequence_length):
    """`(text, label)` -> `(ids, label)`, ids int32 1-D, truncated to `sequence_length`; cached."""
    vectorized = reviews.batch(256).map(
        lambda texts, labels: (vectorizer(texts), labels), num_parallel_calls=tf.data.AUTOTUNE
    )
    return vectorized.unbatch().map(lambda ids, label: (tf.cast(ids[:sequence_length], tf.int32), label)).cache()


def batched(ids, batch_size, sequence_length, shuffle=False, seed=None, drop_remainder=False):
    """Length-bucketed, padded batches `(ids (batch, bucket_length), labels (batch,))`.

    Reviews of similar length share a batch padded to the next multiple of 64 (at most
    `sequence_length`): the attention cost follows the real lengths and a few fixed shapes keep
    `jit_compile` from recompiling.
    """
    if shuffle:
        ids = ids.shuffle(50_000, seed=seed, reshuffle_each_iteration=True)
    boundaries = bucket_boundaries(sequence_length, width=64)
    return ids.bucket_by_sequence_length(
        element_length_func=lambda token_ids_, label: tf.shape(token_ids_)[0],
        bucket_boundaries=boundaries,
        bucket_batch_sizes=[batch_size] * (len(boundaries) + 1),
        pad_to_bucket_boundary=True,
        drop_remainder=drop_remainder,
    ).prefetch(tf.data.AUTOTUNE)


def padded(ids, batch_size, shuffle=False, seed=None, drop_remainder=False):
    """Batches `(ids (batch, longest), labels (batch,))` of reviews in any order, padded to the
    longest of each batch: what `packed` lays into rows (the packing, not the order, removes the
    padding)."""
    if shuffle:
        ids = ids.shuffle(50_000, seed=seed, reshuffle_each_iteration=True)
    return ids.padded_batch(batch_size, drop_remainder=drop_remainder).prefetch(tf.data.AUTOTUNE)


def packed(token_ids, sequence_length):
    """The attention branch's packed rows of a batch of reviews: `pipelines.batching.pack_documents`
    of the first `sequence_length` tokens of each, into rows of `sequence_length`."""
    return pack_documents(token_ids[:, :sequence_length], sequence_length)
