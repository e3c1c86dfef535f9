"""Transformer decoder block: causal self-attention, optional cross-attention, feed-forward."""

import keras
from keras import ops

from keras_attn.blocks.transformer_encoder import TransformerBlock
from keras_attn.core.masks import zero_padding
from keras_attn.layers.capabilities import describe
from keras_attn.layers.capabilities import unsupported
from keras_attn.layers.segment_arguments import real_tokens
from keras_attn.utils import as_float_inputs
from keras_attn.utils import check_padding_mask
from keras_attn.utils import check_sequence_shape
from keras_attn.utils import keras_mask


@keras.saving.register_keras_serializable(package="keras_attn")
class TransformerDecoder(TransformerBlock):
    """Transformer decoder block (Vaswani et al., 2017) with key/value caches for generation.

    Causal self-attention over `decoder_sequence`, then (when the layer is called with an
    `encoder_sequence`) cross-attention from the decoder to the encoder sequence (any length
    and width), then a feed-forward block; each sub-block has a residual connection and a
    layer normalisation, post-norm by default, pre-norm with `norm_first=True`. Attention is
    `keras_attn.MultiHeadAttention` (exact masking, float32 softmax). Call the layer with or
    without `encoder_sequence` consistently: the first call decides whether it has
    cross-attention.

    Padding: the Keras masks of `decoder_sequence` and `encoder_sequence` (from
    `Embedding(mask_zero=True)` or `TokenAndPositionEmbedding` upstream) are used when
    `decoder_padding_mask` / `encoder_padding_mask` are not passed; explicit masks always win.
    Padded keys are never attended to and padded decoder positions get zero attention
    outputs, so padding never changes the outputs at real positions. Padded rows of
    `decoder_sequence` are zeroed (by selection) before the block reads them (without a
    key/value cache), and the attention layers zero padded keys and values, so whatever the
    padding holds, NaN and inf included, reaches no real output and no weight gradient. The
    output keeps the decoder's Keras mask.

    Cached decoding (KerasHub semantics): pass `self_attention_cache`
    `(batch, 2, max_len, kv_heads, key_dim)` (see `initial_self_attention_cache`) and
    `self_attention_cache_update_index`, the position of the first token of
    `decoder_sequence`; its keys/values are written into the cache and the tokens attend
    causally to the cache. With `sliding_window=W` that cache has `min(W, max_len)` slots, a
    ring buffer (memory constant in the position; `keras_attn.layers.window_cache`) in which the
    position bias and the attention pattern still see each key's true position. With
    cross-attention also pass `cross_attention_cache` from
    `compute_cross_attention_cache(encoder_sequence)` (the encoder keys/values projected once);
    `encoder_sequence` is then not projected again and may be omitted (pass
    `encoder_padding_mask` explicitly, there is no Keras mask to read it from). In
    cached mode `decoder_padding_mask` covers the new tokens only, so padding must come after
    the real tokens (right padding), as in generation.

    Another self-attention (`self_attention=`, see `TransformerEncoder`) is called like every
    family, with `use_causal_mask=True`; a family whose `capabilities.causal` is `False`
    (`LinformerSelfAttention`) raises a `ValueError` saying why. A family with a recurrent state
    (`capabilities.cache == "recurrent"`, `LinearAttention`) decodes with that state as its
    cache: `initial_self_attention_cache` returns it (its size does not depend on
    `max_length`), and `self_attention_cache_update_index` is not needed (the state holds
    every earlier token). A family without a cache (`capabilities.cache is None`,
    `LSHSelfAttention`) raises when asked for one.

    Args:
        intermediate_dim: width of the feed-forward hidden layer.
        num_heads: number of attention heads.
        key_dim: size of each attention head; defaults to `hidden // num_heads` (which must
            then divide).
        dropout: dropout on each sub-block's output before the residual add (and on the
            attention weights unless `attention_dropout` is given).
        attention_dropout: dropout on the attention weights; defaults to `dropout`.
        activation: feed-forward activation.
        layer_norm_epsilon: epsilon of the layer normalisations.
        norm_first: pre-norm (`True`) or post-norm (`False`).
        sliding_window: optional positive int; self-attention is limited to
            `|i - j| < window`.
        num_key_value_heads: key/value heads for grouped-query attention (divides `num_heads`).
        kernel_initializer: initializer of every kernel.
        bias_initializer: initializer of every bias.
        attention_pattern: optional `keras_attn.patterns.Pattern` (or its config) of the
            self-attention, intersected with the causal mask and `sliding_window`; with a
            cache the new tokens sit at `self_attention_cache_update_index`.
        self_attention: optional causal self-attention layer, a prototype copied by the block
            (see `TransformerEncoder`); `sliding_window`, `attention_pattern` and `position_bias`
            then belong to that layer (passing them raises); `key_dim`, `attention_dropout` and `num_key_value_heads` configure the
            cross-attention.
        position_bias: optional `keras_attn.core.position_bias.PositionBias` layer (or its config)
            for `num_heads` heads, e.g. `keras_attn.ALiBi(num_heads)` or
            `keras_attn.RelativePositionBias(num_heads, bidirectional=False)`, added to the
            self-attention logits (also in cached decoding, where the new tokens sit at
            `self_attention_cache_update_index`); cross-attention gets none.
        **kwargs: base `Layer` arguments (`name`, `dtype`, ...).

    Call arguments:
        decoder_sequence: `(batch, target_len, hidden)`.
        encoder_sequence: optional `(batch, source_len, encoder_hidden)`; optional with a
            `cross_attention_cache`.
        decoder_padding_mask: optional boolean `(batch, target_len)`, `True` for real tokens.
        decoder_attention_mask: optional boolean `(batch, target_len, key_len)` (or 4-D with
            a heads axis) combined with the causal and padding masks; `key_len` is `max_len`
            with a cache. Only for a family whose `capabilities.attention_mask` is `True`.
        encoder_padding_mask: optional boolean `(batch, source_len)`.
        encoder_attention_mask: optional boolean `(batch, target_len, source_len)` (or 4-D).
        self_attention_cache: optional `(batch, 2, max_len, kv_heads, key_dim)`, or the
            self-attention layer's recurrent state.
        self_attention_cache_update_index: int or scalar int tensor; required with a key/value
            cache (not with a recurrent state).
        cross_attention_cache: optional `(batch, 2, source_len, kv_heads, key_dim)`.
        use_causal_mask: whether self-attention is causal (default `True`; a given layer built
            causal, `causal=True`, refuses `False`).
        training: whether dropout is active.
        decoder_segment_ids: optional int `(batch, target_len)`: the documents of packed decoder
            rows, `1, 2, ...` for the tokens of each document, `0` for padding
            (`keras_attn.core.segments`). Self-attention stays inside each document (causal
            within it), and with cross-attention a decoder token of document `d` attends only
            to the encoder tokens of document `d`, so each document's outputs and gradients are
            those of the document alone. A token of id `0` is padding. Only for a
            self-attention family whose `capabilities.segments` is `True` (else a `ValueError`
            naming the family and why). In a cached step, the new tokens' documents.
        encoder_segment_ids: optional int `(batch, source_len)` (over the cross-attention cache's
            keys with one), the encoder rows' documents numbered as the decoder's; required
            with `decoder_segment_ids` when the decoder has cross-attention, refused without it.
        self_attention_cache_segment_ids: with `self_attention_cache` and `decoder_segment_ids`,
            int `(batch, cache_len)`, the documents of the tokens the cache holds before the step
            (all zeros when empty): the caller keeps it beside the cache, updated after each step
            by `decoder.self_attention.next_cache_segment_ids(cache, ids, decoder_segment_ids,
            index)` with the cache as the step received it. A recurrent state holds no documents:
            packed decoding needs a key/value cache.

    Returns:
        `(batch, target_len, hidden)`; with a self-attention cache,
        `(outputs, self_attention_cache)`, or `(outputs, self_attention_cache,
        cross_attention_cache)` when the layer has cross-attention.

    Example:

    >>> source = keras.random.normal((2, 9, 32))
    >>> target = keras.random.normal((2, 7, 16))
    >>> decoder = TransformerDecoder(intermediate_dim=64, num_heads=4)
    >>> tuple(decoder(target, source).shape)
    (2, 7, 16)
    >>> cache = decoder.initial_self_attention_cache(batch_size=2, max_length=7)
    >>> cross = decoder.compute_cross_attention_cache(source)
    >>> out, cache, cross = decoder(target[:, :1], source, self_attention_cache=cache,
    ...                             self_attention_cache_update_index=0, cross_attention_cache=cross)
    """

    def _check_self_attention(self, layer):
        """The encoder's checks, then the decoder's own: its self-attention must be able to be causal.

        An override rather than an `__init__` of its own: the constructor (its signature, the one
        the API page shows) stays `TransformerBlock`'s, every argument in it.
        """
        prototype = super()._check_self_attention(layer)
        check_causal(prototype)
        return prototype

    def build(self, decoder_sequence_shape, encoder_sequence_shape=None):
        check_sequence_shape("decoder_sequence", decoder_sequence_shape)
        hidden_dim = decoder_sequence_shape[-1]
        # Checked by Keras at every call (its first argument), not only when built.
        self.input_spec = keras.layers.InputSpec(ndim=3, axes={-1: hidden_dim}, name="decoder_sequence")
        self._build_self_attention(decoder_sequence_shape)
        self.cross_attention = None
        if encoder_sequence_shape is not None:
            check_sequence_shape("encoder_sequence", encoder_sequence_shape)
            self.cross_attention = self._attention("cross_attention", hidden_dim)
            self.cross_attention.build(decoder_sequence_shape, encoder_sequence_shape)
            self.cross_attention_layer_norm = self._layer_norm("cross_attention_layer_norm", decoder_sequence_shape)
            self.cross_attention_dropout = self._dropout("cross_attention_dropout")
        self._build_feed_forward(decoder_sequence_shape)

    def initial_self_attention_cache(self, batch_size, max_length):
        """An all-zero self-attention cache `(batch_size, 2, max_length, kv_heads, key_dim)`, or the
        self-attention layer's empty recurrent state (whatever `max_length`). With a
        `sliding_window=W` the cache has `min(W, max_length)` slots, a ring buffer whose size
        does not grow with `max_length` (see `MultiHeadAttention.initial_cache`).

        The cache's shape follows the width of the decoder's inputs, so the decoder must be built
        first (called once, or `build(decoder_sequence_shape, encoder_sequence_shape)`).
        """
        if not self.built:
            raise ValueError(
                f"`initial_self_attention_cache` needs a built decoder: its cache shape follows the input width. "
                f"Call the decoder once or `build(decoder_sequence_shape)` first. Received: decoder {self.name!r}, built=False"
            )
        if self._cache_kind() == "recurrent":
            return self.self_attention.initial_cache(batch_size)
        return self.self_attention.initial_cache(batch_size, max_length)

    def compute_cross_attention_cache(self, encoder_sequence):
        """Projects the encoder keys/values once: `(batch, 2, source_len, kv_heads, key_dim)`."""
        return compute_cross_attention_cache(self, encoder_sequence)

    def _cache_kind(self):
        """The self-attention family's declared cache, `"key_value"` or `"recurrent"`; a `ValueError` when none."""
        kind = type(self.self_attention).capabilities.cache
        if kind is None:
            raise unsupported(
                self.self_attention,
                "cache",
                "a cached decoding request (`self_attention_cache` or `initial_self_attention_cache`)",
            )
        return kind

    def _check_causal_request(self, use_causal_mask):
        if not use_causal_mask and self.self_attention.causal:
            raise ValueError(
                f"{type(self.self_attention).__name__} was built causal (causal=True): it cannot run without the "
                "causal mask. Received: use_causal_mask=False"
            )

    def _check_call(self, encoder_sequence, self_attention_cache, cross_attention_cache):
        has_cross_attention = self.cross_attention is not None
        has_source = encoder_sequence is not None or cross_attention_cache is not None
        if has_cross_attention != has_source:
            built = "with" if has_cross_attention else "without"
            raise ValueError(
                f"This TransformerDecoder was built {built} cross-attention: call it {built} "
                "`encoder_sequence` (or, with cross-attention, a `cross_attention_cache`) every time. "
                f"Received: encoder_sequence={describe(encoder_sequence)}, "
                f"cross_attention_cache={describe(cross_attention_cache)}"
            )
        if has_cross_attention and (self_attention_cache is None) != (cross_attention_cache is None):
            raise ValueError(
                "With cross-attention, `self_attention_cache` and `cross_attention_cache` must be "
                f"given together. Received: self_attention_cache={describe(self_attention_cache)}, "
                f"cross_attention_cache={describe(cross_attention_cache)}"
            )

    def _checked_documents(self, decoder_sequence, source_length, self_attention_cache, recurrent, given):
        """`(decoder_segment_ids, encoder_segment_ids)` checked and int32 (`None` without) from the call's
        segment-id arguments `given` (by name); a `ValueError` naming one that comes without what it needs."""
        decoder_segment_ids = given["decoder_segment_ids"]
        encoder_segment_ids = given["encoder_segment_ids"]
        self_attention_cache_segment_ids = given["self_attention_cache_segment_ids"]
        given = {
            "decoder_segment_ids": decoder_segment_ids,
            "encoder_segment_ids": encoder_segment_ids,
            "self_attention_cache_segment_ids": self_attention_cache_segment_ids,
        }
        received = ", ".join(f"{name}.shape={describe(ids)}" for name, ids in given.items())
        if decoder_segment_ids is None:
            if encoder_segment_ids is not None or self_attention_cache_segment_ids is not None:
                raise ValueError(f"The segment ids come with `decoder_segment_ids`. Received: {received}")
            return None, None
        if (self.cross_attention is not None) != (encoder_segment_ids is not None):
            raise ValueError(
                "With cross-attention the decoder's documents are matched with the encoder's: pass "
                "`encoder_segment_ids` with `decoder_segment_ids` (without cross-attention, not at all). "
                f"Received: {received}, cross-attention={self.cross_attention is not None}"
            )
        if recurrent:
            raise ValueError(
                f"Packed decoding needs a key/value cache: the recurrent state of {type(self.self_attention).__name__} "
                f"holds no token's document. Received: {received}"
            )
        if (self_attention_cache is None) != (self_attention_cache_segment_ids is None):
            raise ValueError(
                "A cached step of packed rows takes `self_attention_cache_segment_ids`, the documents of the tokens "
                "the cache holds (see `MultiHeadAttention.next_cache_segment_ids`), and only then. Received: "
                f"{received}, self_attention_cache={describe(self_attention_cache)}"
            )
        decoder_segment_ids = self._checked_segment_ids(
            self.self_attention,
            "decoder_segment_ids",
            decoder_segment_ids,
            decoder_sequence.shape[1],
            decoder_sequence.shape[0],
        )
        if encoder_segment_ids is not None:
            encoder_segment_ids = self._checked_segment_ids(
                self.cross_attention,
                "encoder_segment_ids",
                encoder_segment_ids,
                source_length,
                decoder_sequence.shape[0],
            )
        return decoder_segment_ids, encoder_segment_ids

    def call(
        self,
        decoder_sequence,
        encoder_sequence=None,
        decoder_padding_mask=None,
        decoder_attention_mask=None,
        encoder_padding_mask=None,
        encoder_attention_mask=None,
        self_attention_cache=None,
        self_attention_cache_update_index=None,
        cross_attention_cache=None,
        use_causal_mask=True,
        training=None,
        decoder_segment_ids=None,
        encoder_segment_ids=None,
        self_attention_cache_segment_ids=None,
    ):
        self._check_call(encoder_sequence, self_attention_cache, cross_attention_cache)
        self._check_causal_request(use_causal_mask)
        recurrent = self_attention_cache is not None and self._cache_kind() == "recurrent"
        if self_attention_cache is not None and not recurrent and self_attention_cache_update_index is None:
            raise ValueError(
                "`self_attention_cache` needs `self_attention_cache_update_index`, the position of the "
                "first new token (without it the new tokens are never written to the cache). "
                "Received: self_attention_cache_update_index=None"
            )
        decoder_segment_ids, encoder_segment_ids = self._checked_documents(
            decoder_sequence,
            _source_length(encoder_sequence, cross_attention_cache),
            self_attention_cache,
            recurrent,
            dict(
                decoder_segment_ids=decoder_segment_ids,
                encoder_segment_ids=encoder_segment_ids,
                self_attention_cache_segment_ids=self_attention_cache_segment_ids,
            ),
        )
        decoder_padding_mask = keras_mask(decoder_sequence) if decoder_padding_mask is None else decoder_padding_mask
        decoder_sequence = as_float_inputs(decoder_sequence, self.compute_dtype)  # as Keras's layers take them
        # With a key/value cache the mask may cover the whole cache (see `MultiHeadAttention`).
        over_the_tokens = self_attention_cache is None or recurrent  # else it may cover the whole cache
        check_padding_mask(
            "decoder_padding_mask", decoder_padding_mask, decoder_sequence.shape if over_the_tokens else None
        )
        if over_the_tokens or _covers_the_tokens(decoder_padding_mask, decoder_sequence):
            # As in `TransformerEncoder`: padded rows are read as zeros, so they reach no weight gradient.
            decoder_sequence = zero_padding(decoder_sequence, decoder_padding_mask)
        decoder_sequence = zero_padding(decoder_sequence, real_tokens(decoder_segment_ids))
        if decoder_segment_ids is None:  # a family without segments never gets the keywords
            self_documents = cross_documents = {}
        else:
            cross_documents = dict(query_segment_ids=decoder_segment_ids, key_segment_ids=encoder_segment_ids)
            self_documents = (
                dict(segment_ids=decoder_segment_ids)
                if self_attention_cache is None
                else dict(query_segment_ids=decoder_segment_ids, key_segment_ids=self_attention_cache_segment_ids)
            )

        def self_attend(x):
            options = dict(
                query_mask=decoder_padding_mask, use_causal_mask=use_causal_mask, training=training, **self_documents
            )
            if self_attention_cache is None:
                output = self.self_attention(
                    x, value_mask=decoder_padding_mask, attention_mask=decoder_attention_mask, **options
                )
                return output, None  # (batch, target_len, hidden)
            if recurrent:  # (batch, target_len, hidden), the state after the new tokens
                return self.self_attention(x, value_mask=decoder_padding_mask, cache=self_attention_cache, **options)
            return self.self_attention(
                x,
                value_mask=_all_keys(self_attention_cache),
                attention_mask=decoder_attention_mask,
                cache=self_attention_cache,
                cache_update_index=self_attention_cache_update_index,
                **options,
            )  # (batch, target_len, hidden), (batch, 2, max_len, kv_heads, key_dim)

        x, self_attention_cache = self._residual(
            decoder_sequence, self_attend, self.self_attention_layer_norm, self.self_attention_dropout, training
        )
        if self.cross_attention is not None:
            encoder_padding_mask = (
                keras_mask(encoder_sequence) if encoder_padding_mask is None else encoder_padding_mask
            )
            check_padding_mask(
                "encoder_padding_mask",
                encoder_padding_mask,
                None if encoder_sequence is None else encoder_sequence.shape,
            )

            def cross_attend(x):
                if cross_attention_cache is not None and encoder_padding_mask is None:
                    keys_mask = _all_keys(cross_attention_cache)
                else:
                    keys_mask = encoder_padding_mask
                output = self.cross_attention(
                    x,
                    x if encoder_sequence is None else encoder_sequence,  # not projected with a cache
                    query_mask=decoder_padding_mask,
                    value_mask=keys_mask,
                    attention_mask=encoder_attention_mask,
                    cache=cross_attention_cache,
                    training=training,
                    **cross_documents,
                )  # (batch, target_len, hidden), and the unchanged cache when given
                return output[0] if cross_attention_cache is not None else output, None

            x, _ = self._residual(
                x, cross_attend, self.cross_attention_layer_norm, self.cross_attention_dropout, training
            )
        x = self._feed_forward_block(x, training)
        if self_attention_cache is None:
            return x
        if self.cross_attention is None:
            return x, self_attention_cache
        return x, self_attention_cache, cross_attention_cache


def _source_length(encoder_sequence, cross_attention_cache):
    """The static number of encoder tokens cross-attention reads (`None` without, or unknown)."""
    if encoder_sequence is not None:
        return encoder_sequence.shape[1]
    return None if cross_attention_cache is None else cross_attention_cache.shape[2]


def _covers_the_tokens(padding_mask, sequence):
    """Whether a cached call's `padding_mask` is over the new tokens (statically as long), not over the cache."""
    return padding_mask is not None and padding_mask.shape[1] is not None and padding_mask.shape[1] == sequence.shape[1]


def check_causal(self_attention):
    """Raises a `ValueError` saying why unless a decoder's `self_attention` prototype's family can be causal."""
    if self_attention is not None and not type(self_attention).capabilities.causal:
        error = unsupported(self_attention, "causal", "a TransformerDecoder self-attention (always causal)")
        raise ValueError(f"TransformerDecoder needs causal self-attention. {error}")


def compute_cross_attention_cache(decoder, encoder_sequence):
    """`decoder`'s cross-attention keys/values of `encoder_sequence`, projected once.

    Returns:
        `(batch, 2, source_len, kv_heads, key_dim)`, the `cross_attention_cache` argument of
        every cached decoding step.
    """
    if decoder.cross_attention is None:
        raise ValueError(
            "This TransformerDecoder has no cross-attention (it was built without "
            "`encoder_sequence`), so there is no cross-attention cache to compute."
        )
    key = decoder.cross_attention.key_dense(encoder_sequence)  # (batch, source_len, kv_heads, key_dim)
    value = decoder.cross_attention.value_dense(encoder_sequence)  # (batch, source_len, kv_heads, key_dim)
    return ops.stack((key, value), axis=1)


def _all_keys(cache):
    """An all-true key mask `(batch, max_len)` over a cache.

    Passing it explicitly keeps Keras from filling the attention's `value_mask` with the Keras
    mask of the new tokens (their length is not the cache length); the causal mask over the
    cache already limits which keys each new token sees.
    """
    return ops.ones((ops.shape(cache)[0], ops.shape(cache)[2]), "bool")
