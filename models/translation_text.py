"""The translator's text contract: tokens, standardisation, vectorisers, vocabularies, detokenisation.

Tokens are words and punctuation marks: the standardisation splits every character that is not
a letter, a digit, an apostrophe or a space into its own token, with Unicode classes (`\\p{L}`,
`\\p{N}`), so `¿`, `¡` and accented letters are handled like ASCII and accents are kept.
The source side is lowercased (Unicode-aware); the target side keeps its case so that the
detokenised output can be scored with cased BLEU. The target vocabulary holds `[start]` and
`[end]` right after the padding and OOV tokens (the reserved ids of `models.vocabulary`); they
are added around the token ids, never written into the text (the standardisation would split
their brackets). Training, the SavedModel and the ONNX decoder all tokenise through this module.
"""

import os

import keras
import numpy as np
import tensorflow as tf

from models.export_manifest import check_vocabulary_size
from models.serialization import register_serializable
from models.vocabulary import FIRST_TOKEN_ID
from models.vocabulary import PADDING_ID
from models.vocabulary import read_vocabulary
from models.vocabulary import write_vocabulary

# The model's identity in its published exports (`models.export_manifest`).
MODEL_ID = "translator"

# A run's and an export's vocabulary files, one token a line (`models.vocabulary`).
VOCABULARY_FILES = {"source": "source_vocabulary.txt", "target": "target_vocabulary.txt"}

START_TOKEN = "[start]"
END_TOKEN = "[end]"
_SEPARATE_PUNCTUATION = r"([^\p{L}\p{N}\p{M}\s'])"


def _separate_punctuation(text):
    text = tf.strings.regex_replace(text, _SEPARATE_PUNCTUATION, r" \1 ")
    text = tf.strings.regex_replace(text, r"\s+", " ")
    return tf.strings.strip(text)


@register_serializable("keras_attn")
def standardize_keep_case(text):
    """Splits punctuation into tokens and collapses whitespace; keeps case and accents."""
    return _separate_punctuation(text)


@register_serializable("keras_attn")
def standardize_lowercase(text):
    """`standardize_keep_case` after a Unicode-aware lowercasing (`Ñ` -> `ñ`, `É` -> `é`)."""
    return _separate_punctuation(tf.strings.lower(text, encoding="utf-8"))


def _standardizer(lowercase):
    return standardize_lowercase if lowercase else standardize_keep_case


def translation_vectorizer(vocabulary=None, lowercase=False, max_tokens=None, sequence_length=None):
    """A `TextVectorization` with the project's standardisation (word and punctuation tokens).

    With `sequence_length=None` it returns ragged ids (for `tf.data`), otherwise ids padded or
    truncated to `sequence_length` (for serving).
    """
    return keras.layers.TextVectorization(
        max_tokens=max_tokens,
        standardize=_standardizer(lowercase),
        split="whitespace",
        output_mode="int",
        output_sequence_length=sequence_length,
        ragged=sequence_length is None,
        vocabulary=vocabulary,
    )


class TranslationVectorizers:
    """The source and target `TextVectorization` layers and the ids of the special tokens.

    Args:
        source_vocabulary: source tokens (no padding/OOV entries).
        target_vocabulary: target tokens starting with `[start]`, `[end]`.
        sequence_length: the longest source and the longest target (with start and end tokens)
            the model handles.
    """

    def __init__(self, source_vocabulary, target_vocabulary, sequence_length):
        if target_vocabulary[:2] != [START_TOKEN, END_TOKEN]:
            raise ValueError(
                f"`target_vocabulary` must start with {[START_TOKEN, END_TOKEN]}. "
                f"Received: target_vocabulary[:2]={target_vocabulary[:2]}"
            )
        self.source_vocabulary = list(source_vocabulary)
        self.target_vocabulary = list(target_vocabulary)
        self.sequence_length = sequence_length
        self.source = translation_vectorizer(self.source_vocabulary, lowercase=True)
        self.target = translation_vectorizer(self.target_vocabulary, lowercase=False)
        target_tokens = self.target.get_vocabulary()
        self.start_id = target_tokens.index(START_TOKEN)
        self.end_id = target_tokens.index(END_TOKEN)

    @property
    def source_vocabulary_size(self):
        return self.source.vocabulary_size()

    @property
    def target_vocabulary_size(self):
        return self.target.vocabulary_size()

    def save(self, directory):
        write_vocabulary(os.path.join(directory, VOCABULARY_FILES["source"]), self.source_vocabulary)
        write_vocabulary(os.path.join(directory, VOCABULARY_FILES["target"]), self.target_vocabulary)

    @classmethod
    def load(cls, directory, sequence_length, model_vocabulary_sizes=None):
        """The vectorisers of the vocabulary files in `directory`. With `model_vocabulary_sizes`
        (`{"source": ids, "target": ids}`, the model's), a file giving another number of token ids
        is a ValueError naming it, both sizes (`models.export_manifest.check_vocabulary_size`)."""
        vocabularies = {}
        for side, name in VOCABULARY_FILES.items():
            path = os.path.join(directory, name)
            vocabularies[side] = read_vocabulary(path)
            if model_vocabulary_sizes is not None:
                check_vocabulary_size(path, FIRST_TOKEN_ID + len(vocabularies[side]), model_vocabulary_sizes[side])
        return cls(vocabularies["source"], vocabularies["target"], sequence_length)

    def source_ids(self, sentences):
        """`(batch, sequence_length)` int32 source ids, zero-padded, truncated if longer."""
        ragged = self.source(tf.constant(list(sentences)))[:, : self.sequence_length]
        return tf.cast(ragged.to_tensor(PADDING_ID, shape=(None, self.sequence_length)), tf.int32)

    def target_tokens(self, ids):
        """Turns a row of target ids (stopping at `[end]` or padding) into a token list."""
        vocabulary = self.target.get_vocabulary()
        tokens = []
        for token_id in np.asarray(ids).tolist():
            if token_id in (self.end_id, PADDING_ID):
                break
            if token_id != self.start_id:
                tokens.append(vocabulary[token_id])
        return tokens


_NO_SPACE_BEFORE = r" ([.,!?;:%)\]}»…])"
_NO_SPACE_AFTER = r"([¿¡(\[{«]) "


def detokenize(tokens):
    """Joins word and punctuation tokens back into text (`tf.string` tensor or Python lists).

    Args:
        tokens: a `tf.string` tensor of space-joined tokens, or a list of token lists.
    """
    if isinstance(tokens, (list, tuple)):
        joined = tf.constant([" ".join(row) for row in tokens], tf.string)
        return [text.decode("utf-8") for text in detokenize(joined).numpy()]
    text = tf.strings.regex_replace(tokens, _NO_SPACE_BEFORE, r"\1")
    text = tf.strings.regex_replace(text, _NO_SPACE_AFTER, r"\1")
    text = tf.strings.regex_replace(text, r" ' ", "'")
    return tf.strings.regex_replace(text, r"\s+' ", "' ")
