"""One registration package for `models`; `.keras` files saved under the older names still load."""

import json
import zipfile

import keras
import numpy as np
import pytest

from models import imdb_text
from models import translation_text
from models.ngram_bag import NgramBag
from models.serialization import PACKAGE
from models.sparse_linear import SparseLinear
from models.translator import TokenAccuracy
from models.translator import Translator
from models.translator import build_translator
from tests.translation_fixtures import tiny_config
from tests.translation_fixtures import tiny_vectorizers

LEGACY_NAMES = [
    (Translator, "keras_attn>Translator"),
    (TokenAccuracy, "keras_attn>TokenAccuracy"),
    (translation_text.standardize_keep_case, "keras_attn>standardize_keep_case"),
    (translation_text.standardize_lowercase, "keras_attn>standardize_lowercase"),
    (imdb_text.standardize, "keras_attn_pipelines>standardize"),
]


@pytest.mark.parametrize("target", [Translator, TokenAccuracy, NgramBag, SparseLinear, imdb_text.standardize])
def test_models_register_under_one_package(target):
    assert keras.saving.get_registered_name(target) == f"{PACKAGE}>{target.__name__}"


@pytest.mark.parametrize("target, legacy_name", LEGACY_NAMES)
def test_legacy_names_resolve_to_the_same_object(target, legacy_name):
    assert keras.saving.get_registered_object(legacy_name) is target


def _rename_in_keras_file(path, old, new):
    """Rewrites `config.json` of a `.keras` zip, as a file saved before the rename would read."""
    with zipfile.ZipFile(path) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    config = members["config.json"].decode("utf-8")
    assert old in config
    members["config.json"] = config.replace(old, new).encode("utf-8")
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)


def test_a_translator_saved_under_the_old_package_still_loads(tmp_path):
    vectorizers = tiny_vectorizers()
    model = build_translator(tiny_config(vectorizers))
    rng = np.random.default_rng(0)
    source = rng.integers(1, vectorizers.source_vocabulary_size, (2, 6)).astype("int32")
    target = rng.integers(1, vectorizers.target_vocabulary_size, (2, 5)).astype("int32")
    expected = model((source, target))
    path = tmp_path / "translator.keras"
    model.save(path)
    _rename_in_keras_file(path, f'"{PACKAGE}>Translator"', '"keras_attn>Translator"')
    assert json.loads(zipfile.ZipFile(path).read("config.json"))["registered_name"] == "keras_attn>Translator"
    reloaded = keras.saving.load_model(path)
    assert isinstance(reloaded, Translator)
    np.testing.assert_allclose(reloaded((source, target)), expected, atol=1e-6)
