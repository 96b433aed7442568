"""The engine's event stream, on the deterministic fake backend."""

from __future__ import annotations

import threading
from collections import Counter

import numpy as np
import pytest

from chatapp.backends.base import BackendError
from chatapp.backends.fake import STOP_ID, FakeBackend
from chatapp.chat.message import ChatMessage
from chatapp.drafters.model import ModelDrafter
from chatapp.engine.contracts import NO_HINTS
from chatapp.engine.events import DoneEvent, FinishReason, StepEvent, TokenEvent, TokenSource
from chatapp.engine.kv import evaluate_sequence
from chatapp.engine.loop import (
    ContextOverflowError,
    GenerationSettings,
    IncompatibleModelsError,
    SpeculativeEngine,
    TextStream,
    check_compatible,
)
from chatapp.engine.sampling import SamplingParams
from chatapp.policy.fixed import FixedDraftLength

PROMPT = FakeBackend().tokenize("user: hello there\nassistant: ")


def _engine(noise: float = 1.0, **target_kwargs) -> SpeculativeEngine:
    return SpeculativeEngine(FakeBackend(**target_kwargs), ModelDrafter(FakeBackend(noise=noise)))


def _run(engine: SpeculativeEngine, k: int, max_tokens: int = 60, temperature: float = 0.0,
         seed: int = 0, **kwargs) -> list:
    settings = GenerationSettings(SamplingParams(temperature), max_tokens)
    return list(engine.generate(PROMPT, settings, np.random.default_rng(seed),
                                FixedDraftLength(k), **kwargs))


def _ids(events: list) -> list[int]:
    return [e.id for e in events if isinstance(e, TokenEvent)]


def _assert_holds_prefix(backend: FakeBackend, history: list[int], at_least: int) -> None:
    """``backend``'s cache is the first ``at_least`` or more tokens of ``history``."""
    cached = list(backend.cached_tokens)
    assert cached == history[:len(cached)], f"{backend.name} holds tokens not in the history"
    assert len(cached) >= at_least, f"{backend.name} holds {len(cached)} of {len(history)}"


@pytest.mark.parametrize("k", [1, 2, 4, 7])
def test_greedy_speculative_output_equals_target_only(k: int) -> None:
    plain = _ids(_run(_engine(), 0))
    assert len(plain) > 20
    assert _ids(_run(_engine(), k)) == plain


def test_sources_and_step_records_are_consistent() -> None:
    events = _run(_engine(), 3)
    sources = Counter(e.source for e in events if isinstance(e, TokenEvent))
    steps = [e for e in events if isinstance(e, StepEvent)]
    done = events[-1]
    assert isinstance(done, DoneEvent)
    assert sources[TokenSource.ACCEPTED] == sum(s.accepted for s in steps) - _cut_short(events)
    assert sources[TokenSource.RESAMPLED] > 0 and sources[TokenSource.BONUS] > 0
    assert TokenSource.TARGET not in sources
    assert done.stats.drafted == sum(s.drafted for s in steps)
    assert done.stats.target_calls == len(steps)
    assert done.stats.tokens == sum(sources.values())
    assert 0 < done.stats.acceptance_rate < 1
    assert done.stats.mean_accepted_length == pytest.approx(done.stats.tokens / len(steps))


def _cut_short(events: list) -> int:
    """Accepted drafts of the last step that max_tokens left unemitted."""
    last = [e for e in events if isinstance(e, StepEvent)][-1]
    emitted = sum(1 for e in events if isinstance(e, TokenEvent) and e.step == last.step)
    return max(0, last.accepted + 1 - emitted)


def test_plain_decoding_goes_through_the_same_stream() -> None:
    events = _run(_engine(), 0, max_tokens=10)
    assert {e.source for e in events if isinstance(e, TokenEvent)} == {TokenSource.TARGET}
    assert all(s.drafted == 0 for s in events if isinstance(s, StepEvent))


def test_per_position_acceptance_counts_only_verified_positions() -> None:
    done = _run(_engine(), 4, max_tokens=200)[-1]
    rates = done.stats.per_position_accepted
    assert len(rates) == 4 and all(0 <= r <= 1 for r in rates)


def test_identical_draft_accepts_everything() -> None:
    done = _run(_engine(noise=0.0), 4, max_tokens=41)[-1]
    assert done.stats.accepted == done.stats.drafted
    assert done.stats.mean_accepted_length > 4


def test_max_tokens_gives_length_and_exact_count() -> None:
    events = _run(_engine(), 5, max_tokens=13)
    assert len(_ids(events)) == 13
    assert events[-1].finish_reason == FinishReason.LENGTH


def test_stop_token_ends_the_turn_and_is_not_emitted() -> None:
    target = FakeBackend()
    target._table[:, STOP_ID] += 100.0  # the model wants to stop at once
    events = list(SpeculativeEngine(target).generate(
        PROMPT, GenerationSettings(), np.random.default_rng(0), FixedDraftLength(0)))
    assert _ids(events) == [] and events[-1].finish_reason == FinishReason.STOP


def test_draft_length_changes_apply_from_the_next_step() -> None:
    policy = FixedDraftLength(2)
    settings = GenerationSettings(max_tokens=80)
    seen = []
    for event in _engine().generate(PROMPT, settings, np.random.default_rng(0), policy):
        if isinstance(event, StepEvent):
            seen.append(event.k)
            if event.step == 3:
                policy.set(5)
            if event.step == 6:
                policy.set(0)
    assert seen[:4] == [2] * 4 and seen[4:7] == [5] * 3 and set(seen[7:]) == {0}


def test_cancel_stops_before_the_next_step() -> None:
    cancel = threading.Event()
    events = []
    for event in _engine().generate(PROMPT, GenerationSettings(max_tokens=500),
                                    np.random.default_rng(0), FixedDraftLength(3), cancel):
        events.append(event)
        if isinstance(event, StepEvent) and event.step == 2:
            cancel.set()
    assert events[-1].finish_reason == FinishReason.CANCELLED
    assert max(e.step for e in events if isinstance(e, StepEvent)) == 2


def test_kv_caches_stay_in_step_and_are_reused_next_turn() -> None:
    engine = _engine()
    target, draft = engine.target, engine.drafter.backend
    history, rejecting_steps = list(PROMPT), 0
    settings = GenerationSettings(SamplingParams(0.0), 30)
    for event in engine.generate(PROMPT, settings, np.random.default_rng(0), FixedDraftLength(3)):
        if isinstance(event, TokenEvent):
            history.append(event.id)
        elif isinstance(event, StepEvent):
            rejecting_steps += event.accepted < event.drafted
            # After every step both caches hold a prefix of the history, never a rejected
            # draft: the target all of it but at most the last token (emitted, not fed yet); the
            # draft model all but at most three (a step that accepted every draft leaves its
            # last draft and the bonus token unfed, and a plain step adds one more).
            _assert_holds_prefix(target, history, len(history) - 1)
            _assert_holds_prefix(draft, history, len(history) - 3)
    assert rejecting_steps > 0  # there were drafts to roll back
    # A follow-up prompt that extends the history only feeds the new tokens.
    follow_up = history + FakeBackend().tokenize("user: more")
    target.evaluate_calls.clear()
    evaluate_sequence(target, follow_up, 1)
    assert sum(target.evaluate_calls) == len(follow_up) - len(history) + 1


def test_after_rejections_the_target_cache_matches_a_fresh_evaluation() -> None:
    engine = _engine()
    reply = _ids(_run(engine, 4, max_tokens=25, temperature=1.0, seed=3))
    history = PROMPT + reply
    fresh = FakeBackend()
    expected = evaluate_sequence(fresh, history, 1)
    assert np.array_equal(evaluate_sequence(engine.target, history, 1), expected)
    assert list(engine.target.cached_tokens) == history


def test_text_is_streaming_safe_across_a_split_character() -> None:
    stream = TextStream()
    assert stream.push(b"\xc3") == ""
    assert stream.push(b"\xa9") == "é"
    assert stream.push(b"\xff") == "\ufffd"


def test_incompatible_vocabularies_are_refused_naming_both_models() -> None:
    with pytest.raises(IncompatibleModelsError, match="'small'.*'big'"):
        check_compatible(FakeBackend(name="small", vocab_size=40), FakeBackend(name="big"))


def test_prompt_longer_than_the_context_is_refused() -> None:
    engine = SpeculativeEngine(FakeBackend(n_ctx=8))
    with pytest.raises(ContextOverflowError, match="context window"):
        _run(engine, 0)


def test_generation_stops_at_the_context_limit() -> None:
    engine = _engine(n_ctx=len(PROMPT) + 10)
    events = _run(engine, 4, max_tokens=100)
    assert len(_ids(events)) == 10 and events[-1].finish_reason == FinishReason.LENGTH


def test_session_drops_oldest_turns_but_keeps_the_system_prompt() -> None:
    from chatapp.chat.session import ChatSession

    engine = SpeculativeEngine(FakeBackend(n_ctx=120))
    session = ChatSession(engine, GenerationSettings(max_tokens=20), seed=0, system_prompt="K")
    turns = [ChatMessage(role, "the draft token " * 3) for _ in range(6)
             for role in ("user", "assistant")] + [ChatMessage("user", "the target")]
    plan, _ = session.reply(turns, FixedDraftLength(0))
    assert plan.dropped_messages > 0 and plan.dropped_messages % 2 == 0
    assert plan.tokens[:3] == FakeBackend().tokenize("system: K\n")[:3]
    assert len(plan.tokens) + 20 <= 120
    with pytest.raises(ContextOverflowError, match="Shorten the message"):
        session.reply([ChatMessage("user", "the " * 200)], FixedDraftLength(0))


class CountingReads(FakeBackend):
    """A fake model that counts how often its cache is read back (a full copy in llama.cpp)."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.reads = 0

    @property
    def cached_tokens(self):
        self.reads += 1
        return super().cached_tokens


def test_a_draft_reads_the_cache_once_and_feeds_later_tokens_one_by_one() -> None:
    backend = CountingReads(noise=1.0)
    drafter = ModelDrafter(backend)
    drafter.prefill(PROMPT, NO_HINTS)
    backend.reads, backend.evaluate_calls = 0, []
    proposal = drafter.draft(PROMPT, 6, SamplingParams(0.0), np.random.default_rng(0))
    assert len(proposal.tokens) == 6 and backend.reads == 1
    assert backend.evaluate_calls == [1] * 6
    assert list(backend.cached_tokens) == PROMPT + proposal.tokens[:-1]
    # The same tokens as feeding each whole sequence to a fresh model.
    fresh = FakeBackend(noise=1.0)
    for i, token in enumerate(proposal.tokens):
        logits = evaluate_sequence(fresh, PROMPT + proposal.tokens[:i], 1)
        assert int(np.argmax(logits[0])) == token


class FailingTarget(FakeBackend):
    """A fake target whose ``fail_at``-th evaluation raises, its cache left as it was (as the
    backends promise)."""

    def __init__(self, fail_at: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.fail_at = fail_at
        self.calls = 0

    def evaluate(self, tokens, n_logits: int) -> np.ndarray:
        self.calls += 1
        if self.calls == self.fail_at:
            raise BackendError("the target failed")
        return super().evaluate(tokens, n_logits)


def _only_verified(engine: SpeculativeEngine, history: list[int]) -> None:
    """Both caches hold a prefix of ``history`` (the prompt and the tokens emitted): nothing
    drafted and not verified, nothing the reply does not have."""
    for backend in (engine.target, engine.drafter.backend):
        cached = list(backend.cached_tokens)
        assert cached == history[:len(cached)], backend.name


def test_a_backend_error_mid_step_leaves_no_unverified_positions() -> None:
    # Evaluation 1 is the prompt, 2 and 3 verify steps 0 and 1; the 4th fails after step 2's
    # draft: the draft model's cache holds the drafted tokens then.
    engine = SpeculativeEngine(FailingTarget(fail_at=4, name="target"),
                               ModelDrafter(FakeBackend(noise=1.0, name="draft")))
    events = []
    with pytest.raises(BackendError, match="target failed"):
        for event in engine.generate(PROMPT, GenerationSettings(max_tokens=60),
                                     np.random.default_rng(0), FixedDraftLength(4)):
            events.append(event)
    assert [e.step for e in events if isinstance(e, StepEvent)] == [0, 1]
    _only_verified(engine, PROMPT + _ids(events))


def test_a_stream_closed_mid_step_leaves_no_unverified_positions() -> None:
    engine = _engine()
    stream = engine.generate(PROMPT, GenerationSettings(max_tokens=60),
                             np.random.default_rng(0), FixedDraftLength(4))
    events = []
    for event in stream:
        events.append(event)
        if isinstance(event, TokenEvent) and event.step == 2:
            break  # the target's cache holds step 2's whole proposal now
    assert len(engine.target.cached_tokens) > len(PROMPT + _ids(events))
    stream.close()
    _only_verified(engine, PROMPT + _ids(events))


def test_a_replay_stopped_while_its_prompt_is_read_is_stopped_not_failed() -> None:
    """F8's replay (``decode_alone``) stopped by Esc before its prompt is tokenized: the replay
    ends as stopped (None), never as an error (``PromptCancelled`` reached the app as 'an
    unexpected error' once)."""
    from chatapp.chat.session import ChatSession

    session = ChatSession(SpeculativeEngine(FakeBackend(vocab_size=64)),
                          GenerationSettings(max_tokens=20), seed=0)
    cancel = threading.Event()
    cancel.set()
    assert session.decode_alone([ChatMessage("user", "a question " * 50)], 20, cancel) is None
