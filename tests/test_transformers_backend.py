"""The transformers backend on tiny random models (``tests.tiny_hf``): the protocol and the
vocabulary, evaluate and truncate, and the engine on top (greedy identity, exact sampling). Its
loading from folders and GGUF files is in ``test_transformers_loading.py``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence

import numpy as np
import pytest

from chatapp.backends.base import Backend, BackendError
from chatapp.backends.transformers_backend import TransformersBackend
from chatapp.chat.message import ChatMessage
from chatapp.drafters.model import ModelDrafter
from chatapp.engine.contracts import Proposal
from chatapp.engine.events import TokenEvent
from chatapp.engine.loop import GenerationSettings, SpeculativeEngine
from chatapp.engine.sampling import SamplingParams, probabilities
from chatapp.policy.fixed import FixedDraftLength
from tests.stat_tools import fits
from tests.tiny_hf import (
    CHATML,
    CONTROL,
    MODEL_VOCAB,
    PROMPT,
    make_backend,
    make_model,
    make_tokenizer,
    perturbed,
    run,
    sequence,
    torch_threads,
)


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    yield from torch_threads(1)


# -- the protocol and the vocabulary -------------------------------------------------------------

def test_implements_the_backend_protocol() -> None:
    backend = make_backend()
    assert isinstance(backend, Backend)
    assert backend.vocab_size == MODEL_VOCAB
    assert backend.n_ctx == 256  # capped at max_position_embeddings
    assert backend.cached_tokens == ()


def test_stop_ids_include_eos_and_end_of_turn_tokens() -> None:
    backend = make_backend()
    tokenizer = make_tokenizer()
    expected = {263, *(tokenizer.convert_tokens_to_ids(t) for t in CONTROL[1:])}
    assert backend.stop_ids == frozenset(expected)


def test_token_bytes_reassemble_text_and_split_utf8() -> None:
    backend = make_backend()
    text = "the é ü 漢 \n tabs\t"
    ids = backend.tokenize(text)
    assert b"".join(backend.token_bytes(i) for i in ids) == text.encode()
    assert [backend.token_bytes(i) for i in backend.tokenize("é")] == [b"\xc3", b"\xa9"]
    assert backend.token_bytes(backend.tokenize(" the")[0]) == b" the"


def test_token_bytes_of_control_and_padding_ids() -> None:
    backend = make_backend()
    im_end = backend.tokenize("<|im_end|>", special=True)
    assert len(im_end) == 1 and backend.token_bytes(im_end[0]) == b"<|im_end|>"
    assert backend.token_bytes(MODEL_VOCAB - 1) == b""  # beyond the tokenizer
    assert backend.token_bytes(MODEL_VOCAB) == b""


def test_tokenize_parses_control_tokens_only_when_asked() -> None:
    backend = make_backend()
    assert len(backend.tokenize("<|im_end|>")) > 1
    assert backend.tokenize("a<|im_end|>", special=True)[-1] in backend.stop_ids


def test_vocab_fingerprint_depends_on_the_vocabulary_only() -> None:
    assert make_backend(0).vocab_fingerprint() == make_backend(1, "llama").vocab_fingerprint()
    other = make_tokenizer()
    other.add_tokens(["<extra>"])
    changed = TransformersBackend.from_model(make_model(0), other)
    assert changed.vocab_fingerprint() != make_backend(0).vocab_fingerprint()


def test_chat_prompt_uses_the_template_then_falls_back_to_chatml() -> None:
    messages = [ChatMessage("system", "be brief"), ChatMessage("user", "hi é")]
    with_template = make_backend(chat_template=CHATML)
    ids = with_template.chat_prompt(messages)
    assert not with_template.uses_fallback_template
    text = b"".join(with_template.token_bytes(i) for i in ids).decode()
    assert text == "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi é<|im_end|>\n" \
                   "<|im_start|>assistant\n"
    without = make_backend()
    assert without.chat_prompt(messages) == ids
    assert without.uses_fallback_template
    broken = make_backend(chat_template="{{ raise_exception('no system messages') }}")
    assert broken.chat_prompt(messages) == ids
    assert broken.uses_fallback_template


# -- evaluate and truncate -----------------------------------------------------------------------

@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_truncate_then_reevaluate_equals_a_fresh_evaluation(arch: str) -> None:
    tokens, detour = sequence(24), sequence(9, seed=1)
    fresh = make_backend(arch=arch)
    fresh.evaluate(tokens[:15], 0)
    expected = fresh.evaluate(tokens[15:], 9)

    reused = make_backend(arch=arch)
    reused.evaluate(tokens[:20], 0)
    reused.truncate(15)
    assert reused.cached_tokens == tuple(tokens[:15])
    reused.evaluate(detour, 4)  # a rejected branch
    reused.truncate(15)
    np.testing.assert_allclose(reused.evaluate(tokens[15:], 9), expected, rtol=0, atol=1e-5)
    assert reused.cached_tokens == tuple(tokens)

    reused.truncate(0)
    assert reused.cached_tokens == ()
    fresh_whole = make_backend(arch=arch).evaluate(tokens, 5)
    np.testing.assert_allclose(reused.evaluate(tokens, 5), fresh_whole, rtol=0, atol=1e-5)


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_batched_evaluation_equals_one_token_at_a_time(arch: str) -> None:
    tokens = sequence(20)
    batched = make_backend(arch=arch).evaluate(tokens, len(tokens))
    single = make_backend(arch=arch)
    rows = np.concatenate([single.evaluate([t], 1) for t in tokens])
    assert batched.shape == (20, MODEL_VOCAB) and batched.dtype == np.float32
    np.testing.assert_allclose(batched, rows, rtol=0, atol=1e-4)
    last_three = make_backend(arch=arch).evaluate(tokens, 3)
    np.testing.assert_allclose(last_three, batched[-3:], rtol=0, atol=1e-4)


def test_evaluate_without_logits_only_fills_the_cache() -> None:
    backend = make_backend()
    assert backend.evaluate([1, 2, 3], 0).shape == (0, MODEL_VOCAB)
    assert backend.evaluate([], 0).shape == (0, MODEL_VOCAB)
    assert backend.cached_tokens == (1, 2, 3)
    with pytest.raises(ValueError):
        backend.evaluate([4], 2)
    with pytest.raises(ValueError):
        backend.evaluate([MODEL_VOCAB], 1)
    assert backend.cached_tokens == (1, 2, 3)


def test_context_overflow_raises_and_keeps_the_cache() -> None:
    backend = make_backend()
    backend.evaluate(sequence(250), 0)
    with pytest.raises(BackendError, match="n_ctx"):
        backend.evaluate(sequence(7), 1)
    assert len(backend.cached_tokens) == 250


def test_a_failed_forward_empties_the_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = make_backend()
    backend.evaluate([1, 2, 3], 0)
    monkeypatch.setattr(backend, "_forward", lambda tokens, n: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        backend.evaluate([4], 1)
    monkeypatch.undo()
    assert backend.cached_tokens == ()
    np.testing.assert_allclose(backend.evaluate([1, 2, 3, 4], 1),
                               make_backend().evaluate([1, 2, 3, 4], 1), rtol=0, atol=1e-5)


def test_close_is_idempotent_and_final() -> None:
    backend = make_backend()
    backend.evaluate([1, 2], 1)
    backend.close()
    backend.close()
    assert backend.cached_tokens == ()
    with pytest.raises(BackendError, match="closed"):
        backend.evaluate([1], 1)


# -- the engine on top: greedy identity and exact sampling ---------------------------------------

@pytest.fixture(scope="module")
def greedy_reference() -> list[int]:
    tokens, _ = run(SpeculativeEngine(make_backend(0)), 0, SamplingParams(), 0, 48)
    assert len(tokens) == 48  # the random target must not stop early, or the test proves little
    return tokens


@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.parametrize("draft", ["independent", "perturbed"])
def test_greedy_speculation_equals_target_only(greedy_reference: list[int], k: int,
                                               draft: str) -> None:
    target_model = make_model(0)
    draft_model = make_model(7) if draft == "independent" else perturbed(target_model, 7, 0.01)
    tokenizer = make_tokenizer()
    target = TransformersBackend.from_model(target_model, tokenizer)
    drafter = TransformersBackend.from_model(draft_model, tokenizer)
    engine = SpeculativeEngine(target, ModelDrafter(drafter))
    tokens, steps = run(engine, k, SamplingParams(), 0, 48)
    assert tokens == greedy_reference
    drafted = sum(s.drafted for s in steps)
    accepted = sum(s.accepted for s in steps)
    assert accepted < drafted  # rejections and cache rollbacks happened
    if draft == "perturbed":
        assert accepted > drafted / 3  # and so did long accepted runs


class UniformClaimDrafter(ModelDrafter):
    """A broken drafter: samples from the draft model but reports a uniform q (the bug class
    of transformers #32867): the test below must reject its output distribution."""

    def draft(self, context: Sequence[int], k: int, params: SamplingParams,
              rng: np.random.Generator) -> Proposal:
        proposal = super().draft(context, k, params, rng)
        uniform = np.full_like(proposal.probs, 1.0 / proposal.probs.shape[1])
        return Proposal(proposal.tokens, uniform, proposal.source)


def first_two_distribution(target: TransformersBackend, params: SamplingParams) -> np.ndarray:
    """The exact target distribution of the reply's first two tokens, flattened as in
    ``outcome_index``. A stop token ends the reply, so every stop id counts as one outcome."""
    vocab, stops = target.vocab_size, sorted(target.stop_ids)
    first = probabilities(target.evaluate(PROMPT, 1)[0], params)
    joint = np.zeros((vocab + 1, vocab + 1))
    joint[0, 0] = first[stops].sum()
    for token in np.flatnonzero(first > 1e-9):
        if token in target.stop_ids:
            continue
        target.truncate(len(PROMPT))
        second = first[token] * probabilities(target.evaluate([int(token)], 1)[0], params)
        joint[token + 1, 0] = second[stops].sum()
        second[stops] = 0.0
        joint[token + 1, 1:] = second
    target.truncate(0)
    return joint.ravel() / joint.sum()


def outcome_index(reply: list[int], vocab: int) -> int:
    """Index of the first two tokens of ``reply`` (shorter when a stop token ended it)."""
    first, second = (reply + [-1, -1])[:2]
    return (first + 1) * (vocab + 1) + second + 1


def first_two_counts(engine: SpeculativeEngine, k: int, params: SamplingParams, runs: int
                     ) -> tuple[np.ndarray, Counter[str]]:
    """Counts of the first two emitted tokens over ``runs`` seeds, and the sources seen."""
    vocab = engine.target.vocab_size
    counts = np.zeros((vocab + 1) ** 2)
    sources: Counter[str] = Counter()
    for seed in range(runs):
        reply: list[int] = []
        events = engine.generate(PROMPT, GenerationSettings(params, max_tokens=8),
                                 np.random.default_rng(seed), FixedDraftLength(k))
        for event in events:
            if isinstance(event, TokenEvent):
                reply.append(event.id)
                sources[event.source.value] += 1
                if len(reply) == 2:
                    break
        events.close()
        counts[outcome_index(reply, vocab)] += 1
    return counts, sources


@pytest.fixture(scope="module")
def sampling_setup() -> tuple[TransformersBackend, TransformersBackend, np.ndarray]:
    tokenizer = make_tokenizer()
    target_model = make_model(0)
    target = TransformersBackend.from_model(target_model, tokenizer)
    draft = TransformersBackend.from_model(perturbed(target_model, 11, 0.03), tokenizer)
    exact = first_two_distribution(target, SamplingParams(temperature=1.0))
    return target, draft, exact


RUNS = 800  # the wrong q below scores ~5x the critical value at this size; correct ones ~df
EXPECTED_SOURCES = {0: {"target"}, 1: {"accepted", "resampled", "bonus"},
                    3: {"accepted", "resampled"}}  # K=3 reaches "bonus" only at the 4th token


@pytest.mark.parametrize("k", [0, 1, 3])
def test_sampled_first_two_tokens_follow_the_target_distribution(
        sampling_setup: tuple[TransformersBackend, TransformersBackend, np.ndarray], k: int
) -> None:
    target, draft, exact = sampling_setup
    engine = SpeculativeEngine(target, ModelDrafter(draft))
    counts, sources = first_two_counts(engine, k, SamplingParams(temperature=1.0), RUNS)
    assert fits(counts, exact)
    assert set(sources) == EXPECTED_SOURCES[k]


def test_the_distribution_test_rejects_a_wrong_q(
        sampling_setup: tuple[TransformersBackend, TransformersBackend, np.ndarray]) -> None:
    target, draft, exact = sampling_setup
    engine = SpeculativeEngine(target, UniformClaimDrafter(draft))
    counts, _ = first_two_counts(engine, 3, SamplingParams(temperature=1.0), RUNS)
    assert not fits(counts, exact)
