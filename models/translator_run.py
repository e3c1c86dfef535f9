"""A trained translator's run directory: what training writes and what translating and exporting read.

<run>/translator.keras          the model
<run>/run_config.json           the data file, its columns, source and target languages, ...
<run>/split.json                the seeded train / validation / test indices (and the data's sha256)
<run>/source_vocabulary.txt     the vocabularies (`models.translation_text.TranslationVectorizers`)
<run>/target_vocabulary.txt
"""

import json
import os

import keras
import numpy as np

from appkit.files import reading
from appkit.files import write_json_atomic
from models import translator  # noqa: F401  (registers the serialisable classes)
from models.export_manifest import file_sha256
from models.parallel_text import orient_pairs
from models.parallel_text import read_pairs
from models.translation_text import TranslationVectorizers

RUN_CONFIG = "run_config.json"
MODEL_FILE = "translator.keras"
SPLIT_FILE = "split.json"
SPLITS = ("train", "validation", "test")


def read_run_config(run_dir):
    """The run's `run_config.json` as a dict; a ValueError naming `run_dir` when it has none."""
    config_path = os.path.join(run_dir, RUN_CONFIG)
    if not os.path.isfile(config_path):
        raise ValueError(f"`run_dir` holds no {RUN_CONFIG}. Received: run_dir={run_dir!r}")
    with reading(config_path, _retrain(run_dir)), open(config_path, encoding="utf-8") as handle:
        return json.load(handle)


def _retrain(run_dir):
    return f"train the translator again into {run_dir} (python -m pipelines.train_translator --output-dir {run_dir})"


def load_run(run_dir):
    """`(model, vectorizers, run_config)` of a finished training run."""
    run_config = read_run_config(run_dir)
    with reading(os.path.join(run_dir, MODEL_FILE), _retrain(run_dir)):
        model = keras.saving.load_model(os.path.join(run_dir, MODEL_FILE), compile=False)
    sizes = {"source": model.source_vocabulary_size, "target": model.target_vocabulary_size}
    vectorizers = TranslationVectorizers.load(run_dir, model.sequence_length, sizes)
    return model, vectorizers, run_config


def write_split(path, split, data_path, seed, method):
    """Records the split (its method, the seed and the data file's sha256) next to a run."""
    write_json_atomic(
        path,
        {
            "data": os.path.abspath(data_path),
            "sha256": file_sha256(data_path),
            "method": method,
            "seed": seed,
            "sizes": {name: int(len(indices)) for name, indices in split.items()},
            **{name: indices.tolist() for name, indices in split.items()},
        },
    )


def read_split(path):
    """`({split: sorted int64 indices}, method)` as `write_split` recorded them; a split recorded
    before the method was (always by pair) reads as "pair"."""
    with open(path, encoding="utf-8") as handle:
        payload = json.load(handle)
    return {name: np.asarray(payload[name], np.int64) for name in SPLITS}, payload.get("method", "pair")


def held_out_sources(run_dir, count):
    """`count` evenly spaced distinct source sentences of the run's recorded test split."""
    run_config = read_run_config(run_dir)
    sources, _ = orient_pairs(
        read_pairs(run_config["data"]), run_config["columns"], run_config["source"], run_config["target"]
    )
    test = list(dict.fromkeys(sources[i] for i in read_split(os.path.join(run_dir, SPLIT_FILE))[0]["test"]))
    return [test[i] for i in np.linspace(0, len(test) - 1, min(count, len(test))).astype(int)]
