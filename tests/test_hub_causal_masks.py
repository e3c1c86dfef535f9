"""`keras_attn.layers.hub_adapters.causal_masks`: which KerasHub masks pass the causal pattern too.

The oracle of `BUILDERS`' claim is the causal pattern in NumPy: every mask the installed KerasHub's
builders make lies within it. A mask recognised where it does not would change a converted
layer's output, which the last tests hold against the unconverted layer.
"""

import inspect
import types

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_attn
from keras_attn.layers.hub_adapters import causal_masks
from tests.twin_models import max_difference
from tests.twin_models import twins

keras_hub = pytest.importorskip("keras_hub")

LENGTH = 7


def _builder(name):
    """The registered builder, or a skip where the installed KerasHub has no such class (an older one)."""
    module, klass, method = name.rsplit(".", 2)
    builder = getattr(getattr(pytest.importorskip(module), klass, None), method, None)
    if builder is None:
        pytest.skip(f"KerasHub {keras_hub.__version__} has no {klass}.{method}")
    return builder


def _arguments(builder, **given):
    """Keyword arguments of a builder: a sequence of `LENGTH`, a padding mask with padded positions, no cache (index 0)."""
    padding = np.ones((2, LENGTH), bool)
    padding[1, -2:] = False
    arguments = {}
    for position, name in enumerate(list(inspect.signature(builder).parameters)[1:]):
        if position == 0:
            arguments[name] = tf.zeros((2, LENGTH, 4))
        elif "padding" in name:
            arguments[name] = tf.constant(padding)
        elif name == "use_causal_mask":
            arguments[name] = True
        elif name.endswith("cache_update_index"):
            arguments[name] = 0  # Gemma's block passes 0 without a cache
        else:  # the block's own attention mask, the cache
            arguments[name] = None
    arguments.update(given)
    return arguments


@pytest.mark.parametrize("name", sorted(causal_masks.BUILDERS))
def test_every_builders_mask_lies_within_the_causal_pattern(name):
    builder = _builder(name)
    block = types.SimpleNamespace(sliding_window=3)  # Mistral's and Mixtral's builders read their window
    mask = np.asarray(builder(block, **_arguments(builder)), bool)
    causal = np.tril(np.ones((LENGTH, LENGTH), bool))
    assert mask.shape == (2, LENGTH, LENGTH)
    assert not np.any(mask & ~causal)
    assert not np.any(mask[1][:, -2:])  # the padding is in it too: the mask is more than the pattern


def _gpt2_block():
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=32, num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16, max_sequence_length=16
    )
    keras_attn.convert(backbone)
    return next(layer for layer in backbone._flatten_layers() if type(layer).__name__ == "TransformerDecoder")


def test_only_a_causal_mask_with_its_queries_first_is_recognised():
    block = _gpt2_block()
    build = block._compute_self_attention_mask
    arguments = _arguments(type(block)._compute_self_attention_mask)
    assert causal_masks.within_causal_pattern(build(**arguments))
    assert causal_masks.within_causal_pattern(build(**{**arguments, "self_attention_cache_update_index": None}))
    assert not causal_masks.within_causal_pattern(build(**{**arguments, "use_causal_mask": False}))
    assert not causal_masks.within_causal_pattern(build(**{**arguments, "self_attention_cache_update_index": 2}))
    index = tf.constant(0)  # a decoding step's index: a tensor, its value unknown when traced
    assert not causal_masks.within_causal_pattern(build(**{**arguments, "self_attention_cache_update_index": index}))


def test_an_equal_mask_from_elsewhere_is_not_recognised():
    block = _gpt2_block()
    arguments = _arguments(type(block)._compute_self_attention_mask)
    recognised = block._compute_self_attention_mask(**arguments)
    assert not causal_masks.within_causal_pattern(tf.identity(recognised))
    assert not causal_masks.within_causal_pattern(np.asarray(recognised))
    assert not causal_masks.within_causal_pattern(None)


def test_a_builder_without_the_arguments_it_is_read_by_is_left_alone(monkeypatch):
    # Another KerasHub version's builder of the same name, with its cache index named otherwise.
    block = _gpt2_block()
    del block._compute_self_attention_mask  # unwrapped: the class's builder again
    name = "keras_hub.src.layers.modeling.transformer_decoder.TransformerDecoder._compute_self_attention_mask"
    monkeypatch.setitem(causal_masks.BUILDERS, name, ("cache_index", "use_causal_mask"))
    causal_masks.recognise(block)
    assert "_compute_self_attention_mask" not in vars(block)


def test_converting_twice_wraps_a_builder_once():
    block = _gpt2_block()
    build = block._compute_self_attention_mask
    causal_masks.recognise(block)
    assert block._compute_self_attention_mask is build


def test_a_decoder_called_without_its_causal_mask_keeps_its_output():
    # TransformerDecoder(use_causal_mask=False) builds the padding mask alone: bidirectional. Taken
    # for causal, the converted model would hide every later key and differ from the original.
    def build():
        tokens = keras.Input((LENGTH, 8))
        padding = keras.Input((LENGTH,), dtype="bool")
        decoder = keras_hub.layers.TransformerDecoder(intermediate_dim=16, num_heads=2)
        return keras.Model([tokens, padding], decoder(tokens, decoder_padding_mask=padding, use_causal_mask=False))

    reference, model = twins(build)
    keras_attn.convert(model)
    inputs = [np.random.default_rng(0).normal(size=(2, LENGTH, 8)).astype("float32"), np.ones((2, LENGTH), bool)]
    assert max_difference(model(inputs), reference(inputs)) < 1e-5


def test_an_attention_called_with_a_mask_of_its_own_keeps_its_output():
    # A converted Llama attention called directly with a bidirectional mask: nothing recognises it.
    def build():
        backbone = keras_hub.models.LlamaBackbone(
            vocabulary_size=32,
            num_layers=1,
            num_query_heads=2,
            num_key_value_heads=1,
            hidden_dim=8,
            intermediate_dim=16,
        )
        return backbone.get_layer("transformer_layer_0")._self_attention_layer

    reference, attention = twins(build)
    keras_attn.convert(keras.Sequential([attention]))
    x = np.random.default_rng(1).normal(size=(2, LENGTH, 8)).astype("float32")
    everywhere = np.ones((2, LENGTH, LENGTH), bool)
    assert max_difference(attention(x, attention_mask=everywhere), reference(x, attention_mask=everywhere)) < 1e-5
