"""`implementation="auto"`'s rule restated from an explanation's numbers, and a calibration that makes
one kernel the fastest: for the tests of what the dispatcher (`keras_attn.dispatch.cost_model`) runs."""

import functools

from keras_attn.dispatch import cost_model
from keras_attn.dispatch import tuning
from keras_attn.kernels import KERNELS
from keras_attn.kernels import cost


def rule_choice(explanation):
    """The kernel the rule takes given the explanation's predictions: among the kernels taking the
    call that unroll at most `MAX_UNROLLED_STEPS` steps into the graph, of those predicted no
    heavier than Keras's dense attention the lightest whose time is within the tie tolerance of
    the fastest, else the lightest (the first taker when nothing was predicted)."""
    takers = [candidate for candidate in explanation.candidates if not candidate.unsupported]
    if explanation.keras_peak_bytes is None:
        return takers[0].name
    takers = [candidate for candidate in takers if (candidate.unrolled_steps or 0) <= cost.MAX_UNROLLED_STEPS]
    admissible = [candidate for candidate in takers if candidate.peak_bytes <= explanation.keras_peak_bytes]
    if admissible:
        times = {candidate.name: candidate.measured_seconds or candidate.seconds for candidate in admissible}
        fastest = min(times.values())
        tied = [
            candidate for candidate in admissible if times[candidate.name] <= fastest * (1 + cost_model.tie_tolerance())
        ]
        return min(tied, key=lambda candidate: (candidate.peak_bytes, times[candidate.name])).name
    return min(takers, key=lambda candidate: candidate.peak_bytes).name


def prefer_kernel(monkeypatch, tmp_path, kernel):
    """For the rest of the test, a user calibration in `tmp_path` under which `kernel` is predicted
    fastest at any size (a fixed cost per call, half the others') and every kernel holds the tensors
    it counts once (so a streaming kernel is never heavier than Keras's dense attention)."""
    predict_times(monkeypatch, tmp_path, {name: 0.5 if name == kernel else 1.0 for name in KERNELS})


def predict_times(monkeypatch, tmp_path, seconds):
    """For the rest of the test, a user calibration in `tmp_path` predicting `seconds[kernel]` for
    every call on each kernel (a fixed cost per call), each kernel holding the tensors it counts
    once; the cache directory is `tmp_path`, the dispatcher's caches fresh."""
    times = {name: {mode: {"calls": seconds[name]} for mode in cost_model.MODES} for name in KERNELS}
    memory = {
        name: dict.fromkeys(cost_model.MODES, dict(cost_model.ANALYTIC_MEMORY))
        for name in (*KERNELS, cost_model.KERAS_DENSE)
    }
    tuning.write_calibration({"time": times, "memory": memory}, tmp_path / cost_model.CALIBRATION_FILE, {})
    monkeypatch.setenv(cost_model.CACHE_ENV, str(tmp_path))
    # Fresh caches, which the monkeypatch puts back (with the shipped calibration) after the test.
    monkeypatch.setattr(cost_model, "calibration", functools.lru_cache(maxsize=1)(cost_model.calibration.__wrapped__))
    monkeypatch.setattr(cost_model, "_CHOICES", {})
