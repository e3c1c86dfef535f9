"""T5's relative position bias: a learned scalar per head and bucket of relative positions (Raffel et al., 2020)."""

import math

import keras
from keras import ops

from keras_attn.core.position_bias import PositionBias
from keras_attn.core.position_bias import relative_positions
from keras_attn.validation import check_bool
from keras_attn.validation import check_elements
from keras_attn.validation import check_positive_int


def relative_position_buckets(relative_position, bidirectional=True, num_buckets=32, max_distance=128):
    """T5's `_relative_position_bucket`: int32 buckets of `relative_position = key - query`.

    Half the buckets (of the half per direction when `bidirectional`) hold the distances
    `0 .. max_exact - 1` exactly; the rest grow logarithmically up to `max_distance`, beyond which
    every distance shares the last bucket. Causal bucketing (`bidirectional=False`) puts every key
    after the query in bucket 0 (a causal mask hides them). The logarithm is float32, as in T5.
    """
    relative_position = ops.cast(relative_position, "int32")
    distance = -relative_position  # query - key: > 0 for keys before the query
    buckets = ops.zeros_like(distance)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + ops.cast(ops.less(distance, 0), "int32") * num_buckets  # keys after the query
        distance = ops.abs(distance)
    else:
        distance = ops.maximum(distance, 0)
    max_exact = num_buckets // 2
    # max(distance, max_exact): the logarithm is used only there (no log(0)).
    ratio = ops.cast(ops.maximum(distance, max_exact), "float32") / max_exact
    logarithmic = max_exact + ops.cast(
        ops.log(ratio) / math.log(max_distance / max_exact) * (num_buckets - max_exact), "int32"
    )
    logarithmic = ops.minimum(logarithmic, num_buckets - 1)
    return buckets + ops.where(ops.less(distance, max_exact), distance, logarithmic)


@keras.saving.register_keras_serializable(package="keras_attn")
class RelativePositionBias(PositionBias):
    """T5's relative position bias: a learned `(num_buckets, heads)` table indexed by bucketed `key - query`.

    The relative position of each key to each query is put in one of `num_buckets` buckets
    (`relative_position_buckets`: exact for short distances, logarithmic up to `max_distance`,
    shared beyond), and head `h` adds `table[bucket, h]` to the logit. Bidirectional bucketing
    (T5's encoder) tells keys before and after the query apart; causal bucketing (T5's decoder,
    `bidirectional=False`) spends every bucket on the keys before it. Every kernel computes the
    bias per block from positions (`keras_attn.core.position_bias`) and trains the table on every path.
    The table is float32 under mixed precision (it is not autocast).

    Every distance from `max_distance` on shares the last bucket, so a block's bias is a lookup:
    the `2 * max_distance + 1` relative positions in `[-max_distance, max_distance]` are bucketed
    once per block, and each pair reads the entry of its relative position, clipped to that range
    (one gather per pair instead of T5's logarithm per pair).

    Args:
        num_heads: number of attention heads.
        num_buckets: number of buckets (at least 2, at least 4 when `bidirectional`).
        max_distance: the distance from which every relative position shares the last bucket;
            greater than the exact range (`num_buckets // 2`, `// 4` when `bidirectional`).
        bidirectional: bucket keys before and after the query apart (encoder) or not (decoder).
        embeddings_initializer: initializer of the table.
        **kwargs: base `Layer` arguments (`name`, `dtype`, ...).

    Call arguments and return value: as `keras_attn.core.position_bias.PositionBias` (positions in,
    the bias `(batch or 1, heads, query_len, key_len)` out).

    Example:

    >>> bias = RelativePositionBias(num_heads=4, bidirectional=False)
    >>> tuple(bias(keras.ops.arange(3, 6), keras.ops.arange(6)).shape)  # queries at 3, 4, 5
    (1, 4, 3, 6)
    >>> tuple(bias.table.shape)
    (32, 4)
    """

    def __init__(
        self,
        num_heads,
        num_buckets=32,
        max_distance=128,
        bidirectional=True,
        embeddings_initializer="random_normal",
        **kwargs,
    ):
        minimum = 4 if check_bool("bidirectional", bidirectional) else 2
        if isinstance(num_buckets, bool) or not isinstance(num_buckets, int) or num_buckets < minimum:
            raise ValueError(
                f"`num_buckets` must be an integer >= {minimum} (bidirectional={bidirectional}). "
                f"Received: num_buckets={num_buckets!r}"
            )
        check_positive_int("max_distance", max_distance)
        max_exact = num_buckets // (4 if bidirectional else 2)
        if max_distance <= max_exact:
            raise ValueError(
                f"`max_distance` must exceed the {max_exact} exactly bucketed distances. "
                f"Received: max_distance={max_distance}, num_buckets={num_buckets}, bidirectional={bidirectional}"
            )
        super().__init__(num_heads, **kwargs)
        check_elements("The bias table", num_buckets=num_buckets, num_heads=num_heads)
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.bidirectional = bidirectional
        self.embeddings_initializer = keras.initializers.get(embeddings_initializer)

    def build(self, query_positions_shape=None, key_positions_shape=None):
        self.table = self.add_weight(
            name="table",
            shape=(self.num_buckets, self.num_heads),
            initializer=self.embeddings_initializer,
            autocast=False,  # the bias is added to float32 logits
        )
        self.built = True

    def bias_parameters(self):
        return (self.table,)

    def block_bias(self, parameters, query_positions, key_positions):
        (table,) = parameters
        reach = self.max_distance
        buckets = relative_position_buckets(
            ops.arange(-reach, reach + 1), self.bidirectional, self.num_buckets, self.max_distance
        )  # (2 * reach + 1,): the bucket of each relative position -reach..reach
        per_relative = ops.take(ops.cast(table, self.bias_dtype), buckets, axis=0)  # (2 * reach + 1, heads)
        relative = ops.clip(relative_positions(query_positions, key_positions), -reach, reach)  # (batch | 1, q, k)
        # One gather of whole rows (`heads` contiguous numbers each) instead of one gather per head.
        bias = ops.take(per_relative, relative + reach, axis=0)  # (batch | 1, q, k, heads)
        return ops.transpose(bias, (0, 3, 1, 2))  # (batch | 1, heads, q, k)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_buckets": self.num_buckets,
                "max_distance": self.max_distance,
                "bidirectional": self.bidirectional,
                "embeddings_initializer": keras.initializers.serialize(self.embeddings_initializer),
            }
        )
        return config
