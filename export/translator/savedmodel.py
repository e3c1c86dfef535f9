"""The translator's serving SavedModel: raw source strings in, translated strings out.

Two signatures map a batch of raw source strings (`source`, `tf.string`, `(batch,)`) to
translated strings (`translation`): `serving_default` decodes with beam search (beam
`decoding_defaults.BEAM_SIZE`, length penalty `decoding_defaults.LENGTH_PENALTY`: the decoding the
run's headline BLEU measures) and `decoding_defaults.GREEDY_SIGNATURE` ("greedy") greedily, faster.
Tokenisation (`TextVectorization`), the encoder, the cached decoding loop and detokenisation all
run in the graph. Where it is published: `export.serving_layout`.
"""

import keras
import tensorflow as tf

from export.serving_layout import SIGNATURE
from export.serving_layout import one_dimensional_batch
from export.serving_layout import write_archive
from models import decoding_defaults
from models.decoding import translate_ids
from models.translation_text import detokenize
from models.translation_text import translation_vectorizer
from models.vocabulary import PADDING_ID

SIGNATURE_INPUT = "source"
SIGNATURE_OUTPUT = "translation"
SEARCHES = {  # signature: (beam size, length penalty)
    SIGNATURE: (decoding_defaults.BEAM_SIZE, decoding_defaults.LENGTH_PENALTY),
    decoding_defaults.GREEDY_SIGNATURE: (1, 0.0),
}


def source_vectorizer_layer(vectorizers):
    """The lowercasing source `TextVectorization` the signatures share (tracked once)."""
    source_vectorizer = translation_vectorizer(
        vectorizers.source_vocabulary, lowercase=True, sequence_length=vectorizers.sequence_length
    )
    source_vectorizer.build((None,))
    return source_vectorizer


def serving_function(model, vectorizers, source_vectorizer, beam_size, length_penalty=0.0):
    """`serve(source) -> {"translation": ...}`: raw strings in, translated strings out (greedy for
    `beam_size` 1)."""
    target_tokens = tf.constant(vectorizers.target.get_vocabulary(), tf.string)

    def serve(source):
        source = one_dimensional_batch(source)
        source_ids = tf.cast(source_vectorizer(source), tf.int32)  # (batch, sequence_length)
        ids = translate_ids(
            model,
            source_ids,
            vectorizers.start_id,
            vectorizers.end_id,
            beam_size=beam_size,
            length_penalty=length_penalty,
        )[:, 1:]
        words = tf.ragged.boolean_mask(
            tf.gather(target_tokens, ids),
            tf.logical_and(tf.not_equal(ids, vectorizers.end_id), tf.not_equal(ids, PADDING_ID)),
        )  # (batch, None): the tokens before `[end]`
        return {SIGNATURE_OUTPUT: detokenize(tf.strings.reduce_join(words, axis=1, separator=" "))}

    return serve


def write_saved_model(model, vectorizers, path):
    source_vectorizer = source_vectorizer_layer(vectorizers)
    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.track(source_vectorizer)
    for signature, (beam_size, length_penalty) in SEARCHES.items():
        archive.add_endpoint(
            name=signature,
            fn=serving_function(model, vectorizers, source_vectorizer, beam_size, length_penalty),
            input_signature=[tf.TensorSpec((None,), tf.string, name=SIGNATURE_INPUT)],
        )
    write_archive(archive, path)
