"""The translator's serving SavedModel: raw source strings in, translated strings out.

Its `serving_default` signature maps a batch of raw source strings (`source`, `tf.string`,
`(batch,)`) to translated strings (`translation`): tokenisation (`TextVectorization`), the
encoder, the cached greedy decoding loop and detokenisation all run in the graph. Where it is
published: `export.serving_layout`.
"""

import keras
import tensorflow as tf

from export.serving_layout import SIGNATURE
from export.serving_layout import one_dimensional_batch
from export.serving_layout import write_archive
from models.decoding import translate_ids
from models.translation_text import detokenize
from models.translation_text import translation_vectorizer
from models.vocabulary import PADDING_ID

SIGNATURE_INPUT = "source"
SIGNATURE_OUTPUT = "translation"


def serving_function(model, vectorizers):
    """`serve(source) -> {"translation": ...}`: raw strings in, translated strings out."""
    source_vectorizer = translation_vectorizer(
        vectorizers.source_vocabulary, lowercase=True, sequence_length=vectorizers.sequence_length
    )
    source_vectorizer.build((None,))
    target_tokens = tf.constant(vectorizers.target.get_vocabulary(), tf.string)

    def serve(source):
        source = one_dimensional_batch(source)
        source_ids = tf.cast(source_vectorizer(source), tf.int32)  # (batch, sequence_length)
        ids = translate_ids(model, source_ids, vectorizers.start_id, vectorizers.end_id)[:, 1:]
        words = tf.ragged.boolean_mask(
            tf.gather(target_tokens, ids),
            tf.logical_and(tf.not_equal(ids, vectorizers.end_id), tf.not_equal(ids, PADDING_ID)),
        )  # (batch, None): the tokens before `[end]`
        return {SIGNATURE_OUTPUT: detokenize(tf.strings.reduce_join(words, axis=1, separator=" "))}

    return serve, source_vectorizer


def write_saved_model(model, vectorizers, path):
    serve, source_vectorizer = serving_function(model, vectorizers)
    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.track(source_vectorizer)
    archive.add_endpoint(
        name=SIGNATURE,
        fn=serve,
        input_signature=[tf.TensorSpec((None,), tf.string, name=SIGNATURE_INPUT)],
    )
    write_archive(archive, path)
