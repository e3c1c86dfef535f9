"""The attention families by name, each with its declared capabilities.

Every family takes Keras's call convention (`layer(query, value=None, key=None, *, query_mask=...,
value_mask=..., key_mask=..., attention_mask=..., use_causal_mask=..., return_attention_scores=...,
training=...)`, `value=None` for self-attention) and declares what it supports in its class's
`capabilities` (`keras_attn.layers.capabilities.AttentionCapabilities`). `build(name, **kwargs)` makes
one; the blocks take any of them as `self_attention`.

The masks mean the same in every family, what they mean in Keras: `query_mask` marks the real query
positions (a `False` one outputs exactly zero and reaches no weight gradient), `value_mask` and
`key_mask` the real keys (never attended where `False`); a bare `query_mask` masks no key. Each is the
Keras mask of its input when not given (of `query` for both in self-attention).
"""

import dataclasses

from keras_attn.families.linear_attention import LinearAttention
from keras_attn.families.linformer_attention import LinformerSelfAttention
from keras_attn.families.lsh_attention import LSHSelfAttention
from keras_attn.layers.multi_head_attention import MultiHeadAttention

FAMILIES = {
    "dense": MultiHeadAttention,
    "lsh": LSHSelfAttention,
    "linformer": LinformerSelfAttention,
    "linear": LinearAttention,
}

_TABLE_FIELDS = ("causal", "cross", "padding_mask", "attention_mask", "cache", "scores", "onnx", "segments")


def build(name, **kwargs):
    """A new layer of the family `name` (a key of `FAMILIES`) with the constructor arguments `kwargs`.

    Example:

    >>> layer = build("linear", num_heads=2, key_dim=4, causal=True)
    >>> type(layer).__name__, type(layer).capabilities.cache
    ('LinearAttention', 'recurrent')
    """
    if name not in FAMILIES:
        raise ValueError(f"`name` must be one of {sorted(FAMILIES)}. Received: name={name!r}")
    return FAMILIES[name](**kwargs)


def capabilities_table():
    """The Markdown table of every family's declared capabilities (the one in the families guide).

    Example:

    >>> print(capabilities_table().splitlines()[0])
    | family | class | causal | cross | padding_mask | attention_mask | cache | scores | onnx | segments |
    """
    rows = ["| family | class | " + " | ".join(_TABLE_FIELDS) + " |", "|" + " --- |" * (len(_TABLE_FIELDS) + 2)]
    for name, family in FAMILIES.items():
        declared = dataclasses.asdict(family.capabilities)
        cells = [
            "no" if declared[field] in (False, None) else "yes" if declared[field] is True else declared[field]
            for field in _TABLE_FIELDS
        ]
        rows.append(f"| `{name}` | `{family.__name__}` | " + " | ".join(cells) + " |")
    return "\n".join(rows)
