"""What an attention family supports, declared once on its class and read by every caller.

Each attention layer class carries `capabilities = AttentionCapabilities(...)`. The blocks
(`TransformerEncoder`, `TransformerDecoder`) refuse a family that lacks what they need by reading
it, the families refuse call arguments they cannot take through `check_call`, the family table of
`docs/guides/attention_families.md` and the registry test (`tests/test_attention_families.py`)
are written from it. Nothing above a family's own module tells families apart any other way.
"""

import dataclasses

from keras_attn.utils import check_built_input_shapes
from keras_attn.validation import check_same_batch

CACHE_KINDS = (None, "key_value", "recurrent")


@dataclasses.dataclass(frozen=True)
class AttentionCapabilities:
    """The declared abilities of one attention family.

    Attributes:
        causal: whether `use_causal_mask=True` (or the family's own `causal=True`) is supported.
        cross: whether `value` / `key` may be another sequence than `query` (cross-attention).
        padding_mask: whether padding masks (`query_mask`, `value_mask`, `key_mask`, the Keras
            mask of the inputs) are honoured.
        attention_mask: whether an arbitrary boolean `attention_mask` is honoured.
        cache: `None` (no incremental decoding), `"key_value"` (a `(batch, 2, max_len, heads,
            key_dim)` cache written at `cache_update_index`) or `"recurrent"` (a state of constant
            size, `initial_cache(batch)`).
        scores: whether `return_attention_scores=True` returns the attention weights.
        onnx: whether the layer exports to ONNX (tf2onnx) with matching outputs.
        softmax: whether the scores are softmax probabilities (a row over its allowed keys sums
            to 1); linear attention's normalised kernel weights also sum to 1 but are not softmax.
        reasons: `(capability, why)` pairs saying why a capability is missing, quoted in errors.
        scores_over_tokens: whether the returned scores' key axis is the key tokens (`False`
            for Linformer's, over its projected keys): whether they say what a token attends to.
        segments: whether packed rows are honoured: `segment_ids` (or `query_segment_ids` with
            `key_segment_ids`) keep each token's attention inside its own document
            (`keras_attn.core.segments`).

    Example:

    >>> from keras_attn import LinformerSelfAttention
    >>> LinformerSelfAttention.capabilities.causal
    False
    """

    causal: bool
    cross: bool
    padding_mask: bool
    attention_mask: bool
    cache: object
    scores: bool
    onnx: bool
    softmax: bool
    reasons: tuple = ()
    scores_over_tokens: bool = True
    segments: bool = False

    def __post_init__(self):
        if self.cache not in CACHE_KINDS:
            raise ValueError(f"`cache` must be one of {CACHE_KINDS}. Received: cache={self.cache!r}")

    def why_not(self, capability):
        """The declared reason `capability` is missing (an empty string when none is declared)."""
        return dict(self.reasons).get(capability, "")


def unsupported(layer, capability, received):
    """A `ValueError` naming the family, the missing capability, why, and what was received."""
    capabilities = type(layer).capabilities
    why = capabilities.why_not(capability)
    return ValueError(
        f"{type(layer).__name__} does not support {capability} (its capabilities declare "
        f"{capability}={getattr(capabilities, capability)!r}).{' ' + why if why else ''} Received: {received}"
    )


def describe(value):
    """A short description of a call argument for an error message: its shape (shapes of a tuple), else itself."""
    if isinstance(value, (tuple, list)):
        return tuple(describe(item) for item in value)
    return tuple(value.shape) if hasattr(value, "shape") else value


def check_call(
    layer,
    query,
    value=None,
    key=None,
    attention_mask=None,
    use_causal_mask=False,
    projects_key=True,
    segment_ids=None,
):
    """Raises the `unsupported` error for the first call argument `layer`'s family cannot take, then
    the `ValueError` of an input whose shape is not the one the layer was built for (`projects_key=False`:
    the call reads precomputed keys and values, a cache, and `value` / `key` are not projected)."""
    capabilities = type(layer).capabilities
    distinct = {
        name: tensor for name, tensor in (("value", value), ("key", key)) if tensor is not None and tensor is not query
    }
    if distinct and not capabilities.cross:
        shapes = ", ".join(f"{name}.shape={describe(tensor)}" for name, tensor in distinct.items())
        raise unsupported(layer, "cross", f"a `value`/`key` other than `query` ({shapes}); call it with value=None")
    if attention_mask is not None and not capabilities.attention_mask:
        raise unsupported(layer, "attention_mask", f"attention_mask.shape={describe(attention_mask)}")
    if use_causal_mask and not capabilities.causal:
        raise unsupported(layer, "causal", f"use_causal_mask={use_causal_mask!r}")
    if segment_ids is not None and not capabilities.segments:
        raise unsupported(layer, "segments", f"segment ids of shape {describe(segment_ids)}")
    inputs = {"query": query}
    if capabilities.cross and projects_key:  # a self-attention family's projections are all built from the query
        value = query if value is None else value
        inputs.update(value=value, key=value if key is None else key)
    check_built_input_shapes(layer, **inputs)
    check_same_batch(
        query=query, key=inputs.get("key"), value=inputs.get("value")
    )  # before any op: a key zeroed at its padding would broadcast against the query
