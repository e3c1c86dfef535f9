"""`python -m export.verify PATH`: proves published exports intact and loadable, for every model.

PATH is a version directory, a model directory (its newest version is checked) or an export root
(the newest version of every model under it, the `onnx/` tree included). An export root's
`models.config` is checked first: there, parsed as TF Serving parses it, listing every published
model once at its directory in this root (`export.serving_layout.check_models_config`). For each
version:

1. its `manifest.json` (`models.export_manifest`): every file's SHA-256 and size, no file
   missing or added, the model id;
2. a SavedModel is loaded and serves one string in a fresh Python process with TensorFlow only
   (no project code), as a model server would;
3. every ONNX model in it is loaded by onnxruntime.

Prints one line per version checked; a failure prints one line naming the file, exit status 2.
"""

import argparse
from pathlib import Path

from appkit.cli import add_debug_flag
from appkit.cli import user_errors_exit
from export.fresh_process import ExportVerificationError
from export.fresh_process import serve_in_fresh_process
from export.serving_layout import check_models_config
from export.serving_layout import existing_versions
from models.export_manifest import MANIFEST
from models.export_manifest import ExportIntegrityError
from models.export_manifest import check_manifest

_PROBE = "A sentence to check the export with."


def is_export_root(path):
    """Whether the directory `path` is an export root: neither a version nor a model's versions."""
    return not (Path(path) / MANIFEST).is_file() and not existing_versions(path)


def versions_under(path):
    """The version directories PATH names: itself, its newest version, or every model's newest."""
    path = Path(path)
    if not path.is_dir():
        raise ExportIntegrityError(f"{path} is not a directory")
    if (path / MANIFEST).is_file():
        return [path]
    versions = existing_versions(path)
    if versions:
        return [path / str(versions[-1])]
    found = [
        version
        for entry in sorted(path.iterdir())
        if entry.is_dir() and not entry.name.startswith(".")
        for version in _versions_or_none(entry)
    ]
    if not found:
        raise ExportIntegrityError(f"{path} holds no published export version (no {MANIFEST} below it)")
    return found


def _versions_or_none(path):
    try:
        return versions_under(path)
    except ExportIntegrityError:
        return []


def verify_version(version_dir):
    """Checks one version (manifest, then loading); returns a one-line description or raises."""
    manifest = check_manifest(version_dir)
    if "savedmodel" in manifest["format"]:
        try:
            serve_in_fresh_process(version_dir, {manifest["serving_input"]: [_PROBE]})
        except ExportVerificationError as error:
            raise ExportIntegrityError(f"{version_dir}: the SavedModel does not serve: {error}") from None
    onnx_models = sorted(Path(version_dir).rglob("*.onnx"))
    if onnx_models:
        import onnxruntime

        for model in onnx_models:
            try:
                onnxruntime.InferenceSession(str(model), providers=["CPUExecutionProvider"])
            except Exception as error:  # onnxruntime raises its own exception types
                raise ExportIntegrityError(f"{model} does not load in onnxruntime: {error}") from None
    return f"ok {version_dir}: {manifest['model_id']} ({manifest['format']}), {len(manifest['files'])} files verified"


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m export.verify", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("path", help="an export version, a model directory or an export root")
    add_debug_flag(parser)
    args = parser.parse_args(argv)
    with user_errors_exit(parser.prog, args.debug):
        versions = versions_under(args.path)
        if is_export_root(args.path):  # where TF Serving starts; the onnx/ tree below is no server's root
            check_models_config(args.path)
        for version in versions:
            print(verify_version(version))


if __name__ == "__main__":
    main()
