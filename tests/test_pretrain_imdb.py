"""`pipelines.pretrain_imdb` in --smoke size on a small archive cut from the real one: stopped after
its first epoch and rerun, it resumes; its checkpoint then initialises the classifier's attention
branch in `pipelines.train_imdb` (the weights compared with the checkpoint file's own arrays),
found by default beside the output directory, refused with the differing field named."""

import json

import h5py
import numpy as np
import pytest

from pipelines import encoder_checkpoint
from pipelines import pretrain_imdb
from pipelines import resumable_training
from pipelines import train_imdb
from pipelines import training
from tests.imdb_fixtures import Interrupt
from tests.imdb_fixtures import interrupted_after_first_epoch
from tests.imdb_fixtures import smoke_args

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pretrained(small_imdb_archive, imdb_cache_dir, tmp_path_factory):
    """`(directory, summary, resumed output)` of a 2-epoch pretraining stopped after epoch 1 and rerun.

    The directory is `<root>/imdb_pretrain`: where `train_imdb --output-dir <root>/run` looks by default."""
    directory = tmp_path_factory.mktemp("pretraining") / encoder_checkpoint.DEFAULT_DIRECTORY_NAME
    args = smoke_args(small_imdb_archive, imdb_cache_dir, directory, "--epochs", "2")
    with interrupted_after_first_epoch(), pytest.raises(Interrupt):
        pretrain_imdb.main(args)
    interrupted = {
        "history": [int(row["epoch"]) for row in resumable_training.read_history(directory)],
        "finished": (directory / encoder_checkpoint.SUMMARY).exists(),
    }
    summary = pretrain_imdb.main(args)  # the same command again
    return directory, summary, interrupted


def test_a_stopped_pretraining_resumes_and_then_leaves_a_checkpoint(pretrained):
    directory, summary, interrupted = pretrained
    assert interrupted == {"history": [0], "finished": False}  # no checkpoint before the end
    assert [int(row["epoch"]) for row in resumable_training.read_history(directory)] == [0, 1]
    assert summary["epochs_run"] == 2 and summary["epochs_this_invocation"] == 1 and summary["resumed_from_epoch"] == 1
    assert summary == json.loads((directory / encoder_checkpoint.SUMMARY).read_text())
    assert [row["epoch"] for row in summary["epochs"]] == [0, 1]
    for row in summary["epochs"]:
        assert 0 < row["loss"] and 0 <= row["masked_accuracy"] <= 1 and 0 < row["val_loss"] and row["epoch_seconds"] > 0
    # The review labels are never read: the data counts are the training split's, and no test split.
    assert summary["data"]["train"] == 300 - train_imdb.SMOKE_DATA["validation_size"] and "test" not in summary["data"]
    assert summary["model"]["embedding_dim"] == train_imdb.SMOKE_MODEL.embedding_dim
    assert (directory / encoder_checkpoint.VOCABULARY).is_file() and (
        directory / encoder_checkpoint.ENCODER_WEIGHTS
    ).is_file()


def checkpoint_arrays(path):
    """Every array of a `.weights.h5` file under `layers/`, read with h5py (not Keras)."""
    arrays = []
    with h5py.File(path, "r") as weights:
        weights["layers"].visititems(
            lambda name, item: arrays.append(item[()]) if isinstance(item, h5py.Dataset) else None
        )
    return arrays


def sorted_arrays(arrays):
    return sorted((np.asarray(array) for array in arrays), key=lambda array: (array.shape, array.tobytes()))


@pytest.fixture
def initial_encoder_weights(monkeypatch):
    """The classifier's attention-encoder weights as `training.fit` receives the model (before any step)."""
    seen = []
    fit = training.fit

    def recording(args, strategy, policy, model, *rest, **options):
        seen.append(
            [
                weight
                for name in ("token_and_position_embedding", "encoder_0")
                for weight in model.get_layer(name).get_weights()
            ]
        )
        return fit(args, strategy, policy, model, *rest, **options)

    monkeypatch.setattr(training, "fit", recording)
    return seen


def test_the_classifier_starts_from_the_checkpoint_found_beside_its_output(
    pretrained, small_imdb_archive, imdb_cache_dir, initial_encoder_weights, capsys
):
    directory, pretraining, _ = pretrained
    run = train_imdb.main(smoke_args(small_imdb_archive, imdb_cache_dir, directory.parent / "run", "--epochs", "1"))
    assert run.summary["pretrained"] == {"directory": str(directory), "epochs": 2}
    assert "No pretrained encoder" not in capsys.readouterr().out
    want = checkpoint_arrays(directory / encoder_checkpoint.ENCODER_WEIGHTS)
    assert len(want) == len(initial_encoder_weights[0])
    for got, expected in zip(sorted_arrays(initial_encoder_weights[0]), sorted_arrays(want)):
        np.testing.assert_array_equal(got, expected)
    # The vocabulary is the checkpoint's, the classifier's own other branch untouched by it.
    assert (directory.parent / "run" / "vocabulary.txt").read_text() == (directory / "vocabulary.txt").read_text()


def test_without_pretraining_the_encoder_is_not_the_checkpoints(
    pretrained, small_imdb_archive, imdb_cache_dir, initial_encoder_weights, tmp_path
):
    directory, _, _ = pretrained
    run = train_imdb.main(
        smoke_args(small_imdb_archive, imdb_cache_dir, tmp_path, "--epochs", "1", "--pretrained", "none")
    )
    assert run.summary["pretrained"] is None
    want = sorted_arrays(checkpoint_arrays(directory / encoder_checkpoint.ENCODER_WEIGHTS))
    got = sorted_arrays(initial_encoder_weights[0])
    assert not all(a.shape == b.shape and np.array_equal(a, b) for a, b in zip(got, want))


@pytest.mark.parametrize(
    "flags, expected",
    [
        (["--embedding-dim", "32"], "embedding_dim=32 (checkpoint: 16)"),
        (["--num-layers", "2", "--num-heads", "4"], "num_layers=2 (checkpoint: 1), num_heads=4 (checkpoint: 2)"),
        (["--max-train", "100"], "was trained on another vocabulary"),  # other reviews, another vectoriser
    ],
)
def test_a_checkpoint_that_does_not_fit_is_an_error_naming_what_differs(
    pretrained, small_imdb_archive, imdb_cache_dir, tmp_path, capsys, flags, expected
):
    directory, _, _ = pretrained
    with pytest.raises(SystemExit) as exit_info:
        train_imdb.main(
            smoke_args(small_imdb_archive, imdb_cache_dir, tmp_path, "--pretrained", str(directory), *flags)
        )
    assert exit_info.value.code == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("python -m pipelines.train_imdb: error:") and expected in line
    assert not list(tmp_path.glob("*.weights.h5"))  # refused before training


def test_a_named_directory_without_a_finished_checkpoint_is_an_error(
    small_imdb_archive, imdb_cache_dir, tmp_path, capsys
):
    with pytest.raises(SystemExit):
        train_imdb.main(smoke_args(small_imdb_archive, imdb_cache_dir, tmp_path / "run", "--pretrained", str(tmp_path)))
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"--pretrained={str(tmp_path)!r}" in line and "python -m pipelines.pretrain_imdb" in line


def test_a_corrupt_checkpoint_is_an_error_saying_how_to_recover(pretrained, tmp_path):
    directory, _, _ = pretrained
    for name in (encoder_checkpoint.SUMMARY, encoder_checkpoint.VOCABULARY):
        (tmp_path / name).write_bytes((directory / name).read_bytes())
    weights = bytearray((directory / encoder_checkpoint.ENCODER_WEIGHTS).read_bytes())
    weights[-100] ^= 0xFF
    (tmp_path / encoder_checkpoint.ENCODER_WEIGHTS).write_bytes(bytes(weights))
    with pytest.raises(ValueError, match="SHA-256.*rerun `python -m pipelines.pretrain_imdb"):
        encoder_checkpoint.find(encoder_checkpoint.request(str(tmp_path), "unused"))


def test_the_main_jobs_other_seeds_find_again_the_checkpoint_the_first_seed_used(pretrained):
    directory, _, _ = pretrained
    used = encoder_checkpoint.find(encoder_checkpoint.Request(directory, required=True)).describe()
    again = encoder_checkpoint.find(encoder_checkpoint.request_as_used(used))
    assert again.directory == directory and again.describe() == used
    assert encoder_checkpoint.find(encoder_checkpoint.request_as_used(None)) is None
