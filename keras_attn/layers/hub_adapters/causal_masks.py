"""The causal masks of KerasHub's decoder blocks, recognised where their attention receives them.

A KerasHub decoder block builds its self-attention's mask itself: the causal mask (its queries at
the cache index) merged with the padding, the block's `decoder_attention_mask` and, for Mistral
and Mixtral, the sliding window, handed to the attention as one `(batch, query_len, key_len)`
tensor. From that tensor alone no kernel can know which tiles it hides, so the streaming kernels
would compute the half above the diagonal only to mask it. `convert` calls `recognise` on every
layer of the model: a block whose class runs one of `BUILDERS` (KerasHub's own mask builders,
each building its mask within the causal pattern) gets that builder wrapped on the instance, and
the wrapper remembers each mask it returns with its queries at the first key (no cache index, or
the index `0`: training, evaluation, a prompt's prefill). The attention that receives that very
tensor (`within_causal_pattern`: identity, never equality, so no other mask is ever taken for
it) passes the causal pattern with it. The pattern hides nothing the mask does not, so the
outputs are the same; the kernels skip the tiles above the diagonal. A mask built anywhere else
(a user's own, a subclass's builder, a decoding step's queries at a later index, where the few
queries leave nothing to skip) is not recognised, and the attention runs with the mask alone.
"""

import inspect
import weakref

# KerasHub's mask builders whose mask lies within the causal pattern, read in its source:
# `qualified name -> (the argument holding the cache index, the argument that turns the causal
# mask off or None)`.
BUILDERS = {
    "keras_hub.src.layers.modeling.transformer_decoder.TransformerDecoder._compute_self_attention_mask": (
        "self_attention_cache_update_index",
        "use_causal_mask",
    ),
    "keras_hub.src.models.llama.llama_decoder.LlamaTransformerDecoder._compute_self_attention_mask": (
        "self_attention_cache_update_index",
        None,
    ),
    "keras_hub.src.models.mistral.mistral_transformer_decoder.MistralTransformerDecoder._compute_self_attention_mask": (
        "self_attention_cache_update_index",
        None,
    ),
    "keras_hub.src.models.mixtral.mixtral_decoder.MixtralTransformerDecoder._compute_self_attention_mask": (
        "self_attention_cache_update_index",
        None,
    ),
    "keras_hub.src.models.phi3.phi3_decoder.Phi3Decoder._compute_self_attention_mask": (
        "attention_cache_update_index",
        None,
    ),
    "keras_hub.src.models.qwen.qwen_decoder.QwenTransformerDecoder._compute_self_attention_mask": (
        "self_attention_cache_update_index",
        None,
    ),
    "keras_hub.src.models.qwen_moe.qwen_moe_decoder.QwenMoeTransformerDecoder._compute_self_attention_mask": (
        "self_attention_cache_update_index",
        None,
    ),
    "keras_hub.src.models.qwen3.qwen3_decoder.Qwen3TransformerDecoder._compute_self_attention_mask": (
        "self_attention_cache_update_index",
        None,
    ),
    "keras_hub.src.models.qwen3_moe.qwen3_moe_decoder.Qwen3MoeTransformerDecoder._compute_self_attention_mask": (
        "self_attention_cache_update_index",
        None,
    ),
    "keras_hub.src.models.smollm3.smollm3_layers.SmolLM3DecoderLayer._compute_self_attention_mask": (
        "self_attention_cache_update_index",
        None,
    ),
    "keras_hub.src.models.gpt_neo_x.gpt_neo_x_decoder.GPTNeoXDecoder._compute_self_attention_mask": (
        "self_attention_cache_update_index",
        None,
    ),
    "keras_hub.src.models.gemma.gemma_decoder_block.GemmaDecoderBlock._compute_attention_mask": (
        "cache_update_index",
        None,
    ),
}
_BUILDER_NAMES = ("_compute_self_attention_mask", "_compute_attention_mask")
_remembered = {}  # id(mask) -> a weak reference to it: the recognised masks still alive


def recognise(layer):
    """Wrap `layer`'s mask builder, if its class runs one of `BUILDERS`, so that its causal masks are recognised."""
    for name in _BUILDER_NAMES:
        builder = getattr(type(layer), name, None)
        if builder is None or name in vars(layer):  # none, or wrapped already
            continue
        arguments = BUILDERS.get(f"{builder.__module__}.{builder.__qualname__}")
        if arguments is None:
            continue
        signature = inspect.signature(builder)
        # A KerasHub version whose builder takes other arguments than those read here is left alone.
        if all(argument in signature.parameters for argument in arguments if argument is not None):
            setattr(layer, name, _remembering(layer, builder, signature, *arguments))


def within_causal_pattern(mask):
    """Whether `mask` is a recognised mask: one a wrapped builder built within the causal pattern, queries first."""
    reference = _remembered.get(id(mask))
    return reference is not None and reference() is mask


def _remembering(layer, builder, signature, index_argument, switch_argument):
    """`builder` bound to `layer`, remembering each mask it builds within the causal pattern with its queries first."""

    def build(*args, **kwargs):
        mask = builder(layer, *args, **kwargs)
        bound = signature.bind(layer, *args, **kwargs)
        bound.apply_defaults()
        causal = switch_argument is None or bool(bound.arguments[switch_argument])
        index = bound.arguments[index_argument]
        if mask is not None and causal and (index is None or (type(index) is int and index == 0)):
            _remember(mask)
        return mask

    return build


def _remember(mask):
    key = id(mask)
    try:
        _remembered[key] = weakref.ref(mask, lambda _, key=key: _remembered.pop(key, None))
    except TypeError:  # a tensor type without weak references is not recognised
        pass
