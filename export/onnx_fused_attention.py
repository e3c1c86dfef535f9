"""ONNX Runtime's fused attention in our exported graphs: each attention core becomes one
`com.microsoft.MultiHeadAttention` node.

ONNX Runtime's transformer optimizer (`onnxruntime.transformers.optimizer.optimize_model`) fuses
none of the attention of a tf2onnx graph of our layers, whichever of its `model_type`s "bert",
"bert_tf" or "bert_keras" it is given, so this module rewrites the graph itself. What
`keras_attn.MultiHeadAttention` exports, per layer, after its Q/K/V projections reshaped to
`(batch, length, heads, depth)` (`Q4`, `K4`, `V4`; `K4` and `V4` with their padding zeroed), is

    scores = MatMul(Transpose(Q4, [0,2,1,3]), Transpose(K4, [0,2,3,1])) * scale
             (or MatMul(Transpose(Q4 * scale, [0,2,1,3]), ...): a scale of at most 1 is applied
              to the queries, as Keras's layer does, so the logits are not copied for it)
    logits = Cast(mask) * scores + fill * Cast(Not(mask))     (tf2onnx's `where`; absent unmasked)
    out4   = Transpose(MatMul(Softmax(logits), Transpose(V4, [0,2,1,3])), [0,2,1,3])

and `fuse_attention` replaces it with

    out4 = Reshape(MultiHeadAttention(Q, K, V, attention_bias=fill * Cast(Not(mask)),
                                      num_heads, scale), [0, 0, heads, depth])

(`Q`, `K`, `V`: `Q4`, `K4`, `V4` reshaped to `(batch, length, hidden)`). The additive bias is the
graph's own `fill * Cast(Not(mask))` term: 0 where a key is allowed (those logits are unchanged),
`fill` (the float32 lowest value our layers use) where it is masked, so a masked key's weight is
exactly 0 as before. A query row with no allowed key gets uniform weights in both graphs; the layer
zeroes those rows after the core (`where` on its output), which the rewrite leaves as it is.

Every `Softmax` of the graph must be such a core: one the rewrite cannot match (another
attention pattern, a softmax outside attention, an intermediate tensor used elsewhere) raises a
`ValueError` naming the node and what did not match, rather than leaving part of the attention
unfused. The result's parity with the unfused graph and with Keras is for the caller to check
(`tests/test_onnx_fused_attention.py`, `benchmarks/onnx_fused_attention.py`).
"""

import dataclasses
import itertools

import numpy as np
import onnx
from onnx import helper
from onnx import numpy_helper

FUSED_DOMAIN = "com.microsoft"
FUSED_OP = "MultiHeadAttention"
# A `where` fill at or below this value masks its key (the -1e9 idiom and lower); a higher fill
# is a value, not a mask, and cannot become an additive bias.
_MASKING_FILL = -1e9
_TO_HEADS = [0, 2, 1, 3]  # (batch, length, heads, depth) <-> (batch, heads, length, depth)
_KEYS_TRANSPOSED = [0, 2, 3, 1]  # (batch, length, heads, depth) -> (batch, heads, depth, length)


class _Graph:
    """Producers, consumers and constants of an ONNX graph's tensors, by name."""

    def __init__(self, graph):
        self.graph = graph
        self.producer = {output: node for node in graph.node for output in node.output}
        self.consumers = {}
        for node in graph.node:
            for name in node.input:
                self.consumers.setdefault(name, []).append(node)
        self.outputs = {output.name for output in graph.output}
        self.initializers = {tensor.name: tensor for tensor in graph.initializer}

    def constant(self, name):
        """The value of `name` if it is an initializer or a `Constant` node's output, else None."""
        if name in self.initializers:
            return numpy_helper.to_array(self.initializers[name])
        node = self.producer.get(name)
        if node is not None and node.op_type == "Constant" and node.attribute[0].name == "value":
            return numpy_helper.to_array(node.attribute[0].t)
        return None

    def node_of(self, name, op_type):
        """The node producing `name` if it is an `op_type` of the default domain, else None."""
        node = self.producer.get(name)
        return node if node is not None and node.op_type == op_type and node.domain in ("", "ai.onnx") else None

    def only_consumer(self, name):
        """The one node reading `name` (None if it has several readers or is a graph output)."""
        readers = self.consumers.get(name, [])
        return readers[0] if len(readers) == 1 and name not in self.outputs else None


@dataclasses.dataclass
class _AttentionCore:
    """One matched attention core: its inputs, parameters and the nodes it replaces."""

    query: str  # Q4, (batch, length, heads, depth)
    key: str  # K4
    value: str  # V4
    bias: str | None  # additive (batch|1, 1, query_len, key_len), or None unmasked
    scale: float
    heads: int
    depth: int
    output: str  # out4, (batch, length, heads, depth)
    replaced: list  # the core's nodes, from the query transpose to the output transpose
    product: onnx.NodeProto  # the weights-values MatMul: the fused nodes go where it was


def _refuse(node, reason):
    raise ValueError(f"cannot fuse the attention at Softmax node {node.name!r}: {reason}")


def _attribute(node, name, default=None):
    for attribute in node.attribute:
        if attribute.name == name:
            return helper.get_attribute_value(attribute)
    return default


def _transpose_input(graph, name, perm, softmax, role):
    node = graph.node_of(name, "Transpose")
    if node is None or list(_attribute(node, "perm", [])) != perm:
        _refuse(softmax, f"the {role} is not a Transpose with perm {perm} (got {_describe(graph, name)})")
    return node


def _describe(graph, name):
    node = graph.producer.get(name)
    return f"{node.op_type} node {node.name!r}" if node is not None else f"graph input or initializer {name!r}"


def _scaled_scores(graph, name, softmax):
    """`(scores MatMul node, scale, scale Mul node or None)` of `scores * scale` (or bare scores)."""
    mul = graph.node_of(name, "Mul")
    if mul is None:
        matmul = graph.node_of(name, "MatMul")
        if matmul is None:
            _refuse(softmax, f"its logits come from {_describe(graph, name)}, not a scaled MatMul of queries and keys")
        return matmul, 1.0, None
    for scores, factor in _both_orders(mul):
        value = graph.constant(factor)
        matmul = graph.node_of(scores, "MatMul")
        if value is not None and value.size == 1 and matmul is not None:
            return matmul, float(value.reshape(())), mul
    _refuse(softmax, f"Mul node {mul.name!r} is not the query-key MatMul times a scalar constant")


def _scaled_query(graph, name):
    """`(Q4, scale, scale Mul node or None)` of the query operand `Q4 * scale` (or bare `Q4`)."""
    mul = graph.node_of(name, "Mul")
    if mul is not None:
        for query, factor in _both_orders(mul):
            value = graph.constant(factor)
            if value is not None and value.size == 1:
                return query, float(value.reshape(())), mul
    return name, 1.0, None


def _mask_of(graph, name):
    """`m` of `Cast(m)` (a boolean mask cast to float), else None."""
    cast = graph.node_of(name, "Cast")
    return cast.input[0] if cast is not None and _attribute(cast, "to") == onnx.TensorProto.FLOAT else None


def _both_orders(node):
    """A binary node's two inputs in both orders (the commutative ops are matched either way)."""
    return tuple(node.input), tuple(reversed(node.input))


def _masked_logits(graph, name, softmax):
    """`(scaled scores name, additive bias name, the where nodes)` of tf2onnx's
    `Cast(m) * scores + fill * Cast(Not(m))`; `(name, None, [])` when the logits are not masked."""
    add = graph.node_of(name, "Add")
    if add is None:
        return name, None, []
    for kept, filled in _both_orders(add):
        keep, fill = graph.node_of(kept, "Mul"), graph.node_of(filled, "Mul")
        if keep is None or fill is None:
            continue
        for (mask_cast, scores), (fill_name, inverse_cast) in itertools.product(_both_orders(keep), _both_orders(fill)):
            mask, value = _mask_of(graph, mask_cast), graph.constant(fill_name)
            inverse = graph.node_of(_mask_of(graph, inverse_cast) or "", "Not")
            if mask is None or value is None or value.size != 1 or inverse is None or inverse.input[0] != mask:
                continue
            if not float(value.reshape(())) <= _MASKING_FILL:
                _refuse(
                    softmax,
                    f"the masked logits' fill {float(value.reshape(())):g} is above {_MASKING_FILL:g}: not a mask",
                )
            return scores, filled, [add, keep]
    _refuse(
        softmax, f"Add node {add.name!r} is not a masked `where` of the scores (Cast(m) * scores + fill * Cast(Not(m)))"
    )


def _shape_tail(graph, name):
    """The trailing constant entries of the shape tensor `name`: all of it if constant, else the
    constant inputs ending the `Concat` that builds it (through `Cast`s); None if there are none."""
    value = graph.constant(name)
    if value is not None:
        return value.reshape(-1)
    node = graph.producer.get(name)
    if node is not None and node.op_type == "Cast":
        return _shape_tail(graph, node.input[0])
    if node is None or node.op_type != "Concat":
        return None
    tail = []
    for part in reversed(node.input):
        value = graph.constant(part)
        if value is None:
            break
        tail.insert(0, value.reshape(-1))
    return np.concatenate(tail) if tail else None


def _head_shape(graph, query4, softmax):
    """`(heads, depth)`: the last two entries of the query reshape's shape, which must be constants."""
    reshape = graph.node_of(query4, "Reshape")
    shape = None if reshape is None else _shape_tail(graph, reshape.input[1])
    if shape is None or shape.size < 2 or np.any(shape[-2:] <= 0):
        _refuse(softmax, f"the number of heads is not a constant of the query reshape ({_describe(graph, query4)})")
    return int(shape[-2]), int(shape[-1])


def _chain(graph, names, softmax):
    """Checks that each tensor of `names` feeds the next pattern node only; returns nothing."""
    for name in names:
        if graph.only_consumer(name) is None:
            _refuse(softmax, f"its intermediate tensor {name!r} is also read outside the attention core")


def match_attention(graph, softmax):
    """The `_AttentionCore` around `softmax` (a node of `graph`, a `_Graph`), or a ValueError naming what did not match."""
    if _attribute(softmax, "axis", -1) not in (-1, 3):
        _refuse(softmax, f"its axis is {_attribute(softmax, 'axis')}, not the keys' (-1)")
    scores_name, bias, where_nodes = _masked_logits(graph, softmax.input[0], softmax)
    scores, scale, scale_node = _scaled_scores(graph, scores_name, softmax)
    queries = _transpose_input(graph, scores.input[0], _TO_HEADS, softmax, "query operand of the scores")
    keys = _transpose_input(graph, scores.input[1], _KEYS_TRANSPOSED, softmax, "key operand of the scores")
    _chain(graph, [softmax.output[0]], softmax)
    product = graph.only_consumer(softmax.output[0])
    if product.op_type != "MatMul" or product.input[0] != softmax.output[0]:
        _refuse(softmax, f"its weights feed {product.op_type} node {product.name!r}, not a MatMul with the values")
    values = _transpose_input(graph, product.input[1], _TO_HEADS, softmax, "value operand of the weights")
    merge = graph.only_consumer(product.output[0])
    if merge is None or merge.op_type != "Transpose" or list(_attribute(merge, "perm", [])) != _TO_HEADS:
        _refuse(softmax, "the weighted values are not transposed back to (batch, length, heads, depth)")
    query, query_scale, query_scale_node = _scaled_query(graph, queries.input[0])
    scale_nodes = [node for node in (query_scale_node, scale_node) if node is not None]
    core = [queries, keys, scores] + scale_nodes + where_nodes + [softmax, values, product, merge]
    _chain(graph, [node.output[0] for node in core[:-1]], softmax)
    heads, depth = _head_shape(graph, query, softmax)
    return _AttentionCore(
        query=query,
        key=keys.input[0],
        value=values.input[0],
        bias=bias,
        scale=scale * query_scale,
        heads=heads,
        depth=depth,
        output=merge.output[0],
        replaced=core,
        product=product,
    )


def _fused_nodes(core, index):
    """The nodes (and shape initializers) replacing `core`: Q/K/V to (batch, length, hidden),
    MultiHeadAttention, its output back to (batch, length, heads, depth)."""
    prefix = f"fused_attention_{index}"
    flat, split = f"{prefix}/hidden_shape", f"{prefix}/heads_shape"
    initializers = [
        numpy_helper.from_array(np.array([0, 0, -1], np.int64), flat),
        numpy_helper.from_array(np.array([0, 0, core.heads, core.depth], np.int64), split),
    ]
    inputs = []
    nodes = []
    for role, name in (("query", core.query), ("key", core.key), ("value", core.value)):
        inputs.append(f"{prefix}/{role}")
        nodes.append(helper.make_node("Reshape", [name, flat], [inputs[-1]], name=f"{prefix}/{role}_reshape"))
    attention = helper.make_node(
        FUSED_OP,
        inputs + ["", "", core.bias or ""],
        [f"{prefix}/output"],
        name=f"{prefix}/{FUSED_OP}",
        domain=FUSED_DOMAIN,
        num_heads=core.heads,
        scale=core.scale,
    )
    if not core.bias:
        del attention.input[3:]
    nodes.append(attention)
    nodes.append(
        helper.make_node("Reshape", [attention.output[0], split], [core.output], name=f"{prefix}/output_reshape")
    )
    return nodes, initializers


def _read_names(node):
    """The tensor names `node` reads: its inputs and those its subgraphs (If, Loop, Scan) read."""
    names = set(node.input)
    for attribute in node.attribute:
        for subgraph in [attribute.g] if attribute.HasField("g") else list(attribute.graphs):
            for inner in subgraph.node:
                names |= _read_names(inner)
    return names


def _remove_dead_nodes(graph):
    """Drops the nodes and initializers no graph output depends on (the replaced cores' leftovers)."""
    needed = {output.name for output in graph.output}
    kept = []
    for node in reversed(list(graph.node)):
        if any(output in needed for output in node.output):
            kept.append(node)
            needed |= _read_names(node)
    del graph.node[:]
    graph.node.extend(reversed(kept))
    initializers = [tensor for tensor in graph.initializer if tensor.name in needed]
    del graph.initializer[:]
    graph.initializer.extend(initializers)


def fuse_attention(model):
    """A copy of the ONNX `model` whose every attention core is one `com.microsoft.MultiHeadAttention` node.

    Raises:
        ValueError: the graph has no Softmax, or one Softmax is not an attention core the
            rewrite matches (the message names the node and why).
    """
    if not isinstance(model, onnx.ModelProto):
        raise ValueError(f"`model` must be an onnx.ModelProto. Received: model={type(model).__name__}")
    opset = max((entry.version for entry in model.opset_import if entry.domain in ("", "ai.onnx")), default=0)
    if opset < 13:  # before opset 13 Softmax flattens to 2-D from its axis: another operation
        raise ValueError(f"`model` must use ONNX opset 13 or later. Received: a model of opset {opset}")
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = _Graph(model.graph)
    softmaxes = [node for node in model.graph.node if node.op_type == "Softmax" and node.domain in ("", "ai.onnx")]
    if not softmaxes:
        raise ValueError(
            f"`model` holds no Softmax: no attention core to fuse. Received: model graph {model.graph.name!r}"
        )
    cores = [match_attention(graph, softmax) for softmax in softmaxes]
    for index, core in enumerate(cores):
        nodes, initializers = _fused_nodes(core, index)
        position = list(model.graph.node).index(core.product)  # after every input of the core (topological order)
        for offset, node in enumerate(nodes):
            model.graph.node.insert(position + offset, node)
        model.graph.initializer.extend(initializers)
        for node in core.replaced:  # their outputs are read by nothing else (checked by the match)
            model.graph.node.remove(node)
    _remove_dead_nodes(model.graph)
    if not any(opset.domain == FUSED_DOMAIN for opset in model.opset_import):
        model.opset_import.append(helper.make_opsetid(FUSED_DOMAIN, 1))
    return model


def fused_attention_count(model):
    """The number of `com.microsoft.MultiHeadAttention` nodes in the ONNX `model`'s graph."""
    return sum(node.op_type == FUSED_OP and node.domain == FUSED_DOMAIN for node in model.graph.node)


def write_fused_model(source, target):
    """Writes the ONNX file `source` with its attention fused (`fuse_attention`) to `target`; returns the fused model."""
    fused = fuse_attention(onnx.load(str(source)))
    onnx.save(fused, str(target))
    return fused
