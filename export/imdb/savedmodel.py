"""The IMDB classifier's serving SavedModel: raw review strings in, probability and label out.

The `serving_default` signature takes `reviews`, a `tf.string [None]` batch of raw reviews, and
returns `probability` (float32 `[None]`, positive class) and `label` (int64 `[None]`). It runs
the training vectoriser (its vocabulary file travels as a SavedModel asset, `assets/vocabulary.txt`)
and then the token-id model. Where it is published: `export.serving_layout`.
"""

from pathlib import Path

import keras
import tensorflow as tf

from export.serving_layout import SIGNATURE
from export.serving_layout import one_dimensional_batch
from export.serving_layout import write_archive
from models.imdb_text import dense_token_ids
from models.imdb_text import review_vectorizer

INPUT_NAME = "reviews"


def write_savedmodel(model, vocabulary_path, vocabulary_size, sequence_length, path):
    """Writes the raw-string serving SavedModel of `model` to `path`.

    Args:
        model: the token-id classifier (`(batch, seq)` int32 -> `(batch, 1)` probability).
        vocabulary_path: the vocabulary file written by training (ids from 2 on).
        vocabulary_size: the vectoriser's vocabulary size (`vectorizer.vocabulary_size()`).
        sequence_length: reviews are truncated to this many tokens, as in training.
        path: destination directory (created).
    """
    # Rebuilt from the vocabulary file, which the SavedModel then carries as an asset.
    vectorizer = review_vectorizer(vocabulary_size, vocabulary=str(vocabulary_path))
    vectorizer(tf.constant([""]))  # builds it (the export archive tracks built layers only)

    def serve(reviews):
        reviews = one_dimensional_batch(reviews)
        ids = dense_token_ids(reviews, vectorizer, sequence_length)  # (batch, width) int32
        probability = tf.reshape(model(ids, training=False), [-1])  # (batch,)
        return {"probability": probability, "label": tf.cast(probability >= 0.5, tf.int64)}

    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.track(vectorizer)
    archive.add_endpoint(SIGNATURE, serve, input_signature=[tf.TensorSpec([None], tf.string, name=INPUT_NAME)])
    write_archive(archive, path)
    return Path(path)
