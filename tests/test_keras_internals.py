"""`keras_attn.keras_internals` against the pinned Keras: the layers Keras tracks, as Keras walks them."""

import keras
import numpy as np

from keras_attn.keras_internals import attention_takes
from keras_attn.keras_internals import call_context_training
from keras_attn.keras_internals import layer_tree
from keras_attn.keras_internals import sublayers


class Holder(keras.layers.Layer):
    """A custom layer holding an attention layer directly and a dense layer in a list."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.attention = keras.layers.MultiHeadAttention(2, 4, name="attention")
        self.heads = [keras.layers.Dense(3, name="head")]

    def call(self, x):
        return self.heads[0](self.attention(x, x))


def test_sublayers_and_layer_tree_of_custom_layers_and_models():
    holder = Holder(name="holder")
    inputs = keras.Input((5, 8))
    model = keras.Model(inputs, holder(inputs), name="model")

    assert [layer.name for layer in sublayers(holder)] == ["attention", "head"]
    assert holder in sublayers(model)
    tree = layer_tree(model)
    assert tree[0] is model
    assert holder.attention in tree and holder.attention._query_dense in tree
    assert len({id(layer) for layer in tree}) == len(tree)  # each once


def test_call_context_training_is_the_flag_keras_hands_to_sublayers():
    class Probe(keras.layers.Layer):
        def call(self, x):
            self.seen = call_context_training()
            return x

    class Outer(keras.layers.Layer):
        def __init__(self):
            super().__init__()
            self.probe = Probe()

        def call(self, x, training=None):
            return self.probe(x)

    outer, x = Outer(), np.zeros((1, 2), "float32")
    for training in (True, False):
        outer(x, training=training)
        assert outer.probe.seen is training
    assert call_context_training() is None  # outside a call


def test_attention_takes_the_arguments_keras_constructs_its_layer_with():
    assert attention_takes("num_heads") and not attention_takes("num_key_value_heads")
    for name, value in (("sliding_window", 2), ("use_gate", True)):  # Keras 3.15 on
        try:
            keras.layers.MultiHeadAttention(2, 4, **{name: value})
            constructed = True
        except ValueError:  # "Unrecognized keyword arguments"
            constructed = False
        assert attention_takes(name) == constructed, name
