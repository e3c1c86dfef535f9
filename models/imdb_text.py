"""The IMDB classifier's text contract: standardisation, vectoriser, vocabulary and token ids.

What the served model accepts is part of the model: training (`pipelines`) and both exports
(`export`) tokenise through these functions, so they cannot drift apart. Ids are the shared
reserved ids of `models.vocabulary` (0 padding, 1 out-of-vocabulary, words from 2 on).
"""

import re
import string

import keras
import tensorflow as tf

from models.serialization import register_serializable
from models.vocabulary import FIRST_TOKEN_ID
from models.vocabulary import OOV_ID
from models.vocabulary import PADDING_ID
from models.vocabulary import write_vocabulary

# The standardisation applied before whitespace splitting, in this order. The SavedModel runs it
# with TF string ops; the ONNX predictor reads these rules and applies them in Python.
# The model's identity in its published exports (`models.export_manifest`).
MODEL_ID = "imdb_sentiment"

STANDARDIZATION = {
    "lowercase": "ascii",
    "replace": [["<br />", " "]],
    "strip_characters": string.punctuation,
    "split": "ascii_whitespace",
}


@register_serializable("keras_attn_pipelines")
def standardize(texts):
    """Lowercase (ASCII), `<br />` -> space, strip ASCII punctuation: the rules in STANDARDIZATION."""
    texts = tf.strings.lower(texts)  # default encoding "": ASCII letters only
    for old, new in STANDARDIZATION["replace"]:
        texts = tf.strings.regex_replace(texts, re.escape(old), new)
    return tf.strings.regex_replace(texts, f"[{re.escape(STANDARDIZATION['strip_characters'])}]", "")


def review_vectorizer(vocabulary_size, vocabulary=None):
    """Ragged `TextVectorization` with the IMDB standardisation; ids 0 = padding, 1 = OOV."""
    return keras.layers.TextVectorization(
        max_tokens=vocabulary_size,
        standardize=standardize,
        split="whitespace",
        output_mode="int",
        ragged=True,
        vocabulary=vocabulary,
    )


def adapt_review_vectorizer(texts, vocabulary_size):
    """A vectoriser adapted on `texts` (a dataset of strings): the training split only."""
    vectorizer = review_vectorizer(vocabulary_size)
    vectorizer.adapt(texts.batch(1024))
    return vectorizer


def save_review_vocabulary(vectorizer, path):
    """Writes `vectorizer`'s vocabulary in the `models.vocabulary` format; returns the path."""
    return write_vocabulary(path, vectorizer.get_vocabulary(include_special_tokens=False))


def tokenizer_rules(sequence_length):
    """Everything a client needs besides the vocabulary to tokenise exactly as training did."""
    return {
        **STANDARDIZATION,
        "sequence_length": sequence_length,
        "padding_id": PADDING_ID,
        "oov_id": OOV_ID,
        "first_token_id": FIRST_TOKEN_ID,
    }


def dense_token_ids(texts, vectorizer, sequence_length):
    """Int32 ids `(batch, longest row)` (at least one column) for a batch of strings, 0-padded.

    What serving and verification feed the model; training batches differ only in padding.
    """
    ids = vectorizer(texts)[:, :sequence_length].to_tensor(PADDING_ID)  # (batch, longest <= sequence_length)
    at_least_one = tf.maximum(1 - tf.shape(ids)[1], 0)
    return tf.cast(tf.pad(ids, [[0, 0], [0, at_least_one]], constant_values=PADDING_ID), tf.int32)
