"""Property tests: whatever K changes, cancels and rejections happen, the engine stays consistent.

After every turn, for both the draft and the target: the KV cache holds a prefix of the
conversation's history and nothing else (rejected drafts are rolled back at once), and every
emitted id is inside the vocabulary.
"""

from __future__ import annotations

import threading

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chatapp.backends.fake import FakeBackend
from chatapp.drafters.model import ModelDrafter
from chatapp.engine.events import DoneEvent, FinishReason, StepEvent, TokenEvent
from chatapp.engine.kv import evaluate_sequence
from chatapp.engine.loop import GenerationSettings, SpeculativeEngine
from chatapp.engine.sampling import SamplingParams
from chatapp.policy.fixed import FixedDraftLength

turn_plans = st.lists(
    st.fixed_dictionaries({
        "k_changes": st.lists(st.integers(0, 8), min_size=1, max_size=6),
        "cancel_at": st.one_of(st.none(), st.integers(0, 6)),
        "temperature": st.sampled_from([0.0, 0.7, 1.5]),
        "max_tokens": st.integers(1, 30),
    }),
    min_size=1, max_size=4,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plans=turn_plans, seed=st.integers(0, 2**16))
def test_caches_track_history_through_k_changes_cancels_and_rejections(plans: list[dict],
                                                                        seed: int) -> None:
    target, draft = FakeBackend(sharpness=1.0), FakeBackend(sharpness=1.0, noise=2.0)
    engine = SpeculativeEngine(target, ModelDrafter(draft))
    rng = np.random.default_rng(seed)
    history = target.tokenize("user: the spec\nassistant: ")
    for plan in plans:
        policy = FixedDraftLength(plan["k_changes"][0])
        cancel = threading.Event()
        settings_ = GenerationSettings(SamplingParams(plan["temperature"]), plan["max_tokens"])
        reply: list[int] = []
        done = None
        for event in engine.generate(history, settings_, rng, policy, cancel):
            if isinstance(event, TokenEvent):
                assert 0 <= event.id < target.vocab_size
                reply.append(event.id)
            elif isinstance(event, StepEvent):
                changes = plan["k_changes"]
                policy.set(changes[min(event.step + 1, len(changes) - 1)])
                if plan["cancel_at"] == event.step:
                    cancel.set()
            else:
                done = event
        assert isinstance(done, DoneEvent)
        assert done.stats.tokens == len(reply) <= plan["max_tokens"]
        if done.finish_reason == FinishReason.CANCELLED:
            assert plan["cancel_at"] is not None
        prompt_length = len(history)
        history = history + reply
        for backend in (target, draft):
            cached = list(backend.cached_tokens)
            assert cached == history[: len(cached)]  # a prefix of the history, nothing else
        # and the caches are kept: all but the newest token (the target), the prompt (the draft)
        assert len(target.cached_tokens) >= len(history) - 1
        assert len(draft.cached_tokens) >= prompt_length - 1
        history = history + target.tokenize("user: and\nassistant: ")
    # The state left behind gives the same logits as a fresh model on the same history.
    assert np.array_equal(evaluate_sequence(target, history, 1),
                          evaluate_sequence(FakeBackend(sharpness=1.0), history, 1))
