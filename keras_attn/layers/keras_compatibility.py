"""The routes by which `MultiHeadAttention` behaves as Keras's layer where its own kernels do not run.

The layer's fast path takes `(batch, seq, features)` inputs attending over the sequence (axis 1)
with a 1-D output shape. Other ranks, `attention_axes` and output shapes take Keras's route through
its projections and masks (`call_over_attention_axes`; options that only the sequence path has are
refused, naming them), whose attention is still keras_attn's kernel: the layer's
`_compute_attention` flattens the attention axes into one sequence (`keras_attn.layers.attention_axes`). A subclass overriding `_compute_attention` (Keras's hook) is called as
Keras calls it, with every mask merged (`hooked_attention`). The shape and axes checks name the
input or argument that cannot work.
"""

import keras
from keras import ops

from keras_attn import patterns
from keras_attn.core.masks import keras_rows_without_keys
from keras_attn.core.masks import merge_masks
from keras_attn.core.masks import pattern_mask
from keras_attn.core.masks import zero_masked
from keras_attn.core.segments import segment_mask
from keras_attn.layers import projections
from keras_attn.layers.attention_axes import check_masks
from keras_attn.layers.attention_axes import merged_mask
from keras_attn.layers.attention_axes import resolved
from keras_attn.layers.attention_axes import rows_with_keys

_SEQUENCE_AXIS = (1,)  # the attention axes of (batch, seq, features) inputs, resolved


def check_input_shapes(query_shape, value_shape, key_shape):
    """ValueError naming the input whose rank or shape cannot work, with what was received."""
    shapes = {"query": tuple(query_shape), "value": tuple(value_shape), "key": tuple(key_shape)}
    if shapes["value"][1:-1] != shapes["key"][1:-1]:
        raise ValueError(
            "All dimensions of `value` and `key`, except the last one, must be equal. "
            f"Received: value.shape={shapes['value']}, key.shape={shapes['key']}"
        )
    for name, shape in shapes.items():
        if len(shape) < 3:
            raise ValueError(f"`{name}` must have rank >= 3 (batch, ..., features). Received: {name}.shape={shape}")
    if len({len(shape) for shape in shapes.values()}) > 1:
        raise ValueError(
            "`query`, `value` and `key` must have the same rank. Received: "
            + ", ".join(f"{name}.shape={shape}" for name, shape in shapes.items())
        )


def _resolved_axes(attention_axes, rank):
    return None if attention_axes is None else resolved(attention_axes, rank)[0]


def check_attention_axes(attention_axes, query_shape):
    """ValueError unless every attention axis lies between the batch axis and the feature axis, each
    once (`1` and `-3` of rank-4 inputs are one axis)."""
    rank = len(query_shape)
    axes = _resolved_axes(attention_axes, rank) or ()
    for axis in axes:
        if not 1 <= axis <= rank - 2 or axes.count(axis) > 1:
            raise ValueError(
                f"`attention_axes` must name distinct axes between the batch and the feature axis (1 to {rank - 2} "
                f"for rank-{rank} inputs). Received: attention_axes={attention_axes}, query_shape={tuple(query_shape)}"
            )


def attends_over_the_sequence(query_shape, value_shape, key_shape, attention_axes, output_shape):
    """Whether the inputs are `(batch, seq, features)` attending over axis 1 with a 1-D output shape."""
    ranks = {len(query_shape), len(value_shape), len(key_shape)}
    axes = _resolved_axes(attention_axes, len(query_shape))
    return ranks == {3} and axes in (None, _SEQUENCE_AXIS) and (output_shape is None or len(output_shape) == 1)


def built_for_the_sequence(layer):
    """Whether a built layer's projections are those of `(batch, seq, features)` inputs attending over
    axis 1 with a 1-D output shape: Keras's equations for them, which `build` gives this path too."""
    inputs = (layer._query_dense, layer._key_dense, layer._value_dense)
    return (
        all(projection.equation == projections.INPUT_EQUATION for projection in inputs)
        and layer._output_dense.equation == projections.OUTPUT_EQUATION
        and tuple(layer._attention_axes) == _SEQUENCE_AXIS
    )


def einsum_gate(layer, query_shape):
    """The gate of Keras's einsum path, built for `query_shape`, as Keras 3.15 builds it (an older
    Keras has no `use_gate`): the query projection's equation and bias axes with `value_dim` per
    head and a sigmoid. Its weights come after the other projections' in `get_weights()` (Keras
    3.15 puts them before the value projection's)."""
    config = layer._query_dense.get_config()
    config.update(name="gate", activation="sigmoid", output_shape=(*config["output_shape"][:-1], layer._value_dim))
    gate = keras.layers.EinsumDense.from_config(config)
    gate.build(query_shape)
    return gate


def check_sequence_options(layer, query_shape):
    """ValueError naming the first constructor option of `layer` that only the sequence path has."""
    sequence_only = {
        "num_key_value_heads": layer.num_key_value_heads if layer.num_key_value_heads != layer.num_heads else None,
        "sliding_window": layer.sliding_window,
        "implementation": layer.implementation if layer.implementation not in ("auto", "dense") else None,
        "flash_attention": True if layer.flash_attention else None,
        "hard": True if layer.hard else None,
        "attention_pattern": layer.attention_pattern,
        "position_bias": layer.position_bias,
    }
    _refuse_sequence_only(layer, sequence_only, f"query_shape={tuple(query_shape)}", quote_value=True)


def _refuse_sequence_only(layer, options, query_shape, quote_value):
    """ValueError naming the first of `options` given (not `None`): only the sequence path has it."""
    for name, value in options.items():
        if value is not None:
            given = f"{name}={value!r}, " if quote_value else ""
            raise ValueError(
                f"`{name}` needs (batch, seq, features) inputs attending over axis 1 and a 1-D "
                f"`output_shape`. Received: {given}{query_shape}, "
                f"attention_axes={layer._attention_axes}, output_shape={layer._output_shape}"
            )


def hooked_attention(
    layer, projected_query, projected_key, projected_value, attention_bias, options, training, return_attention_scores
):
    """A subclass's `_compute_attention`, called as Keras calls it: every mask merged (the pattern,
    causal mask and window of `options`, `key_value_cache.attention_options`, and the documents of
    its segment ids), no causal flag."""
    if attention_bias is not None:
        raise ValueError(
            "`attention_bias` cannot reach an overridden `_compute_attention` (its signature has no "
            f"bias). Received: attention_bias.shape={tuple(attention_bias.shape)}"
        )
    if layer.position_bias is not None:
        raise ValueError(
            "`position_bias` cannot reach an overridden `_compute_attention` (its signature has no "
            f"bias). Received: position_bias={layer.position_bias!r}"
        )
    mask = _every_mask(options, ops.shape(projected_query)[1], ops.shape(projected_key)[1])
    return layer._compute_attention(
        projected_query, projected_key, projected_value, mask, training, return_attention_scores
    )


def _every_mask(options, query_len, key_len):
    """The one boolean mask of `options` (`key_value_cache.attention_options` with the segment ids):
    its mask, pattern, causal mask and window, and the documents of its segment ids."""
    pattern = patterns.from_shorthands(options["pattern"], options["is_causal"], options["sliding_window"])
    mask = pattern_mask(options["mask"], pattern, query_len, key_len, options["query_offset"])
    if options.get("query_segment_ids") is not None:  # the hook's signature has no ids: they join the mask
        mask = merge_masks(mask, segment_mask(options["query_segment_ids"], options["key_segment_ids"]))
    return mask


def keras_rows(layer, attended, value, options, return_attention_scores):
    """`attended` `(batch, query_len, heads, value_dim)` with the rows that have no allowed key as
    `keras.layers.MultiHeadAttention` computes them (`rows_without_keys="keras"`).

    Keras's layer runs `keras.ops.dot_product_attention` unless it has dropout or returns its scores:
    there such a row softmaxes equal masked logits, the mean of `value` over all the keys (the
    TensorFlow backend's result, which `keras_attn.ops` reproduces). With dropout or the scores,
    its einsum path's softmax zeroes the masked weights: a zero row, the kernel's own.
    `options` are `key_value_cache.attention_options` (the hook passes its merged mask alone)."""
    if layer._dropout > 0 or return_attention_scores:
        return attended
    query_len, key_len = ops.shape(attended)[1], ops.shape(value)[1]
    plain = options.get("pattern") is None and options.get("sliding_window") is None
    if plain and isinstance(options.get("query_offset", 0), int) and options.get("query_offset", 0) == 0:
        mask, is_causal = options["mask"], options.get("is_causal", False)  # no (query_len, key_len) mask built
        if options.get("query_segment_ids") is not None:
            mask = merge_masks(mask, segment_mask(options["query_segment_ids"], options["key_segment_ids"]))
    else:
        mask, is_causal = _every_mask(options, query_len, key_len), False
    if mask is None:  # a causal mask alone leaves every query key 0
        return attended
    return keras_rows_without_keys(attended, value, mask, is_causal, query_len, key_len)


def call_over_attention_axes(
    layer,
    query,
    value,
    key,
    query_mask,
    value_mask,
    key_mask,
    attention_mask,
    return_attention_scores,
    training,
    use_causal_mask,
    attention_bias,
    cache,
    cache_update_index,
    segment_ids,
):
    """Keras's route for other ranks, axes and output shapes (its einsum projections and masks, the
    layer's `_compute_attention` on keras_attn's kernel), with this layer's masking rules
    (`segment_ids`: any of the call's segment-id arguments, which this path refuses)."""
    unsupported = {
        "attention_bias": attention_bias,
        "cache": cache,
        "cache_update_index": cache_update_index,
        "segment_ids": segment_ids,
    }
    _refuse_sequence_only(layer, unsupported, f"query.shape={tuple(query.shape)}", quote_value=False)
    if use_causal_mask and tuple(layer._attention_axes) != _SEQUENCE_AXIS:  # Keras's mask orders axis 1 only
        raise ValueError(
            "A causal mask over more than one attention axis, or over another axis than 1 (the one after the "
            "batch), is not supported: `use_causal_mask=True` needs `attention_axes=(1,)`. Received: "
            f"use_causal_mask=True, attention_axes={layer._attention_axes}, query.shape={tuple(query.shape)}"
        )
    _check_other_axes(layer._attention_axes, query, value, key)
    check_masks(
        query.shape,
        key.shape,
        layer._num_heads,
        layer._attention_axes,
        query_mask=query_mask,
        value_mask=value_mask,
        key_mask=key_mask,
        attention_mask=attention_mask,
    )
    mask = merged_mask(
        query,
        layer._attention_axes,
        query_mask,
        merge_masks(value_mask, key_mask),
        attention_mask,
        layer._compute_causal_mask(query, value) if use_causal_mask else None,
    )
    gate = layer._gate_dense(query) if layer._use_gate else None
    attended, weights = layer._compute_attention(
        layer._query_dense(query),
        layer._key_dense(key),
        layer._value_dense(value),
        mask,
        training,
        return_attention_scores,
    )
    if gate is not None:
        attended = attended * gate
    output = layer._output_dense(attended)
    rows = rows_with_keys(mask, query, layer._attention_axes)  # zeros, not the bias, without keys
    output = output if rows is None else zero_masked(output, ops.expand_dims(rows, -1))
    return (output, weights) if return_attention_scores else output


def _check_other_axes(axes, query, value, key):
    """ValueError unless `value` and `key` have the query's sizes on the axes attention does not run
    over (the batch axis, and the others outside `axes`): Keras's einsum pairs them."""
    _, others = resolved(axes, len(query.shape))
    for name, tensor in (("value", value), ("key", key)):
        if any(
            None not in (query.shape[a], tensor.shape[a]) and query.shape[a] != tensor.shape[a] for a in (0, *others)
        ):
            raise ValueError(
                f"`{name}` must have the query's sizes on the batch axis and the axes attention does not run over "
                f"({', '.join(map(str, (0, *others)))} for attention_axes={axes}). "
                f"Received: query.shape={tuple(query.shape)}, {name}.shape={tuple(tensor.shape)}"
            )
