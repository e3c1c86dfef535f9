"""export.serving_layout under concurrency and kills: publishers in separate processes, a reader
that must never see an empty or partial `models.config`, and staging left by killed exports."""

import multiprocessing
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from export import serving_layout

_MODELS = ("alpha", "beta", "gamma")
_VERSIONS_EACH = 6


def _publisher(export_dir, model_name, versions):
    """Publishes `versions` versions of `model_name` and rewrites models.config after each."""
    for _ in range(versions):
        with serving_layout.staging_directory(Path(export_dir) / model_name) as staging:
            (staging / "saved_model.pb").write_bytes(b"x" * 1000)
            serving_layout.publish(staging, Path(export_dir) / model_name)
        serving_layout.write_models_config(export_dir)


def _config_names(text):
    return sorted(line.split('"')[1] for line in text.splitlines() if line.strip().startswith("name:"))


def test_concurrent_publishers_never_show_a_reader_an_empty_or_partial_config(tmp_path):
    serving_layout.write_models_config(tmp_path)  # an empty list, but a complete file
    bad_reads, reads = [], [0]
    done = threading.Event()

    def read_forever():
        while not done.is_set():
            text = (tmp_path / "models.config").read_text()
            reads[0] += 1
            if not (text.startswith("model_config_list {\n") and text.endswith("}\n")):
                bad_reads.append(text)

    reader = threading.Thread(target=read_forever)
    reader.start()
    context = multiprocessing.get_context("fork")  # the publishers touch files only, never TensorFlow
    publishers = [context.Process(target=_publisher, args=(str(tmp_path), name, _VERSIONS_EACH)) for name in _MODELS]
    for process in publishers:
        process.start()
    for process in publishers:
        process.join(120)
    done.set()
    reader.join()

    assert [process.exitcode for process in publishers] == [0, 0, 0]
    assert reads[0] > 10 and bad_reads == []
    # No publisher dropped another's model: the last write lists all three, each with every version.
    assert _config_names((tmp_path / "models.config").read_text()) == sorted(_MODELS)
    for name in _MODELS:
        assert serving_layout.existing_versions(tmp_path / name) == list(range(1, _VERSIONS_EACH + 1))
        assert sorted(os.listdir(tmp_path / name)) == [str(v) for v in range(1, _VERSIONS_EACH + 1)]
    assert not [path for path in tmp_path.iterdir() if path.name.endswith(".tmp")]


def test_a_slow_publisher_never_drops_a_version_published_meanwhile(tmp_path, monkeypatch):
    """Publisher A lists the models, then B publishes and rewrites models.config before A writes:
    A's stale list must not win (without the lock, the config ends up without B's model)."""
    listing, lock = serving_layout._models_config_text, serving_layout._exclusive_lock
    listed, beta_asks_for_the_config_lock = threading.Event(), threading.Event()

    def slow_listing(export_dir):
        text = listing(export_dir)
        listed.set()
        # A holds on to its list until B asks for the lock A holds (B then waits for A's write); a
        # publisher that takes no lock never asks, and after the timeout A writes its stale list last.
        beta_asks_for_the_config_lock.wait(timeout=10)
        return text

    def lock_then_tell(path, blocking=True):
        if Path(path).name == serving_layout._CONFIG_LOCK:
            beta_asks_for_the_config_lock.set()
        return lock(path, blocking)

    _publisher(tmp_path, "alpha", 1)
    monkeypatch.setattr(serving_layout, "_models_config_text", slow_listing)
    slow = threading.Thread(target=serving_layout.write_models_config, args=(tmp_path,))
    slow.start()
    listed.wait()
    monkeypatch.setattr(serving_layout, "_models_config_text", listing)
    monkeypatch.setattr(serving_layout, "_exclusive_lock", lock_then_tell)
    _publisher(tmp_path, "beta", 1)
    slow.join()
    assert _config_names((tmp_path / "models.config").read_text()) == ["alpha", "beta"]


# An exporter that holds its staging directory until it is killed (`signal.pause`: no timer).
_HOLD_STAGING = """
import signal, sys

from export import serving_layout
with serving_layout.staging_directory(sys.argv[1]) as staging:
    (staging / "saved_model.pb").write_bytes(b"half")
    print(staging, flush=True)
    signal.pause()
"""


def _start_exporter(model_dir):
    process = subprocess.Popen(
        [sys.executable, "-c", _HOLD_STAGING, str(model_dir)], stdout=subprocess.PIPE, text=True, cwd=os.getcwd()
    )
    return process, Path(process.stdout.readline().strip())


def test_next_export_removes_staging_of_killed_exports_but_not_of_live_ones(tmp_path):
    killed, killed_staging = _start_exporter(tmp_path)
    live, live_staging = _start_exporter(tmp_path)
    try:
        killed.send_signal(signal.SIGKILL)
        killed.wait()
        assert killed_staging.is_dir()
        with serving_layout.staging_directory(tmp_path) as staging:
            assert not killed_staging.exists()  # its lock died with its process
            assert live_staging.is_dir()  # its exporter still holds the lock
            published = serving_layout.publish(staging, tmp_path)
        assert published == tmp_path / "1" and not (published / ".lock").exists()
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["1", live_staging.name])
    finally:
        live.kill()
        live.wait()


def test_unlocked_staging_is_removed_only_once_old(tmp_path):
    """A staging directory without a lock file is mid-rename (recent) or orphaned (old)."""
    recent, old = tmp_path / ".staging-recent", tmp_path / ".staging-old"
    recent.mkdir()
    old.mkdir()
    an_hour_and_more = time.time() - serving_layout._UNLOCKED_STALE_SECONDS - 60
    os.utime(old, (an_hour_and_more, an_hour_and_more))
    assert serving_layout.remove_stale_staging(tmp_path) == [old]
    assert recent.is_dir() and not old.exists()


# Model names that would publish outside `<export_dir>/<name>` or as a hidden directory.
BAD_MODEL_NAMES = ["../escape", "a/b", "x/../y", "", ".hidden", "-flag", "a..b", "/abs", "with space", None]


@pytest.mark.parametrize("name", BAD_MODEL_NAMES, ids=[repr(name) for name in BAD_MODEL_NAMES])
def test_a_model_name_that_is_not_a_plain_directory_name_is_refused(name):
    with pytest.raises(ValueError, match=re.escape(f"Received: model_name={name!r}")):
        serving_layout.check_model_name(name)


def test_plain_model_names_are_accepted():
    for name in ("imdb_sentiment", "m1", "a.b-c", "Model2"):
        assert serving_layout.check_model_name(name) == name


def _published_root(export_dir):
    """`alpha` and `beta` published (one version each) and listed in `models.config`, beside an
    `onnx/` tree that TF Serving does not serve."""
    for name in ("alpha", "beta"):
        _publisher(export_dir, name, 1)
    (export_dir / "onnx" / "alpha" / "1").mkdir(parents=True)
    return export_dir


def _tampered(text, export_dir):
    """What can be wrong with a root's models.config: (description, new text or None to delete, words
    the error must hold)."""
    alpha = f'base_path: "{export_dir.resolve() / "alpha"}"'
    start = text.index('  config {\n    name: "beta"')
    beta_entry = text[start : text.index("  }\n", start) + 4]
    return [
        ("missing", None, "is missing: TF Serving finds the models"),
        ("not a config", "model_config_list { config {", "is not a TF Serving model config"),
        ("a model left out", text.replace(beta_entry, ""), "does not list 'beta'"),
        ("a model twice", text.replace(beta_entry, beta_entry * 2), "lists model 'beta' twice"),
        ("a model not published", text.replace('"beta"', '"gamma"'), "lists model 'gamma', which has no published"),
        ("another place", text.replace(alpha, 'base_path: "/elsewhere/alpha"'), "at base_path '/elsewhere/alpha'"),
        ("another platform", text.replace('"tensorflow"', '"onnx"', 1), "on platform 'onnx', expected 'tensorflow'"),
    ]


def test_models_config_is_checked_as_tf_serving_reads_it(tmp_path):
    export_dir = _published_root(tmp_path / "export")
    config = export_dir / serving_layout.MODELS_CONFIG
    written = config.read_text()
    assert serving_layout.check_models_config(export_dir) == ["alpha", "beta"]
    for description, text, words in _tampered(written, export_dir):
        if text is None:
            config.unlink()
        else:
            config.write_text(text)
        with pytest.raises(ValueError) as raised:
            serving_layout.check_models_config(export_dir)
        assert str(config.resolve()) in str(raised.value) and words in str(raised.value), description
        config.write_text(written)


def test_the_verify_command_refuses_an_export_root_without_models_config(tmp_path, capsys):
    from export import verify

    export_dir = _published_root(tmp_path / "export")
    (export_dir / serving_layout.MODELS_CONFIG).unlink()
    with pytest.raises(SystemExit) as exit_info:
        verify.main([str(export_dir)])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and f"{export_dir.resolve() / 'models.config'} is missing" in error
