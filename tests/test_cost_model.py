"""The dispatcher of `implementation="auto"` (`keras_attn.dispatch.cost_model`): its rule, its
explanation, and the calibration it reads (`keras_attn.dispatch.tuning`, `keras_attn.tune`)."""

import json
import warnings
from pathlib import Path

import keras
import numpy as np
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

import keras_attn
from keras_attn import patterns
from keras_attn.dispatch import attention as attention_module
from keras_attn.dispatch import cost_model
from keras_attn.dispatch import tuning
from keras_attn.kernels import KERNELS
from keras_attn.kernels import cost
from keras_attn.kernels.call import AttentionCall
from tests.dispatch_rule import prefer_kernel
from tests.dispatch_rule import rule_choice

PATTERNS = {
    "none": None,
    "causal": patterns.Causal(),
    "windowed": patterns.Causal() & patterns.SlidingWindow(128),
    "strided": patterns.Causal() & (patterns.SlidingWindow(64) | patterns.Strided(64)),
}


@st.composite
def signatures(draw):
    """An `explain_implementation` call: sizes from one token to 16,384, every kind of call."""
    batch = draw(st.integers(1, 4))
    query_len = draw(st.sampled_from([1, 7, 128, 256, 1000, 2048, 4096, 16384]))
    key_len = draw(st.sampled_from([query_len, 512, 8192]))
    key_heads = draw(st.sampled_from([1, 2, 8]))
    training = draw(st.booleans())
    return dict(
        query_shape=(batch, query_len, key_heads * draw(st.sampled_from([1, 2])), draw(st.sampled_from([16, 64]))),
        key_shape=(batch, key_len, key_heads, None),
        dtype=draw(st.sampled_from(["float32", "bfloat16", "float16"])),
        pattern=PATTERNS[draw(st.sampled_from(sorted(PATTERNS)))],
        dropout_rate=draw(st.sampled_from([0.0, 0.1])),
        training=training,
        return_weights=draw(st.booleans()),
        packed=query_len == key_len and draw(st.booleans()),
    )


def _explain(signature):
    query_shape, key_shape = signature["query_shape"], signature["key_shape"]
    key_shape = (*key_shape[:3], query_shape[3])
    return keras_attn.explain_implementation(**{**signature, "key_shape": key_shape})


@settings(max_examples=60, deadline=None)
@given(signatures())
def test_auto_never_takes_a_kernel_heavier_than_keras_when_a_lighter_one_takes_the_call(signature):
    explanation = _explain(signature)
    by_name = {candidate.name: candidate for candidate in explanation.candidates}
    chosen = by_name[explanation.chosen]
    takers = [candidate for candidate in explanation.candidates if not candidate.unsupported]
    assert not chosen.unsupported and (chosen.unrolled_steps or 0) <= cost.MAX_UNROLLED_STEPS
    takers = [candidate for candidate in takers if (candidate.unrolled_steps or 0) <= cost.MAX_UNROLLED_STEPS]
    lighter = [candidate for candidate in takers if candidate.peak_bytes <= explanation.keras_peak_bytes]
    if lighter:
        assert chosen.peak_bytes <= explanation.keras_peak_bytes
        fastest = min(candidate.seconds for candidate in lighter)
        assert chosen.seconds <= fastest * (1 + cost_model.tie_tolerance())  # a near-tie goes to the lighter
        ties = [candidate for candidate in lighter if candidate.seconds <= fastest * (1 + cost_model.tie_tolerance())]
        assert chosen.peak_bytes == min(candidate.peak_bytes for candidate in ties)
    else:
        assert chosen.peak_bytes == min(candidate.peak_bytes for candidate in takers)
    assert explanation.chosen == rule_choice(explanation)


def test_the_choice_is_deterministic_for_a_signature_and_is_the_explained_one():
    first = keras.KerasTensor((2, 2048, 8, 64))
    second = keras.KerasTensor((2, 2048, 8, 64))  # another tensor of the same signature
    calls = [
        AttentionCall(q, q, q, pattern=patterns.Causal(), training=True, dropout_rate=0.1) for q in (first, second)
    ]
    chosen = {attention_module._choose_implementation("auto", call) for call in calls * 2}
    assert chosen == {cost_model.explain(calls[0]).chosen}
    assert cost_model.signature(calls[0]) == cost_model.signature(calls[1])
    other = AttentionCall(first, first, first, pattern=patterns.Causal())  # forward: another signature
    assert cost_model.signature(other) != cost_model.signature(calls[0])


def test_the_explanation_names_every_kernel_with_its_own_reason():
    explanation = keras_attn.explain_implementation((1, 512, 4, 32), is_causal=True, return_weights=True)
    assert [candidate.name for candidate in explanation.candidates] == list(KERNELS)
    call = AttentionCall(*(keras.KerasTensor((1, 512, 4, 32)),) * 3, pattern=patterns.Causal(), return_weights=True)
    text = str(explanation)
    for candidate in explanation.candidates:
        assert f"  {candidate.name}: " in text
        reason = KERNELS[candidate.name].why_unsupported(call)
        assert candidate.unsupported == reason
        if reason:
            assert reason in text and not candidate.admissible
    assert explanation.chosen == "dense"  # the only kernel returning weights


def test_the_explanation_says_why_a_supported_kernel_was_not_taken():
    explanation = keras_attn.explain_implementation((1, 2048, 8, 64), is_causal=True, training=True)
    chosen_seconds = {candidate.name: candidate.seconds for candidate in explanation.candidates}[explanation.chosen]
    for candidate in explanation.candidates:
        if candidate.name == explanation.chosen or candidate.unsupported:
            continue
        if candidate.peak_bytes > explanation.keras_peak_bytes:
            assert candidate.why_not.startswith("predicted peak") and "exceeds Keras's dense" in candidate.why_not
        elif candidate.seconds > chosen_seconds * cost_model.PRUNE_FACTOR:
            assert candidate.why_not.endswith("not a contender")
        elif candidate.seconds > chosen_seconds * (1 + cost_model.tie_tolerance()):
            assert candidate.why_not.startswith(f"predicted slower than {explanation.chosen!r}")
        else:
            assert f"but predicted heavier than {explanation.chosen!r}" in candidate.why_not


def test_auto_never_takes_a_kernel_unrolling_more_steps_than_it_allows(monkeypatch, tmp_path):
    # Packed rows at 8,192 tokens: the chunked kernel would unroll 64 chunks of 64 key tiles into the
    # graph. Even predicted fastest and lightest, it is not taken, and the explanation says why.
    prefer_kernel(monkeypatch, tmp_path, "chunked")
    explanation = keras_attn.explain_implementation((1, 8192, 8, 64), training=True, packed=True)
    chunked = {candidate.name: candidate for candidate in explanation.candidates}["chunked"]
    assert chunked.unrolled_steps == (8192 // 128) ** 2 > cost.MAX_UNROLLED_STEPS
    assert explanation.chosen != "chunked" and not chunked.admissible
    assert chunked.why_not.startswith(f"unrolls {chunked.unrolled_steps} steps into the graph")
    # At 1,024 tokens (64 steps) the same calibration makes it the choice.
    assert keras_attn.explain_implementation((1, 1024, 8, 64), training=True, packed=True).chosen == "chunked"


def test_the_documented_unrolling_limit_is_the_dispatchers():
    guide = (Path(__file__).resolve().parents[1] / "docs" / "guides" / "kernels.md").read_text(encoding="utf-8")
    assert f"`MAX_UNROLLED_STEPS` ({cost.MAX_UNROLLED_STEPS})" in guide
    assert f"unrolling at most {cost.MAX_UNROLLED_STEPS} steps" in attention_module.scaled_dot_product_attention.__doc__


def test_unknown_lengths_take_the_first_kernel_that_takes_them():
    explanation = keras_attn.explain_implementation((None, None, 4, 16))
    assert explanation.chosen == "dense" and explanation.keras_peak_bytes is None
    query = keras.KerasTensor((None, None, 4, 16))
    assert attention_module._choose_implementation("auto", AttentionCall(query, query, query)) == "dense"


def test_a_named_kernel_still_raises_its_reason():
    query = keras.KerasTensor((1, 64, 2, 8))
    call = AttentionCall(query, query, query, return_weights=True)
    with pytest.raises(ValueError, match=r"`implementation='chunked'` needs `return_weights=False`"):
        attention_module._choose_implementation("chunked", call)


def test_auto_follows_the_calibration_in_the_cache_directory(monkeypatch, tmp_path):
    query = keras.KerasTensor((1, 256, 2, 8))
    call = AttentionCall(query, query, query, pattern=patterns.Causal())
    for kernel in ("blockwise", "chunked", "dense"):
        prefer_kernel(monkeypatch, tmp_path / kernel, kernel)
        assert attention_module._choose_implementation("auto", call) == kernel
        assert cost_model.explain(call).calibration == str(tmp_path / kernel / "calibration.json")


def test_the_fit_recovers_the_coefficients_that_made_the_measurements():
    # Rows whose "measurements" are a known dot product of the features: the fit must return
    # coefficients predicting them (the features of these cells are independent enough).
    cells = tuning.grid((256, 512, 1024, 2048), (1, 2), heads=2, depth=16, settings=("causal", "bidirectional"))
    truth = {"calls": 1e-3, "steps": 2e-5, "pairs": 3e-9, "dropout_pairs": 1e-9, "flops": 5e-11}
    rows = []
    for cell in cells:
        features = cost_model.kernel_features("blockwise", cell.call()).time
        rows.append({"cell": cell, "name": "blockwise", "seconds": sum(truth[f] * features[f] for f in truth)})
    fitted = tuning.fit(rows, "time")["blockwise"]
    for row in rows:
        features = cost_model.kernel_features("blockwise", row["cell"].call()).time
        predicted = sum(fitted[row["cell"].mode][f] * features[f] for f in cost.TIME_FEATURES)
        np.testing.assert_allclose(predicted, row["seconds"], rtol=1e-6)


def test_tune_writes_reads_and_refits_the_calibration_in_the_cache_directory(monkeypatch, tmp_path):
    monkeypatch.setenv(cost_model.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(cost_model, "_CHOICES", {})
    try:
        path = keras_attn.tune(lengths=(16, 32, 64), heads=1, depth=4, repeats=1, settings=("causal",))
        assert path == str(tmp_path / "calibration.json")
        written = json.loads((tmp_path / "calibration.json").read_text())
        measured = {"dense", "chunked", "blockwise"}  # the kernels taking a causal call
        assert set(written["time"]) == measured and written["memory"] == {}
        assert all(set(written["time"][name]) == set(cost_model.MODES) for name in measured)
        assert cost_model.calibration()["source"] == path  # read back, in this process
        query = keras.KerasTensor((1, 64, 1, 4))
        call = AttentionCall(query, query, query, pattern=patterns.Causal())
        features = cost_model.kernel_features("chunked", call).time
        expected = sum(written["time"]["chunked"]["forward"][f] * v for f, v in features.items())
        assert cost_model.predict("chunked", call, "time") == pytest.approx(max(0.0, expected))
        shipped = json.loads(cost_model.SHIPPED_CALIBRATION.read_text())
        assert cost_model.calibration()["time"]["strided"] == shipped["time"]["strided"]  # not measured: shipped
    finally:
        monkeypatch.undo()
        cost_model.reload_calibration()
    assert cost_model.calibration()["source"] == str(cost_model.SHIPPED_CALIBRATION)


def test_the_shipped_calibration_covers_every_kernel_and_keras():
    shipped = json.loads(cost_model.SHIPPED_CALIBRATION.read_text())
    query = keras.KerasTensor((1, 256, 8, 64))
    call = AttentionCall(query, query, query, pattern=PATTERNS["strided"])  # a call every kernel takes
    for name in KERNELS:
        assert set(shipped["time"][name]) == set(cost_model.MODES), name
        memory_model = cost_model.memory_model(name, cost_model.kernel_features(name, call))
        assert set(shipped["memory"][memory_model]) == set(cost_model.MODES), name
    assert set(shipped["memory"][cost_model.KERAS_DENSE]) == set(cost_model.MODES)
    assert "dense" not in shipped["memory"]  # it holds Keras's tensors: Keras's coefficients predict it
    assert cost_model.calibration_problem(shipped) is None  # what a user's calibration is held to


def test_a_fit_with_keras_layer_measured_is_a_calibration_the_dispatcher_reads(monkeypatch, tmp_path):
    # `tune(measure_memory=True)` and the benchmark measure Keras's layer too (the memory ceiling):
    # its time is a peer's, not a kernel's, and a calibration naming it would be refused.
    cells = tuning.grid((256, 512, 1024), (1,), heads=2, depth=16, settings=("causal",))
    rows = [
        {"cell": cell, "name": name, "seconds": 1e-3 * cell.length, "peak_bytes": 2**21 * cell.length}
        for cell in cells
        for name in (*tuning.candidates(cell), cost_model.KERAS_DENSE)
    ]
    calibration = {"time": tuning.fit(rows, "time"), "memory": tuning.fit(rows, "memory")}
    assert set(calibration["time"]) == set(tuning.candidates(cells[0]))
    assert cost_model.KERAS_DENSE in calibration["memory"]
    path = tuning.write_calibration(calibration, tmp_path / "calibration.json", {})
    monkeypatch.setenv(cost_model.CACHE_ENV, str(tmp_path))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a refused calibration warns
            cost_model.reload_calibration()
            assert cost_model.calibration()["source"] == path
    finally:
        monkeypatch.undo()
        cost_model.reload_calibration()


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(lengths=(0,)), "lengths"),
        (dict(lengths=(1,)), "lengths"),  # one length: a fit predicting minutes for milliseconds
        (dict(lengths=(256, 256, 512)), "lengths"),  # two distinct
        (dict(lengths=(256, 512, 2**20)), "lengths"),  # beyond the range: a raw OOM
        (dict(lengths="256"), "lengths"),
        (dict(batch_sizes=()), "batch_sizes"),
        (dict(heads=0), "heads"),
        (dict(depth=2.5), "depth"),
        (dict(repeats=True), "repeats"),
        (dict(settings=("diagonal",)), "settings"),
        (dict(measure_memory="yes"), "measure_memory"),
    ],
)
def test_tune_refuses_bad_arguments_naming_them(kwargs, name):
    with pytest.raises(ValueError, match=f"`{name}` must .* Received: {name}="):
        keras_attn.tune(**kwargs)


@pytest.mark.parametrize(
    "args, kwargs, name",
    [
        (((1, 16, 2),), {}, "query_shape"),
        (((1, 16, 2, 0),), {}, "query_shape"),
        (((1, 16, 2, 8), (1, 16, 3, 8)), {}, "query_shape"),  # 2 heads are not a multiple of 3
        (((1, 16, 2, 8),), dict(dtype="int32"), "dtype"),
        (((1, 16, 2, 8),), dict(dropout_rate=1.5), "dropout_rate"),
        (((1, 16, 2, 8),), dict(training="yes"), "training"),
        (((1, 16, 2, 8),), dict(mask_shape=(1, 16)), "mask_shape"),
        (((1, 16, 2, 8),), dict(sliding_window=0), "sliding_window"),
    ],
)
def test_explain_implementation_refuses_bad_arguments_naming_them(args, kwargs, name):
    with pytest.raises(ValueError, match=f"`{name}`"):
        keras_attn.explain_implementation(*args, **kwargs)


@pytest.mark.parametrize(
    "kwargs", [dict(), dict(is_causal=True), dict(pattern=PATTERNS["strided"]), dict(is_causal=True, packed=True)]
)
def test_the_largest_lengths_are_explained_without_a_loop_over_every_block(kwargs):
    # Beyond MAX_SUMMED_BLOCKS blocks a feature sums over a sample of them: an answer at int32's
    # largest length (a loop over its 16 million chunks took minutes), close to the exact sum below it.
    explanation = keras_attn.explain_implementation((1, 2**31 - 1, 8, 64), **kwargs)
    assert explanation.chosen in ("blockwise", "strided")
    length = 2**19  # 4,096 chunks of 128 queries: sampled
    query = keras.KerasTensor((1, length, 8, 64))
    call = AttentionCall(query, query, query, pattern=kwargs.get("pattern", patterns.Causal()))
    chunks = KERNELS["chunked"].pattern_query_chunks(length, length, 128, call.pattern)
    exact = sum((c.query_stop - c.query_start) * (c.key_stop - c.key_start) for c in chunks) * 8
    assert cost.MAX_SUMMED_BLOCKS < len(chunks)
    assert KERNELS["chunked"].cost_features(call).time["pairs"] == pytest.approx(exact, rel=1e-3)


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 500), st.integers(0, 500), st.sampled_from([None, 1, 7, 64]))
def test_tiles_are_counted_as_they_are_made(start, width, tile_size):
    chunk = KERNELS["chunked"].QueryChunk(0, 1, start, start + width)
    chunked = KERNELS["chunked"]
    assert chunked.tile_count(chunk, tile_size) == len(chunked.chunk_tiles(chunk, tile_size))


@pytest.mark.parametrize("implementation", ["chunked", cost_model.KERAS_DENSE])
def test_the_grid_feeds_document_ids_to_its_steps_as_a_model_does(implementation):
    # Ids made inside the traced step would be constants, and TensorFlow's graph optimiser would fold
    # the chunked kernel's document skipping into them: timed faster than in any model.
    cell = tuning.Cell(1, 64, 2, 8, "packed", "forward", False)
    step = tuning._step(cell, implementation)
    graph = step.func.graph
    ids = [tensor for tensor in graph.inputs if tensor.dtype == "int32" and tuple(tensor.shape) == (1, 64)]
    assert len(ids) == 1 and not graph.captures  # fed, not captured (a captured tensor lives with the graph)
    constants = [op for op in graph.get_operations() if op.type == "Const" and tuple(op.outputs[0].shape) == (1, 64)]
    assert constants == []
    np.testing.assert_array_equal(step.args[3].numpy(), cell.segment_ids())
