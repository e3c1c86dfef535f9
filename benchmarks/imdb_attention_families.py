"""Which attention family reads a whole IMDB review best: the attention branch alone, one budget each.

Every family gets the same attention-only classifier (token + learned position embedding over
up to `--max-tokens` tokens, one pre-norm block of that family's self-attention and a
feed-forward network, masked mean+max pooling, a logit), the same tokenised training reviews,
the same wall-clock training budget (`--train-seconds`, Adam, length-bucketed batches), and is
scored on the same seeded test reviews. Each family runs in a fresh process, so its peak
resident memory is its own. The Long Range Arena Text accuracies (Tay et al. 2020: byte-level
IMDB, 4K bytes) are listed beside each family for orientation; they are not comparable numbers.

    nice python -m benchmarks.imdb_attention_families --train-seconds 60 --test-examples 2000
"""

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time

from benchmarks import common

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from keras_attn import FeedForward  # noqa: E402
from keras_attn import LinearAttention  # noqa: E402
from keras_attn import LinformerSelfAttention  # noqa: E402
from keras_attn import LSHSelfAttention  # noqa: E402
from keras_attn import MaskedGlobalPooling  # noqa: E402
from keras_attn import SelfAttention  # noqa: E402
from keras_attn import TokenAndPositionEmbedding  # noqa: E402
from models.imdb_text import adapt_review_vectorizer  # noqa: E402
from pipelines.imdb_data import batched  # noqa: E402
from pipelines.imdb_data import load_cache  # noqa: E402
from pipelines.imdb_data import split_reviews  # noqa: E402
from pipelines.imdb_data import token_ids  # noqa: E402

# Long Range Arena, Text task (Tay et al. 2020, table 1), by the family's model there.
LRA_TEXT = {
    "dense": ("Transformer", 64.27),
    "sliding_window": ("Local Attention", 52.98),
    "lsh": ("Reformer", 56.10),
    "linformer": ("Linformer", 53.94),
    "linear_elu": ("Linear Transformer", 65.90),
    "favor": ("Performer", 65.40),
}


def attention_layer(family, args):
    """The family's self-attention layer, `num_heads` heads of `width / num_heads`."""
    heads, key_dim = args.num_heads, args.width // args.num_heads
    layers = {
        # Blockwise: the dense result without a (seq, seq) matrix per head (2 GB at 2,048 tokens).
        "dense": lambda: SelfAttention(num_heads=heads, key_dim=key_dim, implementation="blockwise"),
        "sliding_window": lambda: SelfAttention(num_heads=heads, key_dim=key_dim, sliding_window=args.window),
        "lsh": lambda: LSHSelfAttention(
            heads, key_dim, num_buckets=args.lsh_buckets, num_hashes=2, chunk_size=args.window // 2, seed=0
        ),
        "linformer": lambda: LinformerSelfAttention(
            heads, key_dim, max_length=args.max_tokens, projected_length=args.projected_length, seed=0
        ),
        "linear_elu": lambda: LinearAttention(heads, key_dim, feature_map="elu"),
        "favor": lambda: LinearAttention(heads, key_dim, feature_map="favor", redraw_features=True, seed=0),
    }
    return layers[family]()


def build_classifier(family, args):
    """Token ids `(batch, seq)` -> positive-class probability, through one block of the family's attention."""
    ids = keras.Input((None,), dtype="int32", name="token_ids")
    hidden = TokenAndPositionEmbedding(args.vocabulary_size, args.max_tokens, args.width, mask_zero=True)(ids)
    hidden = keras.layers.Dropout(args.dropout)(hidden)
    attended = attention_layer(family, args)(keras.layers.LayerNormalization()(hidden))
    hidden = hidden + keras.layers.Dropout(args.dropout)(attended)
    hidden = hidden + FeedForward(2 * args.width, dropout=args.dropout)(keras.layers.LayerNormalization()(hidden))
    pooled = keras.layers.Concatenate()([MaskedGlobalPooling("mean")(hidden), MaskedGlobalPooling("max")(hidden)])
    logit = keras.layers.Dense(1)(keras.layers.Dropout(args.dropout)(pooled))
    return keras.Model(ids, keras.layers.Activation("sigmoid", dtype="float32")(logit))


class TimeBudget(keras.callbacks.Callback):
    """Stops training once `seconds` of wall time have passed; counts the steps taken."""

    def __init__(self, seconds):
        super().__init__()
        self.seconds, self.steps = seconds, 0

    def on_train_begin(self, logs=None):
        self.start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1
        if time.perf_counter() - self.start >= self.seconds:
            self.model.stop_training = True


def datasets(args):
    """Length-bucketed `(ids, label)` batches of the training reviews and of the seeded test reviews."""
    splits = split_reviews(load_cache(allow_download=False), 1, max_train=args.train_examples, max_test=args.test_examples)
    vectorizer = adapt_review_vectorizer(splits.train.map(lambda text, label: text), args.vocabulary_size)
    train = token_ids(splits.train, vectorizer, args.max_tokens)
    test = token_ids(splits.test, vectorizer, args.max_tokens)
    return (
        batched(train, args.batch_size, args.max_tokens, shuffle=True, seed=0),
        batched(test, args.batch_size, args.max_tokens),
        splits.counts,
    )


def run_family(family, args):
    """Trains and scores one family in this process; returns its row."""
    keras.utils.set_random_seed(0)
    train, test, counts = datasets(args)
    model = build_classifier(family, args)
    model.compile(optimizer=keras.optimizers.Adam(args.learning_rate), loss="binary_crossentropy", metrics=["accuracy"])
    budget = TimeBudget(args.train_seconds)
    start = time.perf_counter()
    # One endless pass over the shuffled reviews, stopped by the budget (at least one step).
    model.fit(train.repeat(), steps_per_epoch=10**9, epochs=1, verbose=0, callbacks=[budget])
    training_s = time.perf_counter() - start
    start = time.perf_counter()
    _, accuracy = model.evaluate(test, verbose=0)
    lra_model, lra_accuracy = LRA_TEXT[family]
    return {
        "family": family,
        "layer": type(attention_layer(family, args)).__name__,
        "parameters": model.count_params(),
        "train_reviews": counts["train"],
        "test_reviews": counts["test"],
        "training_steps": budget.steps,
        "training_s": training_s,
        "evaluation_s": time.perf_counter() - start,
        "test_accuracy": float(accuracy),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "lra_text_model": lra_model,
        "lra_text_accuracy": lra_accuracy,
    }


def run_in_subprocess(family, argv):
    """`run_family` in a fresh Python process (its own peak memory); returns its row."""
    with tempfile.NamedTemporaryFile(suffix=".json") as output:
        command = [sys.executable, "-m", "benchmarks.imdb_attention_families", *argv, "--family", family,
                   "--row-output", output.name]
        subprocess.run(command, check=True)
        with open(output.name) as handle:
            return json.load(handle)


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = common.parse_args(
        __doc__.splitlines()[0],
        families=dict(default=",".join(LRA_TEXT), help="comma-separated families to run"),
        train_examples=dict(type=int, default=25_000, help="training reviews (one held out)"),
        test_examples=dict(type=int, default=25_000, help="test reviews scored (seeded order)"),
        train_seconds=dict(type=float, default=900.0, help="training wall-time budget per family"),
        max_tokens=dict(type=int, default=2048),
        vocabulary_size=dict(type=int, default=20_000),
        width=dict(type=int, default=64),
        num_heads=dict(type=int, default=4),
        window=dict(type=int, default=128, help="sliding window; LSH chunks are half of it"),
        lsh_buckets=dict(type=int, default=32),
        projected_length=dict(type=int, default=128),
        batch_size=dict(type=int, default=32),
        learning_rate=dict(type=float, default=1e-3),
        dropout=dict(type=float, default=0.1),
        family=dict(default=None, help=argparse.SUPPRESS),
        row_output=dict(default=None, help=argparse.SUPPRESS),
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.train_examples, args.test_examples, args.train_seconds = 16, 8, 0.0
        args.max_tokens, args.vocabulary_size, args.width, args.num_heads = 64, 200, 8, 2
        args.window, args.lsh_buckets, args.projected_length, args.batch_size = 8, 4, 8, 4
    if args.family:  # one family, in this (child) process
        row = run_family(args.family, args)
        with open(args.row_output, "w") as handle:
            json.dump(row, handle)
        return [row]
    families = args.families.split(",")
    # Smoke runs stay in one process (seconds); real runs give each family a fresh one.
    rows = [run_family(f, args) if args.smoke else run_in_subprocess(f, argv) for f in families]
    dense = next((row["test_accuracy"] for row in rows if row["family"] == "dense"), None)
    for row in rows:
        row["accuracy_vs_dense"] = row["test_accuracy"] / dense if dense else None
    common.print_table(
        rows,
        [
            ("family", "family", "{}"),
            ("test_accuracy", "test acc", "{:.4f}"),
            ("training_steps", "steps", "{}"),
            ("training_s", "train s", "{:.0f}"),
            ("evaluation_s", "eval s", "{:.0f}"),
            ("peak_rss_mb", "peak MB", "{:.0f}"),
            ("lra_text_accuracy", "LRA Text", "{:.2f}"),
        ],
    )
    config = {k: v for k, v in vars(args).items() if k not in ("output", "family", "row_output")}
    common.write_results("imdb_attention_families" + ("_smoke" if args.smoke else ""), {"config": config, "rows": rows},
                         args.output)
    return rows


if __name__ == "__main__":
    main()
