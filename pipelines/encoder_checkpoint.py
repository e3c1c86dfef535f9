"""The pretrained-encoder checkpoint: what `pipelines.pretrain_imdb` leaves and `pipelines.train_imdb` loads.

A finished pretraining directory holds `vocabulary.txt` (the vectoriser's, `models.vocabulary`
format), `encoder.weights.h5` (`models.sentiment_classifier.build_review_encoder`'s weights) and,
written last, `summary.json`: the encoder's configuration, the SHA-256 of the weights file and
the pretraining figures. A directory without `summary.json` holds no finished checkpoint (a
pretraining still running, or killed: rerun it to resume).

The classifier uses a checkpoint only if it fits: the `ENCODER_FIELDS` of its configuration equal
the checkpoint's and its vectoriser, adapted on its own training reviews, has the checkpoint's
vocabulary. Anything else is a `ValueError` naming what differs.
"""

import dataclasses
import json
from pathlib import Path

from appkit.files import reading
from appkit.files import replacing
from appkit.files import write_json_atomic
from models.export_manifest import file_sha256
from models.sentiment_classifier import ENCODER_FIELDS
from models.sentiment_classifier import SentimentClassifierConfig
from models.sentiment_classifier import build_review_encoder
from models.sentiment_classifier import load_encoder_weights
from models.vocabulary import read_vocabulary

SUMMARY = "summary.json"
ENCODER_WEIGHTS = "encoder.weights.h5"
VOCABULARY = "vocabulary.txt"
DEFAULT_DIRECTORY_NAME = "imdb_pretrain"  # beside the classifier's --output-dir: runs/imdb_pretrain
COMMAND = "python -m pipelines.pretrain_imdb"
NONE = "none"


@dataclasses.dataclass(frozen=True)
class Request:
    """Which checkpoint a training run asked for: `directory` (`None`: none), and whether it must
    exist (`--pretrained DIR`) or is used only when there (the default)."""

    directory: Path | None
    required: bool


def request(flag, output_dir):
    """The `Request` of `--pretrained` (`flag`: `None` when not given, "none", or a directory).

    Not given: `<parent of output_dir>/imdb_pretrain` (`runs/imdb_pretrain` beside `runs/imdb`),
    used when a finished checkpoint is there.
    """
    if flag is None:
        return Request(Path(output_dir).parent / DEFAULT_DIRECTORY_NAME, required=False)
    if flag.lower() == NONE:
        return Request(None, required=False)
    return Request(Path(flag), required=True)


def request_as_used(used):
    """The `Request` for the checkpoint a finished run used (its summary's `pretrained`: the
    `EncoderCheckpoint.describe()` dict, or `None`): the main job's other seeds train with it, so
    every seed starts from the same encoder (or none), and the how-to line is printed once."""
    if used is None:
        return Request(None, required=False)
    return Request(Path(used["directory"]), required=True)


@dataclasses.dataclass(frozen=True)
class EncoderCheckpoint:
    """A finished checkpoint: its directory, encoder configuration, vocabulary and summary."""

    directory: Path
    config: SentimentClassifierConfig
    vocabulary: list
    summary: dict

    def describe(self):
        """What a training summary records about the checkpoint it used."""
        return {"directory": str(self.directory), "epochs": self.summary["epochs_run"]}


def write(directory, encoder, config, summary):
    """Writes the encoder's weights, then `summary.json` (`summary` plus the configuration and the
    weights' SHA-256), each atomically; the vocabulary must already be in `directory`."""
    directory = Path(directory)
    with replacing(directory / ENCODER_WEIGHTS, suffix=".weights.h5") as temporary:
        encoder.save_weights(str(temporary))
    payload = {
        **summary,
        "model": config.to_dict(),
        "encoder_weights": ENCODER_WEIGHTS,
        "encoder_weights_sha256": file_sha256(directory / ENCODER_WEIGHTS),
        "vocabulary": VOCABULARY,
    }
    write_json_atomic(directory / SUMMARY, payload)
    return payload


def find(wanted):
    """The finished checkpoint of the `Request` `wanted`, or `None` (none asked, or the default
    directory holds none: then one line says how to make it).

    Raises:
        ValueError: a required directory holds no finished checkpoint, or a file is corrupt.
    """
    if wanted.directory is None:
        return None
    path = wanted.directory / SUMMARY
    if not path.is_file():
        if wanted.required:
            raise ValueError(
                f"`--pretrained` must name a finished pretraining directory (with {SUMMARY}; `none` for "
                f"no pretraining). Run `{COMMAND} --output-dir {wanted.directory}` first. "
                f"Received: --pretrained={str(wanted.directory)!r}"
            )
        print(
            f"No pretrained encoder at {wanted.directory}: the attention branch starts from random weights. "
            f"`{COMMAND} --output-dir {wanted.directory}` (same --data and model flags) pretrains one, which "
            "this command then starts from (docs/models/imdb_classifier.md, the ablation: its default 2 epochs do not help yet).",
            flush=True,
        )
        return None
    recovery = f"rerun `{COMMAND} --output-dir {wanted.directory}` to rewrite it"
    with reading(path, recovery):
        summary = json.loads(path.read_text())
        config = SentimentClassifierConfig.from_dict(summary["model"])
    weights = wanted.directory / summary["encoder_weights"]
    with reading(weights, recovery):
        if file_sha256(weights) != summary["encoder_weights_sha256"]:
            raise ValueError(f"its SHA-256 is not the one {path} records")
    with reading(wanted.directory / summary["vocabulary"], recovery):
        vocabulary = read_vocabulary(wanted.directory / summary["vocabulary"])
    return EncoderCheckpoint(wanted.directory, config, vocabulary, summary)


def check_fits(checkpoint, config, vocabulary):
    """Raises a `ValueError` naming every `ENCODER_FIELDS` value of `config` that differs from the
    checkpoint's, or the first token where `vocabulary` (the run's, without reserved ids) differs."""
    differing = [
        f"{name}={getattr(config, name)!r} (checkpoint: {getattr(checkpoint.config, name)!r})"
        for name in ENCODER_FIELDS
        if getattr(config, name) != getattr(checkpoint.config, name)
    ]
    if differing:
        raise ValueError(
            f"The pretrained encoder in {checkpoint.directory} does not fit this model: "
            f"{', '.join(differing)}. Pass the checkpoint's values, pretrain again with these, or "
            f"--pretrained {NONE}."
        )
    if list(vocabulary) != checkpoint.vocabulary:
        first = next(
            (index for index, (ours, theirs) in enumerate(zip(vocabulary, checkpoint.vocabulary)) if ours != theirs),
            min(len(vocabulary), len(checkpoint.vocabulary)),
        )
        ours, theirs = (
            tokens[first] if first < len(tokens) else None for tokens in (vocabulary, checkpoint.vocabulary)
        )
        raise ValueError(
            f"The pretrained encoder in {checkpoint.directory} was trained on another vocabulary: this run's "
            f"vectoriser has {ours!r} where the checkpoint has {theirs!r} (token {first}). Pretrain with the "
            f"same --data, --validation-size and --max-train, or --pretrained {NONE}."
        )


def load_into(classifier, checkpoint):
    """Loads the checkpoint's encoder weights into `classifier`'s attention branch; returns the layer names."""
    encoder = build_review_encoder(checkpoint.config)
    weights = checkpoint.directory / checkpoint.summary["encoder_weights"]
    with reading(weights, f"rerun `{COMMAND} --output-dir {checkpoint.directory}`"):
        encoder.load_weights(str(weights))
    return load_encoder_weights(classifier, encoder)
