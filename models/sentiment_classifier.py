"""The IMDB sentiment classifier: token ids in, positive-class probability out.

Two branches, each with its own logit, combined by a learnt weighted sum:

- attention, on `attention_inputs`:
  - "tokens": `TokenAndPositionEmbedding` (with the padding mask) over the first
    `sequence_length` tokens, `num_layers` `TransformerEncoder` blocks (`review_encoder`, which a
    masked-language-model pretraining may initialise: `load_encoder_weights`) and
    `MaskedGlobalPooling` over the real tokens (mean, max or both) feed a dense logit;
  - "ngrams": `WeightedNgramEmbedding` of the whole review's distinct unigrams and hashed bigrams
    (each embedded once, scaled by the n-gram branch's feature weight) and `AttentionPooling` (a
    learnt query attends over them) feed a dense logit;
- n-gram: a sparse bag of the unigrams and hashed bigrams of the whole review (up to
  `max_tokens`), each weighted by its naive-Bayes log-count ratio (`NgramBag`), feeds a linear
  logit (`SparseLinear`): NBSVM's bag-of-n-grams logistic regression.

Tokenisation happens outside the model (in `tf.data`, or in the serving function), so the model
compiles with XLA and converts to ONNX.
"""

import dataclasses

import keras
import numpy as np

from appkit.cli import config_field
from keras_attn import AttentionPooling
from keras_attn import MaskedGlobalPooling
from keras_attn import TokenAndPositionEmbedding
from keras_attn import TransformerEncoder
from keras_attn import attention_families
from keras_attn.validation import check_choice
from models.bigram_embedding import HashedBigramEmbedding
from models.ngram_bag import WEIGHTINGS
from models.ngram_bag import NgramBag
from models.ngram_bag import check_bigram_ids
from models.packed_documents import PACKED_IDS
from models.packed_documents import SEGMENT_IDS
from models.packed_documents import TOKEN_INDEX
from models.packed_documents import GatherTokens
from models.sparse_linear import SparseLinear
from models.vocabulary import smallest_vocabulary_size
from models.weighted_ngram_embedding import WeightedNgramEmbedding

_POOLING_MODES = ("mean", "max")
BRANCHES = ("attention", "ngram")
ATTENTION_INPUTS = ("tokens", "ngrams")


@dataclasses.dataclass(frozen=True)
class SentimentClassifierConfig:
    """Sizes of the classifier; the defaults are the configuration the IMDB model card reports.

    Attributes:
        vocabulary_size: token vocabulary, padding (0) and OOV (1) included.
        max_tokens: longest token sequence the model reads (reviews are truncated to it).
        sequence_length: tokens the attention branch reads (the first ones).
        embedding_dim: width of the token embeddings and encoder blocks.
        num_layers: number of `TransformerEncoder` blocks.
        num_heads: attention heads per block.
        intermediate_dim: hidden size of each block's feed-forward network.
        dropout: dropout in the blocks and before the attention head.
        pooling: pooling modes over the encoder outputs, concatenated: any of "mean", "max".
        position_encoding: "learned" or "sinusoidal".
        bigram_buckets: size of the bigram feature space of the n-gram branch (and of
            `attention_inputs="ngrams"`): hash buckets, or bigrams in the learnt vocabulary.
        bigram_ids: how a bigram becomes a feature, one of `models.ngram_bag.BIGRAM_IDS` ("hashed":
            a hash bucket; "vocabulary": its own feature among the `bigram_buckets` bigrams found
            in most training reviews, `vocabulary_size` at most 46,340).
        attention_bigram_buckets: hashed bigram embeddings added to the attention branch's token
            embeddings (`HashedBigramEmbedding`), 0 for none.
        ngram_weighting: how the n-gram branch weighs its features, one of `models.ngram_bag.WEIGHTINGS`
            ("naive_bayes": NBSVM's log-count ratios; "idf": a TF-IDF vector).
        ngram_scale: norm of the n-gram vectors (see `NgramBag`).
        attention: the encoder blocks' self-attention family, a key of
            `keras_attn.attention_families.FAMILIES` ("dense": the blocks' own softmax attention).
        attention_inputs: what the attention branch reads, one of `ATTENTION_INPUTS`: "tokens"
            (token embeddings of the first `sequence_length` tokens through the encoder blocks) or
            "ngrams" (`WeightedNgramEmbedding` of the whole review's distinct n-grams,
            `embedding_dim` wide, pooled by `AttentionPooling` with `num_heads` heads; the encoder
            fields then play no part).
    """

    vocabulary_size: int = config_field(20_000, minimum=smallest_vocabulary_size())
    max_tokens: int = 2_048
    sequence_length: int = 512
    embedding_dim: int = 64
    num_layers: int = 1
    num_heads: int = 4
    intermediate_dim: int = 128
    dropout: float = 0.3
    pooling: tuple = ("mean", "max")
    position_encoding: str = "learned"
    bigram_buckets: int = 2**20
    bigram_ids: str = "hashed"
    attention_bigram_buckets: int = config_field(0, minimum=0)
    ngram_weighting: str = "naive_bayes"
    ngram_scale: float = 10.0
    attention: str = "dense"
    attention_inputs: str = "tokens"

    def __post_init__(self):
        if self.attention not in attention_families.FAMILIES:
            raise ValueError(
                f"`attention` must be one of {sorted(attention_families.FAMILIES)}. Received: attention={self.attention!r}"
            )
        check_choice("ngram_weighting", self.ngram_weighting, WEIGHTINGS)
        check_bigram_ids(self.bigram_ids, self.vocabulary_size)
        check_choice("attention_inputs", self.attention_inputs, ATTENTION_INPUTS)
        if not self.pooling or any(mode not in _POOLING_MODES for mode in self.pooling):
            raise ValueError(
                f"`pooling` must be a non-empty sequence of {_POOLING_MODES}. Received: pooling={self.pooling!r}"
            )
        if self.embedding_dim % self.num_heads:  # each head's width is `embedding_dim // num_heads`
            raise ValueError(
                "`embedding_dim` must be a multiple of `num_heads`. Received: "
                f"embedding_dim={self.embedding_dim}, num_heads={self.num_heads}"
            )
        if not 0 < self.sequence_length <= self.max_tokens:
            raise ValueError(
                "`sequence_length` must be in [1, max_tokens]. Received: "
                f"sequence_length={self.sequence_length}, max_tokens={self.max_tokens}"
            )

    def to_dict(self):
        return {**dataclasses.asdict(self), "pooling": list(self.pooling)}

    @classmethod
    def from_dict(cls, values):
        return cls(**{**values, "pooling": tuple(values["pooling"])})


# Sizes of the families that need more than heads and head size: LSH's chunks and buckets
# (Reformer: about `sequence_length / chunk_size` buckets), Linformer's projected keys.
_FAMILY_OPTIONS = {
    "lsh": lambda config: {"chunk_size": 64, "num_buckets": max(2, 2 * (config.sequence_length // 128)), "seed": 0},
    "linformer": lambda config: {
        "max_length": config.sequence_length,
        "projected_length": min(64, config.sequence_length),
        "seed": 0,
    },
}


def self_attention_prototype(config):
    """The encoder blocks' self-attention of `config.attention`, a prototype each block copies;
    `None` for "dense" (the blocks' own `MultiHeadAttention`, with attention dropout)."""
    if config.attention == "dense":
        return None
    options = _FAMILY_OPTIONS.get(config.attention, lambda config: {})(config)
    return attention_families.build(
        config.attention, num_heads=config.num_heads, key_dim=config.embedding_dim // config.num_heads, **options
    )


# The fields of `SentimentClassifierConfig` that shape the attention branch's encoder
# (`review_encoder`): a pretrained encoder's must equal the classifier's to be loaded into it.
ENCODER_FIELDS = (
    "vocabulary_size",
    "sequence_length",
    "embedding_dim",
    "num_layers",
    "num_heads",
    "intermediate_dim",
    "position_encoding",
    "attention_bigram_buckets",
    "attention",
    "attention_inputs",
)


def review_encoder(token_ids, config, segment_ids=None):
    """The attention branch up to its last encoder block, on functional tensors.

    Token (and optional hashed bigram) embeddings of the first `sequence_length` ids, dropout and
    `num_layers` `TransformerEncoder` blocks. The classifier pools this for its logit; the
    masked language model of `models.masked_language_model` predicts masked tokens from it. Both
    build it here, so the layers carry the same names (`token_and_position_embedding`,
    `bigram_embedding`, `encoder_{i}`) and weights move between them by name.

    Args:
        token_ids: int32 `(batch, seq)`, 0 = padding.
        config: a `SentimentClassifierConfig` (its `ENCODER_FIELDS` and `dropout`).
        segment_ids: int32 `(batch, seq)` when `token_ids` are packed rows
            (`pipelines.batching.pack_documents`): positions restart at each document, attention
            and bigrams stay within it, so each document is encoded as it is alone.

    Returns:
        `(batch, min(seq, sequence_length), embedding_dim)`, with the Keras mask of the real tokens.
    """
    first_tokens = token_ids[:, : config.sequence_length]  # (batch, min(seq, sequence_length))
    segments = {} if segment_ids is None else {"segment_ids": segment_ids[:, : config.sequence_length]}
    hidden = TokenAndPositionEmbedding(
        config.vocabulary_size,
        config.sequence_length,
        config.embedding_dim,
        mask_zero=True,
        position_encoding=config.position_encoding,
        name="token_and_position_embedding",
    )(first_tokens, **segments)  # (batch, seq, embedding_dim)
    if config.attention_bigram_buckets:
        hidden = keras.layers.Add(name="token_and_bigram_embedding")(
            [
                hidden,
                HashedBigramEmbedding(config.attention_bigram_buckets, config.embedding_dim, name="bigram_embedding")(
                    first_tokens, **segments
                ),
            ]
        )
    hidden = keras.layers.Dropout(config.dropout, name="embedding_dropout")(hidden)
    for index in range(config.num_layers):
        hidden = TransformerEncoder(
            config.intermediate_dim,
            config.num_heads,
            dropout=config.dropout,
            self_attention=self_attention_prototype(config),
            name=f"encoder_{index}",
        )(hidden, **segments)  # (batch, seq, embedding_dim)
    return hidden


def build_review_encoder(config, packed=False):
    """`review_encoder` as a `keras.Model` named "review_encoder": int token ids `(batch, seq)` ->
    `(batch, min(seq, sequence_length), embedding_dim)`; what a pretraining checkpoint holds.

    `packed=True`: it reads packed rows instead, a dict of `packed_ids` and `segment_ids` (int32
    `(rows, row_length)`, `pipelines.batching.pack_documents`), with the same weights."""
    if not packed:
        token_ids = keras.Input((None,), dtype="int32", name="token_ids")
        return keras.Model(token_ids, review_encoder(token_ids, config), name="review_encoder")
    inputs = packed_inputs(config)
    return keras.Model(inputs, review_encoder(inputs[PACKED_IDS], config, inputs[SEGMENT_IDS]), name="review_encoder")


def packed_inputs(config):
    """The `keras.Input`s of packed rows: `{packed_ids, segment_ids}`, int32 `(rows, sequence_length)`.

    Raises:
        ValueError: `config` reads n-grams, not a token sequence (there is nothing to pack).
    """
    if config.attention_inputs != "tokens":
        raise ValueError(
            "Packed rows need `attention_inputs='tokens'` (the n-gram attention reads no token sequence). "
            f"Received: attention_inputs={config.attention_inputs!r}"
        )
    # Rows are always `sequence_length` long; a static length lets `implementation="auto"` predict
    # each kernel's cost (with an unknown length it can only take the dense kernel).
    length = config.sequence_length
    return {name: keras.Input((length,), dtype="int32", name=name) for name in (PACKED_IDS, SEGMENT_IDS)}


def load_encoder_weights(classifier, encoder):
    """Copies the weights of every layer of `encoder` (`build_review_encoder`) into the layer of the
    same name of `classifier` (`build_sentiment_classifier`, same `ENCODER_FIELDS`).

    Returns:
        The names of the layers copied.

    Raises:
        ValueError: `classifier` has no layer of that name or its weights differ in shape.
    """
    targets = {layer.name: layer for layer in classifier.layers}
    copied = []
    for layer in encoder.layers:
        if not layer.weights:
            continue
        target = targets.get(layer.name)
        shapes = [tuple(weight.shape) for weight in layer.weights]
        if target is None or [tuple(weight.shape) for weight in target.weights] != shapes:
            raise ValueError(
                f"`classifier` must have a layer {layer.name!r} with weights of shapes {shapes}. Received: "
                f"{None if target is None else [tuple(weight.shape) for weight in target.weights]}"
            )
        target.set_weights(layer.get_weights())
        copied.append(layer.name)
    return copied


def _attention_logit(token_ids, config, packed=None):
    """The attention branch of `config.attention_inputs`: its features, dropout, logit `(batch, 1)`.

    `packed`: the `packed_ids`, `segment_ids` and `token_index` inputs of the first
    `sequence_length` tokens of `token_ids`' reviews packed into rows; the encoder reads those rows
    and each review's hidden states are gathered back before the pooling, so that it pools one
    vector per review from the same states as over the padded batch."""
    if config.attention_inputs == "ngrams":
        features = _ngram_attention_features(token_ids, config)
    else:
        if packed is None:
            hidden = review_encoder(token_ids, config)  # (batch, seq, embedding_dim)
            mask = None  # the Keras mask of `hidden`
        else:
            rows = review_encoder(packed[PACKED_IDS], config, packed[SEGMENT_IDS])  # (rows, row_length, dim)
            hidden = GatherTokens(name="review_tokens")(rows, packed[TOKEN_INDEX])  # (batch, seq, embedding_dim)
            mask = keras.ops.not_equal(token_ids[:, : config.sequence_length], 0)  # (batch, seq)
        features = [MaskedGlobalPooling(mode, name=f"{mode}_pooling")(hidden, mask=mask) for mode in config.pooling]
        features = features[0] if len(features) == 1 else keras.layers.Concatenate(name="attention_features")(features)
    features = keras.layers.Dropout(config.dropout, name="attention_dropout")(features)
    return keras.layers.Dense(1, dtype="float32", name="attention_logit")(features)


def _ngram_attention_features(token_ids, config):
    """`(batch, embedding_dim)`: the whole review's distinct n-grams, embedded and weighted, attention-pooled."""
    hidden, counted = WeightedNgramEmbedding(
        config.vocabulary_size,
        config.bigram_buckets,
        config.embedding_dim,
        bigram_ids=config.bigram_ids,
        name="weighted_ngram_embedding",
    )(token_ids)  # (batch, 2 * seq - 1, embedding_dim) and each n-gram's first occurrence (batch, 2 * seq - 1)
    hidden = keras.layers.Dropout(config.dropout, name="embedding_dropout")(hidden)
    pooling = AttentionPooling(config.num_heads, config.embedding_dim // config.num_heads, name="attention_pooling")
    return pooling(hidden, mask=counted)


def adapt_ngram_weights(classifier, batches):
    """Learns the n-gram branch's feature weights from `batches` of `(token_ids, label)` (the
    training split only) and gives them to the attention branch's `WeightedNgramEmbedding`, if it
    has one: both read the same features."""
    bag = classifier.get_layer("ngram_bag")
    bag.adapt(batches)
    for layer in classifier.layers:
        if isinstance(layer, WeightedNgramEmbedding):
            layer.feature_weights.assign(bag.feature_weights)
            if bag.bigram_vocabulary is not None:
                layer.bigram_vocabulary.assign(bag.bigram_vocabulary)


def build_sentiment_classifier(config=SentimentClassifierConfig(), packed=False):
    """The classifier as a functional `keras.Model`: int token ids `(batch, seq)` -> probability.

    The "ensemble" layer weighs the branch logits `[attention, ngram]` (initially their mean);
    `fit_ensemble` fits its three numbers on held-out data once the branches are trained, each
    on its own loss through `training_model`. Two views of the review trained apart and weighed
    on data they did not see, because one joint head, or a plain mean of the logits, leans on
    whichever branch memorises the training set fastest (README's IMDB ablation).

    Call `adapt_ngram_weights(model, ...)` on the training token ids and labels before training.

    Args:
        config: a `SentimentClassifierConfig`.
        packed: whether the attention branch reads packed rows (`pipelines.batching.pack_documents`
            of the first `sequence_length` tokens of the reviews): the inputs are then a dict of
            `token_ids` and the packed `packed_ids`, `segment_ids` and `token_index`. Same weights,
            same outputs as the padded model.

    Returns:
        A `keras.Model` named "sentiment_classifier" with one input `token_ids` (int32,
        0 = padding, at most `max_tokens` long) and one float32 output `(batch, 1)`: the
        positive-class probability.
    """
    token_ids = keras.Input((None,), dtype="int32", name="token_ids")
    packed_rows = None
    if packed:
        packed_rows = {**packed_inputs(config), TOKEN_INDEX: keras.Input((None,), dtype="int32", name=TOKEN_INDEX)}
    ngram_bag = NgramBag(
        config.vocabulary_size,
        config.bigram_buckets,
        config.ngram_weighting,
        scale=config.ngram_scale,
        bigram_ids=config.bigram_ids,
        name="ngram_bag",
    )
    features, values = ngram_bag(token_ids)  # (batch, 2 * seq - 1) each: a sparse weighted bag of n-grams
    logits = [
        _attention_logit(token_ids, config, packed_rows),
        SparseLinear(ngram_bag.num_features, dtype="float32", name="ngram_logit")((features, values)),
    ]
    # Not trainable with the branches: `fit_ensemble` fits it afterwards, on held-out data.
    ensemble = keras.layers.Dense(
        1,
        kernel_initializer=keras.initializers.Constant(0.5),
        dtype="float32",
        trainable=False,
        name="ensemble",
    )(keras.layers.Concatenate(name="branch_logits")(logits))  # (batch, 1)
    probability = keras.layers.Activation("sigmoid", dtype="float32", name="probability")(ensemble)
    inputs = token_ids if packed_rows is None else {"token_ids": token_ids, **packed_rows}
    return keras.Model(inputs, probability, name="sentiment_classifier")


def training_model(classifier):
    """The same layers with one output per branch plus the ensemble: `{"attention", "ngram", "probability"}`.

    Train this one with a loss on each branch (`BRANCHES`); its weights are the classifier's.
    """
    outputs = {
        branch: keras.layers.Activation("sigmoid", dtype="float32", name=branch)(
            classifier.get_layer(f"{branch}_logit").output
        )
        for branch in BRANCHES
    }
    outputs["probability"] = classifier.output
    return keras.Model(classifier.input, outputs, name="sentiment_classifier_training")


def fit_ensemble(classifier, batches, l2=1.0):
    """Fits the "ensemble" weights, a logistic regression on the branch logits, on `batches`.

    Only the ensemble's kernel and bias change. Use data the branches were not trained on (the
    validation slice): on the training set the branch that memorised most would get the weight.
    Three parameters: Newton's method (iteratively reweighted least squares) in float64 finds
    the optimum exactly, under any distribution strategy, with no optimizer state.

    Args:
        classifier: the model of `build_sentiment_classifier`, branches trained.
        batches: a dataset of `(token_ids, label)` batches.
        l2: L2 penalty on the two logit weights (keeps them finite when the data are separable).

    Returns:
        The fitted `{"kernel": [attention, ngram], "bias": b}`.
    """
    branch_logits = keras.Model(classifier.input, classifier.get_layer("branch_logits").output)
    logits, labels = [], []
    for token_ids, label in batches:
        logits.append(keras.ops.convert_to_numpy(branch_logits(token_ids, training=False)))
        labels.append(keras.ops.convert_to_numpy(label))
    logits = np.concatenate(logits).astype(np.float64)  # (examples, branches)
    if len(logits) == 0:
        raise ValueError(f"`batches` holds no examples. Received: batches={batches!r}")
    weights = _logistic_regression(logits, np.concatenate(labels).astype(np.float64).reshape(-1), l2)
    kernel, bias = weights[:-1], weights[-1]
    classifier.get_layer("ensemble").set_weights([kernel.reshape(-1, 1).astype("float32"), np.array([bias], "float32")])
    return {"kernel": kernel.tolist(), "bias": float(bias)}


def _logistic_regression(features, labels, l2, iterations=100, tolerance=1e-10):
    """Weights `(features + 1,)` (bias last) minimising the log loss plus `l2/2 * |kernel|^2`."""
    design = np.concatenate([features, np.ones((len(features), 1))], axis=1)  # (examples, features + 1)
    penalty = np.diag([l2] * features.shape[1] + [0.0])  # the bias is not penalised
    weights = np.zeros(design.shape[1])
    for _ in range(iterations):
        probability = 1.0 / (1.0 + np.exp(-design @ weights))  # (examples,)
        gradient = design.T @ (probability - labels) + penalty @ weights
        hessian = (design.T * (probability * (1.0 - probability))) @ design + penalty
        step = np.linalg.solve(hessian, gradient)
        weights -= step
        if np.max(np.abs(step)) < tolerance:
            break
    return weights
