"""Cross-attention alignments of a translation: which source tokens each produced token attended to.

The translation is decoded first (greedy or beam, with the cache); its tokens are then fed back
teacher-forced, once, with `keras_attn.visualization.attention_weights` recording every decoder
block's cross-attention: row `i` is the step that produced target token `i`.
"""

import numpy as np

from keras_attn.visualization import attention_maps
from keras_attn.visualization import attention_weights
from models.vocabulary import PADDING_ID


def produced_tokens(vectorizers, target_ids):
    """The decoded row `[start] w1 .. [end] 0 ..` as its produced tokens `w1 .. [end]` and their ids."""
    target_ids = np.asarray(target_ids)
    vocabulary = vectorizers.target.get_vocabulary()
    produced = []
    for token_id in target_ids[1:].tolist():
        if token_id == PADDING_ID:
            break
        produced.append(token_id)
        if token_id == vectorizers.end_id:
            break
    return [vocabulary[token_id] for token_id in produced], produced


def alignment_maps(model, vectorizers, sentence, target_ids):
    """One `AttentionMap` per decoder block: `(heads, produced tokens, source tokens)`.

    Args:
        model: a `Translator`.
        vectorizers: its `TranslationVectorizers`.
        sentence: the source sentence.
        target_ids: the decoded ids of that sentence, `[start] w1 .. [end] 0 ..`.
    """
    source_ids = np.asarray(vectorizers.source_ids([sentence]))  # (1, sequence_length)
    source_vocabulary = vectorizers.source.get_vocabulary()
    source_tokens = [source_vocabulary[i] for i in source_ids[0].tolist() if i != PADDING_ID]
    tokens, produced = produced_tokens(vectorizers, target_ids)
    if not tokens:
        raise ValueError(
            f"`target_ids` holds no produced token. Received: target_ids={np.asarray(target_ids).tolist()}"
        )
    target_in = np.asarray(target_ids)[None, : len(produced)].astype("int32")  # [start] w1 .. (1, produced)
    weights = attention_weights(model, (source_ids, target_in))
    cross = {block.cross_attention.path: weights[block.cross_attention.path] for block in model.decoder_layers}
    return attention_maps(cross, tokens, source_tokens)
