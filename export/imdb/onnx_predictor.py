"""Runs an exported IMDB classifier with onnxruntime, tokenising exactly as training did.

Self-contained: needs only NumPy and onnxruntime (no TensorFlow, no project code), so the export
bundle ships a copy of this file next to `model.onnx`, `model.int8.onnx`, `model.fused.onnx` (with
dense attention), `vocabulary.txt` and `tokenizer.json`:

    import onnx_predictor
    predictor = onnx_predictor.OnnxSentimentPredictor("path/to/bundle")
    predictor.predict(["A wonderful film.", "Dull and far too long."])
    # {"probability": array([...], float32), "label": array([1, 0])}
    onnx_predictor.OnnxSentimentPredictor("path/to/bundle", quantized=True)  # the int8 model
    onnx_predictor.OnnxSentimentPredictor("path/to/bundle", fused=True)  # ONNX Runtime's fused attention

`model.int8.onnx` is `model.onnx` with int8 weights (ONNX Runtime's dynamic quantisation): about a
quarter of the size, its probabilities a little off the float model's (more than the 1e-5 the
float model keeps to Keras), so the export checks it by accuracy, not parity. Its activations are
quantised with one scale per batch (padding included), so a review's probability also moves a
little with the batch it is sent in, where the float model's does not.

`model.fused.onnx` is `model.onnx` with each attention core one `com.microsoft.MultiHeadAttention`
node (a contrib operator of the standard onnxruntime packages): the same probabilities within the float
model's 1e-5 of Keras, faster on long batches.

Tokenisation (`tokenizer.json` holds the rules the SavedModel's TF string ops apply):
lowercase ASCII letters only, replace each `replace` pair in order, delete every character of
`strip_characters`, split on runs of ASCII whitespace, look each token up in the vocabulary
(line `i` of `vocabulary.txt` is id `first_token_id + i`; unknown tokens get `oov_id`), keep the
first `sequence_length` ids and right-pad the batch with `padding_id` to its longest row.

Inputs are what the SavedModel's `tf.string` signature takes: one review or a sequence (list,
tuple, NumPy array) of them, each `str` or `bytes`. Bytes need not be UTF-8: like TensorFlow's
string ops, the rules act on the ASCII bytes and leave every other byte in its token (which is
then out of vocabulary). An empty batch answers empty arrays.
"""

import json
import re
from pathlib import Path

import numpy as np
import onnxruntime

try:  # in the repository
    from models.export_manifest import check_manifest
    from models.export_manifest import check_vocabulary_size
except ImportError:  # in an exported bundle: the copy beside this file
    from export_manifest import check_manifest
    from export_manifest import check_vocabulary_size

MODEL_ID = "imdb_sentiment"
# The bundle's model files: the float model (the export's parity with Keras) and its int8 quantisation.
MODEL_FILES = {False: "model.onnx", True: "model.int8.onnx"}
# The float model with each attention core one `com.microsoft.MultiHeadAttention` node (same parity).
FUSED_MODEL_FILE = "model.fused.onnx"

_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
_ASCII_WHITESPACE = re.compile("[ \t\n\v\f\r]+")


class OnnxSentimentPredictor:
    """Raw review strings in, positive-class probability and label out, through onnxruntime.

    Args:
        bundle_dir: directory holding `model.onnx` (and `model.int8.onnx`), `vocabulary.txt` and
            `tokenizer.json`.
        session_options: optional `onnxruntime.SessionOptions` (graph optimisation level, thread
            counts) for the session; onnxruntime's defaults otherwise. One predictor may serve
            concurrent threads: `predict` keeps no state between calls.
        quantized: `True` runs `model.int8.onnx` (int8 weights: smaller, and within the export's
            accuracy tolerance of the float model rather than equal to it), `False` `model.onnx`.
        fused: `True` runs `model.fused.onnx`, the float model with ONNX Runtime's fused attention
            (the same probabilities, faster on long batches; in bundles whose attention has a
            fused form), not with `quantized`.
    """

    def __init__(self, bundle_dir, session_options=None, quantized=False, fused=False):
        for name, flag in (("quantized", quantized), ("fused", fused)):
            if not isinstance(flag, bool):
                raise TypeError(f"`{name}` must be True or False. Received: {name}={flag!r}")
        if quantized and fused:
            raise ValueError(
                "`quantized` and `fused` name two different models: choose one. Received: quantized=True, fused=True"
            )
        bundle_dir = Path(bundle_dir)
        # Every file as published (SHA-256), and a model of this kind, before anything is loaded.
        manifest = check_manifest(bundle_dir, MODEL_ID)
        self.rules = json.loads((bundle_dir / "tokenizer.json").read_text(encoding="utf-8"))
        if self.rules.get("lowercase") != "ascii" or self.rules.get("split") != "ascii_whitespace":
            raise ValueError(f"Unsupported tokenizer rules in {bundle_dir / 'tokenizer.json'}: {self.rules}")
        tokens = (bundle_dir / "vocabulary.txt").read_text(encoding="utf-8").split("\n")[:-1]
        first = self.rules["first_token_id"]
        check_vocabulary_size(
            bundle_dir / "vocabulary.txt", first + len(tokens), manifest["vocabulary_sizes"]["reviews"]
        )
        self.token_to_id = {token: first + index for index, token in enumerate(tokens)}
        self._strip = re.compile("[" + re.escape(self.rules["strip_characters"]) + "]")
        self.model_path = bundle_dir / (FUSED_MODEL_FILE if fused else MODEL_FILES[quantized])
        if not self.model_path.is_file():  # the manifest holds every published file: an older bundle, or no fused form
            raise FileNotFoundError(
                f"{self.model_path} is not in the bundle (exported before int8 and fused models, or a model whose "
                f"attention has no fused form): export the model again, or load the float model (quantized=False, fused=False)"
            )
        self.session = onnxruntime.InferenceSession(
            str(self.model_path), sess_options=session_options, providers=["CPUExecutionProvider"]
        )
        self.input_name = self.session.get_inputs()[0].name

    @staticmethod
    def reviews(texts):
        """`texts` as a list of `str`: a lone `str`/`bytes` is a batch of one; bytes that are not
        UTF-8 keep each undecodable byte as a lone surrogate (never matches a vocabulary token)."""
        if isinstance(texts, (str, bytes)):
            texts = [texts]
        if isinstance(texts, np.ndarray) and texts.ndim <= 1:
            texts = texts.reshape(-1).tolist()
        if not isinstance(texts, (list, tuple)):
            raise TypeError(f"`texts` must be a string or a list of strings. Received: texts={texts!r}")
        reviews = []
        for index, text in enumerate(texts):
            if isinstance(text, bytes):
                text = text.decode("utf-8", errors="surrogateescape")
            if not isinstance(text, str):
                raise TypeError(f"`texts[{index}]` must be a str or bytes. Received: {text!r} ({type(text).__name__})")
            reviews.append(text)
        return reviews

    def standardize(self, text):
        text = text.translate(_ASCII_LOWER)
        for old, new in self.rules["replace"]:
            text = text.replace(old, new)
        return self._strip.sub("", text)

    def token_ids(self, texts):
        """Int32 ids `(batch, longest row)` (at least one column), 0-padded on the right."""
        oov, length = self.rules["oov_id"], self.rules["sequence_length"]
        rows = []
        for text in self.reviews(texts):
            tokens = [token for token in _ASCII_WHITESPACE.split(self.standardize(text)) if token]
            rows.append([self.token_to_id.get(token, oov) for token in tokens][:length])
        ids = np.full((len(rows), max([1] + [len(row) for row in rows])), self.rules["padding_id"], np.int32)
        for index, row in enumerate(rows):
            ids[index, : len(row)] = row
        return ids

    def predict(self, texts):
        """`{"probability": float32 (batch,), "label": int64 (batch,)}` for a string or a list of strings."""
        ids = self.token_ids(texts)
        if ids.shape[0] == 0:
            probability = np.zeros([0], np.float32)
        else:
            (probability,) = self.session.run(None, {self.input_name: ids})
        probability = probability.reshape(-1)
        return {"probability": probability, "label": (probability >= 0.5).astype(np.int64)}
