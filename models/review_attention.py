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
        maps: one `AttentionMap` `(heads, tokens, tokens)` per encoder block.
        received: `(tokens,)` attention each token receives, averaged over blocks, heads and
            queries (sums to 1).
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
    maps = attention_maps({name: calls[0] for name, calls in capture.weights.items()}, tokens) if tokens else []
    received = np.mean([m.weights.mean(axis=(0, 1)) for m in maps], axis=0) if maps else np.zeros(0)
    return ReviewAttention(probability, tokens, maps, received)
