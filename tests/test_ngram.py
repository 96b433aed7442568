"""Prompt-lookup drafting (n-gram), n-gram + model, and how the loader wires them."""

from __future__ import annotations

import numpy as np
import pytest

import chatapp.assembly.loader as loader
import chatapp.policy.draft_length as draft_length
from chatapp.backends.fake import FakeBackend
from chatapp.drafters.combined import NgramModelDrafter
from chatapp.drafters.edits import CONFIDENT_RUN, LONG_RUN
from chatapp.drafters.lookup import Lookaheads, NgramDrafter, NgramIndex
from chatapp.drafters.model import ModelDrafter
from chatapp.engine.contracts import (
    NO_HINTS,
    DraftBudget,
    Proposal,
    ShadowScore,
    StepOutcome,
    one_hot_rows,
)
from chatapp.engine.events import DoneEvent, TokenEvent
from chatapp.engine.loop import GenerationSettings, SpeculativeEngine
from chatapp.engine.sampling import SamplingParams
from chatapp.policy.auto import AutoDraftLength
from chatapp.policy.fixed import FixedDraftLength
from chatapp.settings.config import Config
from tests.stat_tools import fits

GREEDY = SamplingParams()
RNG = np.random.default_rng(0)


def index_of(tokens: list[int], min_n: int = 1, max_n: int = 4) -> NgramIndex:
    index = NgramIndex(min_n, max_n)
    for token in tokens:
        index.append(token)
    return index


def test_proposes_the_continuation_of_the_longest_match() -> None:
    # "3 4" occurs twice: after "1 2 3 4" comes 5 and after "9 3 4" comes 6. The context ends in
    # "2 3 4": the 3-gram match wins over the more recent 2-gram one.
    index = index_of([1, 2, 3, 4, 5, 9, 3, 4, 6, 7, 2, 3, 4])
    assert index.lookup(3) == [5, 9, 3]


def test_prefers_the_most_recent_of_equally_long_matches() -> None:
    index = index_of([1, 2, 7, 1, 2, 8, 1, 2])
    assert index.lookup(1) == [8]


def test_no_match_proposes_nothing() -> None:
    assert index_of([1, 2, 3, 4]).lookup(4) == []
    assert index_of([]).lookup(4) == []


def test_a_repeating_pattern_continues_past_the_end() -> None:
    assert index_of([5, 6, 7, 5, 6, 7, 5]).lookup(6) == [6, 7, 5, 6, 7, 5]
    assert index_of([9, 9, 9]).lookup(4) == [9, 9, 9, 9]


def test_min_n_ignores_short_matches() -> None:
    assert index_of([1, 2, 3, 4, 1], min_n=2).lookup(2) == []
    assert index_of([1, 2, 3, 4, 1], min_n=1).lookup(2) == [2, 3]


def test_proposal_rows_are_one_hot() -> None:
    drafter = NgramDrafter(vocab_size=20)
    proposal = drafter.propose([1, 2, 3, 1, 2], DraftBudget.uniform(4), GREEDY, RNG)
    assert proposal.tokens == [3, 1, 2, 3]
    assert proposal.rows is None  # built only when read: greedy verification never does
    assert proposal.probs.shape == (4, 20) and proposal.probs.dtype == np.float64
    assert np.array_equal(proposal.probs.sum(axis=1), np.ones(4))
    assert all(proposal.probs[i, t] == 1.0 for i, t in enumerate(proposal.tokens))
    assert one_hot_rows([], 20).shape == (0, 20)


def test_index_follows_a_growing_context_and_rebuilds_for_another() -> None:
    drafter = NgramDrafter(vocab_size=20)
    context = [1, 2, 3, 4]
    drafter.prefill(context[:-1], NO_HINTS)
    assert drafter.propose(context, DraftBudget.uniform(3), GREEDY, RNG).tokens == []
    context += [1, 2]  # the engine appends to the same list
    assert drafter.propose(context, DraftBudget.uniform(3), GREEDY, RNG).tokens == [3, 4, 1]
    other = [7, 8, 9, 7]  # a different conversation: not an extension
    assert drafter.propose(other, DraftBudget.uniform(2), GREEDY, RNG).tokens == [8, 9]
    edited = [1, 2, 3, 4, 1, 5, 1]  # shares a prefix, then differs
    assert drafter.propose(edited, DraftBudget.uniform(1), GREEDY, RNG).tokens == [5]


def test_incremental_index_equals_a_fresh_one() -> None:
    rng = np.random.default_rng(1)
    tokens = list(rng.integers(0, 6, size=300))
    drafter = NgramDrafter(vocab_size=6, edits=False)  # the lookup alone
    context: list[int] = []
    for token in tokens:
        context.append(int(token))
        got = drafter.propose(context, DraftBudget.uniform(5), GREEDY, RNG).tokens
        assert got == index_of(context).lookup(5)


def _run(engine: SpeculativeEngine, prompt: list[int], policy, max_tokens: int = 80,
         sampling: SamplingParams = GREEDY, seed: int = 0) -> tuple[list[int], DoneEvent]:
    out, done = [], None
    for event in engine.generate(prompt, GenerationSettings(sampling, max_tokens),
                                 np.random.default_rng(seed), policy):
        if isinstance(event, TokenEvent):
            out.append(event.id)
        elif isinstance(event, DoneEvent):
            done = event
    assert done is not None
    return out, done


PROMPT = FakeBackend().tokenize("user: the speculative draft token is the target token\n"
                                "assistant: ")


@pytest.mark.parametrize("policy_factory", [lambda: FixedDraftLength(4), AutoDraftLength])
def test_greedy_output_equals_target_only(policy_factory) -> None:
    # The fake model's greedy output falls into a cycle (period 57) after about 90 tokens, which
    # prompt lookup predicts perfectly from about 150 tokens on. The target sleeps 1 ms per call,
    # so that verifying several tokens costs about what one does (as on a GPU) and drafting pays.
    reference, _ = _run(SpeculativeEngine(FakeBackend()), PROMPT, FixedDraftLength(0), 300)
    drafter = NgramDrafter(FakeBackend().vocab_size)
    policy = policy_factory()
    target = FakeBackend(delay_s=0.001)
    out, done = _run(SpeculativeEngine(target, drafter), PROMPT, policy, 300)
    assert out == reference
    assert done.stats.accepted > 100
    assert done.stats.target_calls < 200


@pytest.mark.parametrize("fill", [False, True])
def test_ngram_plus_model_greedy_output_equals_target_only(fill: bool) -> None:
    reference, _ = _run(SpeculativeEngine(FakeBackend()), PROMPT, FixedDraftLength(0))
    drafter = NgramModelDrafter(NgramDrafter(FakeBackend().vocab_size),
                                ModelDrafter(FakeBackend(noise=1.0), deferred=True), fill=fill)
    out, done = _run(SpeculativeEngine(FakeBackend(), drafter), PROMPT, FixedDraftLength(3))
    assert out == reference
    assert done.stats.drafted > 0
    # and with an auto policy, across two turns
    policy = AutoDraftLength()
    engine = SpeculativeEngine(FakeBackend(), drafter)
    for _ in range(2):
        out, _ = _run(engine, PROMPT, policy)
        assert out == reference


def test_ngram_plus_model_uses_the_model_when_there_is_no_match() -> None:
    model = ModelDrafter(FakeBackend(noise=1.0))
    drafter = NgramModelDrafter(NgramDrafter(FakeBackend().vocab_size), model)
    proposal = drafter.propose([1, 2, 3, 4], DraftBudget.uniform(3), GREEDY, RNG)
    assert len(proposal.tokens) == 3  # from the model
    proposal = drafter.propose([1, 2, 3, 1, 2], DraftBudget.uniform(3), GREEDY, RNG)
    assert proposal.tokens == [3, 1, 2]  # from the n-gram
    assert np.array_equal(proposal.probs, one_hot_rows([3, 1, 2], FakeBackend().vocab_size))


def test_deferred_drafter_touches_the_draft_model_only_when_drafting() -> None:
    draft = FakeBackend(noise=1.0)
    engine = SpeculativeEngine(FakeBackend(), ModelDrafter(draft, deferred=True))
    _run(engine, PROMPT, FixedDraftLength(0), max_tokens=10)
    assert draft.evaluate_calls == []
    _run(engine, PROMPT, FixedDraftLength(2), max_tokens=10)
    assert draft.evaluate_calls


def test_deferred_drafter_drops_stale_tokens_when_the_conversation_changes() -> None:
    draft = FakeBackend(noise=1.0)
    engine = SpeculativeEngine(FakeBackend(), ModelDrafter(draft, deferred=True))
    _run(engine, PROMPT, FixedDraftLength(2), max_tokens=10)
    assert len(draft.cached_tokens) > len(PROMPT)
    other_chat = [PROMPT[0] + 1] + list(PROMPT[1:])
    _run(engine, other_chat, FixedDraftLength(0), max_tokens=10)
    assert len(draft.cached_tokens) == 0  # nothing is shared with the new chat; nothing evaluated


def test_shadow_scoring_reports_would_be_acceptance() -> None:
    drafter = NgramDrafter(vocab_size=20, kind_by_context=False, edits=False,
                           lookaheads=Lookaheads(lookup=3))
    context = [1, 2, 3, 4, 9]
    drafter.prefill(context, NO_HINTS)
    # "9" has no earlier match: a plain would-be step. Then 1 2 3 4 repeats after 1 ...
    context += [1, 2, 3, 4, 5, 1, 2, 7]
    assert drafter.propose(context, DraftBudget({}, 0, consult=True), GREEDY, RNG).tokens == []
    scores = drafter.score_emitted(context)
    # at "9 1": lookup of "1" gives 2 3 4 -> all matched (3/3); 5 is the target's token;
    # at "...5 1": lookup "5 1"? no; "1" -> most recent continuation 2 3 4: 2 matches, 7 not.
    # Each position is told as soon as a token decides it (partial scores, then the final one).
    assert [(s.source, s.proposed, s.matched, s.start, s.settled) for s in scores] == [
        ("ngram", 3, 1, 0, False), ("ngram", 3, 2, 1, False), ("ngram", 3, 3, 2, True),
        ("ngram", 3, 1, 0, False), ("ngram", 3, 1, 1, True)]
    # each score is handed over once
    assert drafter.score_emitted(context) == ()


def test_a_copy_growing_through_the_edit_rungs_is_scored_under_each_rung() -> None:
    # The edits' kinds say how long the cursor's run is: a copy starts as "edit-new", is
    # "edit-run" from 4 matched tokens and "edit-run-long" from 12. Each rung must be scored
    # from the step where the edits would propose it, though the proposal the copy started
    # with (16 tokens of "edit-new") is still pending then: the longer rungs are what drafts.
    source = list(range(10, 50))
    context = [1, 2, *source, 3, 4]
    drafter = NgramDrafter(vocab_size=100, kind_by_context=False)
    drafter.prefill(context, NO_HINTS)
    told: list[set[tuple[str, int]]] = []  # (kind, positions matched) told at each step
    for token in source[:24]:
        scores = drafter.score_emitted(context)
        assert all(s.matched == s.start + 1 for s in scores)  # one position a token
        told.append({(s.source, s.matched) for s in scores if s.source[:4] == "edit"})
        context.append(token)

    def step_telling(kind: str, matched: int) -> int:
        return next(step for step, scores in enumerate(told) if (kind, matched) in scores)

    # a rung's first position is decided by the token after the run reached it
    assert step_telling("edit-run", 1) == step_telling("edit-new", CONFIDENT_RUN + 1)
    assert step_telling("edit-run-long", 1) == step_telling("edit-new", LONG_RUN + 1)
    assert step_telling("edit-new", 16)  # the first proposal is scored to its end as well


def test_a_run_still_matching_drafts_under_the_kind_its_scores_build() -> None:
    # A lookup run starts as a short match ("ngram-short-cold": the last token alone recurs)
    # and becomes a long one as it matches; the live proposal is then "ngram-long-cold", a kind
    # with no record, but it continues the would-be proposal being scored: the drafter offers
    # it under that proposal's kind too, and drafts it where only that kind is trusted.
    drafter = NgramDrafter(vocab_size=40, edits=False)
    context = [1, 2, 3, 4, 5, 6, 7, 8, 9, 30]
    drafter.prefill(context, NO_HINTS)
    context += [1]
    short_only = DraftBudget({"ngram-short-cold": 5}, 0, consult=True)
    first = drafter.propose(context, short_only, GREEDY, RNG)
    assert (first.source, first.tokens) == ("ngram-short-cold", [2, 3, 4, 5, 6])
    context += [2, 3, 4]  # the run goes on: the match is 4 tokens long now
    drafter.score_emitted(context)
    assert drafter.candidates(5)[0].kinds == ("ngram-long-cold", "ngram-short-cold")
    live = drafter.propose(context, short_only, GREEDY, RNG)
    assert (live.source, live.tokens) == ("ngram-short-cold", [5, 6, 7, 8, 9])
    context += [5, 7]  # the run broke (6 was proposed): nothing vouches for what follows
    drafter.score_emitted(context)
    assert drafter.candidates(5)[0].kinds == ("ngram-short-warm",)


def test_make_drafter_ngram_does_not_load_a_draft_model(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the n-gram drafter must not load a model")

    monkeypatch.setattr(loader, "load_backend", refuse)
    drafter = loader.make_drafter(Config(drafter="ngram"), FakeBackend())
    assert isinstance(drafter, NgramDrafter)


def test_make_drafter_model_kinds() -> None:
    target, draft = FakeBackend(), FakeBackend(noise=1.0)
    model = loader.make_drafter(Config(drafter="model"), target, draft=draft)
    assert isinstance(model, ModelDrafter) and model.deferred and model.backend is draft
    both = loader.make_drafter(Config(drafter="ngram+model"), target, draft=draft)
    assert isinstance(both, NgramModelDrafter) and both.model.backend is draft
    assert both.model.deferred


def test_first_token_distribution_matches_target_only_when_sampling() -> None:
    """At temperature 1 the n-gram's one-hot proposals leave the output distribution exact."""
    target = FakeBackend()
    sampling = SamplingParams(temperature=1.0)
    # A prompt "a b c a b" makes the n-gram propose c; pick one where p(c) is neither ~0 nor ~1,
    # so that both acceptance and the residual resampling are exercised.
    from tests.exactness import uncertain_case  # it imports this module

    prompt, c, p = uncertain_case(target, sampling, (
        ([a, b, c, a, b], c) for a in range(1, 9) for b in range(1, 9) for c in range(1, 9)))
    engine = SpeculativeEngine(target, NgramDrafter(target.vocab_size))
    samples = 3000
    counts = np.zeros(target.vocab_size)
    accepted = 0
    for seed in range(samples):
        out, done = _run(engine, prompt, FixedDraftLength(3), max_tokens=4, sampling=sampling,
                         seed=seed)
        counts[out[0]] += 1
        accepted += done.stats.accepted > 0
        assert done.stats.drafted >= 3  # the first step really drafted K = 3
    assert 0 < accepted < samples
    assert fits(counts, p)


def test_specchat_run_gives_the_drafters_scores_to_the_auto_policy(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from chatapp.chat.session import ChatSession
    from chatapp.cli import main

    policies: list[AutoDraftLength] = []

    def recording_policy(setting: draft_length.PolicySetting) -> AutoDraftLength:
        policies.append(AutoDraftLength())
        return policies[-1]

    def fake_session(config, progress, with_draft=True):
        engine = SpeculativeEngine(FakeBackend(), NgramDrafter(FakeBackend().vocab_size))
        return ChatSession(engine, GenerationSettings(max_tokens=200), seed=0)

    monkeypatch.setattr(loader, "build_session", fake_session)
    # The conversation's draft length makes it.
    monkeypatch.setattr(draft_length.PolicySetting, "policy", recording_policy)
    assert main(["run", "--drafter", "ngram", "-k", "auto", "hello"]) == 0
    assert len(policies) == 1
    sources = policies[0].learnt()["arms"]
    assert sources and all(kind.startswith(("ngram", "edit")) for kind in sources)


class _ContextScorer:
    """A drafter that proposes nothing and scores one would-be proposal per call, named after
    the length of the context it was given."""

    name = "scorer"

    def prefill(self, context, hints) -> None:
        pass

    def propose(self, context, budget, params, rng):
        return Proposal.empty(FakeBackend().vocab_size)

    def score_emitted(self, context) -> tuple[ShadowScore, ...]:
        return (ShadowScore(f"after-{len(context)}", 1, 1),)

    def rollback(self, context, verified) -> None:
        pass

    def close(self) -> None:
        pass


class _Recording(FixedDraftLength):
    """A learning policy's view of the engine: every outcome, in order."""

    adaptive = True

    def __init__(self) -> None:
        super().__init__(0)
        self.outcomes: list[StepOutcome] = []

    def observe(self, outcome: StepOutcome) -> None:
        self.outcomes.append(outcome)


def test_a_step_outcome_carries_the_scores_its_own_tokens_decided() -> None:
    # The policy chooses the next budget right after a step's outcome: a free source whose
    # proposal failed at its first token must be told so in that outcome, not a step later
    # (a 15-token draft failing twice in a row cost the edits 6% of the held-out replies).
    policy = _Recording()
    _run(SpeculativeEngine(FakeBackend(), _ContextScorer()), PROMPT, policy, max_tokens=12)
    lengths = [len(PROMPT) + emitted for emitted in range(1, len(policy.outcomes) + 1)]
    assert [outcome.scores for outcome in policy.outcomes] == [
        (ShadowScore(f"after-{n}", 1, 1),) for n in lengths]
