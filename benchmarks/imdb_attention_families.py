"""Which attention family reads a whole IMDB review best: the attention branch alone, one CPU budget each.

Every family gets the same attention-only classifier (token + learned position embedding over
up to `--max-tokens` tokens, `--blocks` pre-norm blocks of that family's self-attention and a
feed-forward network, a final layer norm, masked mean+max pooling, a logit), the same tokenised
training reviews (the official 25,000 but one), the same length-bucketed batches and the same **CPU-time budget**:
a family trains until its process has used `--train-cpu-seconds` of CPU time (user + system,
`resource.getrusage(RUSAGE_SELF)`, counted from its first training step and checked after each
step), with a learning rate that warms up and then decays to zero as a function of the budget
used. CPU time, not wall time, so that the other jobs on a shared machine slow a family down
without shortening its training. Each family runs in a fresh process (its peak resident memory is
its own), pinned to one core with one TensorFlow thread (`taskset`; `--workers` families at once,
one core each), and is scored on every official test review (25,000). The Long Range Arena Text
accuracies (Tay et al. 2020: byte-level IMDB, 4K bytes) are listed beside each family for
orientation; they are not comparable numbers.

    python -m benchmarks.imdb_attention_families --train-cpu-seconds 240 --workers 2 \
        --families linear_elu,favor,sliding_window,strided,dense,linformer,lsh
"""

import argparse
import concurrent.futures
import json
import os
import queue
import resource
import subprocess
import sys
import tempfile
import threading
import time

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from benchmarks import measurement
from keras_attn import FeedForward  # noqa: E402
from keras_attn import LinearAttention  # noqa: E402
from keras_attn import LinformerSelfAttention  # noqa: E402
from keras_attn import LSHSelfAttention  # noqa: E402
from keras_attn import MaskedGlobalPooling  # noqa: E402
from keras_attn import SelfAttention  # noqa: E402
from keras_attn import TokenAndPositionEmbedding  # noqa: E402
from keras_attn import patterns  # noqa: E402
from models.imdb_text import adapt_review_vectorizer  # noqa: E402
from pipelines.imdb_data import default_cache_dir  # noqa: E402
from pipelines.imdb_data import load_cache  # noqa: E402
from pipelines.imdb_data import split_reviews  # noqa: E402

PEER_RATIO = "accuracy_vs_dense"  # the rows' ratio to the peer measured in the same run (tests/test_benchmarks.py)
BENCH_ARGS = [
    "--families",
    "dense,linear_elu",
    "--train-cpu-seconds",
    "60",
    "--test-examples",
    "5000",
]  # `make bench` (benchmarks/run_all.py): two families, a short budget: the full comparison is the script's defaults

# Long Range Arena, Text task (Tay et al. 2020, table 1), by the family's model there.
LRA_TEXT = {
    "dense": ("Transformer", 64.27),
    "sliding_window": ("Local Attention", 52.98),
    "strided": ("Sparse Transformer", 63.58),
    "lsh": ("Reformer", 56.10),
    "linformer": ("Linformer", 53.94),
    "linear_elu": ("Linear Transformer", 65.90),
    "favor": ("Performer", 65.40),
}
PAD_TO = 64  # batches are padded to a multiple of this many tokens (few distinct shapes)


def family_list(text):
    """`--families`: comma-separated keys of `LRA_TEXT`, as a list."""
    families = text.split(",")
    unknown = [family for family in families if family not in LRA_TEXT]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown families {unknown}: expected some of {list(LRA_TEXT)}. Received: {text!r}"
        )
    return families


def attention_layer(family, args):
    """The family's self-attention layer, `num_heads` heads of `width / num_heads`."""
    heads, key_dim = args.num_heads, args.width // args.num_heads
    sparse = patterns.SlidingWindow(args.window) | patterns.Strided(args.window)  # Child et al., non-causal
    layers = {
        # Blockwise: the dense result without a (seq, seq) matrix per head (2 GB at 2,048 tokens).
        "dense": lambda: SelfAttention(num_heads=heads, key_dim=key_dim, implementation="blockwise"),
        "sliding_window": lambda: SelfAttention(num_heads=heads, key_dim=key_dim, sliding_window=args.window),
        "strided": lambda: SelfAttention(
            num_heads=heads, key_dim=key_dim, attention_pattern=sparse, implementation="blockwise"
        ),
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
    """Token ids `(batch, seq)` -> positive-class probability, through `blocks` blocks of the family's attention."""
    ids = keras.Input((None,), dtype="int32", name="token_ids")
    hidden = TokenAndPositionEmbedding(args.vocabulary_size, args.max_tokens, args.width, mask_zero=True)(ids)
    hidden = keras.layers.Dropout(args.dropout)(hidden)
    for _ in range(args.blocks):
        attended = attention_layer(family, args)(keras.layers.LayerNormalization()(hidden))
        hidden = hidden + keras.layers.Dropout(args.dropout)(attended)
        hidden = hidden + FeedForward(2 * args.width, dropout=args.dropout)(keras.layers.LayerNormalization()(hidden))
    hidden = keras.layers.LayerNormalization()(hidden)
    pooled = keras.layers.Concatenate()([MaskedGlobalPooling("mean")(hidden), MaskedGlobalPooling("max")(hidden)])
    logit = keras.layers.Dense(1)(keras.layers.Dropout(args.dropout)(pooled))
    return keras.Model(ids, keras.layers.Activation("sigmoid", dtype="float32")(logit))


def cpu_seconds():
    """User + system CPU time of this process (every thread), in seconds."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class CpuBudget(keras.callbacks.Callback):
    """Stops training once the process has used `seconds` of CPU time since the first step.

    The learning rate follows the budget used, `f = used / seconds`: a linear warm-up to
    `peak_learning_rate` over the first `warmup` of it, then a cosine decay to zero at `f = 1`,
    so every family ends its schedule exactly when its budget runs out.
    """

    def __init__(self, seconds, peak_learning_rate, warmup=0.05, label=None, report_every=100):
        super().__init__()
        self.seconds, self.peak, self.warmup = seconds, peak_learning_rate, warmup
        self.label, self.report_every, self.steps = label, report_every, 0

    def learning_rate(self, fraction):
        if fraction < self.warmup:
            return self.peak * (fraction + 1e-3) / self.warmup
        progress = min(1.0, (fraction - self.warmup) / (1 - self.warmup))
        return self.peak * 0.5 * (1 + np.cos(np.pi * progress))

    def on_train_begin(self, logs=None):
        self.start_cpu, self.start_wall = cpu_seconds(), time.perf_counter()

    def on_train_batch_begin(self, batch, logs=None):
        self.model.optimizer.learning_rate.assign(self.learning_rate(self.used() / self.seconds))

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1
        if self.label and self.steps % self.report_every == 0:  # progress of a long run, to its log
            print(
                f"{self.label}: step {self.steps}, {self.used():.0f} CPU s, "
                f"{time.perf_counter() - self.start_wall:.0f} s, loss {float(logs['loss']):.4f}",
                flush=True,
            )
        if self.used() >= self.seconds:
            self.model.stop_training = True

    def on_train_end(self, logs=None):
        self.cpu_s, self.wall_s = self.used(), time.perf_counter() - self.start_wall

    def used(self):
        return cpu_seconds() - self.start_cpu


def tokenised_reviews(args):
    """`{split: (ids: list of int32 arrays, labels: int32 array)}`, tokenised once and cached on disk.

    The vectoriser (`models.imdb_text`) is adapted on the training reviews only; ids are cut to
    `max_tokens`; the first `test_examples` test reviews (of the cache's seeded order) are kept.
    The cache (under the data cache directory, keyed by the data and the settings) lets every
    family's process skip the tokenisation.
    """
    data = load_cache(allow_download=False)
    key = f"{data.directory.name}-v{args.vocabulary_size}-t{args.max_tokens}-n{args.train_examples}"
    path = default_cache_dir() / "imdb_tokens" / f"{key}.npz"
    if not path.is_file():
        splits = split_reviews(data, 1, max_train=args.train_examples)
        vectorizer = adapt_review_vectorizer(splits.train.map(lambda text, label: text), args.vocabulary_size)
        arrays = {}
        for name, reviews in (("train", splits.train), ("test", splits.test)):
            ids, labels = [], []
            for texts, batch_labels in reviews.batch(1024):
                ids += [row[: args.max_tokens].astype(np.int32) for row in vectorizer(texts).numpy()]
                labels.append(batch_labels.numpy())
            arrays[f"{name}_lengths"] = np.array([len(row) for row in ids], np.int32)
            arrays[f"{name}_ids"] = np.concatenate(ids).astype(np.int32)
            arrays[f"{name}_labels"] = np.concatenate(labels).astype(np.int32)
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".npz", delete=False) as handle:
            try:
                np.savez(handle, **arrays)
            except BaseException:
                os.unlink(handle.name)
                raise
        os.replace(handle.name, path)  # atomic: a concurrent reader never sees half a file
    with np.load(path) as arrays:
        reviews = {}
        for split in ("train", "test"):
            ends = np.cumsum(arrays[f"{split}_lengths"])[:-1]
            reviews[split] = (np.split(arrays[f"{split}_ids"], ends), arrays[f"{split}_labels"])
    test_ids, test_labels = reviews["test"]
    reviews["test"] = (test_ids[: args.test_examples], test_labels[: args.test_examples])
    return reviews


def length_batches(lengths, batch_size, rng=None):
    """Index batches of reviews padded to the same multiple of `PAD_TO` tokens.

    With `rng`, the reviews are shuffled within each padded length and the batches shuffled (a
    training epoch); without it, the batches run from the shortest reviews up (evaluation).
    """
    padded = (np.maximum(lengths, 1) + PAD_TO - 1) // PAD_TO
    order = rng.permutation(len(lengths)) if rng is not None else np.arange(len(lengths))
    order = order[np.argsort(padded[order], kind="stable")]
    batches = []
    for bucket in np.unique(padded):
        members = order[padded[order] == bucket]
        batches += [members[i : i + batch_size] for i in range(0, len(members), batch_size)]
    if rng is not None:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches


def padded_batch(ids, indices):
    """`(len(indices), padded length)` int32 ids, 0-padded to a multiple of `PAD_TO`."""
    longest = max(max(len(ids[i]) for i in indices), 1)
    batch = np.zeros((len(indices), -(-longest // PAD_TO) * PAD_TO), np.int32)
    for row, i in enumerate(indices):
        batch[row, : len(ids[i])] = ids[i]
    return batch


def training_batches(ids, labels, batch_size, seed):
    """Endless `(ids, labels)` batches, epoch after epoch, each epoch freshly shuffled."""
    rng = np.random.default_rng(seed)
    lengths = np.array([len(row) for row in ids])

    def epochs():
        while True:
            for indices in length_batches(lengths, batch_size, rng):
                yield padded_batch(ids, indices), labels[indices]

    signature = (tf.TensorSpec((None, None), tf.int32), tf.TensorSpec((None,), tf.int32))
    return tf.data.Dataset.from_generator(epochs, output_signature=signature).prefetch(2)


def accuracy(model, ids, labels, batch_size):
    """Accuracy of `model` on every review, in batches of similar length (one traced function)."""
    lengths = np.array([len(row) for row in ids])
    batches = length_batches(lengths, batch_size)
    predict = tf.function(lambda x: model(x, training=False), input_signature=[tf.TensorSpec((None, None), tf.int32)])
    correct = 0
    for indices in batches:
        probabilities = predict(tf.constant(padded_batch(ids, indices))).numpy()[:, 0]
        correct += int(np.sum((probabilities > 0.5) == (labels[indices] == 1)))
    return correct / len(labels)


def run_family(family, args):
    """Trains and scores one family in this process; returns its row."""
    keras.utils.set_random_seed(args.seed)
    reviews = tokenised_reviews(args)
    (train_ids, train_labels), (test_ids, test_labels) = reviews["train"], reviews["test"]
    model = build_classifier(family, args)
    model.compile(
        optimizer=keras.optimizers.AdamW(args.learning_rate, weight_decay=args.weight_decay, clipnorm=1.0),
        loss="binary_crossentropy",
    )
    budget = CpuBudget(args.train_cpu_seconds, args.learning_rate, label=family)
    # One endless pass over the shuffled reviews, stopped by the budget (at least one step).
    model.fit(
        training_batches(train_ids, train_labels, args.batch_size, args.seed),
        steps_per_epoch=10**9,
        epochs=1,
        verbose=0,
        callbacks=[budget],
    )
    start_cpu, start_wall = cpu_seconds(), time.perf_counter()
    test_accuracy = accuracy(model, test_ids, test_labels, 2 * args.batch_size)
    lra_model, lra_accuracy = LRA_TEXT[family]
    return {
        "family": family,
        "layer": type(attention_layer(family, args)).__name__,
        "parameters": model.count_params(),
        "train_reviews": len(train_labels),
        "test_reviews": len(test_labels),
        "training_steps": budget.steps,
        "epochs": budget.steps * args.batch_size / len(train_labels),
        "training_cpu_s": budget.cpu_s,
        "training_wall_s": budget.wall_s,
        "evaluation_cpu_s": cpu_seconds() - start_cpu,
        "evaluation_wall_s": time.perf_counter() - start_wall,
        "test_accuracy": test_accuracy,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "lra_text_model": lra_model,
        "lra_text_accuracy": lra_accuracy,
    }


def run_in_subprocess(family, argv, core):
    """`run_family` in a fresh Python process pinned to CPU `core` with one thread per pool; its row."""
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1"}
    with tempfile.NamedTemporaryFile(suffix=".json") as output:
        command = [
            "taskset",
            "-c",
            str(core),
            sys.executable,
            "-m",
            "benchmarks.imdb_attention_families",
            *argv,
            "--family",
            family,
            "--row-output",
            output.name,
        ]
        subprocess.run(command, check=True, env=environment)
        with open(output.name) as handle:
            row = json.load(handle)
    print(json.dumps(row), flush=True)
    return row


def run_families(families, argv, workers, on_row):
    """Rows of `families`, `workers` processes at once, each on a core of its own.

    `on_row(rows)` is called with the rows finished so far (in the order of `families`) each
    time a family finishes, so a run cut short still leaves its finished rows.
    """
    free_cores, lock, finished = queue.Queue(), threading.Lock(), {}
    for core in range(workers):
        free_cores.put(core)

    def run_on_a_free_core(family):
        core = free_cores.get()
        try:
            row = run_in_subprocess(family, argv, core)
        finally:
            free_cores.put(core)
        with lock:
            finished[family] = row
            on_row([finished[f] for f in families if f in finished])
        return row

    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        return list(pool.map(run_on_a_free_core, families))


def write_table(rows, families, args):
    """Adds each row's accuracy relative to dense and writes the JSON (with the families still missing)."""
    dense = next((row["test_accuracy"] for row in rows if row["family"] == "dense"), None)
    for row in rows:
        row["accuracy_vs_dense"] = row["test_accuracy"] / dense if dense else None
    config = {k: v for k, v in vars(args).items() if k not in ("output", "family", "row_output")}
    missing = [family for family in families if family not in {row["family"] for row in rows}]
    measurement.write_results(
        "imdb_attention_families" + ("_smoke" if args.smoke else ""),
        {"config": config, "rows": rows, "families_missing": missing},
        args.output,
    )


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = measurement.parse_args(
        __doc__.splitlines()[0],
        families=dict(
            type=family_list, default=list(LRA_TEXT), help=f"comma-separated families to run, of {', '.join(LRA_TEXT)}"
        ),
        train_examples=dict(type=int, default=25_000, help="training reviews (one held out)"),
        test_examples=dict(type=int, default=25_000, help="test reviews scored (seeded order)"),
        train_cpu_seconds=dict(type=float, default=240.0, help="training CPU-time budget per family"),
        workers=dict(type=int, default=2, help="families trained at once, one core each"),
        max_tokens=dict(type=int, default=2048),
        vocabulary_size=dict(type=int, default=20_000),
        width=dict(type=int, default=64),
        num_heads=dict(type=int, default=4),
        blocks=dict(type=int, default=1),
        window=dict(type=int, default=128, help="sliding window and stride; LSH chunks are half of it"),
        lsh_buckets=dict(type=int, default=32),
        projected_length=dict(type=int, default=128),
        batch_size=dict(type=int, default=32),
        learning_rate=dict(type=float, default=1e-3, help="peak of the warm-up + cosine schedule"),
        weight_decay=dict(type=float, default=0.01),
        dropout=dict(type=float, default=0.1),
        seed=dict(type=int, default=0),
        family=dict(default=None, help=argparse.SUPPRESS),
        row_output=dict(default=None, help=argparse.SUPPRESS),
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.train_examples, args.test_examples, args.train_cpu_seconds = 16, 8, 0.1
        args.max_tokens, args.vocabulary_size, args.width, args.num_heads = 64, 200, 8, 2
        args.window, args.lsh_buckets, args.projected_length, args.batch_size = 8, 4, 8, 4
    if args.family:  # one family, in this (child) process
        row = run_family(args.family, args)
        with open(args.row_output, "w") as handle:
            json.dump(row, handle)
        return [row]
    families = args.families
    # Smoke runs stay in one process (seconds); real runs give each family a fresh one.
    if args.smoke:
        rows = [run_family(f, args) for f in families]
    else:
        tokenised_reviews(args)  # once, before the families start
        rows = run_families(families, argv, args.workers, lambda done: write_table(done, families, args))
    write_table(rows, families, args)
    measurement.print_table(
        rows,
        [
            ("family", "family", "{}"),
            ("test_accuracy", "test acc", "{:.4f}"),
            ("training_steps", "steps", "{}"),
            ("epochs", "epochs", "{:.2f}"),
            ("training_cpu_s", "train CPU s", "{:.0f}"),
            ("training_wall_s", "train wall s", "{:.0f}"),
            ("evaluation_cpu_s", "eval CPU s", "{:.0f}"),
            ("evaluation_wall_s", "eval wall s", "{:.0f}"),
            ("peak_rss_mb", "peak MB", "{:.0f}"),
            ("lra_text_accuracy", "LRA Text", "{:.2f}"),
        ],
    )
    return rows


if __name__ == "__main__":
    main()
