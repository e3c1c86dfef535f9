"""One registration scheme for the serialisable objects of `models`.

Everything in `models` registers under the package `keras_attn_models` (the library's own layers
use `keras_attn`). Files saved before the scheme was unified name some objects under an older
package; those names stay resolvable, so old `.keras` files still load.
"""

import keras

PACKAGE = "keras_attn_models"


def register_serializable(*legacy_packages):
    """Registers under `PACKAGE`, and also resolves the names under `legacy_packages`."""

    def register(target):
        for package in legacy_packages:
            keras.saving.register_keras_serializable(package=package)(target)
        return keras.saving.register_keras_serializable(package=PACKAGE)(target)  # the name saved from now on

    return register
