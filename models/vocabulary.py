"""The reserved token ids and the vocabulary file format shared by every model of this project.

Ids follow `keras.layers.TextVectorization`: 0 is padding (`keras_attn`'s embedding masks it),
1 is out-of-vocabulary, and the vocabulary file's line `i` is id `FIRST_TOKEN_ID + i`: the reserved
ids are not in the file, which is the format `TextVectorization(vocabulary=path)` reads back.
"""

from appkit.files import write_text_atomic
from keras_attn.positions.token_and_position_embedding import PADDING_ID

OOV_ID = 1
FIRST_TOKEN_ID = 2

__all__ = ["PADDING_ID", "OOV_ID", "FIRST_TOKEN_ID", "smallest_vocabulary_size", "write_vocabulary", "read_vocabulary"]


def smallest_vocabulary_size(reserved_tokens=()):
    """The fewest token ids a model's vocabulary may have: padding, OOV, `reserved_tokens` and one
    word (`TextVectorization` refuses fewer than two, and a vocabulary of no word teaches nothing)."""
    return FIRST_TOKEN_ID + len(reserved_tokens) + 1


def write_vocabulary(path, tokens):
    """Writes `tokens` (no reserved entries) one a line, atomically; returns the path."""
    return write_text_atomic(path, "".join(f"{token}\n" for token in tokens))


def read_vocabulary(path):
    """The tokens of a file written by `write_vocabulary`, in id order."""
    with open(path, encoding="utf-8") as handle:
        return [line.rstrip("\n") for line in handle]
