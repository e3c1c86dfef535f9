"""Which self-attention the translator's encoder and decoder blocks use, by name.

- `"dense"`: the blocks' own softmax `MultiHeadAttention` over every (earlier) token;
- `"window"`: the same attention limited to `|i - j| < window` (in the causal decoder: the
  `window` latest tokens, the new one included); it decodes with the blocks' key/value cache;
- `"linear"`: `keras_attn.LinearAttention` (kernelised, ELU feature map), causal in the decoder,
  where its recurrent state is the decoding cache (`TransformerDecoder.initial_self_attention_cache`).

Cross-attention stays softmax attention in every choice. What a choice can do (cache kind, ONNX)
is read from the family's declared `capabilities`, never from the name.
"""

from keras_attn import attention_families

CHOICES = ("dense", "window", "linear")


def check_choice(attention, attention_window):
    """Raises a `ValueError` naming the argument unless `attention` is one of `CHOICES` and
    `attention_window` a positive int."""
    if attention not in CHOICES:
        raise ValueError(f"`attention` must be one of {CHOICES}. Received: attention={attention!r}")
    if isinstance(attention_window, bool) or not isinstance(attention_window, int) or attention_window < 1:
        raise ValueError(f"`attention_window` must be a positive int. Received: attention_window={attention_window!r}")


def block_options(attention, attention_window, num_heads, head_dim, causal):
    """The `TransformerEncoder` / `TransformerDecoder` keyword arguments that give their
    self-attention the choice `attention` (`causal` for the decoder's)."""
    check_choice(attention, attention_window)
    if attention == "dense":
        return {}
    if attention == "window":
        return {"sliding_window": attention_window}
    return {"self_attention": attention_families.build("linear", num_heads=num_heads, key_dim=head_dim, causal=causal)}
