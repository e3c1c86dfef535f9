"""KerasHub's architectures and what `keras_attn.convert` does with each: the one definition.

`ARCHITECTURES` has one entry per backbone class that KerasHub exports (`keras_hub.models`): how to
build it tiny from its constructor (no preset is downloaded) and the route its attention takes, or
the reason it is not built or not converted. The registry walk (`tests/test_convert_keras_hub_registry.py`)
checks each entry against what `convert` does and fails on a backbone class with no entry, so a new
KerasHub release shows up by itself; `architectures_table()` renders the table of the converting
guide (docs/guides/converting_models.md) from the same entries.
"""

import dataclasses

# The KerasHub release whose registry the entries describe (the `test` extra's pin): its constructors
# are what the tiny arguments fit. The oldest supported release is checked by tests/test_convert.py
# and tests/test_convert_keras_hub.py in `make test-compat`; this walk belongs to this release.
KERAS_HUB_RELEASE = "0.32."
# The routes of a converted layer, as `convert`'s report names them.
CONVERTED = "converted"  # keras.layers.MultiHeadAttention (subclasses included) -> keras_attn's

TEXT = dict(vocabulary_size=64, num_layers=2, hidden_dim=16, intermediate_dim=32)
GROUPED = dict(num_query_heads=4, num_key_value_heads=2)


@dataclasses.dataclass(frozen=True)
class Converts:
    """A backbone whose every attention layer converts: its tiny constructor arguments and route.

    `kwargs` may name nested backbones as `Nested(name)` (built from their own entry). `routes`
    are the routes its attention layers take: `CONVERTED`, or the names of adapter modules;
    `lm` is the causal or seq2seq LM task class (greedy `generate` compared), if any.
    """

    kwargs: dict
    routes: tuple
    lm: str = None
    inputs: dict = None  # input shapes where the backbone's own are not fixed: {name: shape}


@dataclasses.dataclass(frozen=True)
class Named:
    """A backbone that holds attention `convert` does not take (or that the walk does not build), and why."""

    reason: str
    kwargs: dict = None  # tiny constructor arguments: the walk checks `convert` names it
    match: str = None  # a fragment of the reason `convert` gives, checked when `kwargs` are given


@dataclasses.dataclass(frozen=True)
class NoAttention:
    """A backbone that holds no attention layer (convolutional, Fourier, recurrent)."""

    what: str


@dataclasses.dataclass(frozen=True)
class Nested:
    """A constructor argument that is another backbone of `ARCHITECTURES`, built from its entry (and `overrides`)."""

    name: str
    overrides: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class HubLayer:
    """A constructor argument that is a layer of `keras_hub.layers`, built from `kwargs`."""

    name: str
    kwargs: dict


OP_IN_CALL = (
    "its attention layer calls `keras.ops.dot_product_attention` directly in its own `call`, with no hook for "
    "convert to replace: `keras_attn.enable()` is the switch that reaches it"
)
OWN_CALL = "computes its attention in its own `call`, with no hook for convert to replace"
NOT_BUILT = "not built by the walk: "

T5GEMMA = {
    f"{stack}_{key}": value
    for stack in ("encoder", "decoder")
    for key, value in dict(
        hidden_dim=16,
        intermediate_dim=32,
        num_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        layer_types=["sliding_attention", "full_attention"],
    ).items()
} | dict(vocabulary_size=64, attn_logit_softcapping=1.0, sliding_window=3)

VISION = dict(patch_size=4, hidden_dim=16, num_layers=2, num_heads=2, intermediate_dim=32)

ARCHITECTURES = {
    "AlbertBackbone": Converts(
        dict(TEXT, num_heads=2, embedding_dim=8, num_groups=1, num_inner_repetitions=1), (CONVERTED,)
    ),
    "BartBackbone": Converts(dict(TEXT, num_heads=2, max_sequence_length=16), (CONVERTED,), lm="BartSeq2SeqLM"),
    "BertBackbone": Converts(dict(TEXT, num_heads=2, max_sequence_length=16), (CONVERTED,)),
    "BloomBackbone": Converts(dict(TEXT, num_heads=2), ("bloom",), lm="BloomCausalLM"),
    "CLIPTextEncoder": Converts(dict(TEXT, embedding_dim=16, num_heads=2, max_sequence_length=8), (CONVERTED,)),
    "CLIPVisionEncoder": Converts(dict(VISION, image_shape=(16, 16, 3)), (CONVERTED,)),
    "CLIPBackbone": Converts(
        dict(vision_encoder=Nested("CLIPVisionEncoder"), text_encoder=Nested("CLIPTextEncoder"), projection_dim=8),
        (CONVERTED,),
    ),
    "DebertaV3Backbone": Converts(dict(TEXT, num_heads=2, max_sequence_length=16, bucket_size=4), ("disentangled",)),
    "DeiTBackbone": Converts(
        dict(image_shape=(16, 16, 3), patch_size=4, num_layers=2, num_heads=2, hidden_dim=16, intermediate_dim=32),
        (CONVERTED,),
    ),
    "DINOV2Backbone": Converts(dict(VISION, image_shape=(16, 16, 3), position_embedding_shape=(16, 16)), (CONVERTED,)),
    "DINOV3Backbone": Converts(dict(VISION, image_shape=(16, 16, 3)), ("op_in_call",)),
    "DistilBertBackbone": Converts(dict(TEXT, num_heads=2, max_sequence_length=16), (CONVERTED,)),
    "EdRecBackbone": Converts(
        dict(vocab_size=64, num_layers_enc=1, num_layers_dec=1, hidden_dim=16, intermediate_dim=32, num_heads=2),
        (CONVERTED,),
    ),
    "ElectraBackbone": Converts(
        dict(vocab_size=64, num_layers=2, num_heads=2, hidden_dim=16, embedding_dim=16, intermediate_dim=32),
        (CONVERTED,),
    ),
    "ESMBackbone": Converts(dict(TEXT, num_heads=2), ("op_in_call",)),
    "FalconBackbone": Converts(dict(TEXT, num_attention_heads=2), ("falcon",), lm="FalconCausalLM"),
    "GemmaBackbone": Converts(dict(TEXT, head_dim=8, **GROUPED), ("gemma",), lm="GemmaCausalLM"),
    "Gemma3Backbone": Converts(
        dict(
            TEXT,
            head_dim=8,
            image_size=16,
            **GROUPED,
            attention_logit_soft_cap=1.0,  # bites on the tiny model's logits
            use_sliding_window_attention=True,
            sliding_window_size=3,
        ),
        ("gemma3",),
        lm="Gemma3CausalLM",
    ),
    "GPT2Backbone": Converts(dict(TEXT, num_heads=2, max_sequence_length=16), (CONVERTED,), lm="GPT2CausalLM"),
    "GPTNeoXBackbone": Converts(
        dict(TEXT, num_heads=2, max_sequence_length=16), ("repeated_heads",), lm="GPTNeoXCausalLM"
    ),
    "GptOssBackbone": Converts(
        dict(TEXT, **GROUPED, num_experts=2, head_dim=8, sliding_window=3), ("gpt_oss",), lm="GptOssCausalLM"
    ),
    "LlamaBackbone": Converts(dict(TEXT, **GROUPED), ("repeated_heads",), lm="LlamaCausalLM"),
    "Llama3Backbone": Converts(dict(TEXT, **GROUPED), ("repeated_heads",), lm="Llama3CausalLM"),
    "MetaCLIP2TextEncoder": Converts(dict(TEXT, embedding_dim=16, num_heads=2, max_sequence_length=8), (CONVERTED,)),
    "MetaCLIP2VisionEncoder": Converts(dict(VISION, image_shape=(16, 16, 3)), (CONVERTED,)),
    "MetaCLIP2Backbone": Converts(
        dict(
            vision_encoder=Nested("MetaCLIP2VisionEncoder"),
            text_encoder=Nested("MetaCLIP2TextEncoder"),
            projection_dim=8,
        ),
        (CONVERTED,),
    ),
    "MistralBackbone": Converts(dict(TEXT, **GROUPED, sliding_window=4), ("repeated_heads",), lm="MistralCausalLM"),
    "MixtralBackbone": Converts(
        dict(TEXT, **GROUPED, num_experts=2, sliding_window=4), ("repeated_heads",), lm="MixtralCausalLM"
    ),
    "MoonshineBackbone": Converts(
        dict(
            vocabulary_size=64,
            filter_dim=16,
            encoder_num_layers=1,
            decoder_num_layers=1,
            hidden_dim=16,
            intermediate_dim=32,
            encoder_num_heads=2,
            decoder_num_heads=2,
        ),
        (CONVERTED,),
        inputs={"encoder_input_values": (2047, 1), "encoder_padding_mask": (2047,)},  # 4 encoder frames
    ),
    "OPTBackbone": Converts(dict(TEXT, num_heads=2, max_sequence_length=16), (CONVERTED,), lm="OPTCausalLM"),
    "Phi3Backbone": Converts(dict(TEXT, **GROUPED), ("repeated_heads",), lm="Phi3CausalLM"),
    "QwenBackbone": Converts(dict(TEXT, **GROUPED), ("repeated_heads",), lm="QwenCausalLM"),
    "QwenMoeBackbone": Converts(
        dict(TEXT, **GROUPED, moe_intermediate_dim=8, shared_expert_intermediate_dim=8, num_experts=2, top_k=1),
        ("repeated_heads",),
        lm="QwenMoeCausalLM",
    ),
    "Qwen3Backbone": Converts(
        dict(TEXT, **GROUPED, head_dim=8, sliding_window_size=4), ("repeated_heads",), lm="Qwen3CausalLM"
    ),
    "Qwen3MoeBackbone": Converts(
        dict(TEXT, **GROUPED, head_dim=8, moe_intermediate_dim=8, num_experts=2, top_k=1),
        ("repeated_heads",),
        lm="Qwen3MoeCausalLM",
    ),
    "Qwen3_5Backbone": Converts(
        dict(TEXT, **GROUPED, head_dim=8, layer_types=["linear_attention", "full_attention"]),
        ("repeated_heads",),
        lm="Qwen3_5CausalLM",
    ),
    "Qwen3_5MoeBackbone": Converts(
        dict(
            vocabulary_size=64,
            num_layers=2,
            hidden_dim=16,
            **GROUPED,
            head_dim=8,
            moe_intermediate_dim=8,
            shared_expert_intermediate_size=8,
            num_experts=2,
            top_k=1,
            layer_types=["linear_attention", "full_attention"],
        ),
        ("repeated_heads",),
    ),
    "RobertaBackbone": Converts(dict(TEXT, num_heads=2, max_sequence_length=16), (CONVERTED,)),
    "RoformerV2Backbone": Converts(dict(TEXT, num_heads=2, head_size=8), ("op_in_call",)),
    "SigLIPTextEncoder": Converts(dict(TEXT, embedding_dim=16, num_heads=2, max_sequence_length=8), (CONVERTED,)),
    "SigLIPVisionEncoder": Converts(dict(VISION, image_shape=(16, 16, 3)), (CONVERTED,)),
    "SigLIPBackbone": Converts(
        dict(vision_encoder=Nested("SigLIPVisionEncoder"), text_encoder=Nested("SigLIPTextEncoder")), (CONVERTED,)
    ),
    "SmolLM3Backbone": Converts(
        dict(
            TEXT,
            num_attention_heads=4,
            num_key_value_heads=2,
            attention_bias=False,
            attention_dropout=0.0,
            rope_layer_enabled_list=[True, False],
            layer_types=["full_attention", "full_attention"],
            mlp_bias=False,
            layer_norm_epsilon=1e-6,
            max_position_embeddings=32,
            rope_theta=10000.0,
            partial_rotary_factor=1.0,
        ),
        ("repeated_heads",),
        lm="SmolLM3CausalLM",
    ),
    "T5Backbone": Converts(dict(TEXT, num_heads=2, key_value_dim=8), ("t5",), lm="T5Seq2SeqLM"),
    "ViTBackbone": Converts(
        dict(image_shape=(16, 16, 3), patch_size=4, num_layers=2, num_heads=2, hidden_dim=16, mlp_dim=32), (CONVERTED,)
    ),
    "WhisperBackbone": Converts(
        dict(TEXT, num_heads=2, num_mels=8, max_encoder_sequence_length=16, max_decoder_sequence_length=16),
        (CONVERTED,),
    ),
    "BLIP2Backbone": Named(
        NOT_BUILT + "it is assembled from a BLIP2VisionEncoder, a BLIP2QFormer and a language model "
        "(BLIP2CustomOPT or Flan-T5), models that are not backbones and have no tiny entry here"
    ),
    "DepthAnythingBackbone": Named(
        "converts (its DINOv2 encoder's Keras attention), but not within the parity bound: built tiny (DINOv2 of "
        "4 layers on a 16 x 16 patch grid, the smallest its four-stage neck takes), its gradients differ from the "
        'unconverted model\'s by 3.8e-5 of the largest gradient entry under `implementation="auto"` (the '
        "blockwise kernel at 257 tokens; 3e-7 with the dense kernel), its outputs by 8.7e-7"
    ),
    "DFineBackbone": Named(
        "DFineMultiheadAttention " + OWN_CALL + "; DFineMultiscaleDeformableAttention samples features at learned "
        "offsets, which is not dot-product attention"
    ),
    "FluxBackbone": Converts(
        dict(
            input_channels=4,
            hidden_size=16,
            mlp_ratio=2.0,
            num_heads=2,
            depth=1,
            depth_single_blocks=1,
            axes_dim=[2, 2, 4],  # sums to the head dimension
            theta=10000,
            use_bias=True,
            image_shape=(8, 4),
            text_shape=(8, 8),
            image_ids_shape=(8, 3),
            text_ids_shape=(8, 3),
            y_shape=(8,),
        ),
        ("torch_style",),
    ),
    "Gemma3nBackbone": Named(
        "Gemma3nTextAttention's `_compute_attention` returns the attention weights with the output and its audio "
        "encoder's attention " + OWN_CALL + "; no adapter yet"
    ),
    "Gemma4Backbone": Converts(  # text only: its vision and audio encoders' attention have no adapter
        dict(
            TEXT,
            head_dim=8,
            image_size=16,
            **GROUPED,
            attention_logit_soft_cap=1.0,
            sliding_window_size=3,
            sliding_window_pattern=2,
        ),
        ("gemma4",),
        lm="Gemma4CausalLM",
    ),
    "MiTBackbone": Converts(
        dict(
            layerwise_depths=[1, 1],
            num_layers=2,
            layerwise_num_heads=[1, 2],
            layerwise_sr_ratios=[2, 1],
            max_drop_path_rate=0.0,
            layerwise_patch_sizes=[3, 3],
            layerwise_strides=[2, 2],
            image_shape=(16, 16, 3),
            hidden_dims=[8, 16],
        ),
        ("spatial_reduction",),
    ),
    "MobileNetV5Backbone": Named("MultiQueryAttention2d (attention over 2D feature maps) " + OWN_CALL),
    "PaliGemmaBackbone": Converts(
        dict(
            TEXT,
            image_size=16,
            head_dim=8,
            **GROUPED,
            vit_patch_size=4,
            vit_num_heads=2,
            vit_hidden_dim=16,
            vit_num_layers=1,
            vit_intermediate_dim=32,
        ),
        ("gemma", "vit_scores"),
        lm="PaliGemmaCausalLM",
    ),
    "PARSeqBackbone": Converts(
        dict(
            image_encoder=Nested("ViTBackbone"),
            vocabulary_size=64,
            max_label_length=7,  # the token_ids are one longer
            decoder_hidden_dim=16,
            num_decoder_layers=1,
            num_decoder_heads=2,
            decoder_mlp_dim=32,
        ),
        (CONVERTED,),
    ),
    "SAMBackbone": Converts(
        dict(
            image_encoder=Nested("ViTDetBackbone"),
            prompt_encoder=HubLayer(
                "SAMPromptEncoder",
                dict(hidden_size=8, image_embedding_size=(4, 4), input_image_size=(16, 16), mask_in_channels=16),
            ),
            mask_decoder=HubLayer(
                "SAMMaskDecoder",
                dict(
                    num_layers=2,
                    hidden_size=8,
                    intermediate_dim=32,
                    num_heads=2,
                    embedding_dim=8,
                    num_multimask_outputs=3,
                    iou_head_depth=3,
                    iou_head_hidden_dim=8,
                ),
            ),
        ),
        ("decomposed_relative", "downsampling"),
        inputs={"points": (1, 2), "labels": (1,), "boxes": (1, 2, 2), "masks": (0, 16, 16, 1)},
    ),
    "SAM3PromptableConceptBackbone": Named("SAM3Attention " + OP_IN_CALL.removeprefix("its attention layer ")),
    "SegFormerBackbone": Converts(
        dict(image_encoder=Nested("MiTBackbone"), projection_filters=8), ("spatial_reduction",)
    ),
    "StableDiffusion3Backbone": Named(
        "its MMDiT blocks compute their attention in their own `call` (calling `keras.ops.dot_product_attention` "
        "on JAX and PyTorch only), with no hook for convert to replace"
    ),
    "SwinTransformerBackbone": Converts(
        dict(image_shape=(16, 16, 3), embed_dim=8, depths=[2, 2], num_heads=[1, 2], window_size=2, patch_size=2),
        ("shifted_windows",),
    ),
    "T5GemmaBackbone": Converts(T5GEMMA, ("additive_mask",), lm="T5GemmaSeq2SeqLM"),
    "T5Gemma2Backbone": Converts(T5GEMMA, ("additive_mask",), lm="T5Gemma2Seq2SeqLM"),
    "VideoPrismBackbone": Converts(
        dict(
            num_frames=2,
            patch_size=4,
            hidden_dim=16,
            intermediate_dim=32,
            num_heads=2,
            num_spatial_layers=1,
            num_temporal_layers=1,
            num_auxiliary_layers=1,
            vocabulary_size=64,
            num_text_layers=1,
            attention_logit_soft_cap=1.0,
            image_shape=(16, 16, 3),
        ),
        ("video_prism",),
    ),
    "ViTDetBackbone": Converts(
        dict(
            hidden_size=16,
            num_layers=2,
            intermediate_dim=32,
            num_heads=2,
            global_attention_layer_indices=[1],
            image_shape=(16, 16, 3),
            patch_size=4,
            num_output_channels=8,
            window_size=2,
        ),
        ("decomposed_relative",),
    ),
    "XLMRobertaBackbone": Converts(dict(TEXT, num_heads=2, max_sequence_length=16), (CONVERTED,)),
    "XLNetBackbone": Named(
        "TwoStreamRelativeAttention (a subclass of Keras's MultiHeadAttention) overrides `call`: its content and "
        "query streams add relative-position and segment terms to the logits in its own `compute_attention`, "
        "which never reaches Keras's `_compute_attention` hook",
        dict(TEXT, num_heads=2),
        "overrides `call` and computes attention without `_compute_attention`",
    ),
}
ARCHITECTURES.update(
    {
        name: NoAttention(what)
        for what, names in {
            "convolutional": (
                "BASNetBackbone CSPNetBackbone DeepLabV3Backbone DenseNetBackbone EfficientNetBackbone "
                "HGNetV2Backbone MobileNetBackbone ResNetBackbone RetinaNetBackbone VGGBackbone XceptionBackbone"
            ),
            "Fourier-transform token mixing": "FNetBackbone",
            "recurrent (RWKV time mixing)": "RWKV7Backbone",
            "an abstract base of the feature-pyramid backbones": "FeaturePyramidBackbone",
        }.items()
        for name in names.split()
    }
)


def _row(name, entry):
    """`| backbone | convert | how, or why not |` for one entry."""
    if isinstance(entry, NoAttention):
        return f"| {name} | no attention | {entry.what} |"
    if isinstance(entry, Named):
        return f"| {name} | named | {entry.reason} |"
    how = "; ".join(
        "Keras's `MultiHeadAttention` (or its subclass) becomes keras-attn's"
        if route == CONVERTED
        else f"its own attention, through the adapter `keras_attn.layers.hub_adapters.{route}`"
        for route in entry.routes
    )
    checked = "outputs and gradients equal" + (f", `{entry.lm}` generates the same greedy tokens" if entry.lm else "")
    kind = "converted" if entry.routes == (CONVERTED,) else "adapted"
    return f"| {name} | {kind} | {how} ({checked}) |"


def coverage():
    """`(converting, holding_attention)`: the backbones that convert with parity, of those that hold attention."""
    holding = [entry for entry in ARCHITECTURES.values() if not isinstance(entry, NoAttention)]
    return sum(isinstance(entry, Converts) for entry in holding), len(holding)


def architectures_table():
    """The Markdown table of the converting guide: every backbone KerasHub exports, what `convert` does with it.

    >>> print(architectures_table().splitlines()[2])
    | AlbertBackbone | converted | Keras's `MultiHeadAttention` (or its subclass) becomes keras-attn's (outputs and gradients equal) |
    """
    converting, holding = coverage()
    rows = ["| backbone | `convert` | how, or why not |", "| --- | --- | --- |"]
    rows += [_row(name, ARCHITECTURES[name]) for name in sorted(ARCHITECTURES, key=str.lower)]
    rows.append("")
    rows.append(
        f"{converting} of the {holding} backbones that hold attention convert with parity "
        f"({100 * converting // holding} %); {len(ARCHITECTURES) - holding} hold none."
    )
    return "\n".join(rows)
