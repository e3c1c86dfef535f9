import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

# The IMDB archive fixtures, for every test module that names them as arguments.
pytest_plugins = ["tests.imdb_fixtures"]


@pytest.fixture(autouse=True)
def _float32_policy_and_seed():
    """Every test starts from float32 and fixed seeds, whatever the previous test set."""
    keras.config.set_dtype_policy("float32")
    keras.utils.set_random_seed(1234)
    np.random.seed(1234)
    yield
    keras.config.set_dtype_policy("float32")
