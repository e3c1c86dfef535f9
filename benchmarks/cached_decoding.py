"""Per-token latency of incremental decoding: key/value cache vs recomputing the prefix.

A stack of `--layers` causal self-attention blocks (`keras_attn.MultiHeadAttention` plus a
residual), batch 1, width 256, 8 heads. At output step `s`:

- cached: one token attends over the layer's cache (`cache`, `cache_update_index=s - 1`; the
  cache holds `max(--steps)` positions, so the step costs the same at every `s`);
- recompute: the whole prefix of `s` tokens runs through the stack again (causal mask) and the
  last position is the new token's output, as without a cache.

Each is timed two ways, both in `tf.function`, with and without `jit_compile`:

- `call`: one Python call per token (what a Python decoding loop pays, dispatch included);
- `loop`: `--loop-tokens` tokens in one compiled `while` loop, each output fed back as the next
  token (how `models.decoding` generates: its greedy and beam searches are one `while_loop`), so
  the per-token figure is the step itself and the cache is updated in place.

All (mode, kind, step) candidates run in turn `--repeats` times and each keeps its best time, so
the ratios come from the same run.

    python -m benchmarks.cached_decoding
"""

import functools
import sys

import tensorflow as tf  # noqa: E402

from benchmarks import measurement
from keras_attn.layers.multi_head_attention import MultiHeadAttention  # noqa: E402

PEER_RATIO = "recompute_over_cached"  # the rows' ratio to the peer measured in the same run (tests/test_benchmarks.py)
BENCH_ARGS = ["--repeats", "10"]  # `make bench` (benchmarks/run_all.py): the steps and modes, fewer repeats

DEFAULT_STEPS = (8, 16, 32, 64, 128, 256)


class Stack:
    """Causal self-attention blocks sharing their weights between the cached and full passes."""

    def __init__(self, num_layers, width, heads, max_length):
        self.layers = [MultiHeadAttention(heads, width // heads) for _ in range(num_layers)]
        self.heads, self.key_dim, self.max_length = heads, width // heads, max_length
        probe = tf.zeros((1, 2, width))
        for layer in self.layers:
            layer(probe, probe)

    def full(self, x):
        """`(1, length, width)` -> the output of the last position `(1, 1, width)`."""
        for layer in self.layers:
            x = x + layer(x, x, use_causal_mask=True)
        return x[:, -1:]

    def step(self, token, caches, index):
        """One token `(1, 1, width)` at position `index`; returns its output and the new caches."""
        new_caches = []
        for layer, cache in zip(self.layers, caches):
            attended, cache = layer(token, token, use_causal_mask=True, cache=cache, cache_update_index=index)
            token = token + attended
            new_caches.append(cache)
        return token, new_caches

    def empty_caches(self):
        shape = (1, 2, self.max_length, self.heads, self.key_dim)
        return [tf.random.normal(shape) for _ in self.layers]  # contents do not change the cost


def generation_loop(step, tokens):
    """`step(token, state) -> (token, state)` run `tokens` times in one graph `while` loop."""

    def run(token, state):
        for _ in tf.range(tokens):
            token, state = step(token, state)
        return token, state

    return run


def candidates_for(stack, steps, width, loop_tokens, jit_compile):
    """`{(mode, kind, step): callable}` for the cached step and the recomputed prefix."""
    compile_ = functools.partial(tf.function, jit_compile=jit_compile)
    cached_call = compile_(stack.step)
    # One trace for every prefix length without XLA; XLA compiles each length once (warm-up).
    spec = tf.TensorSpec((1, None, width), tf.float32)
    recompute_call = compile_(stack.full, input_signature=None if jit_compile else [spec])

    def cached_step(index):
        def step(token, caches):
            return stack.step(token, caches, index)

        return step

    def recompute_step(token, prefix):
        prefix = tf.concat([prefix[:, 1:], token], axis=1)  # the newest token replaces the oldest
        return stack.full(prefix), prefix

    cached_loop = compile_(lambda token, caches, index: generation_loop(cached_step(index), loop_tokens)(token, caches))
    recompute_loop = compile_(generation_loop(recompute_step, loop_tokens))
    caches = stack.empty_caches()
    token = tf.random.normal((1, 1, width))
    candidates = {}
    for step in steps:
        prefix = tf.random.normal((1, step, width))
        index = tf.constant(step - 1)
        candidates[("call", "cached", step)] = lambda index=index: cached_call(token, caches, index)
        candidates[("call", "recompute", step)] = lambda prefix=prefix: recompute_call(prefix)
        candidates[("loop", "cached", step)] = lambda index=index: cached_loop(token, caches, index)
        candidates[("loop", "recompute", step)] = lambda prefix=prefix: recompute_loop(token, prefix)
    return candidates


def measure(stack, steps, width, repeats, loop_tokens, jit_compile):
    candidates = candidates_for(stack, steps, width, loop_tokens, jit_compile)
    best = measurement.best_seconds_round_robin(candidates, repeats)
    rows = []
    for mode, tokens_per_call in (("call", 1), ("loop", loop_tokens)):
        for step in steps:
            cached = best[(mode, "cached", step)] / tokens_per_call
            recompute = best[(mode, "recompute", step)] / tokens_per_call
            rows.append(
                {
                    "jit_compile": jit_compile,
                    "mode": mode,
                    "step": step,
                    "cached_ms": cached * 1e3,
                    "recompute_ms": recompute * 1e3,
                    "recompute_over_cached": recompute / cached,
                }
            )
        first = rows[-len(steps)]["cached_ms"]
        for row in rows[-len(steps) :]:
            row["cached_vs_first_step"] = row["cached_ms"] / first
    return rows


def main(argv=None):
    parser = measurement.parse_args(
        __doc__.splitlines()[0],
        steps=dict(type=int, nargs="+", default=list(DEFAULT_STEPS)),
        layers=dict(type=int, default=4),
        width=dict(type=int, default=256),
        heads=dict(type=int, default=8),
        repeats=dict(type=int, default=20),
        loop_tokens=dict(type=int, default=16, help="tokens per compiled generation loop (mode `loop`)"),
        jit_compile=dict(type=int, nargs="+", default=[0, 1]),
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.steps, args.layers, args.width, args.heads, args.repeats, args.loop_tokens = [2, 4], 1, 16, 2, 2, 2
        args.jit_compile = [0]
    stack = Stack(args.layers, args.width, args.heads, max_length=max(args.steps))
    rows = []
    for jit_compile in args.jit_compile:
        rows.extend(measure(stack, args.steps, args.width, args.repeats, args.loop_tokens, bool(jit_compile)))
    measurement.print_table(
        rows,
        [
            ("jit_compile", "jit", "{}"),
            ("mode", "mode", "{}"),
            ("step", "step", "{}"),
            ("cached_ms", "cached ms/token", "{:.2f}"),
            ("recompute_ms", "recompute ms/token", "{:.2f}"),
            ("recompute_over_cached", "recompute / cached", "{:.1f}"),
            ("cached_vs_first_step", "cached / first step", "{:.2f}"),
        ],
    )
    config = {k: v for k, v in vars(args).items() if k != "output"}
    measurement.write_results(
        "cached_decoding" + ("_smoke" if args.smoke else ""), {"config": config, "rows": rows}, args.output
    )
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
