"""The published distribution, as a user gets it: `python -m build`, then the wheel alone.

Three rules of a layer library: the wheel holds `keras_attn` and nothing else (never the
repository's `appkit`/`models`/`pipelines`/`export`), it requires only tensorflow, keras and numpy
(everything else is an extra), and importing it and using every public name loads nothing optional
beyond what `import keras, tensorflow` already loaded. The version is written once.
"""

import email.parser
import json
import os
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

import keras_attn
from tests.library_selection import APP_MODULES

REPO_ROOT = Path(__file__).resolve().parents[1]
LIGHT_REQUIREMENTS = {"tensorflow", "keras", "numpy"}
EXTRAS = {"viz", "export", "data", "apps", "docs", "test", "all", "gpu"}


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    """The sdist and the wheel built from it by `python -m build` (no network: --no-isolation)."""
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(REPO_ROOT)],
        check=True,
        capture_output=True,
        text=True,
    )
    (wheel,) = out.glob("keras_attn-*.whl")
    (sdist,) = out.glob("keras_attn-*.tar.gz")
    return wheel, sdist


def _wheel_metadata(wheel):
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        return email.parser.Parser().parsestr(archive.read(name).decode())


def _requirement_name(requirement):
    return re.match(r"[A-Za-z0-9_.\-]+", requirement).group(0).lower().replace("_", "-")


def test_wheel_ships_only_keras_attn(dist):
    wheel, _ = dist
    with zipfile.ZipFile(wheel) as archive:
        tops = {name.split("/")[0] for name in archive.namelist()}
    assert tops == {"keras_attn", f"keras_attn-{keras_attn.__version__}.dist-info"}, sorted(tops)


def test_wheel_requires_only_what_the_layers_need(dist):
    metadata = _wheel_metadata(dist[0])
    requirements = metadata.get_all("Requires-Dist")
    unconditional = {_requirement_name(r) for r in requirements if "extra ==" not in r}
    assert unconditional == LIGHT_REQUIREMENTS
    assert set(metadata.get_all("Provides-Extra")) == EXTRAS
    in_export = {_requirement_name(r) for r in requirements if re.search(r"extra == ['\"]export['\"]", r)}
    assert in_export == {"tf2onnx", "onnx", "onnxruntime", "tensorflow-serving-api"}


def test_version_is_written_once(dist):
    metadata = _wheel_metadata(dist[0])
    top_release = re.search(r"^## \[(\d[^\]]*)\]", (REPO_ROOT / "CHANGELOG.md").read_text(), re.M).group(1)
    assert metadata["Version"] == keras_attn.__version__ == top_release


def test_sdist_carries_the_tests_license_and_changelog(dist):
    with tarfile.open(dist[1]) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    assert {"LICENSE", "CHANGELOG.md", "tests/test_distribution.py", "tests/reference.py"} <= names
    assert "Apache License" in (REPO_ROOT / "LICENSE").read_text()
    assert not any(name.startswith(("appkit/", "models/", "pipelines/", "export/")) for name in names)


# Run in a fresh interpreter whose first path entry is the unpacked wheel and whose working
# directory is not the checkout. Each public name is built and called once; a public name the
# table does not know fails the test rather than going unchecked.
_USE_EVERY_PUBLIC_NAME = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import keras, tensorflow  # the baseline: what Keras itself loads
import numpy as np
baseline = set(sys.modules)
import keras_attn as ka

x = np.random.default_rng(0).normal(size=(2, 8, 16)).astype("float32")
q = x.reshape(2, 8, 4, 4)
ids = np.array([[3, 5, 0, 0], [1, 2, 3, 4]])
uses = {
    "ALiBi": lambda: ka.MultiHeadAttention(4, 4, position_bias=ka.ALiBi(4))(x, x),
    "RelativePositionBias": lambda: ka.MultiHeadAttention(4, 4, position_bias=ka.RelativePositionBias(4))(x, x),
    "CausalSelfAttention": lambda: ka.CausalSelfAttention(num_heads=2, key_dim=8)(x),
    "CrossAttention": lambda: ka.CrossAttention(num_heads=2, key_dim=8)(x, x),
    "SelfAttention": lambda: ka.SelfAttention(num_heads=2, key_dim=8)(x),
    "MultiHeadAttention": lambda: ka.MultiHeadAttention(2, 8)(x, x, use_causal_mask=True),
    "FeedForward": lambda: ka.FeedForward(32)(x),
    "LSHSelfAttention": lambda: ka.LSHSelfAttention(2, 8, num_buckets=2, chunk_size=4)(x),
    "LinearAttention": lambda: ka.LinearAttention(2, 8)(x),
    "LinformerSelfAttention": lambda: ka.LinformerSelfAttention(2, 8, max_length=8, projected_length=4)(x),
    "MaskedGlobalPooling": lambda: ka.MaskedGlobalPooling()(x),
    "AttentionPooling": lambda: ka.AttentionPooling(2, 4)(x),
    "PositionEmbedding": lambda: ka.PositionEmbedding(8)(x),
    "RotaryEmbedding": lambda: ka.RotaryEmbedding()(q),
    "SinusoidalPositionEncoding": lambda: ka.SinusoidalPositionEncoding()(x),
    "TokenAndPositionEmbedding": lambda: ka.TokenAndPositionEmbedding(10, 4, 8)(ids),
    "TransformerEncoder": lambda: ka.TransformerEncoder(32, 2)(x),
    "TransformerDecoder": lambda: ka.TransformerDecoder(32, 2)(x, x),
    "causal_mask": lambda: ka.causal_mask(4, 4),
    "convert": lambda: ka.convert(keras.Model(i := keras.Input((8, 16)), keras.layers.MultiHeadAttention(2, 8)(i, i)))(x),
    "sliding_window_mask": lambda: ka.sliding_window_mask(4, 4, 2),
    "merge_masks": lambda: ka.merge_masks(ka.causal_mask(4, 4), ka.sliding_window_mask(4, 4, 2)),
    "masked_softmax": lambda: ka.masked_softmax(x, x > 0),
    "scaled_dot_product_attention": lambda: ka.scaled_dot_product_attention(q, q, q, pattern=ka.patterns.Causal()),
    "patterns": lambda: ka.scaled_dot_product_attention(
        q, q, q, pattern=ka.patterns.SlidingWindow(3) & ka.patterns.Causal() | ka.patterns.GlobalTokens(1)),
    "attention_families": lambda: ka.attention_families.build("linear", num_heads=2, key_dim=8)(
        x, return_attention_scores=True),
    "ops": lambda: ka.ops.dot_product_attention(q, q, q, is_causal=True),
    "document_positions": lambda: ka.document_positions(ids),
    "packing": lambda: list(ka.packing.pack(tensorflow.data.Dataset.from_tensor_slices(tensorflow.ragged.constant(
        [[1, 2], [3]])), row_length=4)),
    "enable": lambda: (ka.enable(), keras.ops.dot_product_attention(q, q, q, flash_attention=True), ka.disable()),
    "disable": lambda: ka.disable(),
    "explain_implementation": lambda: str(ka.explain_implementation((1, 8, 2, 4), is_causal=True)),
    "set_measured_dispatch": lambda: ka.set_measured_dispatch(False),
    "tune": lambda: ka.tune(lengths=(16, 32, 64), heads=1, depth=4, repeats=1, settings=("causal",)),  # KERAS_ATTN_CACHE
    "__version__": lambda: ka.__version__,
}
unknown = sorted(set(ka.__all__) - set(uses))
for name in ka.__all__:
    if name in uses:
        uses[name]()
print(json.dumps({"file": ka.__file__, "unknown": unknown, "new": sorted(set(sys.modules) - baseline)}))
"""


def test_importing_and_using_every_public_name_loads_nothing_optional(dist, tmp_path):
    site = tmp_path / "site"
    with zipfile.ZipFile(dist[0]) as archive:
        archive.extractall(site)
    result = subprocess.run(
        [sys.executable, "-c", _USE_EVERY_PUBLIC_NAME, str(site)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "KERAS_ATTN_CACHE": str(tmp_path / "cache")},  # where `tune` writes
    )
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert Path(report["file"]).is_relative_to(site), report["file"]
    assert report["unknown"] == [], f"public names the test cannot use: {report['unknown']}"
    loaded = {name.split(".")[0] for name in report["new"]}
    assert not loaded & APP_MODULES, sorted(loaded & APP_MODULES)


# README's install commands, each as this test runs it: offline (`--no-index`, `--no-deps`: the
# dependencies are the venv's, `--no-build-isolation`: setuptools is too), into a directory of its
# own. A command README gives that this table does not know fails the test.
_README_INSTALL = {
    "pip install .": ["install", "--target", "{target}", "."],
}
_OFFLINE = ["--no-index", "--no-deps", "--no-build-isolation", "--quiet"]


def readme_install_commands():
    """The commands of README.md's "## Install" shell block (`&&` splits one line in two)."""
    text = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"^## Install\n.*?^```sh\n(.*?)^```", text, re.MULTILINE | re.DOTALL).group(1)
    lines = [line.split("#")[0].strip() for line in block.splitlines()]
    return [command.strip() for line in lines if line for command in line.split("&&")]


def test_the_readme_install_commands_install_a_working_keras_attn(dist, tmp_path):
    commands = readme_install_commands()
    assert set(commands) == set(_README_INSTALL), f"README.md's install commands changed: {commands}"
    installed = []
    for command in commands:
        arguments = _README_INSTALL[command]
        if arguments is None:
            continue
        target = tmp_path / f"target{len(installed)}"
        pip = [a.format(target=target, wheel=dist[0]) for a in arguments]
        subprocess.run([sys.executable, "-m", "pip", *pip, *_OFFLINE], cwd=REPO_ROOT, check=True, capture_output=True)
        if "--target" in pip:
            installed.append(target)
    for target in installed:  # a fresh interpreter, away from the checkout, imports what pip installed
        found = subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys; sys.path.insert(0, sys.argv[1]); import keras_attn as k; "
                "print(k.__file__, k.__version__, k.MultiHeadAttention.__name__)",
                str(target),
            ],
            cwd=tmp_path,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.split()
        assert Path(found[0]).is_relative_to(target) and found[1:] == [keras_attn.__version__, "MultiHeadAttention"]


def test_the_extras_the_readme_names_are_the_wheels(dist):
    section = re.search(r"^## Install\n(.*?)^## ", (REPO_ROOT / "README.md").read_text(encoding="utf-8"), re.M | re.S)
    named = set(re.findall(r"\.\[(\w+)\]", section.group(1))) | set(
        re.findall(r"^\| `(\w+)` \|", section.group(1), re.M)
    )
    assert named and named <= set(_wheel_metadata(dist[0]).get_all("Provides-Extra")), named
