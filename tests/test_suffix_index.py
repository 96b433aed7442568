"""The history-wide suffix index: incremental = rebuilt, the memory bound, deletion, proposals,
keeping in step with a HistoryStore."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

import chatapp.assembly.loader as loader
from chatapp.backends.fake import FakeBackend
from chatapp.chat.history import HistoryStore
from chatapp.drafters.lookup import NgramDrafter
from chatapp.drafters.suffix import LIVE, SuffixSource
from chatapp.drafters.suffix_index import MAX_PROPOSAL, ORDERS, HistoryCorpus
from chatapp.engine.contracts import NO_HINTS, DraftHints
from chatapp.engine.loop import SpeculativeEngine
from chatapp.engine.sampling import SamplingParams
from chatapp.policy.auto import AutoDraftLength
from chatapp.policy.fixed import FixedDraftLength
from chatapp.settings.config import Config
from tests.exactness import assert_two_token_distribution_exact, uncertain_case
from tests.test_ngram import _run  # one turn: the emitted token ids and the DoneEvent

LINE = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14]


def _texts(seed: int, n: int, length: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(40) for _ in range(length)] for _ in range(n)]


def test_incremental_equals_rebuilt() -> None:
    texts = _texts(1, 4, 300)
    incremental = HistoryCorpus()
    rng = random.Random(2)
    cursors = [0] * len(texts)
    while any(c < len(t) for c, t in zip(cursors, texts)):
        i = rng.randrange(len(texts))  # chats grow interleaved, a few tokens at a time
        step = rng.randrange(1, 9)
        incremental.extend_chat(i, texts[i][cursors[i]:cursors[i] + step])
        cursors[i] += step
    rebuilt = HistoryCorpus()
    for i in reversed(range(len(texts))):
        rebuilt.add_chat_text(i, texts[i])
    assert incremental.counts() == rebuilt.counts()
    for context in _texts(3, 20, 12):
        assert incremental.propose(context) == rebuilt.propose(context)


def test_remove_chat_leaves_the_index_as_if_it_was_never_added() -> None:
    a, b = _texts(4, 2, 400)
    both = HistoryCorpus()
    both.add_chat_text("a", a)
    both.add_chat_text("b", b)
    both.remove_chat("a")
    only_b = HistoryCorpus()
    only_b.add_chat_text("b", b)
    assert both.counts() == only_b.counts()
    assert both.chats() == ["b"] and len(both) == len(b)
    both.remove_chat("b")
    assert both.counts() == {} and len(both) == 0


def test_replacing_a_chat_text_equals_adding_the_new_text() -> None:
    corpus = HistoryCorpus()
    corpus.add_chat_text(1, LINE * 3)
    corpus.add_chat_text(1, LINE[:4] + [99] + LINE)  # an edited message: not an extension
    fresh = HistoryCorpus()
    fresh.add_chat_text(1, LINE[:4] + [99] + LINE)
    assert corpus.counts() == fresh.counts()


def held_bytes(obj: object, seen: set[int] | None = None) -> int:
    """The bytes of ``obj`` and of every object it holds (containers followed, each object
    counted once): what the index itself keeps, whatever else the process allocates."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    size = sys.getsizeof(obj)
    if isinstance(obj, dict):
        size += sum(held_bytes(k, seen) + held_bytes(v, seen) for k, v in obj.items())
    elif isinstance(obj, (list, tuple, set, frozenset)):
        size += sum(held_bytes(item, seen) for item in obj)
    elif hasattr(obj, "__dict__"):
        size += held_bytes(vars(obj), seen)
    return size


def test_capacity_evicts_least_recent_chats_and_bounds_memory() -> None:
    capacity = 4096
    corpus = HistoryCorpus(capacity)
    for i in range(12):  # every n-gram distinct, the worst case
        corpus.add_chat_text(i, list(range(1000 * i, 1000 * (i + 1))))
        assert len(corpus) <= capacity
    assert corpus.chats() == [8, 9, 10, 11]  # the latest four fit
    # The bound stated in the module, on what the index holds (its documents and counts, after
    # evictions), not on the process's allocations: other tests' threads may allocate meanwhile,
    # and objects reused from the interpreter's free lists escaped that count.
    assert held_bytes(corpus) < 2200 * capacity
    long = HistoryCorpus(capacity)
    long.add_chat_text("live", list(range(100)) * 50)  # one chat over the capacity
    assert len(long) == capacity


def test_proposes_a_verbatim_copy_long_and_an_unseen_context_nothing() -> None:
    corpus = HistoryCorpus()
    text = _texts(6, 1, 200)[0]
    corpus.add_chat_text("old", text)
    proposal = corpus.propose(text[50:58])
    assert proposal.tokens == text[58:58 + MAX_PROPOSAL]
    assert proposal.match == ORDERS[-1] and proposal.kind == "suffix-long"
    assert corpus.propose([97, 98, 99]).tokens == []


def test_proposes_the_continuation_with_the_most_support() -> None:
    corpus = HistoryCorpus()
    for chat in range(3):
        corpus.add_chat_text(chat, [1, 2, 3, 4, 50 + (chat == 2), 6])
    proposal = corpus.propose([1, 2, 3, 4])
    assert proposal.tokens[0] == 50 and proposal.support == 2
    assert proposal.confidence == pytest.approx(2 / 3)


def test_an_ambiguous_continuation_is_not_proposed() -> None:
    corpus = HistoryCorpus()
    for chat in range(3):
        corpus.add_chat_text(chat, [1, 2, 3, 4, 50 + chat])
    assert corpus.propose([1, 2, 3, 4]).tokens == []


def test_sync_store_follows_the_history(tmp_path: Path) -> None:
    store = HistoryStore(tmp_path / "h.sqlite3")
    first = store.create_chat("one")
    store.add_message(first, "user", "alpha beta gamma delta")
    second = store.create_chat("two")
    store.add_message(second, "user", "epsilon zeta eta theta")

    def render(messages) -> list[int]:
        return [hash(word) % 1000 for m in messages for word in m.content.split()]

    corpus = HistoryCorpus.from_store(store, render)
    assert sorted(corpus.chats()) == [first, second]
    store.delete_chat(first)
    corpus.sync_store(store, render)
    assert corpus.chats() == [second]
    alone = HistoryCorpus()
    alone.add_chat_text(second, render(store.messages(second)))
    assert corpus.counts() == alone.counts()
    store.close()


# -- drafting through the engine ------------------------------------------------------------------

def _suffix_drafter(corpus: HistoryCorpus) -> NgramDrafter:
    return NgramDrafter(FakeBackend().vocab_size, edits=False, suffix=SuffixSource(corpus))


def test_greedy_output_with_the_history_drafting_equals_target_only() -> None:
    prompt = FakeBackend().tokenize("user: the draft token is the target token\nassistant: ")
    reference, plain = _run(SpeculativeEngine(FakeBackend()), prompt, FixedDraftLength(0), 120)
    corpus = HistoryCorpus()
    corpus.add_chat_text(7, prompt + reference)  # an earlier chat asked the same
    drafter = _suffix_drafter(corpus)
    out, done = _run(SpeculativeEngine(FakeBackend(), drafter), prompt, FixedDraftLength(16), 120)
    assert out == reference
    assert done.stats.target_calls * 3 < plain.stats.target_calls
    assert sorted(corpus.chats(), key=str) == [7, LIVE]  # the reply went to its own document
    policy = AutoDraftLength()
    engine = SpeculativeEngine(FakeBackend(delay_s=0.001), drafter)
    for _ in range(2):
        assert _run(engine, prompt, policy, 120)[0] == reference
    assert any(kind.startswith("suffix") for kind in policy.learnt()["arms"])


def test_output_distribution_is_unchanged_when_sampling() -> None:
    """At temperature 1 the suffix index's one-hot proposal (three tokens an earlier chat had
    after this context) leaves the joint distribution of the first two tokens exact."""
    target = FakeBackend(sharpness=1.0)
    sampling = SamplingParams(temperature=1.0)
    # the fake looks at the last two tokens: vary them to find a context and a token c whose
    # p(c) is neither ~0 nor ~1
    base, c, _ = uncertain_case(target, sampling, (
        ([8, 21, 22, 23, 24, 25, 26, a, b], c)
        for a in range(1, 20) for b in range(1, 20) for c in range(1, 20)))
    corpus = HistoryCorpus()
    corpus.add_chat_text("earlier", base + [c, 5, 6])
    assert corpus.propose(base, 3).tokens == [c, 5, 6]
    assert_two_token_distribution_exact(
        target, base, sampling, lambda: SpeculativeEngine(target, _suffix_drafter(_copy(corpus))))


def _copy(corpus: HistoryCorpus) -> HistoryCorpus:
    fresh = HistoryCorpus(corpus.capacity)
    for chat in corpus.chats():
        if chat != LIVE:
            fresh.add_chat_text(chat, corpus.document(chat))
    return fresh


def test_the_open_chat_is_followed_renamed_and_removed_as_each_replys_hints_say() -> None:
    corpus = HistoryCorpus()
    source = SuffixSource(corpus)
    drafter = NgramDrafter(30, edits=False, suffix=source)
    drafter.prefill(LINE * 2, NO_HINTS)
    assert corpus.document(LIVE) == LINE * 2  # a new chat, not saved yet
    drafter.prefill(LINE * 2 + [1, 2], DraftHints(document=12))  # saved as chat 12
    assert corpus.chats() == [12] and corpus.document(12) == LINE * 2 + [1, 2]
    drafter.prefill([3, 4, 5], DraftHints(document=13))  # another chat's context
    assert corpus.document(13) == [3, 4, 5] and corpus.document(12) == LINE * 2 + [1, 2]
    drafter.prefill([3, 4, 5], DraftHints(renamed={13: 14}, forgotten={12}))  # a new chat
    assert corpus.chats() == [14] and corpus.document(14) == [3, 4, 5] and source.chat == LIVE


def test_build_session_indexes_the_history_for_the_default_drafter(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = HistoryStore(tmp_path / "h.sqlite3")
    chat = store.create_chat("one")
    store.add_message(chat, "user", "the draft token is the target token")
    monkeypatch.setattr(loader, "load_backend", lambda *args, **kwargs: FakeBackend())
    indexes: list[SuffixSource | None] = []
    make_drafter = loader.make_drafter

    def recorded(*args: object, history_index: SuffixSource | None = None, **kwargs: object):
        indexes.append(history_index)
        return make_drafter(*args, history_index=history_index, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(loader, "make_drafter", recorded)
    loader.build_session(Config(drafter="ngram"), history=store)
    loader.build_session(Config(drafter="ngram"))
    assert indexes[0] is not None and indexes[0].corpus.chats() == [chat]
    assert indexes[1] is None
    store.close()
