"""BERT's token masking for masked-language-model pretraining, as a `tf.data` map function.

The [MASK] token is the out-of-vocabulary id (`MASK_ID = OOV_ID`), not a new id: the vocabulary,
its file and the classifier's embedding table stay exactly those of a run without pretraining,
and the pretrained token table loads into the classifier by name, row for row. To the classifier
an unknown word is a word whose identity is hidden, which is what [MASK] teaches the encoder to
read from the context. OOV tokens are never chosen as targets (predicting "unknown" teaches
nothing), nor is padding.
"""

import tensorflow as tf

from models.vocabulary import FIRST_TOKEN_ID
from models.vocabulary import OOV_ID

MASK_ID = OOV_ID
MASK_RATE = 0.15  # of the word tokens, chosen as targets
MASK_TOKEN_FRACTION = 0.8  # of the chosen: replaced by MASK_ID
RANDOM_TOKEN_FRACTION = 0.1  # of the chosen: replaced by a random word; the rest are kept


def mask_tokens(token_ids, seed, vocabulary_size, rate=MASK_RATE):
    """Chooses and corrupts target tokens of a padded batch, BERT's way (Devlin et al., 2019).

    Each word token (id >= `FIRST_TOKEN_ID`) is chosen independently with probability `rate`;
    padding and OOV tokens never are. A chosen token is replaced by `MASK_ID` with probability 0.8,
    by a word id drawn uniformly from `[FIRST_TOKEN_ID, vocabulary_size)` with probability 0.1,
    and kept otherwise. Stateless: the same `seed` gives the same result.

    Args:
        token_ids: int32 `(batch, seq)`, 0-padded.
        seed: int `(2,)` tensor, the stateless random seed.
        vocabulary_size: ids are in `[0, vocabulary_size)`.
        rate: the probability that a word token is chosen.

    Returns:
        `(inputs, labels, weights)`: `inputs` a dict of `token_ids` (int32 `(batch, seq)`, the
        corrupted ids) and `masked_positions` (int32 `(batch, targets)`: the chosen positions of
        each row in increasing order, then 0s); `labels` the original ids at those positions
        (int32 `(batch, targets)`, 0 in the filler slots); `weights` float32 `(batch, targets)`,
        1 for a chosen position and 0 for a filler. `targets` is the most tokens chosen in one
        row of the batch, at least 1.

    Raises:
        ValueError: `rate` outside (0, 1) or `vocabulary_size` leaving no word id.
    """
    if not 0 < rate < 1:
        raise ValueError(f"`rate` must be in (0, 1). Received: rate={rate}")
    if vocabulary_size <= FIRST_TOKEN_ID:
        raise ValueError(f"`vocabulary_size` must exceed {FIRST_TOKEN_ID}. Received: vocabulary_size={vocabulary_size}")
    token_ids = tf.convert_to_tensor(token_ids, tf.int32)
    shape = tf.shape(token_ids)
    choose_seed, action_seed, word_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 3))
    chosen = (token_ids >= FIRST_TOKEN_ID) & (tf.random.stateless_uniform(shape, choose_seed) < rate)  # (batch, seq)
    action = tf.random.stateless_uniform(shape, action_seed)  # < 0.8: mask, < 0.9: random word, else keep
    random_words = tf.random.stateless_uniform(
        shape, word_seed, minval=FIRST_TOKEN_ID, maxval=vocabulary_size, dtype=tf.int32
    )
    corrupted = tf.where(chosen & (action < MASK_TOKEN_FRACTION), MASK_ID, token_ids)
    corrupted = tf.where(
        chosen & (action >= MASK_TOKEN_FRACTION) & (action < MASK_TOKEN_FRACTION + RANDOM_TOKEN_FRACTION),
        random_words,
        corrupted,
    )
    positions = tf.broadcast_to(tf.range(shape[1], dtype=tf.int32), shape)  # (batch, seq)

    def padded(values):  # (batch, ragged chosen) -> (batch, max(1, most chosen in a row))
        dense = tf.ragged.boolean_mask(values, chosen).to_tensor(0)
        return tf.pad(dense, [[0, 0], [0, tf.maximum(1 - tf.shape(dense)[1], 0)]])

    return {"token_ids": corrupted, "masked_positions": padded(positions)}, padded(token_ids), padded(tf.ones(shape))
