"""The integrity manifest of a published export version: what it is and the hash of every file.

Part of each model's serving contract, so below both sides that use it: `export` writes and
verifies it, the loaders in `pipelines` and the ONNX bundle's predictor check it.

    <version>/manifest.json   {"model_id", "format", "keras_attn_version", "vocabulary_sizes",
                               "files": {relative path: {"sha256", "bytes"}}}

Written last into the staging directory, after verification and before the atomic publish, so a
published version always carries it. `check_manifest` re-hashes every file and names the first
one missing, changed, truncated or added, and refuses an export of another model by its id;
`check_vocabulary_size` refuses a vocabulary file that does not give the model's number of token ids.
Standard library only: the ONNX bundle ships a copy of this file beside its predictor, which checks
the bundle with it before loading anything.
"""

import hashlib
import json
import os
from pathlib import Path

MANIFEST = "manifest.json"
_UNLISTED = {MANIFEST, ".lock"}  # the staging lock goes away at publish


class ExportIntegrityError(ValueError):
    """A published export that is not what its manifest says: names the file and what to do."""


def file_sha256(path):
    """Hex SHA-256 of a file, read in 1 MiB blocks (the one definition: run files and data caches use it too)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _files(version_dir):
    """The files of `version_dir` a manifest lists: all but itself, the staging lock and the
    `__pycache__` Python writes when the bundle's predictor is imported."""
    root = Path(version_dir)
    return sorted(
        path.relative_to(root).as_posix()
        for path in root.rglob("*")
        if path.is_file()
        and path.relative_to(root).as_posix() not in _UNLISTED
        and "__pycache__" not in path.relative_to(root).parts
    )


def write_manifest(version_dir, model_id, export_format, vocabulary_sizes, library_version, serving_input):
    """Writes `<version_dir>/manifest.json` (atomically) over every file now in `version_dir`.

    `serving_input` names the string (or token-id) input of the served signature, so a checker can
    run the export without knowing the model.
    """
    root = Path(version_dir)
    manifest = {
        "model_id": model_id,
        "format": export_format,
        "keras_attn_version": library_version,
        "serving_input": serving_input,
        "vocabulary_sizes": dict(vocabulary_sizes),
        "files": {
            name: {"sha256": file_sha256(root / name), "bytes": (root / name).stat().st_size} for name in _files(root)
        },
    }
    temporary = root / (MANIFEST + ".tmp")
    temporary.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    os.replace(temporary, root / MANIFEST)
    return manifest


def read_manifest(version_dir):
    """The manifest of `version_dir`, or an `ExportIntegrityError` naming the file."""
    path = Path(version_dir) / MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ExportIntegrityError(
            f"{path} is missing: {version_dir} is not a published keras-attn export version "
            "(or was exported before manifests); export it again"
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ExportIntegrityError(f"{path} is unreadable ({error}); export the model again") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict) or "model_id" not in manifest:
        raise ExportIntegrityError(f"{path} is not a keras-attn export manifest; export the model again")
    return manifest


def check_manifest(version_dir, model_id=None):
    """The manifest of `version_dir` once every file matches it; else an `ExportIntegrityError`
    naming the file (or the model id found, when `model_id` expects another model)."""
    root = Path(version_dir)
    manifest = read_manifest(root)
    if model_id is not None and manifest["model_id"] != model_id:
        raise ExportIntegrityError(f"{root} is an export of {manifest['model_id']}, expected {model_id}")
    for name, expected in sorted(manifest["files"].items()):
        path = root / name
        if not path.is_file():
            raise ExportIntegrityError(f"{path} is missing from the export; export the model again")
        if path.stat().st_size != expected["bytes"] or file_sha256(path) != expected["sha256"]:
            raise ExportIntegrityError(
                f"{path} differs from the export's manifest (size {path.stat().st_size} bytes, "
                f"{expected['bytes']} published): the file is truncated or altered; export the model again"
            )
    added = sorted(set(_files(root)) - set(manifest["files"]))
    if added:
        raise ExportIntegrityError(f"{root / added[0]} is not part of the published export; remove it or export again")
    return manifest


def check_vocabulary_size(path, token_ids, model_token_ids):
    """Raises a ValueError naming `path` when its vocabulary gives `token_ids` ids (the reserved ones
    included) where the model takes `model_token_ids`: a file cut short or another run's would map
    words to the wrong embeddings, or the model's output ids to no token at all."""
    if token_ids != model_token_ids:
        raise ValueError(
            f"{path} gives {token_ids} token ids, the model takes {model_token_ids}: the vocabulary does not "
            "match the model (a cut or replaced file); restore the file written with the model"
        )
