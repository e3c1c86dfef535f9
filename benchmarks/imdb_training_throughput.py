"""End-to-end training throughput of the IMDB classifier vs the same model on Keras attention.

Both models come from `models.sentiment_classifier.build_sentiment_classifier` with the same
configuration; in the peer every encoder block's self-attention is
`keras.layers.MultiHeadAttention` (same heads, sizes, dropout: the parameter counts are checked
equal). Both train with `model.fit` (Adam, binary cross-entropy, the same `jit_compile`) on the
same real IMDB reviews, tokenised to ids in `tf.data`; throughput is measured over the epochs
after the first (which includes tracing and compilation), alternating the models.

    python -m benchmarks.imdb_training_throughput
"""

import contextlib
import inspect
import sys
import time

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import models.sentiment_classifier as sentiment_classifier  # noqa: E402
from benchmarks import measurement
from keras_attn import TransformerEncoder  # noqa: E402
from models.imdb_text import adapt_review_vectorizer  # noqa: E402
from models.imdb_text import dense_token_ids  # noqa: E402

PEER_RATIO = "speedup_vs_keras"  # the rows' ratio to the peer measured in the same run (tests/test_benchmarks.py)
BENCH_ARGS = ["--rounds", "2"]  # `make bench` (benchmarks/run_all.py): fewer rounds

_KERAS_MHA_ARGUMENTS = set(inspect.signature(keras.layers.MultiHeadAttention.__init__).parameters)


class KerasSelfAttention(keras.layers.MultiHeadAttention):
    """Keras's layer, unchanged, called the way the blocks call every attention layer: `value=None`
    is self-attention (Keras's own `call` requires `value`)."""

    def build(self, query_shape, value_shape=None, key_shape=None):
        super().build(query_shape, query_shape if value_shape is None else value_shape, key_shape)

    def call(
        self,
        query,
        value=None,
        key=None,
        query_mask=None,
        value_mask=None,
        key_mask=None,
        attention_mask=None,
        return_attention_scores=False,
        training=None,
        use_causal_mask=False,
    ):
        return super().call(
            query,
            query if value is None else value,
            key,
            query_mask=query_mask,
            value_mask=value_mask,
            key_mask=key_mask,
            attention_mask=attention_mask,
            return_attention_scores=return_attention_scores,
            training=training,
            use_causal_mask=use_causal_mask,
        )


class KerasAttentionEncoder(TransformerEncoder):
    """`TransformerEncoder` whose self-attention is `keras.layers.MultiHeadAttention` (the peer)."""

    def _attention(self, name, hidden_dim, **options):
        ours = super()._attention(name, hidden_dim, **options)
        config = {key: value for key, value in ours.get_config().items() if key in _KERAS_MHA_ARGUMENTS}
        return KerasSelfAttention(**config)


@contextlib.contextmanager
def keras_attention_encoders():
    """Builds classifiers with `KerasAttentionEncoder` blocks inside the block."""
    original = sentiment_classifier.TransformerEncoder
    sentiment_classifier.TransformerEncoder = KerasAttentionEncoder
    try:
        yield
    finally:
        sentiment_classifier.TransformerEncoder = original


def build_models(config):
    ours = sentiment_classifier.build_sentiment_classifier(config)
    with keras_attention_encoders():
        peer = sentiment_classifier.build_sentiment_classifier(config)
    if ours.count_params() != peer.count_params():
        raise RuntimeError(f"Model sizes differ: {ours.count_params()} vs {peer.count_params()} parameters")
    return {"keras_attn": ours, "keras MultiHeadAttention": peer}


def training_data(config, count, batch_size):
    reviews = measurement.imdb_test_reviews(count)
    texts = tf.constant([text for text, _ in reviews])
    labels = tf.constant([[float(label)] for _, label in reviews])
    vectorizer = adapt_review_vectorizer(tf.data.Dataset.from_tensor_slices(texts), config.vocabulary_size)
    ids = dense_token_ids(texts, vectorizer, config.max_tokens)  # (count, longest) int32
    return tf.data.Dataset.from_tensor_slices((ids, labels)).batch(batch_size, drop_remainder=True).cache()


class EpochTimer(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.seconds = []

    def on_epoch_begin(self, epoch, logs=None):
        self._start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.seconds.append(time.perf_counter() - self._start)


def main(argv=None):
    parser = measurement.parse_args(
        __doc__.splitlines()[0],
        examples=dict(type=int, default=512, help="real reviews per epoch"),
        batch_size=dict(type=int, default=32),
        rounds=dict(type=int, default=3, help="timed epochs per model (after one warm-up epoch)"),
        jit_compile=dict(default="auto", help="passed to model.compile: auto, 1 or 0"),
    )
    args = parser.parse_args(argv)
    config = sentiment_classifier.SentimentClassifierConfig()
    if args.smoke:
        args.examples, args.batch_size, args.rounds, args.jit_compile = 8, 4, 1, "0"
        config = sentiment_classifier.SentimentClassifierConfig(
            vocabulary_size=200,
            max_tokens=32,
            sequence_length=32,
            embedding_dim=8,
            num_heads=2,
            intermediate_dim=8,
            bigram_buckets=64,
        )
    jit_compile = {"auto": "auto", "1": True, "0": False}[str(args.jit_compile)]
    data = training_data(config, args.examples, args.batch_size)
    models = build_models(config)
    timers = {}
    for name, model in models.items():
        model.compile(optimizer="adam", loss="binary_crossentropy", jit_compile=jit_compile)
        timers[name] = EpochTimer()
        model.fit(data, epochs=1, verbose=0, callbacks=[timers[name]])  # warm-up: tracing, XLA
    for _ in range(args.rounds):
        for name, model in models.items():
            model.fit(data, epochs=1, verbose=0, callbacks=[timers[name]])
    examples = (args.examples // args.batch_size) * args.batch_size
    rows = []
    for name, timer in timers.items():
        best = min(timer.seconds[1:])
        rows.append(
            {
                "model": name,
                "parameters": models[name].count_params(),
                "warmup_epoch_s": timer.seconds[0],
                "best_epoch_s": best,
                "examples_per_s": examples / best,
            }
        )
    peer = rows[1]["examples_per_s"]
    for row in rows:
        row["speedup_vs_keras"] = row["examples_per_s"] / peer
    measurement.print_table(
        rows,
        [
            ("model", "model", "{}"),
            ("parameters", "params", "{}"),
            ("warmup_epoch_s", "first epoch s", "{:.1f}"),
            ("best_epoch_s", "best epoch s", "{:.2f}"),
            ("examples_per_s", "examples/s", "{:.1f}"),
            ("speedup_vs_keras", "x keras", "{:.2f}"),
        ],
    )
    payload = {
        "config": {**{k: v for k, v in vars(args).items() if k != "output"}, "model": config.to_dict()},
        "rows": rows,
    }
    measurement.write_results("imdb_training_throughput" + ("_smoke" if args.smoke else ""), payload, args.output)
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
