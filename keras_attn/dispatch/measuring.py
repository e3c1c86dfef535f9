"""The kernel times `implementation="auto"` decides by: measured once per bucket of calls, kept in
memory and in the user's cache directory.

A call's bucket (`bucket_key`) is its signature (`keras_attn.dispatch.signatures.signature`: the
shapes, dtypes, pattern, mode and flags the kernels read) with each length rounded down to a power
of two (`bucket_length`), so that a dataset of varied lengths or a growing decode measures a
handful of buckets. The first call of a bucket times each kernel it asks about on random tensors
of that call's own shapes (`measured_call`; an unknown batch is 1), in the call's mode (forward;
forward and backward when training): a model of one length is timed at exactly that length, which
can rank the kernels otherwise than half of it would. One untimed run (tracing), then timed runs
each, in turn (`best_seconds`): `REPEATS` rounds at least and more while the rounds have taken
under `TARGET_SECONDS` (a call of milliseconds is timed many times: one run's noise is the
machine's), `MAX_REPEATS` at most, stopping once they have taken `BUDGET_SECONDS`; each kernel
keeps its best time. The timing runs in a thread of its own: outside any graph being traced
(`tf.function`, `jit_compile=True`, `model.fit`) and any distribution strategy's replica context,
eagerly.

Times are kept per bucket in memory and in `measured_times-<environment>.json` in the user's cache
directory (`keras_attn.dispatch.state`), so that another process of the same environment measures
nothing again; a bucket's stored time of a kernel never changes, so the choice of a call is
deterministic once its kernels are measured.
"""

import dataclasses
import hashlib
import json
import threading
import time
import warnings

import keras
import numpy as np

from keras_attn.dispatch import state
from keras_attn.dispatch.signatures import signature
from keras_attn.kernels import KERNELS
from keras_attn.kernels.call import AttentionCall

REPEATS = 3  # timed runs per kernel at least, within the budget (the best is kept)
MAX_REPEATS = 30  # timed runs per kernel at most
TARGET_SECONDS = 0.5  # rounds go on past REPEATS until they have taken this long
BUDGET_SECONDS = 2.0  # timed runs stop once a bucket's have taken this long (each kernel runs once at least)
DOCUMENTS = 4  # equal documents per packed row of a representative call
SEED = 1234  # the representative tensors' and dropout's seed

_times = {}  # bucket key -> {kernel: seconds}, what this process measured or read
_lock = threading.Lock()  # one measurement at a time (replicas of a strategy trace in threads)


def bucket_length(length):
    """The bucket of a length: the largest power of two not above it.

    >>> [bucket_length(n) for n in (1, 3, 4, 1000, 1024, 1025)]
    [1, 2, 4, 512, 1024, 1024]
    """
    return 1 << (int(length).bit_length() - 1)


def packed_ids(batch, length):
    """int32 `(batch, length)` segment ids of `DOCUMENTS` equal documents per row (ids from 1)."""
    document = -(-length // DOCUMENTS)
    return np.broadcast_to(np.arange(length) // document + 1, (batch, length)).astype("int32")


def _shape_with_lengths(shape, lengths):
    """`shape` with the sizes of axes named in `lengths` (`{axis: (length, new_length)}`) changed
    where they are that length (a broadcast axis of 1 stays 1); an unknown batch is 1."""
    sizes = [1 if size is None else size for size in shape]
    for axis, (length, new_length) in lengths.items():
        if sizes[axis] == length:
            sizes[axis] = new_length
    return tuple(sizes)


def _offset_with_key_len(call, key_len, new_key_len):
    """A Python int `query_offset` keeps its distance to the last key (a decoding step stays the
    newest tokens of the cache); a tensor one is 0."""
    offset = call.query_offset
    if isinstance(offset, bool) or not isinstance(offset, int):
        return 0
    return max(0, offset - (key_len - new_key_len))


def bucketed_call(call, make=keras.KerasTensor):
    """The `AttentionCall` of `call`'s bucket: each tensor of the bucket's shape made by
    `make(shape, dtype)` (symbolic by default), the other fields as in `call`."""
    return _call_with_lengths(call, bucket_length(call.query.shape[1]), bucket_length(call.key.shape[1]), make)


def measured_call(call, make=keras.KerasTensor):
    """The `AttentionCall` the kernels are timed on for `call`: its own shapes (an unknown batch 1),
    each tensor made by `make(shape, dtype)`, dropout seeded by a `keras.random.SeedGenerator` as a
    layer's is, the other fields as in `call`."""
    # With a constant seed TensorFlow's graph optimiser folds a streaming kernel's per-tile
    # keep-masks (small enough to fold) into constants: that kernel would be timed without dropout.
    seed_generator = keras.random.SeedGenerator(SEED)
    return _call_with_lengths(call, call.query.shape[1], call.key.shape[1], make, seed_generator)


def _call_with_lengths(call, new_query_len, new_key_len, make, seed_generator=None):
    query_len, key_len = call.query.shape[1], call.key.shape[1]
    lengths = {"query": {1: (query_len, new_query_len)}, "key": {1: (key_len, new_key_len)}}
    pairwise = {2: (query_len, new_query_len), 3: (key_len, new_key_len)}

    def made(tensor, axes):
        if tensor is None:
            return None
        return make(_shape_with_lengths(tensor.shape, axes), keras.backend.standardize_dtype(tensor.dtype))

    return AttentionCall(
        query=made(call.query, lengths["query"]),
        key=made(call.key, lengths["key"]),
        value=made(call.value, lengths["key"]),
        mask=made(call.mask, pairwise),
        bias=made(call.bias, pairwise),
        pattern=call.pattern,
        query_offset=_offset_with_key_len(call, key_len, new_key_len),
        scale=call.scale if isinstance(call.scale, (int, float)) else None,
        dropout_rate=call.dropout_rate,
        seed_generator=seed_generator,
        return_weights=call.return_weights,
        hard=call.hard,
        position_bias=call.position_bias,
        query_segment_ids=made(call.query_segment_ids, lengths["query"]),
        key_segment_ids=made(call.key_segment_ids, lengths["key"]),
        logit_soft_cap=call.logit_soft_cap,
        training=call.training,
    )


def bucket_key(call):
    """The JSON text of the signature of `call`'s bucket: the key of its measured times."""
    return json.dumps(signature(bucketed_call(call)), default=str)


def times_path():
    """The file of this environment's measured times in the user's cache directory."""
    digest = hashlib.sha256(json.dumps(state.environment(), sort_keys=True).encode()).hexdigest()[:12]
    return state.cache_dir() / f"measured_times-{digest}.json"


def _times_problem(payload):
    entries = payload.get("times")
    if not isinstance(entries, dict):
        return "`times` is not a mapping"
    for key, kernels in entries.items():
        if not isinstance(kernels, dict) or not kernels:
            return f"times[{key!r}] is not a mapping of kernels"
        for name, seconds in kernels.items():
            if name not in KERNELS:
                return f"times[{key!r}] names {name!r}, not a kernel of {tuple(KERNELS)}"
            problem = state.nonnegative_number_problem(f"times[{key!r}][{name!r}]", seconds)
            if problem:
                return problem
    return None


def forget():
    """Forgets the times this process measured or read (the file stays)."""
    _times.clear()


def measured_seconds(call, names):
    """`({kernel: seconds}, source)` for each kernel of `names` on `call`'s bucket, where `source`
    says where the times came from: `"measured now"`, `"cache file <path>"` or `"memory"`
    (measured or read earlier in this process). Kernels not yet known are measured now."""
    key = bucket_key(call)
    with _lock:
        known = _times.setdefault(key, {})
        source = "memory"
        if any(name not in known for name in names):
            path = times_path()
            stored = (state.read(path, _times_problem) or {}).get("times", {}).get(key, {})
            for name, seconds in stored.items():
                known.setdefault(name, seconds)
            source = f"cache file {path}"
        missing = [name for name in names if name not in known]
        if missing:
            measured = _measure_and_store(call, key, missing)
            for name, seconds in measured.items():
                known.setdefault(name, seconds)
            source = "measured now"
        return {name: known[name] for name in names}, source


def _measure_and_store(call, key, names):
    path = times_path()
    unwritable = state.unwritable_reason(path.parent)  # checked before measuring
    measured = time_kernels(call, names)
    if unwritable:
        if str(path.parent) not in _unwritable_warned:
            _unwritable_warned.add(str(path.parent))
            warnings.warn(
                f"keras_attn cannot store measured kernel times in {path.parent} ({unwritable}); they are kept "
                f"in memory for this process only. Set ${state.CACHE_ENV} to a writable directory.",
                stacklevel=4,
            )
        return measured

    def merged(current):
        times = dict((current or {}).get("times", {}))
        entry = dict(times.get(key, {}))
        for name, seconds in measured.items():
            entry.setdefault(name, seconds)  # a stored time never changes: another process's stays
        times[key] = entry
        return {"times": times}

    try:
        state.update(path, _times_problem, merged)
        stored = state.read(path, _times_problem)
        return {**measured, **(stored or {}).get("times", {}).get(key, {})}
    except OSError as error:  # the disk filled up, the directory vanished: the times stay in memory
        warnings.warn(f"keras_attn could not store measured kernel times in {path}: {error}", stacklevel=4)
        return measured


_unwritable_warned = set()


def _random_tensor(shape, dtype):
    import tensorflow as tf

    if dtype == "bool":
        return tf.ones(shape, "bool")
    if "int" in dtype:  # segment ids
        return tf.constant(packed_ids(shape[0], shape[1]))
    return tf.cast(tf.random.stateless_normal(shape, seed=(SEED, len(shape))), dtype)


def time_kernels(call, names, repeats=None, budget_seconds=None):
    """`{kernel: best seconds}` of each kernel of `names` on random tensors of `call`'s shapes
    (`measured_call`), in its mode, made and timed in a thread of its own (outside any graph being
    traced). Raises what the timing raised."""
    repeats = REPEATS if repeats is None else repeats
    budget_seconds = BUDGET_SECONDS if budget_seconds is None else budget_seconds
    outcome = {}

    def run():
        try:
            outcome["times"] = _timed(measured_call(call, make=_random_tensor), names, repeats, budget_seconds)
        except BaseException as error:  # handed to the caller's thread
            outcome["error"] = error

    thread = threading.Thread(target=run, name="keras_attn-measure", daemon=True)
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["times"]


def _timed(call, names, repeats, budget_seconds):
    steps = {name: step(call, name) for name in names}
    for run in steps.values():  # the first run's setup: not timed
        run_to_completion(run())
    return best_seconds(steps, repeats, budget_seconds)


def best_seconds(steps, repeats=REPEATS, budget_seconds=BUDGET_SECONDS):
    """`{name: best seconds}` of each step of `steps` (`{name: callable}`, already run once), run
    in turn: `repeats` rounds at least and more while the rounds have taken under `TARGET_SECONDS`,
    `MAX_REPEATS` at most, stopping after the round that reaches `budget_seconds`."""
    best = dict.fromkeys(steps, float("inf"))
    start = time.perf_counter()
    for rounds in range(1, MAX_REPEATS + 1):
        for name, run in steps.items():
            began = time.perf_counter()
            run_to_completion(run())
            best[name] = min(best[name], time.perf_counter() - began)
        elapsed = time.perf_counter() - start
        if elapsed >= budget_seconds or (rounds >= repeats and elapsed >= TARGET_SECONDS):
            break
    return best


def step(call, name):
    """The traced step (called without arguments) of kernel `name` on `call` (eager tensors):
    forward, or forward and the gradients of query, key and value when `call.training`."""
    import tensorflow as tf

    # The tensors are the traced function's arguments, not captured by it: TensorFlow keeps a
    # traced graph that holds a `tf.custom_gradient` (every kernel's) alive for good, and with it
    # what the graph captured: the random tensors of every bucket measured, for the process's life.
    tensors = {field.name: getattr(call, field.name) for field in dataclasses.fields(call)}
    tensors = {field: value for field, value in tensors.items() if tf.is_tensor(value)}

    def attend(tensors):
        return KERNELS[name].attend(dataclasses.replace(call, **tensors))

    @tf.function(autograph=False)  # plain TensorFlow: no AutoGraph conversion to go wrong
    def forward(tensors):
        return attend(tensors)

    @tf.function(autograph=False)  # plain TensorFlow: no AutoGraph conversion to go wrong
    def training(tensors):
        inputs = (tensors["query"], tensors["key"], tensors["value"])
        with tf.GradientTape() as tape:
            tape.watch(inputs)
            output = tf.nest.flatten(attend(tensors))[0]
            loss = tf.reduce_sum(tf.cast(output, "float32") ** 2)
        return tape.gradient(loss, inputs)

    # Traced here, outside TensorFlow's retracing count: every bucket's steps share these
    # functions' code, and calling them as `tf.function`s would log retracing warnings.
    traced = (training if call.training else forward).get_concrete_function(tensors)
    return lambda: traced(tensors)


def run_to_completion(result):
    """Waits for every tensor of `result` (a step's outputs) to be computed."""
    import tensorflow as tf

    for tensor in tf.nest.flatten(result):
        if tensor is not None:
            tensor.numpy()
