"""A small IMDB archive cut from the real one, for the pipeline, export and smoke tests.

`small_imdb_archive` copies a few hundred real reviews (both splits, both labels, the original
member paths) into a tar.gz under pytest's temporary directory, once per session. It never
downloads: without the real archive (`../shared/data`, `$KERAS_ATTN_DATA`, `$IMDB_DATA_DIR`)
the tests that need it are skipped. The fixtures are
registered for every module by `pytest_plugins` in tests/conftest.py.
`interrupted_after_first_epoch` stops the training commands after their first committed epoch.
"""

import contextlib
import io
import re
import tarfile

import keras
import pytest

from pipelines import imdb_data
from pipelines import resumable_training
from tests.shared_data import missing_shared_data

# Reviews per (split, label) in the small archive.
PER_CLASS = {"train": 150, "test": 80}
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
