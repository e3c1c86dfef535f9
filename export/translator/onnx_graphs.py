"""The translator as two ONNX graphs, and the greedy decoding loop that runs them in onnxruntime.

`encoder.onnx` (source ids -> the decoder's cross-attention keys/values, projected once) and
`decoder_step.onnx` (one token + the self-attention cache -> logits + the updated cache), with
dynamic batch and lengths, written with the vocabularies and `decoding.json` (start, end and
padding ids, length, cache shape); `OnnxGreedyDecoder` drives them with onnxruntime only.
"""

import json
import os

import numpy as np
import tensorflow as tf

from export.onnx_conversion import check_onnx_capable
from export.onnx_conversion import convert
from models.decoding import cross_attention_caches
from models.decoding import decoder_step
from models.vocabulary import PADDING_ID


def check_onnx_exportable(model):
    """Raises a `ValueError` naming the family unless the translator can go into these graphs:
    every attention layer exports to ONNX (`check_onnx_capable`) and every decoder block's
    self-attention decodes with a key/value cache (the graphs carry the self-attention caches
    as one stacked key/value tensor)."""
    check_onnx_capable(model)
    for layer in model.decoder_layers:
        family = type(layer.self_attention)
        if family.capabilities.cache != "key_value":
            raise ValueError(
                "The translator's ONNX graphs carry the decoder's self-attention caches as one stacked key/value "
                f"tensor: its {model.attention!r} self-attention ({family.__name__}) declares "
                f"cache={family.capabilities.cache!r}. Export the SavedModel alone (`--no-onnx`). "
                f"Received: attention={model.attention!r}"
            )


def _stacked_caches(model):
    """`(layers, heads, head_dim)`: the static sizes of the stacked caches `(layers, 2, length, heads, head_dim)`."""
    return len(model.decoder_layers), model.num_heads, model.embedding_dim // model.num_heads


def onnx_functions(model):
    """The encoder and one cached decoder step as `tf.function`s with dynamic batch and lengths."""
    layers, heads, head_dim = _stacked_caches(model)
    cache_spec = (None, layers, 2, None, heads, head_dim)

    @tf.function(input_signature=[tf.TensorSpec((None, None), tf.int32, name="source_ids")])
    def encoder(source_ids):
        caches = cross_attention_caches(model, model.encode(source_ids))
        return {"cross_cache": tf.stack(caches, axis=1)}  # (batch, layers, 2, source_len, heads, head_dim)

    @tf.function(
        input_signature=[
            tf.TensorSpec((None, 1), tf.int32, name="token"),
            tf.TensorSpec((), tf.int32, name="index"),
            tf.TensorSpec(cache_spec, tf.float32, name="self_cache"),
            tf.TensorSpec(cache_spec, tf.float32, name="cross_cache"),
            tf.TensorSpec((None, None), tf.int32, name="source_ids"),
        ]
    )
    def step(token, index, self_cache, cross_cache, source_ids):
        logits, updated = decoder_step(
            model,
            token,
            tf.unstack(self_cache, layers, axis=1),
            tf.unstack(cross_cache, layers, axis=1),
            model.source_padding_mask(source_ids),
            index,
        )
        return {"logits": logits, "updated_self_cache": tf.stack(updated, axis=1)}

    return encoder, step


def write_onnx(model, vectorizers, directory):
    """Writes the two graphs, `decoding.json` and the vocabularies into `directory`
    (`check_onnx_exportable` first)."""
    check_onnx_exportable(model)
    os.makedirs(directory, exist_ok=True)
    encoder, step = onnx_functions(model)
    for name, function in (("encoder", encoder), ("decoder_step", step)):
        convert(function, os.path.join(directory, f"{name}.onnx"))  # the cache write is a scatter: ScatterND
    layers, heads, head_dim = _stacked_caches(model)
    with open(os.path.join(directory, "decoding.json"), "w", encoding="utf-8") as handle:
        json.dump(
            {
                "start_id": vectorizers.start_id,
                "end_id": vectorizers.end_id,
                "padding_id": PADDING_ID,
                "max_length": vectorizers.sequence_length,
                "cache_shape": [layers, 2, heads, head_dim],
            },
            handle,
            indent=1,
        )
    vectorizers.save(directory)


class OnnxGreedyDecoder:
    """Greedy decoding with onnxruntime only, the sessions and `decoding.json` loaded once:
    `decoder(source_ids)` gives `(batch, max_length)` ids like `translate_ids`."""

    def __init__(self, directory):
        import onnxruntime

        with open(os.path.join(directory, "decoding.json"), encoding="utf-8") as handle:
            self.decoding = json.load(handle)
        options = {"providers": ["CPUExecutionProvider"]}
        self.encoder = onnxruntime.InferenceSession(os.path.join(directory, "encoder.onnx"), **options)
        self.step = onnxruntime.InferenceSession(os.path.join(directory, "decoder_step.onnx"), **options)
        self.output_names = [output.name for output in self.step.get_outputs()]

    def __call__(self, source_ids):
        decoding = self.decoding
        source_ids = np.asarray(source_ids, np.int32)
        batch, max_length = source_ids.shape[0], decoding["max_length"]
        (cross_cache,) = self.encoder.run(None, {"source_ids": source_ids})
        layers, pair, heads, head_dim = decoding["cache_shape"]
        self_cache = np.zeros((batch, layers, pair, max_length, heads, head_dim), np.float32)
        tokens = np.full((batch, max_length), decoding["padding_id"], np.int32)
        tokens[:, 0] = decoding["start_id"]
        finished = np.zeros(batch, bool)
        for index in range(max_length - 1):
            outputs = self.step.run(
                None,
                {
                    "token": tokens[:, index : index + 1],
                    "index": np.asarray(index, np.int32),
                    "self_cache": self_cache,
                    "cross_cache": cross_cache,
                    "source_ids": source_ids,
                },
            )
            outputs = dict(zip(self.output_names, outputs))
            self_cache = outputs["updated_self_cache"]
            next_ids = np.argmax(outputs["logits"], axis=-1).astype(np.int32)
            next_ids[finished] = decoding["padding_id"]
            tokens[:, index + 1] = next_ids
            finished |= next_ids == decoding["end_id"]
            if finished.all():
                break
        return tokens
