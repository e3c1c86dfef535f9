"""Decoder-stack tokens/s and cache memory at early and late positions: dense, window and linear.

A stack of `--layers` causal `TransformerDecoder` blocks (batch 1) decodes `--tokens` tokens
starting at each position of `--positions` (default 256 and 8,192), each output fed back as the
next token, in one compiled `while` loop (how `models.decoding` generates). The self-attention
families:

- `dense`: `MultiHeadAttention` with a full key/value cache of `position + tokens` slots, which
  every step attends over: its cost and memory grow with the position;
- `window`: `sliding_window=--window`, whose cache is a ring buffer of `window` slots
  (`keras_attn.layers.window_cache`) whatever the position;
- `linear`: `LinearAttention(causal=True)`, whose recurrent state has a constant size.

The cache's contents do not change the cost, so each position starts from a random cache (the
linear state from the empty one). Memory is the exact size of the caches the stack holds (every
layer's, in bytes), the part of decoding memory that depends on the position. A family's
positions run in turn `--repeats` times and each keeps its best time, so the ratio of its tokens/s
at each position to its first position's comes from the same rounds (goal for window and linear:
8,192 within 10 % of 256); families are timed one after the other. Window and linear run the same
program at both positions on caches of the same shape (the linear state does not even read the
position), so their ratio is 1 up to the machine's noise. One TensorFlow thread by default
(`--threads`): a batch-1 step at width 64 has little to share between cores, and on a loaded
machine TensorFlow's default thread pools make the times of identical programs spread far
more than one thread does.

    python -m benchmarks.decoding_positions
"""

import sys

import tensorflow as tf  # noqa: E402

from benchmarks import measurement
from keras_attn import LinearAttention  # noqa: E402
from keras_attn import TransformerDecoder  # noqa: E402

PEER_RATIO = "tokens_per_s_over_first_position"  # (tests/test_benchmarks.py)
BENCH_ARGS = ["--repeats", "10"]  # `make bench` (benchmarks/run_all.py): fewer repeats

FAMILIES = ("dense", "window", "linear")
COLUMNS = (  # (row key, header, format) of the printed table
    ("family", "family", "{}"),
    ("position", "position", "{}"),
    ("tokens_per_s", "tokens/s", "{:.0f}"),
    ("ms_per_token", "ms/token", "{:.3f}"),
    ("cache_kib", "cache KiB", "{:.1f}"),
    (PEER_RATIO, "tokens/s vs first", "{:.2f}"),
    ("cache_over_first_position", "cache vs first", "{:.2f}"),
)


def decoder_stack(family, num_layers, width, heads, window):
    """`num_layers` built decoders whose self-attention is `family`'s."""
    options = {
        "dense": {},
        "window": {"sliding_window": window},
        "linear": {"self_attention": LinearAttention(heads, width // heads, causal=True)},
    }[family]
    stack = [TransformerDecoder(intermediate_dim=2 * width, num_heads=heads, **options) for _ in range(num_layers)]
    for decoder in stack:
        decoder.build((None, None, width))
    return stack


def starting_caches(stack, family, position, tokens):
    """Every layer's cache for decoding `tokens` tokens from `position`: random contents (empty linear state)."""
    caches = [decoder.initial_self_attention_cache(1, position + tokens) for decoder in stack]
    if family == "linear":
        return caches
    return [tf.random.normal(cache.shape) for cache in caches]


def cache_bytes(caches):
    return sum(int(tf.size(t)) * t.dtype.size for t in tf.nest.flatten(caches))


def decode_loop(stack, tokens, jit_compile):
    """A compiled `(token, caches, start) -> (token, caches)` decoding `tokens` tokens from position `start`."""

    def step(token, caches, index):
        new_caches = []
        for decoder, cache in zip(stack, caches):
            token, cache = decoder(token, self_attention_cache=cache, self_attention_cache_update_index=index)
            new_caches.append(cache)
        return token, new_caches

    def run(token, caches, start):
        for offset in tf.range(tokens):
            token, caches = step(token, caches, start + offset)
        return token, caches

    return tf.function(run, jit_compile=jit_compile)


def measure_family(family, args, token):
    """`{position: (best seconds, cache bytes)}` of one family, its positions timed in turn.

    Each family is its own round robin, so no timed loop runs right after a heavier family's: a
    loop timed after one that swept megabytes of caches starts on cold caches and reads slow.
    """
    stack = decoder_stack(family, args.layers, args.width, args.heads, args.window)
    loop = decode_loop(stack, args.tokens, bool(args.jit_compile))
    candidates, memory = {}, {}
    for position in args.positions:
        caches = starting_caches(stack, family, position, args.tokens)
        memory[position] = cache_bytes(caches)
        start = tf.constant(position)
        candidates[position] = lambda caches=caches, start=start: loop(token, caches, start)
    best = measurement.best_seconds_round_robin(candidates, args.repeats)
    return {position: (best[position], memory[position]) for position in args.positions}


def measure(args):
    token = tf.random.normal((1, 1, args.width))
    rows = []
    for family in FAMILIES:
        measured = measure_family(family, args, token)
        first_seconds, first_bytes = measured[args.positions[0]]
        for position, (seconds, size) in measured.items():
            rows.append(
                {
                    "family": family,
                    "position": position,
                    "tokens_per_s": args.tokens / seconds,
                    "ms_per_token": 1e3 * seconds / args.tokens,
                    "cache_kib": size / 2**10,
                    PEER_RATIO: first_seconds / seconds,
                    "cache_over_first_position": size / first_bytes,
                }
            )
    return rows


def main(argv=None):
    parser = measurement.parse_args(
        __doc__.splitlines()[0],
        positions=dict(type=int, nargs="+", default=[256, 8192]),
        layers=dict(type=int, default=2),
        width=dict(type=int, default=64),
        heads=dict(type=int, default=4),
        window=dict(type=int, default=128),
        tokens=dict(type=int, default=128, help="tokens per compiled decoding loop"),
        repeats=dict(type=int, default=40),
        jit_compile=dict(type=int, default=1),
        threads=dict(type=int, default=1, help="TensorFlow intra- and inter-op threads; 0 keeps TensorFlow's"),
    )
    args = parser.parse_args(argv)
    if args.smoke:  # (in the test process TensorFlow is already running: its threads stay)
        args.positions, args.layers, args.width, args.heads, args.window = [4, 16], 1, 8, 2, 4
        args.tokens, args.repeats, args.jit_compile, args.threads = 2, 2, 0, 0
    if args.threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    rows = measure(args)
    measurement.print_table(rows, COLUMNS)
    config = {k: v for k, v in vars(args).items() if k != "output"}
    measurement.write_results(
        "decoding_positions" + ("_smoke" if args.smoke else ""), {"config": config, "rows": rows}, args.output
    )
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
