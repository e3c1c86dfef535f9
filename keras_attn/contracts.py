"""The contract of every public argument, declared once: its kind, dtype, rank, range, relation to
the other inputs, and meaning.

`SPECS` maps an argument's name to its `ArgSpec`, the meaning a name has on every surface that
takes it (`num_heads` is a positive int everywhere, `segment_ids` the documents of
`keras_attn.core.segments.DOCUMENTS` everywhere); `SURFACE_SPECS` holds the few names that mean
something else on one surface. The checks that enforce a spec are `keras_attn.validation`'s, one
per kind (`check_positive_int`, `check_rate`, `check_bool`, `check_choice`, `check_position`,
`check_segment_ids` for every segment-id argument, `check_tensor` for the other tensors), run before
any TensorFlow op, and for a built layer's inputs Keras's `InputSpec` set in `build` (checked by
Keras at every call, so a layer built on width 8 refuses width 6). Tensor values (negative or huge
ids, NaN) are checked when they are known (eager); in a graph or under XLA the shapes and dtypes are.

The specs are the code: each names its checking function (`ArgSpec.check`, a name of `CHECKS`,
the `keras_attn.validation` check of its kind), and `enforce()`, run at the end of
`keras_attn/__init__.py`, wraps every public function of `ENFORCED_MODULES` and the `__init__` and
`call` of every public class and of its keras_attn bases in `checked`, which runs those checks on the
arguments given before the surface runs (tests/test_contracts.py fails for a public surface not
wrapped, and runs every spec's check on a good and a bad value). What the entry does not check:

- tensor arguments (`TENSOR_KINDS`) beyond their dtype (a float spec's tensor must be a float, any
  tensor numeric or bool: `_check_tensor_dtype`): their spec's check (`check_tensor`: dtype kind and
  rank) is named and tested, but the entry leaves the rest to the surface, whose checks need the other
  arguments (a mask's `(batch, seq)` is the inputs', a segment id's length the query's or the
  key's, a built layer's width its `InputSpec`) and name the expected shape, which the rank alone
  cannot;
- `"object"` arguments (initializers, activations, seeds, patterns, position-bias layers, models,
  data sets): Keras or the library's registry resolves them and refuses what it cannot resolve;
- Keras's own constructor arguments of our layers (`name`, `dtype`, `trainable`, ... through
  `**kwargs`) and `keras_attn.visualization` (which the core never imports; it checks its own);
- combinations of arguments (`num_key_value_heads` divides `num_heads`, `flash_attention` against
  `implementation`): the surface's own checks, which see them together.

`public_arguments()` walks the public API (`keras_attn.__all__` and the public submodules);
tests/test_contracts.py fails for an argument without a spec and tries the bad values of each
spec's kind on every surface it has a valid call for.

To give a new argument its contract, add one line to `SPECS` (or to `SURFACE_SPECS` when its name
already means something else elsewhere):

>>> spec("keras_attn.scaled_dot_product_attention", "segment_ids").dtype
'int'
>>> spec("keras_attn.packing.place", "lengths").range
'[0, row_length]'
"""

import dataclasses
import functools
import importlib
import inspect
import numbers

import keras
import numpy as np
import tensorflow as tf

from keras_attn import validation

# The public modules whose `__all__` is walked (the package itself first).
PUBLIC_MODULES = (
    "keras_attn",
    "keras_attn.packing",
    "keras_attn.patterns",
    "keras_attn.ops",
    "keras_attn.attention_families",
    "keras_attn.visualization",
)
# The public modules whose surfaces `enforce` wraps: the core library (`keras_attn.visualization`,
# which the core never imports, checks its own arguments).
ENFORCED_MODULES = PUBLIC_MODULES[:-1]


@dataclasses.dataclass(frozen=True)
class ArgSpec:
    """One argument's contract.

    Attributes:
        kind: the class of value, which names its check and the bad values the contract test
            tries: a scalar kind of `SCALAR_KINDS`, a tensor kind of `TENSOR_KINDS`, or `"object"`
            (a Python object resolved by Keras or a registry, which refuses what it cannot resolve).
        meaning: what the argument says, in a few words.
        dtype: a tensor's dtype kind, `"int"`, `"float"`, `"bool"` (or two joined by `|`); `None`
            for a scalar.
        rank: a tensor's rank(s) as a string, e.g. `"2"` or `"2-4"`; `None` for a scalar.
        range: the values allowed, e.g. `">= 0"`, `"finite"`, `"[0, 1)"`; `""` when any of the dtype.
        relation: the sizes it shares with the other inputs, e.g. `"(batch, length) of inputs"`,
            `"width the layer was built on"`.
        choices: for a `"choice"`, a function of no arguments returning the allowed values (read
            when checked: the registries are defined after this module).
        check: the name of its checking function in `CHECKS`, run by `checked` at the entry of
            every surface taking the argument; by default the one of its kind (`KIND_CHECKS`),
            `None` for an `"object"`.
    """

    kind: str
    meaning: str
    dtype: str = None
    rank: str = None
    range: str = ""
    relation: str = ""
    choices: object = None
    check: str = None

    def __post_init__(self):
        if self.check is None and self.kind != OBJECT:
            object.__setattr__(self, "check", KIND_CHECKS[self.kind])


SCALAR_KINDS = (
    "bool",
    "truth_value",
    "bool_or_none",
    "positive_int",
    "positive_int_or_none",
    "rate",
    "rate_or_none",
    "positive_number",
    "positive_number_or_none",
    "non_negative_number_or_none",
    "number_above_1",
    "choice",
    "axes",
    "position",
)
TENSOR_KINDS = (
    "sequence",  # float (batch, seq, features) or (batch, seq, heads, depth) inputs
    "token_ids",
    "segment_ids",
    "positions",
    "padding_mask",
    "attention_mask",
    "bias",
    "document_mask",
    "losses",
    "lengths",
    "cache",
    "logits",
)
OBJECT = "object"
# The checking function (a name of `CHECKS`) of each kind.
KIND_CHECKS = {
    "bool": "check_bool",
    "truth_value": "check_truth_value",
    "bool_or_none": "check_bool",
    "positive_int": "check_positive_int",
    "positive_int_or_none": "check_positive_int",
    "rate": "check_rate",
    "rate_or_none": "check_rate",
    "positive_number": "check_number",
    "positive_number_or_none": "check_number",
    "non_negative_number_or_none": "check_number",
    "number_above_1": "check_number",
    "choice": "check_choice",
    "axes": "check_axes",
    "position": "check_position",
    **{kind: "check_tensor" for kind in TENSOR_KINDS},
}

_INT_IDS = dict(dtype="int", rank="2", range="[0, 2**31 - 1], one document per id (DOCUMENTS)")


def _ids(meaning, relation="(batch, length) of the inputs"):
    return ArgSpec("segment_ids", meaning, relation=relation, **_INT_IDS)


def _padding(meaning, relation="(batch, seq) of the inputs"):
    return ArgSpec("padding_mask", meaning, dtype="bool|int", rank="2", relation=relation)


def _sequence(meaning, rank="3", relation="width the layer was built on", dtype="float"):
    return ArgSpec("sequence", meaning, dtype=dtype, rank=rank, relation=relation)


# The layers that read int and bool inputs as floats, as Keras's own layers do (`utils.as_float_inputs`).
_CAST_TO_FLOAT = "float|int|bool"


def _object(meaning):
    return ArgSpec(OBJECT, meaning)


def _registry(module, name, first=()):
    """The choices `first + tuple(module.name)`, read when checked."""
    return lambda: (*first, *getattr(importlib.import_module(module), name))


_IMPLEMENTATIONS = _registry("keras_attn.kernels", "KERNELS", first=("auto",))


SPECS = {
    # Sizes and counts.
    "num_heads": ArgSpec("positive_int", "attention heads (query heads)", range="[1, 2**31 - 1]"),
    "key_dim": ArgSpec("positive_int", "depth of each query/key head", range="[1, 2**31 - 1]"),
    "value_dim": ArgSpec("positive_int_or_none", "depth of each value head (default key_dim)"),
    "num_key_value_heads": ArgSpec("positive_int_or_none", "key/value heads (grouped-query), divides num_heads"),
    "intermediate_dim": ArgSpec("positive_int", "width of the feed-forward hidden layer"),
    "output_dim": ArgSpec("positive_int_or_none", "output width (default the input width)"),
    "num_buckets": ArgSpec("positive_int", "hash buckets (LSH) or relative-position buckets"),
    "num_hashes": ArgSpec("positive_int", "rounds of hashing (LSH)"),
    "chunk_size": ArgSpec("positive_int", "tokens per chunk; never changes the output, only the cost"),
    "num_random_features": ArgSpec("positive_int_or_none", "random features of the FAVOR+ map"),
    "max_length": ArgSpec("positive_int", "longest sequence a Linformer projection takes"),
    "projected_length": ArgSpec("positive_int", "keys after Linformer's projection"),
    "sequence_length": ArgSpec("positive_int", "positions of the table (the longest input)"),
    "max_documents": ArgSpec("positive_int_or_none", "most documents a packed row holds"),
    "max_distance": ArgSpec("positive_int", "distance past which relative positions share a bucket"),
    "encoding_dim": ArgSpec("positive_int_or_none", "width of a concatenated encoding"),
    "vocabulary_size": ArgSpec("positive_int", "rows of the token table; token ids are below it"),
    "embedding_dim": ArgSpec("positive_int", "width of the embeddings"),
    "sliding_window": ArgSpec("positive_int_or_none", "keys before (and at) each query it sees"),
    "row_length": ArgSpec("positive_int", "tokens of a packed row"),
    "window": ArgSpec("positive_int", "documents packed together (pack); keys of the window (masks)"),
    "stride": ArgSpec("positive_int", "distance between the keys of a strided pattern"),
    "block_size": ArgSpec("positive_int", "tokens of a local block"),
    "num_tokens": ArgSpec("positive_int", "leading tokens that see and are seen by all"),
    # Rates, scales and numbers.
    "dropout": ArgSpec("rate", "dropout rate", range="[0, 1)"),
    "attention_dropout": ArgSpec("rate_or_none", "dropout of the attention weights (default dropout)"),
    "dropout_rate": ArgSpec("rate", "dropout of the attention weights", range="[0, 1)"),
    "scale": ArgSpec(
        "positive_number_or_none", "inverse temperature of the softmax", range="(0, float32 max]", check="check_scale"
    ),
    "logit_soft_cap": ArgSpec(
        "positive_number_or_none",
        "tanh cap of the scaled logits (Gemma 2)",
        range="[float32 smallest normal, float32 max]",
        check="check_soft_cap",
    ),
    "max_wavelength": ArgSpec("number_above_1", "longest wavelength of the sinusoids", range="> 1"),
    "scaling_factor": ArgSpec("positive_number", "divides the rotary positions", range="> 0"),
    "layer_norm_epsilon": ArgSpec("positive_number", "epsilon of the layer norms", range="> 0"),
    # Flags.
    "use_bias": ArgSpec("bool", "projections with biases"),
    "flash_attention": ArgSpec("bool_or_none", "Keras's flash switch: True/False/None"),
    "use_gate": ArgSpec("bool", "gated attention output"),
    "hard": ArgSpec("bool", "one-hot weights (argmax) in the forward pass"),
    "causal": ArgSpec("bool", "a query sees no later key"),
    "is_causal": ArgSpec("bool", "a query sees no later key"),
    # Keras's layers take a truth value here (its own tests pass `use_causal_mask=0`).
    "use_causal_mask": ArgSpec("truth_value", "a query sees no later key (this call)"),
    "redraw_features": ArgSpec("bool", "new random features at each training step"),
    "share_key_value": ArgSpec("bool", "one Linformer projection for keys and values"),
    "projection_per_head": ArgSpec("bool", "a Linformer projection per head"),
    "bidirectional": ArgSpec("bool", "relative buckets distinguish before and after"),
    "mask_zero": ArgSpec("bool", "token id 0 is padding (a Keras mask)"),
    "scale_embeddings": ArgSpec("bool", "token embeddings times sqrt(embedding_dim)"),
    "norm_first": ArgSpec("bool", "pre-norm (True) or post-norm block"),
    "truncate": ArgSpec("bool", "cut a document longer than its row"),
    "return_attention_scores": ArgSpec("bool", "also return the weights"),
    "return_weights": ArgSpec("bool", "also return the weights"),
    "return_report": ArgSpec("bool", "also return what was converted"),
    "strict": ArgSpec("bool", "refuse a layer that cannot be converted"),
    "training": ArgSpec("bool_or_none", "training mode (dropout)"),
    "zero_unattended_keys": ArgSpec("bool", "zero the keys and values no query may attend to"),
    "enabled": ArgSpec("bool_or_none", "whether auto measures (None: as set)"),
    "tie_tolerance": ArgSpec(
        "non_negative_number_or_none", "fraction of the fastest time within which the lighter kernel wins", range=">= 0"
    ),
    # Choices.
    "implementation": ArgSpec("choice", "attention kernel by name, or 'auto'", choices=_IMPLEMENTATIONS),
    "rows_without_keys": ArgSpec(
        "choice",
        "output of a query with no allowed key: zero, or Keras's layer's",
        choices=_registry("keras_attn.layers.multi_head_attention", "ROWS_WITHOUT_KEYS"),
    ),
    "feature_map": ArgSpec(
        "choice",
        "feature map of linear attention",
        choices=_registry("keras_attn.families.linear_attention", "FEATURE_MAPS"),
    ),
    "mode": ArgSpec(
        "choice", "'mean' or 'max' pooling", choices=_registry("keras_attn.blocks.masked_global_pooling", "_MODES")
    ),
    "merge_mode": ArgSpec(
        "choice",
        "'add' or 'concat' the encoding",
        choices=_registry("keras_attn.positions.sinusoidal_position_encoding", "_MERGE_MODES"),
    ),
    "position_encoding": ArgSpec(
        "choice",
        "'learned' or 'sinusoidal' positions",
        choices=_registry("keras_attn.positions.token_and_position_embedding", "_POSITION_ENCODINGS"),
    ),
    "strategy": ArgSpec(
        "choice", "'first_fit' or 'best_fit' packing", choices=_registry("keras_attn.packing", "STRATEGIES")
    ),
    "attention_axes": ArgSpec("axes", "axes attention runs over (a non-empty tuple)"),
    # Positions.
    "start_index": ArgSpec("position", "position of the first token", dtype="int", rank="0", range=">= 0"),
    "query_offset": ArgSpec("position", "position of the first query among the keys", dtype="int", range=">= 0"),
    "cache_update_index": ArgSpec(
        "position", "where a cached step writes", dtype="int", rank="0", range=">= 0", check="check_cache_index"
    ),
    "self_attention_cache_update_index": ArgSpec(
        "position", "where a cached step writes", dtype="int", rank="0", range=">= 0", check="check_cache_index"
    ),
    "query_len": ArgSpec("position", "queries of the mask", dtype="int", rank="0", range=">= 0"),
    "key_len": ArgSpec("position", "keys of the mask", dtype="int", rank="0", range=">= 0"),
    # Tensors: inputs.
    "inputs": _sequence("the sequence (batch, seq, features)"),
    "query": _sequence("queries (batch, query_len, features) or (batch, query_len, heads, depth)", rank="3-4"),
    "value": _sequence("values (batch, key_len, features); None for self-attention", rank="3-4"),
    "key": _sequence("keys (batch, key_len, features); default value", rank="3-4"),
    "decoder_sequence": _sequence("decoder inputs (batch, target_len, features)"),
    "encoder_sequence": _sequence("encoder outputs (batch, source_len, features)"),
    "token_ids": ArgSpec("token_ids", "token ids", dtype="int", rank="2", range="[0, vocabulary_size)"),
    "positions": ArgSpec(
        "positions", "each token's position", dtype="int", rank="2", range=">= 0", relation="(batch, seq) of inputs"
    ),
    "logits": ArgSpec("logits", "attention logits (..., query_len, key_len)", dtype="float", rank=">= 2"),
    "losses": ArgSpec("losses", "per-token or per-document losses", dtype="float", rank="2", range="any float"),
    # Tensors: documents.
    "segment_ids": _ids("documents of a packed row, 0 for padding"),
    "query_segment_ids": _ids("the queries' documents", "(batch, query_len)"),
    "key_segment_ids": _ids("the keys' documents", "(batch, key_len)"),
    "decoder_segment_ids": _ids("the decoder tokens' documents", "(batch, target_len)"),
    "encoder_segment_ids": _ids("the encoder tokens' documents", "(batch, source_len)"),
    "self_attention_cache_segment_ids": _ids("documents of the tokens the cache holds", "(batch, cache_len)"),
    "document_mask": ArgSpec(
        "document_mask", "the rows' real documents", dtype="bool|int", rank="2", relation="(batch, max_documents)"
    ),
    # Tensors: masks and biases.
    "mask": ArgSpec("attention_mask", "True where a query may attend a key", dtype="bool|int", rank="2-4"),
    "query_mask": _padding("real queries", "(batch, query_len)"),
    "value_mask": _padding("real keys", "(batch, key_len)"),
    "key_mask": _padding("real keys", "(batch, key_len)"),
    "padding_mask": _padding("real tokens"),
    "decoder_padding_mask": _padding("real decoder tokens", "(batch, target_len)"),
    "encoder_padding_mask": _padding("real encoder tokens", "(batch, source_len)"),
    "attention_mask": ArgSpec("attention_mask", "True where a query may attend a key", dtype="bool|int", rank="2-4"),
    "decoder_attention_mask": ArgSpec("attention_mask", "decoder self-attention mask", dtype="bool|int", rank="2-3"),
    "encoder_attention_mask": ArgSpec("attention_mask", "cross-attention mask", dtype="bool|int", rank="2-3"),
    "bias": ArgSpec("bias", "added to the logits; -inf masks", dtype="float", rank="4", relation="broadcasts"),
    "attention_bias": ArgSpec("bias", "added to the logits; -inf masks", dtype="float", rank="4"),
    # Tensors: caches.
    "cache": ArgSpec("cache", "key/value cache (batch, 2, max_len, heads, depth)", dtype="float", rank="5"),
    "self_attention_cache": ArgSpec("cache", "the decoder self-attention's cache", dtype="float", rank="5"),
    "cross_attention_cache": ArgSpec("cache", "precomputed cross-attention keys/values", dtype="float", rank="5"),
    "lengths": ArgSpec("lengths", "tokens of each document", dtype="int", rank="1", range="[0, row_length]"),
    # Objects resolved by Keras or by the library's registries.
    "output_shape": _object("output shape: an int or a shape tuple (Keras)"),
    "seed": _object("Keras seed: int, None or SeedGenerator"),
    "seed_generator": _object("keras.random.SeedGenerator for dropout"),
    "attention_pattern": _object("a keras_attn.patterns pattern or its name"),
    "pattern": _object("a keras_attn.patterns pattern or its name"),
    "position_bias": _object("a position bias layer (ALiBi, RelativePositionBias) or None"),
    "self_attention": _object("the attention layer of the block"),
    "activation": _object("a Keras activation"),
    "dataset": _object("tf.data.Dataset of documents (1-D tokens or dicts)"),
    "model": _object("a Keras model or layer"),
    "left": _object("a pattern"),
    "right": _object("a pattern"),
    "identifier": _object("a pattern, its name or its config"),
    "values": ArgSpec("sequence", "model outputs to unpack", dtype="any", rank=">= 2", relation="(batch, ...)"),
}
for _name in (
    "kernel_initializer",
    "bias_initializer",
    "kernel_regularizer",
    "bias_regularizer",
    "activity_regularizer",
    "kernel_constraint",
    "bias_constraint",
    "initializer",
    "embeddings_initializer",
    "projection_initializer",
):
    SPECS[_name] = _object("a Keras initializer, regularizer or constraint")
for _name, _meaning in {
    # keras_attn.visualization: plots and pages of captured weights (checked by their own module).
    "weights": "attention weights (batch, heads, query_len, key_len)",
    "query_tokens": "labels of the queries",
    "key_tokens": "labels of the keys",
    "example": "which example of the batch",
    "name": "the layer's name",
    "attention_map": "one layer's AttentionMap",
    "attention_maps": "AttentionMaps of a model",
    "max_queries": "most queries shown",
    "max_keys": "most keys shown",
    "query_start": "first query shown",
    "max_ticks": "most tick labels",
    "columns": "heads per row of the figure",
    "labelled": "label the axes",
    "head": "which head",
    "figure": "a matplotlib figure",
    "dpi": "resolution of the image",
    "path": "file to write",
    "title": "page or figure title",
    "subtitle": "page subtitle",
    "extra_html": "HTML appended to the page",
    "tokens": "labels of the tokens",
    "scores": "a score per token",
}.items():
    SPECS[_name] = _object(_meaning)
SPECS["query_positions"] = SPECS["key_positions"] = _object("positions of the shown queries or keys")

# Names that mean something else on one surface.
_BLOCK_KEY_DIM = ArgSpec("positive_int_or_none", "depth of each query/key head (None: the width / num_heads)")
SURFACE_SPECS = {
    "keras_attn.ops.dot_product_attention": {
        "query": _sequence("queries (batch, query_len, heads, depth)", rank="4", relation="Keras's layout"),
        "key": _sequence("keys (batch, key_len, kv_heads, depth)", rank="4", relation="Keras's layout"),
        "value": _sequence("values (batch, key_len, kv_heads, depth)", rank="4", relation="Keras's layout"),
        "mask": ArgSpec("attention_mask", "True where a query may attend a key", dtype="bool", rank="2-4"),
        "attn_logits_soft_cap": ArgSpec(
            "positive_number_or_none",
            "tanh cap of the logits (Keras's argument)",
            range="[float32 smallest normal, float32 max]",
            check="check_soft_cap",
        ),
    },
    "keras_attn.scaled_dot_product_attention": {
        "query": _sequence("queries (batch, query_len, heads, depth)", rank="4", relation="depth of key"),
        "key": _sequence("keys (batch, key_len, kv_heads, depth)", rank="4", relation="batch of query"),
        "value": _sequence("values (batch, key_len, kv_heads, value_depth)", rank="4", relation="key_len of key"),
    },
    "keras_attn.TransformerEncoder.__init__": {"key_dim": _BLOCK_KEY_DIM},
    "keras_attn.TransformerDecoder.__init__": {"key_dim": _BLOCK_KEY_DIM},
    "keras_attn.TokenAndPositionEmbedding.__init__": {
        "sequence_length": ArgSpec(
            "positive_int_or_none", "positions of the learned table (None: sinusoidal, any length)"
        )
    },
    "keras_attn.RotaryEmbedding.call": {
        "inputs": _sequence("queries or keys (batch, seq, heads, depth)", rank="4", relation="any even depth")
    },
    "keras_attn.FeedForward.call": {"inputs": _sequence("features (batch, ..., features)", rank=">= 2")},
    "keras_attn.MaskedGlobalPooling.call": {"inputs": _sequence("the sequence (batch, seq, features)", relation="")},
    "keras_attn.SinusoidalPositionEncoding.call": {
        "inputs": _sequence(
            "the sequence (batch, seq, features)", relation="width fits encoding_dim", dtype=_CAST_TO_FLOAT
        )
    },
    "keras_attn.AttentionPooling.call": {
        "inputs": _sequence("the sequence (batch, seq, features)", dtype=_CAST_TO_FLOAT)
    },
    "keras_attn.TransformerEncoder.call": {
        "inputs": _sequence("the sequence (batch, seq, features)", dtype=_CAST_TO_FLOAT)
    },
    "keras_attn.TransformerDecoder.call": {
        "decoder_sequence": _sequence("decoder inputs (batch, target_len, features)", dtype=_CAST_TO_FLOAT)
    },
    "keras_attn.masked_softmax": {
        "mask": ArgSpec("attention_mask", "True where a logit counts", dtype="bool", relation="broadcasts to logits")
    },
    "keras_attn.sliding_window_mask": {"window": ArgSpec("positive_int", "keys before (and at) each query it sees")},
    "keras_attn.packing.pack": {
        "row_length": _object("tokens of a packed row: an int, or {feature: int} (checked by pack, per feature)")
    },
    "keras_attn.packing.place": {
        "lengths": ArgSpec("lengths", "tokens of each document", dtype="int", rank="1", range="[0, row_length]")
    },
    "keras_attn.packing.mean_over_documents": {
        "losses": ArgSpec("losses", "per-document losses", dtype="float", rank="2", relation="(batch, max_documents)")
    },
    "keras_attn.packing.mean_over_tokens": {
        "losses": ArgSpec("losses", "per-token losses", dtype="float", rank="2", relation="(batch, length)")
    },
    "keras_attn.attention_families.build": {
        "name": ArgSpec(
            "choice", "a family of FAMILIES", choices=_registry("keras_attn.attention_families", "FAMILIES")
        )
    },
    "keras_attn.explain_implementation": {
        "query_shape": _object("(batch, query_len, heads, depth) of the call, None entries unknown"),
        "key_shape": _object("(batch, key_len, kv_heads, depth); default query_shape"),
        "value_shape": _object("(batch, key_len, kv_heads, value_depth); default key_shape"),
        "dtype": _object("the compute dtype of query, key and value (a float dtype, standardized by Keras)"),
        "mask_shape": _object("shape of a boolean mask, or None"),
        "bias_shape": _object("shape of an additive bias, or None"),
        "packed": ArgSpec("bool", "the call has segment ids"),
    },
    "keras_attn.tune": {
        "lengths": _object("sequence lengths of the calibration grid (positive ints)"),
        "batch_sizes": _object("batch sizes of the calibration grid (positive ints)"),
        "heads": ArgSpec("positive_int", "heads of the calibration calls"),
        "depth": ArgSpec("positive_int", "depth of the calibration calls"),
        "repeats": ArgSpec("positive_int", "timed runs per cell"),
        "settings": _object("the call kinds measured (causal, bidirectional, packed, ...)"),
        "measure_memory": ArgSpec("bool", "also measure peak memory (needs TF's BFC CPU allocator)"),
        "verbose": ArgSpec("bool", "print each cell"),
    },
}


def spec(surface, name):
    """The `ArgSpec` of argument `name` on `surface` (e.g. `"keras_attn.MultiHeadAttention.call"`),
    or `None` when it has none (which the contract test refuses)."""
    return SURFACE_SPECS.get(surface, {}).get(name) or SPECS.get(name)


def public_arguments():
    """`[(surface, argument name)]` for every named argument of every public function, and of every
    public class's constructor and `call` (its Keras base classes' own arguments excluded)."""
    arguments = []
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        for name in _public_names(module):
            thing = getattr(module, name)
            if inspect.ismodule(thing) or not callable(thing):
                continue
            surface = f"{module_name}.{name}"
            if inspect.isclass(thing):
                for method in ("__init__", "call"):
                    arguments += [(f"{surface}.{method}", arg) for arg in _class_parameters(thing, method)]
            else:
                arguments += [(surface, arg) for arg in _named_parameters(thing)]
    return arguments


def _public_names(module):
    """`module.__all__`, or the public names it defines itself (`keras_attn.patterns` has no `__all__`)."""
    if hasattr(module, "__all__"):
        return module.__all__
    return [
        name
        for name, thing in vars(module).items()
        if not name.startswith("_") and getattr(thing, "__module__", None) == module.__name__
    ]


def _class_parameters(klass, method):
    """The parameters of `method` on `klass` and on its keras_attn bases reached through `**kwargs`."""
    names = []
    for base in klass.__mro__:
        if base.__module__.startswith("keras_attn") and method in vars(base):
            names += [name for name in _named_parameters(vars(base)[method])[1:] if name not in names]
    return names


def _named_parameters(function):
    return [
        parameter.name
        for parameter in inspect.signature(function).parameters.values()
        if parameter.kind not in (parameter.VAR_KEYWORD, parameter.VAR_POSITIONAL)
    ]


def _or_none(spec):
    return spec.kind.endswith("_or_none")


def _check_rate(spec, name, value):
    return value if value is None and _or_none(spec) else validation.check_rate(name, value)


def _check_number(spec, name, value):
    if spec.kind == "non_negative_number_or_none":
        return validation.check_number(name, value, at_least=0, allow_none=True)
    bound = 1 if spec.kind == "number_above_1" else 0
    return validation.check_number(name, value, above=bound, allow_none=_or_none(spec))


def _check_cache_index(spec, name, value):
    """A cache index is a position whose range is the cache's: an int is left to the surface, which names
    that range (`[0, cache_len - new tokens]`); anything else is refused as a position."""
    if isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_)):
        return value
    return validation.check_position(name, value)


def _check_axes(spec, name, value):
    """`None`, an int, or a non-empty tuple or list of ints (Keras's `attention_axes`)."""
    ints = value if isinstance(value, (list, tuple)) else (value,)
    valid = value is None or (
        len(ints) > 0 and all(isinstance(axis, numbers.Integral) and not isinstance(axis, bool) for axis in ints)
    )
    if not valid:
        raise ValueError(f"`{name}` must be None, an int or a non-empty sequence of ints. Received: {name}={value!r}")
    return value


def _check_tensor(spec, name, value):
    """A tensor's dtype kind and rank against its spec (`None`: not given); its sizes against the other
    inputs and its values are the surface's to check (they need the other arguments)."""
    if value is None:
        return value
    dtype = getattr(value, "dtype", None)
    shape = getattr(value, "shape", None)
    if dtype is None or shape is None:
        array = np.asarray(value)  # a nested list: its NumPy dtype and shape, no TensorFlow op
        dtype, shape = array.dtype, array.shape
    try:
        received = keras.backend.standardize_dtype(dtype)
    except ValueError:  # strings, objects: no Keras dtype, and no kind a spec allows
        received = str(getattr(dtype, "name", dtype))
    kind = (
        "bool" if received == "bool" else "int" if "int" in received else "float" if "float" in received else received
    )
    rank = None if shape is None or getattr(shape, "rank", 0) is None else len(shape)
    kinds = spec.dtype.split("|")
    if ("any" not in kinds and kind not in kinds) or (rank is not None and not _rank_allowed(spec.rank, rank)):
        raise ValueError(
            f"`{name}` must be a tensor of dtype {' or '.join(kinds)} and rank {spec.rank}. "
            f"Received: {name}.dtype={received}, {name}.shape={tuple(shape)}"
        )
    return value


def _check_tensor_dtype(spec, name, value):
    """At the entry, a tensor's dtype alone, where no other argument changes what it may be: a float
    tensor's (a `"float"` spec) must be a float, any tensor's numeric or bool (a string or object
    tensor reaches no kernel). The rest of `_check_tensor` is the surface's (module docstring)."""
    dtype = getattr(value, "dtype", None)
    if dtype is None:
        return
    try:
        received = keras.backend.standardize_dtype(dtype)
    except ValueError:  # strings, objects
        received = str(getattr(dtype, "name", dtype))
    numeric = received == "bool" or "int" in received or "float" in received
    if not numeric or (spec.dtype == "float" and "float" not in received):
        allowed = "numeric or bool" if spec.dtype == "any" else " or ".join(spec.dtype.split("|"))
        raise ValueError(
            f"`{name}` must be a tensor of dtype {allowed}. "
            f"Received: {name}.dtype={received}, {name}.shape={tuple(value.shape)}"
        )


def _rank_allowed(allowed, rank):
    """Whether `rank` is one of `allowed`: `"2"`, `"2-4"`, `">= 2"`, or `None` for any."""
    if allowed is None:
        return True
    if allowed.startswith(">="):
        return rank >= int(allowed[2:])
    low, _, high = allowed.partition("-")
    return int(low) <= rank <= int(high or low)


# Each checking function a spec names, as `check(spec, name, value)`: the validators of
# `keras_attn.validation`, given what the spec says (its choices, whether `None` is allowed).
CHECKS = {
    "check_bool": lambda spec, name, value: validation.check_bool(name, value, allow_none=_or_none(spec)),
    "check_truth_value": lambda spec, name, value: validation.check_bool(name, value, allow_int=True),
    "check_positive_int": lambda spec, name, value: validation.check_positive_int(name, value, _or_none(spec)),
    "check_rate": _check_rate,
    "check_number": _check_number,
    "check_scale": lambda spec, name, value: validation.check_scale(value),
    "check_soft_cap": lambda spec, name, value: validation.check_soft_cap(value, name),
    "check_choice": lambda spec, name, value: validation.check_choice(name, value, spec.choices()),
    "check_axes": _check_axes,
    "check_cache_index": _check_cache_index,
    "check_position": lambda spec, name, value: validation.check_position(name, value),
    "check_tensor": _check_tensor,
}


# Plain Python on Python values: AutoGraph, converting a traced surface, must not convert the checks
# (TensorFlow 2.19's turned a spec's `choices` function into None).
@tf.autograph.experimental.do_not_convert
def check_arguments(surface, arguments):
    """Runs the check of each scalar argument's spec on `surface` (`{name: value}`), before the surface
    runs: the first bad value raises its check's `ValueError` naming it. Tensor arguments are left to the
    surface (see the module docstring)."""
    for name, value in arguments.items():
        argument = spec(surface, name)
        if argument is not None and argument.kind in SCALAR_KINDS:
            CHECKS[argument.check](argument, name, value)
        elif argument is not None and argument.kind in TENSOR_KINDS:
            _check_tensor_dtype(argument, name, value)


def _is_default(value, default):
    """Whether `value` is the parameter's own default (`None`, a number, a string: compared by value)."""
    if default is inspect.Parameter.empty:
        return False
    if value is default:
        return True
    return isinstance(default, (bool, int, float, str)) and type(value) is type(default) and value == default


def checked(function, surface):
    """`function` with `check_arguments` run on the arguments it is given (its defaults are valid, also
    when given explicitly, as `from_config` gives every one); `function.__contract__` names its
    surface. A call that does not bind is left to `function` to refuse."""
    signature = inspect.signature(function)
    defaults = {name: parameter.default for name, parameter in signature.parameters.items()}

    @functools.wraps(function)
    def checked_function(*args, **kwargs):
        try:
            arguments = signature.bind_partial(*args, **kwargs).arguments
        except TypeError:
            return function(*args, **kwargs)  # raises Python's own TypeError naming the argument
        given = {name: value for name, value in arguments.items() if not _is_default(value, defaults.get(name))}
        check_arguments(surface, given)
        return function(*args, **kwargs)

    checked_function.__signature__ = (
        signature  # for `inspect.getfullargspec` (Keras's auto config), which does not unwrap
    )
    checked_function.__contract__ = surface
    # A surface runs as written inside a traced function: its loops are `tf.while_loop`s and need no
    # AutoGraph, which converts everything a traced function calls and mis-converted the kernels
    # (TensorFlow 2.20 called a converted helper with its caller's arguments).
    return tf.autograph.experimental.do_not_convert(checked_function)


def enforce():
    """Wraps every public surface in `checked`: each public function of `ENFORCED_MODULES` (rebound in
    its public module) and the `__init__` and `call` of each public class and of its keras_attn bases.
    Called once, at the end of `keras_attn/__init__.py`."""
    for module_name in ENFORCED_MODULES:
        module = importlib.import_module(module_name)
        for name in _public_names(module):
            thing = getattr(module, name)
            surface = f"{module_name}.{name}"
            if inspect.isclass(thing):
                _enforce_class(thing, surface)
            elif callable(thing) and not inspect.ismodule(thing) and not hasattr(thing, "__contract__"):
                setattr(module, name, checked(thing, surface))


def _enforce_class(klass, surface):
    for base in klass.__mro__:
        if not base.__module__.startswith("keras_attn"):
            continue
        for method in ("__init__", "call"):
            function = vars(base).get(method)
            if function is not None and not hasattr(function, "__contract__"):
                setattr(base, method, checked(function, f"{surface}.{method}"))
