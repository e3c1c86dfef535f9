"""The core op's dropout arguments for a KerasHub layer that drops out its attention weights in its hook."""


def weights_dropout(dropout_layer, training):
    """`dropout_rate`, `training` and `seed_generator` of `scaled_dot_product_attention`, from the layer's
    `keras.layers.Dropout` (or `None`: no dropout), so the weights are dropped as KerasHub's hook drops them."""
    rate = 0.0 if dropout_layer is None else dropout_layer.rate
    return dict(
        dropout_rate=rate,
        training=bool(training),
        seed_generator=dropout_layer.seed_generator if rate else None,  # Keras makes none at rate 0
    )
