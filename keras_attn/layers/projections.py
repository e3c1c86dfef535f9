"""The input and output projections of `MultiHeadAttention` on `(batch, seq, features)` inputs.

The layer keeps Keras's `EinsumDense` sublayers (`_query_dense`, `_key_dense`, `_value_dense`,
`_output_dense`: their weights, names and quantization are Keras's); these functions call them
faster where the result is the same: one fused QKV matmul when `query`, `key` and `value` are
one tensor, and the output projection as one 2-D matmul. A quantized projection (integer kernel
and scale, `Model.quantize`) always runs through its own layer.
"""

import keras
from keras import ops

from keras_attn.utils import compiled_by_xla

INPUT_EQUATION = "abc,cde->abde"  # (batch, seq, features) -> (batch, seq, heads, head_dim)
OUTPUT_EQUATION = "abcd,cde->abe"  # Keras's output projection, (batch, seq, heads, head_dim) -> (batch, seq, features)


def projection(layer, name, heads, head_dim, activation=None):
    """A `(batch, seq, features) -> (batch, seq, heads, head_dim)` projection, as Keras builds it."""
    dense = keras.layers.EinsumDense(
        INPUT_EQUATION,
        output_shape=(None, heads, head_dim),
        bias_axes="de" if layer._use_bias else None,
        activation=activation,
        name=name,
        **layer._get_common_kwargs_for_sublayer(),
    )
    # A per-position projection keeps a padding mask valid; the layer reads the masks from its
    # `*_mask` arguments, so the projections only need not to drop (and warn).
    dense.supports_masking = True
    return dense


def quantized(*projections):
    """Whether any of the projections is quantized (`Model.quantize`)."""
    return any(projection.quantization_mode is not None for projection in projections)


def project(layer, query, key, value):
    """Projected `(batch, seq, heads, dim)` query, key and value; one matmul for a self-attention input
    (the layer's `_fused_qkv`), except for one token outside XLA (a decoding step), where
    concatenating the three kernels on every call costs more than two more matmuls (XLA hoists the
    concatenation out of a generation loop)."""
    projections = (layer._query_dense, layer._key_dense, layer._value_dense)
    if quantized(*projections):
        return layer._query_dense(query), layer._key_dense(key), layer._value_dense(value)
    if query is value and key is value and not (query.shape[1] == 1 and not compiled_by_xla()):
        return layer._fused_qkv(query)
    return (
        _head_projection(layer, layer._query_dense, query, layer.num_heads, layer.key_dim),
        _head_projection(layer, layer._key_dense, key, layer.num_key_value_heads, layer.key_dim),
        _head_projection(layer, layer._value_dense, value, layer.num_key_value_heads, layer.value_dim),
    )


def _head_projection(layer, dense, inputs, heads, head_dim):
    """An unquantized input projection (`EinsumDense` `abc,cde->abde`) as one 2-D matmul:
    `(batch, seq, features)` -> `(batch, seq, heads, head_dim)`."""
    kernel = ops.reshape(dense.kernel, (ops.shape(dense.kernel)[0], heads * head_dim))
    bias = ops.reshape(dense.bias, (-1,)) if layer.use_bias else None
    batch, length = ops.shape(inputs)[0], ops.shape(inputs)[1]
    return ops.reshape(affine(inputs, kernel, bias, layer.compute_dtype), (batch, length, heads, head_dim))


def fused_qkv(layer, inputs):
    """One matmul for the query, key and value projections of the same tensor."""
    projections = (layer._query_dense, layer._key_dense, layer._value_dense)
    kernel = ops.concatenate(
        [ops.reshape(p.kernel, (ops.shape(p.kernel)[0], -1)) for p in projections], axis=-1
    )  # (features, (heads + 2 * kv_heads) * head_dim)
    bias = ops.concatenate([ops.reshape(p.bias, (-1,)) for p in projections], axis=0) if layer.use_bias else None
    fused = affine(inputs, kernel, bias, layer.compute_dtype)  # (batch, seq, fused)
    sizes = [
        layer.num_heads * layer.key_dim,
        layer.num_key_value_heads * layer.key_dim,
        layer.num_key_value_heads * layer.value_dim,
    ]
    query, key, value = ops.split(fused, [sizes[0], sizes[0] + sizes[1]], axis=-1)
    batch, length = ops.shape(inputs)[0], ops.shape(inputs)[1]
    query = ops.reshape(query, (batch, length, layer.num_heads, layer.key_dim))
    key = ops.reshape(key, (batch, length, layer.num_key_value_heads, layer.key_dim))
    value = ops.reshape(value, (batch, length, layer.num_key_value_heads, layer.value_dim))
    return query, key, value


def output_projection(layer, attended):
    """`_output_dense` as one 2-D matmul: `(batch, query_len, heads, value_dim)` -> `(batch, query_len, output_dim)`.

    The same weights and result as calling the `EinsumDense`, which lowers `abcd,cde->abe` to
    a batched matmul whose kernel gradient is computed per batch element and then summed.
    """
    if quantized(layer._output_dense):
        return layer._output_dense(attended)  # integer kernel and scale: the layer's own quantized call
    kernel = layer._output_dense.kernel  # (heads, value_dim, output_dim)
    width = layer.num_heads * layer.value_dim
    batch, length = ops.shape(attended)[0], ops.shape(attended)[1]
    attended = ops.reshape(attended, (batch, length, width))  # (batch, query_len, heads * value_dim)
    bias = layer._output_dense.bias if layer.use_bias else None
    return affine(
        attended, ops.reshape(kernel, (width, -1)), bias, layer.compute_dtype
    )  # (batch, query_len, output_dim)


def affine(inputs, kernel, bias, dtype):
    """`inputs (..., in) @ kernel (in, out) + bias (out,)` in `dtype`, as one 2-D matmul.

    The rows are flattened first so that the bias is added to the matmul's own output: `ops.add`
    of a vector is a `BiasAdd` on TensorFlow (whose gradient is a fast reduction; `+` gives an
    `AddV2` reduced by a slow column sum), and a `BiasAdd` right after a 2-D `MatMul` is fused
    into it by TensorFlow's graph optimiser (after the reshape of a 3-D `ops.matmul` it is a pass
    of its own).
    """
    kernel = ops.cast(kernel, dtype)
    outputs = ops.matmul(ops.reshape(inputs, (-1, ops.shape(kernel)[0])), kernel)  # (rows, out)
    if bias is not None:
        outputs = ops.add(outputs, ops.cast(bias, dtype))
    return ops.reshape(outputs, (*ops.shape(inputs)[:-1], ops.shape(kernel)[1]))
