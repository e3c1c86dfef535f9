"""Adapters: KerasHub attention layers that are not `keras.layers.MultiHeadAttention`, on keras_attn's kernels.

The decoder blocks of the Llama, Mistral, Phi3, Qwen, SmolLM3, GPT-NeoX and Gemma families build
their own attention layer (`LlamaAttention`, `CachedMistralAttention`, `QwenAttention`,
`CachedGemmaAttention`, ...): its `call` projects the inputs, applies the rotary embedding, writes
the key/value cache and then calls the layer's `_compute_attention` hook on the projected query,
keys and values. An adapter is a module of this
package that defines, for one hook signature:

- `compute_attention(layer, ...)`: the hook, computed by `keras_attn.scaled_dot_product_attention`
  (`hub_attention`: masked keys and values as KerasHub takes them, not zeroed first) with the
  layer's scale, mask, window and dropout;
- optionally `HOOK`: the method of the KerasHub class that `compute_attention` replaces,
  `"_compute_attention"` unless it says otherwise (a class without that hook: its `call`);
- `why_unsupported(layer)`: `None`, or why this layer's attention cannot run there (an option of
  the layer the core op has no equivalent for).

`ADAPTERS` maps the qualified name of each KerasHub class to its adapter: the one registry. A layer
is matched by the classes of its MRO, so KerasHub itself is never imported (nor is it a
dependency); `adapt` changes the layer's class in place to a subclass whose hook is the adapter's
(one per KerasHub class, cached). The layer keeps its call, its cache handling, its sublayers and
its variables. A KerasHub attention layer whose class has no adapter is reported by `convert` with
`why_not_adapted`.
"""

import importlib

ADAPTERS = {
    "keras_hub.src.models.llama.llama_attention.LlamaAttention": "repeated_heads",
    "keras_hub.src.models.mistral.mistral_attention.CachedMistralAttention": "repeated_heads",
    "keras_hub.src.models.mixtral.mixtral_attention.CachedMixtralAttention": "repeated_heads",
    "keras_hub.src.models.phi3.phi3_attention.Phi3Attention": "repeated_heads",
    "keras_hub.src.models.qwen.qwen_attention.QwenAttention": "repeated_heads",
    "keras_hub.src.models.qwen_moe.qwen_moe_attention.QwenMoeAttention": "repeated_heads",
    "keras_hub.src.models.qwen3.qwen3_attention.Qwen3Attention": "repeated_heads",
    "keras_hub.src.models.qwen3_moe.qwen3_moe_attention.Qwen3MoeAttention": "repeated_heads",
    "keras_hub.src.models.qwen3_5.qwen3_5_attention.Qwen3_5Attention": "repeated_heads",
    "keras_hub.src.models.smollm3.smollm3_layers.SmolLM3Attention": "repeated_heads",
    "keras_hub.src.models.gpt_neo_x.gpt_neo_x_attention.GPTNeoXAttention": "repeated_heads",
    "keras_hub.src.models.gemma.gemma_attention.CachedGemmaAttention": "gemma",
    "keras_hub.src.models.gemma3.gemma3_attention.CachedGemma3Attention": "gemma3",
    "keras_hub.src.models.gemma4.gemma4_attention.Gemma4TextAttention": "gemma4",
    "keras_hub.src.models.esm.esm_attention.EsmSelfAttention": "op_in_call",
    "keras_hub.src.models.roformer_v2.roformer_v2_attention.RoformerAttention": "op_in_call",
    "keras_hub.src.models.dinov3.dinov3_layers.DINOV3Attention": "op_in_call",
    "keras_hub.src.models.falcon.falcon_attention.FalconAttention": "falcon",
    "keras_hub.src.models.bloom.bloom_attention.BloomAttention": "bloom",
    "keras_hub.src.models.gpt_oss.gpt_oss_attention.GptOssAttention": "gpt_oss",
    "keras_hub.src.models.t5.t5_multi_head_attention.T5MultiHeadAttention": "t5",
    "keras_hub.src.models.mit.mit_layers.SegFormerMultiheadAttention": "spatial_reduction",
    "keras_hub.src.models.pali_gemma.pali_gemma_vit.PaliGemmaVitAttention": "vit_scores",
    "keras_hub.src.models.vit_det.vit_layers.MultiHeadAttentionWithRelativePE": "decomposed_relative",
    "keras_hub.src.models.sam.sam_layers.MultiHeadAttentionWithDownsampling": "downsampling",
    "keras_hub.src.models.video_prism.video_prism_layers.VideoPrismAttention": "video_prism",
    "keras_hub.src.models.swin_transformer.swin_transformer_layers.WindowAttention": "shifted_windows",
    "keras_hub.src.models.flux.flux_maths.FluxRoPEAttention": "torch_style",
    "keras_hub.src.models.deberta_v3.disentangled_self_attention.DisentangledSelfAttention": "disentangled",
    "keras_hub.src.models.t5gemma.t5gemma_attention.T5GemmaAttention": "additive_mask",
    "keras_hub.src.models.t5gemma2.t5gemma2_attention.T5Gemma2Attention": "additive_mask",
    "keras_hub.src.models.t5gemma2.t5gemma2_attention.T5Gemma2MergedAttention": "additive_mask",
}
_ADAPTER = "_keras_attn_adapter"  # the class attribute naming an adapted class's adapter module
_ADAPTED_CLASSES = {}


def is_hub_attention(layer):
    """Whether `layer` is a KerasHub attention layer of its own kind (adapted or not)."""
    klass = type(layer)
    named_so = klass.__module__.startswith("keras_hub.") and klass.__name__.endswith("Attention")
    return is_adapted(layer) or named_so or _registered_class(klass) is not None  # e.g. ViTDet's ...WithRelativePE


def is_adapted(layer):
    """Whether `layer`'s attention already runs through an adapter."""
    return getattr(type(layer), _ADAPTER, None) is not None


def why_not_adapted(layer):
    """`None` if an adapter takes `layer`, else the reason none does."""
    klass = type(layer)
    registered = _registered_class(klass)
    if registered is None:
        return (
            f"no keras_attn adapter for KerasHub's {klass.__name__} ({klass.__module__}); adapters exist for "
            + ", ".join(name.rsplit(".", 1)[1] for name in ADAPTERS)
        )
    hook = _hook(_adapter(registered))
    if getattr(klass, hook) is not getattr(registered, hook):
        return (
            f"its class {klass.__name__} overrides `{hook}` of KerasHub's {registered.__name__}, "
            "the hook the adapter replaces; its own computation would be lost"
        )
    return _adapter(registered).why_unsupported(layer)


def adapt(layer, implementation):
    """Change `layer`'s class in place to its adapted class, whose attention runs with `implementation`."""
    registered = _registered_class(type(layer))
    if type(layer) not in _ADAPTED_CLASSES:
        adapter = _adapter(registered)
        _ADAPTED_CLASSES[type(layer)] = type(
            type(layer).__name__,
            (type(layer),),
            {
                _hook(adapter): adapter.compute_attention,
                _ADAPTER: adapter.__name__,
                "__module__": adapter.__name__,
                "__doc__": type(layer).__doc__,
            },
        )
    layer.__class__ = _ADAPTED_CLASSES[type(layer)]
    layer.implementation = implementation


def _registered_class(klass):
    """The class of `klass`'s MRO that has an adapter, or `None`."""
    for base in klass.__mro__:
        if f"{base.__module__}.{base.__qualname__}" in ADAPTERS:
            return base
    return None


def _hook(adapter):
    """The method of the KerasHub class that `adapter`'s `compute_attention` replaces."""
    return getattr(adapter, "HOOK", "_compute_attention")


def _adapter(registered):
    name = ADAPTERS[f"{registered.__module__}.{registered.__qualname__}"]
    return importlib.import_module(f"{__name__}.{name}")
