"""What the installed Keras lacks among what some tests take from Keras: the oracle's features and fixes.

The supported range starts at Keras 3.10 (`make test-compat`); `make test` runs the newest, where
every such test runs in full. A test whose oracle is a Keras feature added later skips on an older
Keras naming what it lacks; a test that only meets a Keras bug fixed later leaves that part out.
"""

import keras
import pytest

from keras_attn.keras_internals import attention_takes

KERAS_VERSION = tuple(int(part) for part in keras.version().split(".")[:2])


def skip_unless_keras_takes(config):
    """Skips the test when `config` sets a `MultiHeadAttention` argument Keras's layer lacks
    (`sliding_window` and `use_gate` before Keras 3.15): Keras's layer cannot be its oracle."""
    lacking = [name for name in ("sliding_window", "use_gate") if config.get(name) and not attention_takes(name)]
    if lacking:
        pytest.skip(f"Keras {keras.version()}'s MultiHeadAttention has no {', '.join(lacking)} (Keras 3.15 on)")


def skip_before_keras(version, what):
    """Skips the test on a Keras older than `version` (`(major, minor)`), which lacks `what`."""
    if KERAS_VERSION < version:
        pytest.skip(f"Keras {keras.version()} lacks {what} (Keras {'.'.join(map(str, version))} on)")


class _NamedInputProbe(keras.layers.Layer):
    def __init__(self):
        super().__init__()
        self.input_spec = keras.InputSpec(ndim=2, name="probe_input")

    def call(self, inputs):
        return inputs


def _input_spec_errors_name_the_input():
    try:
        _NamedInputProbe()(keras.ops.zeros((1, 1, 1)))
    except ValueError as error:
        return "probe_input" in str(error)
    return False


# Newer Keras names an `InputSpec`'s input in its error ("Input 0 with name 'inputs' of layer ...").
INPUT_SPEC_ERRORS_NAME_THE_INPUT = _input_spec_errors_name_the_input()


def skip_unless_input_spec_error_names_it(error):
    """Skips the test when `error` is an older Keras's `InputSpec` error, which names the input by
    index only: the layer refused the input before any op, as the test wants, but Keras's message
    cannot carry the argument's name."""
    if not INPUT_SPEC_ERRORS_NAME_THE_INPUT and "is incompatible with the layer" in str(error):
        pytest.skip(f"Keras {keras.version()}'s InputSpec errors name the input by index only: {error}")
