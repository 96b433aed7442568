"""The history-wide suffix index: incremental = rebuilt, the memory bound, deletion, proposals,
keeping in step with a HistoryStore."""

from __future__ import annotations

import random
import tracemalloc
from pathlib import Path

import pytest

from chatapp.history import HistoryStore
from chatapp.suffix_index import MAX_PROPOSAL, ORDERS, HistoryCorpus

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


def test_capacity_evicts_least_recent_chats_and_bounds_memory() -> None:
    capacity = 4096
    tracemalloc.start()
    corpus = HistoryCorpus(capacity)
    base = tracemalloc.get_traced_memory()[0]
    for i, text in enumerate(_texts(5, 12, 1000)):
        corpus.add_chat_text(i, text)
        assert len(corpus) <= capacity
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    assert corpus.chats() == [8, 9, 10, 11]  # the latest four fit
    assert used < 1600 * capacity  # the bound stated in the module (every n-gram distinct)
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
