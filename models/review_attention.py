"""What the IMDB classifier's attention branch looks at in one review, with the predicted probability.

The review is tokenised exactly as serving does (`models.imdb_text.dense_token_ids`); the
classifier runs once under `keras_attn.visualization.AttentionCapture`, so the probability and
the maps come from the same pass. The attention branch reads the first `sequence_length` tokens:
those are the maps' tokens.
"""

import dataclasses

import keras
import numpy as np

from keras_attn.visualization import AttentionCapture
from keras_attn.visualization import attention_maps
from models.imdb_text import dense_token_ids
from models.vocabulary import PADDING_ID


@dataclasses.dataclass(frozen=True)
class ReviewAttention:
    """One review explained.

    Attributes:
        probability: the classifier's positive-class probability.
        tokens: the tokens the attention branch read (vocabulary entries; `[UNK]` out of it).
        maps: one `AttentionMap` `(heads, tokens, keys)` per encoder block; the keys are the
            tokens, or `projection k` for a family whose scores are over projected keys
            (`capabilities.scores_over_tokens` False, Linformer).
        received: `(tokens,)` attention each token receives, averaged over the blocks whose keys
            are the tokens, heads and queries (sums to 1; zeros when no block's keys are tokens).
    """

    probability: float
    tokens: list
    maps: list
    received: np.ndarray

    def top_tokens(self, count=10):
        """`(token, received)` pairs of the `count` most attended positions, highest first."""
        order = np.argsort(-self.received, kind="stable")[:count]
        return [(self.tokens[i], float(self.received[i])) for i in order]


def explain_review(model, vectorizer, config, text):
    """The `ReviewAttention` of `text` for a classifier of `build_sentiment_classifier(config)`."""
    token_ids = dense_token_ids([text], vectorizer, config.max_tokens)  # (1, tokens)
    with AttentionCapture(model) as capture:
        probability = float(keras.ops.convert_to_numpy(model(token_ids, training=False))[0, 0])
    vocabulary = vectorizer.get_vocabulary()
    read = [int(i) for i in np.asarray(token_ids)[0, : config.sequence_length] if i != PADDING_ID]
    tokens = [vocabulary[i] for i in read]
    if not tokens:
        return ReviewAttention(probability, tokens, [], np.zeros(0))
    weights = {name: calls[0] for name, calls in capture.weights.items()}
    over_tokens = {layer.path: type(layer).capabilities.scores_over_tokens for layer in capture.layers}
    keys = {
        name: tokens if over_tokens[name] else [f"projection {k}" for k in range(layer_weights.shape[-1])]
        for name, layer_weights in weights.items()
    }
    maps = attention_maps(weights, tokens, keys)
    token_maps = [m.weights.mean(axis=(0, 1)) for m in maps if over_tokens[m.name]]
    received = np.mean(token_maps, axis=0) if token_maps else np.zeros(len(tokens))
    return ReviewAttention(probability, tokens, maps, received)
