"""The oracle of the `keras_attn.convert` tests: the same model built twice with the same weights."""

import numpy as np


def twins(build):
    """`(reference, model)`: `build()` twice, the second with the first's weights (convert changes it in place)."""
    reference, model = build(), build()
    model.set_weights(reference.get_weights())
    return reference, model


def max_difference(a, b):
    """The largest absolute difference of two arrays, in float64."""
    return float(np.max(np.abs(np.asarray(a, "float64") - np.asarray(b, "float64"))))
