"""A history-wide suffix index: which token followed each n-gram, over the open conversation and
the user's earlier chats (the idea of SuffixDecoding, Oliaro et al., and of llama.cpp's
persistent n-gram cache).

``HistoryCorpus`` holds one token document per chat (the chat as the model sees it: the chat
template applied) and, for every n-gram of the sizes ``ORDERS`` in every document, how often each
token followed it. It proposes the continuation with the most support: from the longest suffix of
the context it has seen, the token that followed it most often, then again from the context plus
that token, and so on, while the chain stays confident (see ``propose``).

Contracts:

- Incremental = rebuilt: the counts depend only on the multiset of documents, never on the order
  tokens were added in, so extending a chat token by token gives the same index (and the same
  proposals) as adding the whole chat at once.
- Bounded: at most ``capacity`` tokens are indexed in all. Adding past it evicts whole chats,
  least recently touched first (never the one being added to); a single chat longer than the
  capacity keeps its latest ``capacity`` tokens. Each indexed token holds at most ``len(ORDERS)``
  count entries, so memory is O(capacity): at most about 2.2 KB a token (every n-gram distinct,
  the worst case, after evictions; tests/test_suffix_index.py checks it), about 70 MB at the
  default capacity.
- ``remove_chat`` takes a chat's every count out (deleting a chat in the history removes its text
  from the index). The index lives in memory only and writes nothing: no chat's text reaches
  another chat's stored data. A proposal built from another chat's text only reaches a reply if
  the target accepts it, which exact verification makes distribution-neutral.
- Proposals are a deterministic function of the index and the context (one-hot, exact).

The conversation layer keeps it in step with the SQLite history: ``add_chat_text`` when a chat's
text changes (a new message, an edited one: the chat's document is replaced), ``remove_chat``
when a chat is deleted, ``sync_store`` to drop chats the store no longer has and load new ones.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

ORDERS = (2, 3, 4, 6, 8)  # n-gram sizes indexed, ascending
DEFAULT_CAPACITY = 32768  # tokens indexed in all chats together (about 70 MB at most)
MAX_PROPOSAL = 32  # longest proposal (a verbatim copy of a long span)
MIN_SHARE = 0.5  # a chained token needs at least this share of what followed its n-gram
MIN_CONFIDENCE = 0.3  # the chain stops when the product of its shares falls below this
SHORT_ORDER = 4  # a chain step matched on fewer tokens than this counts as "short"
SHORT_LIMIT = 4  # at most this many tokens are chained on short matches
SUFFIX_LONG, SUFFIX_SHORT = "suffix-long", "suffix-short"  # the kinds of a proposal

ChatKey = Hashable  # a history chat id, or any key for a conversation not stored (the bench's)
Render = Callable[[Sequence[Any]], list[int]]  # a chat's messages -> its tokens


class ChatStore(Protocol):
    """What the index reads of a chat history (``chatapp.chat.history.HistoryStore`` is one): chats
    with an ``id`` and an ``updated_at``, and each chat's messages."""

    def list_chats(self) -> Sequence[Any]: ...

    def messages(self, chat_id: int) -> Sequence[Any]: ...


@dataclass(frozen=True)
class SuffixProposal:
    """A proposed continuation and how well it is supported: ``match`` the n-gram size of its
    first lookup (0: no match), ``support`` how many times its first token followed that n-gram,
    ``confidence`` the product of each chained token's share of its n-gram's continuations."""

    tokens: list[int]
    match: int = 0
    support: int = 0
    confidence: float = 0.0

    @property
    def kind(self) -> str:
        """"suffix-long" (first match on a ``SHORT_ORDER``-gram or longer, seen twice or more, or
        on the longest order), "suffix-short" otherwise: the policy learns each apart."""
        long = self.match >= SHORT_ORDER and (self.support >= 2 or self.match == ORDERS[-1])
        return SUFFIX_LONG if long else SUFFIX_SHORT


class HistoryCorpus:
    """The suffix index over chats; see the module docstring."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < ORDERS[-1] + 1:
            raise ValueError(f"capacity must be at least {ORDERS[-1] + 1} tokens, got {capacity}")
        self.capacity = capacity
        self._docs: OrderedDict[ChatKey, list[int]] = OrderedDict()  # least recent first
        self._counts: dict[tuple[int, ...], dict[int, int]] = {}  # n-gram -> next token -> count
        self._size = 0

    # -- keeping it in step -------------------------------------------------------------------

    @classmethod
    def from_store(cls, store: ChatStore, render: Render,
                   capacity: int = DEFAULT_CAPACITY) -> "HistoryCorpus":
        """The chats of ``store``, newest first until ``capacity`` is reached, each rendered to
        tokens by ``render`` (the target's chat template over the chat's messages)."""
        corpus = cls(capacity)
        corpus.sync_store(store, render)
        return corpus

    def sync_store(self, store: ChatStore, render: Render) -> None:
        """Drop the chats ``store`` no longer has; add the ones it has that are not indexed,
        newest first, while they fit without evicting."""
        stored = store.list_chats()
        ids = {chat.id for chat in stored}
        for key in [key for key in self._docs if isinstance(key, int) and key not in ids]:
            self.remove_chat(key)
        for chat in sorted(stored, key=lambda chat: chat.updated_at, reverse=True):
            if chat.id in self._docs:
                continue
            tokens = render(store.messages(chat.id))
            if self._size + len(tokens) > self.capacity:
                break
            self.extend_chat(chat.id, tokens)
            self._docs.move_to_end(chat.id, last=False)  # older than what is already there

    def add_chat_text(self, chat: ChatKey, tokens: Sequence[int]) -> None:
        """Make ``tokens`` the whole text of ``chat`` (replacing what it had): cheap when they
        extend what is indexed, a replacement otherwise (an edited or regenerated message)."""
        old = self._docs.get(chat)
        if old is not None and len(tokens) >= len(old) and list(tokens[:len(old)]) == old:
            self.extend_chat(chat, tokens[len(old):])
            return
        self.remove_chat(chat)
        self.extend_chat(chat, tokens)

    def extend_chat(self, chat: ChatKey, tokens: Sequence[int]) -> None:
        """Append ``tokens`` to ``chat``'s text (a new chat if unknown)."""
        doc = self._docs.setdefault(chat, [])
        self._docs.move_to_end(chat)
        for token in tokens:
            self._count(tuple(doc[-ORDERS[-1]:]), token, +1)
            doc.append(token)
        self._size += len(tokens)
        self._bound(chat)

    def rename_chat(self, old: ChatKey, new: ChatKey) -> None:
        """Index ``old``'s text under ``new`` (replacing what ``new`` had); the counts stay."""
        doc = self._docs.pop(old, None)
        if doc is None:
            return
        self.remove_chat(new)
        self._docs[new] = doc

    def remove_chat(self, chat: ChatKey) -> None:
        """Take every count of ``chat`` out of the index (nothing if it is not indexed)."""
        doc = self._docs.pop(chat, None)
        if doc is None:
            return
        for end, token in enumerate(doc):
            self._count(tuple(doc[max(0, end - ORDERS[-1]):end]), token, -1)
        self._size -= len(doc)

    def document(self, chat: ChatKey) -> list[int]:
        """A copy of ``chat``'s indexed tokens (empty if it is not indexed)."""
        return list(self._docs.get(chat, ()))

    def chats(self) -> list[ChatKey]:
        """The indexed chats, least recently touched first."""
        return list(self._docs)

    def __len__(self) -> int:
        """Tokens indexed, all chats together (at most ``capacity``)."""
        return self._size

    def counts(self) -> dict[tuple[int, ...], dict[int, int]]:
        """A copy of the n-gram continuation counts (for tests and inspection)."""
        return {key: dict(value) for key, value in self._counts.items()}

    # -- proposing ----------------------------------------------------------------------------

    def propose(self, context: Sequence[int], limit: int = MAX_PROPOSAL) -> SuffixProposal:
        """Up to ``limit`` tokens continuing ``context``: chained most-supported continuations
        of its longest indexed suffix. The chain stops when a token has under ``MIN_SHARE`` of
        its n-gram's continuations, when the product of the shares falls under
        ``MIN_CONFIDENCE``, or after ``SHORT_LIMIT`` tokens matched on n-grams shorter than
        ``SHORT_ORDER`` (long when confident, short or nothing when not)."""
        tail = list(context[-ORDERS[-1]:])
        out: list[int] = []
        first = (0, 0)
        confidence, short = 1.0, 0
        while len(out) < limit:
            found = self._best(tail)
            if found is None:
                break
            token, count, total, order = found
            share = count / total
            short += order < SHORT_ORDER
            if share < MIN_SHARE or confidence * share < MIN_CONFIDENCE or short > SHORT_LIMIT:
                break
            confidence *= share
            first = first if out else (order, count)
            out.append(token)
            tail = tail[1:] + [token] if len(tail) >= ORDERS[-1] else tail + [token]
        if not out:
            return SuffixProposal([])
        return SuffixProposal(out, first[0], first[1], confidence)

    def _best(self, tail: list[int]) -> tuple[int, int, int, int] | None:
        """(the most frequent next token, its count, all counts, n) for the longest n-gram
        ending ``tail`` that has continuations; ties go to the smaller token id."""
        for order in reversed(ORDERS):
            if order > len(tail):
                continue
            nexts = self._counts.get(tuple(tail[-order:]))
            if nexts:
                token, count = min(nexts.items(), key=lambda item: (-item[1], item[0]))
                return token, count, sum(nexts.values()), order
        return None

    # -- counting -----------------------------------------------------------------------------

    def _count(self, window: tuple[int, ...], token: int, delta: int) -> None:
        """Count ``token`` (+1 or -1) as the continuation of every indexed n-gram ending
        ``window`` (the up to ``ORDERS[-1]`` tokens before it)."""
        counts = self._counts
        for order in ORDERS:
            if order > len(window):
                break
            key = window[len(window) - order:]
            nexts = counts.setdefault(key, {})
            value = nexts.get(token, 0) + delta
            if value > 0:
                nexts[token] = value
            else:
                nexts.pop(token, None)
                if not nexts:
                    del counts[key]

    def _bound(self, keep: ChatKey) -> None:
        """Evict least recently touched chats other than ``keep`` while over capacity; then,
        if ``keep`` alone is over, keep its latest ``capacity`` tokens."""
        while self._size > self.capacity and len(self._docs) > 1:
            oldest = next(iter(self._docs))
            if oldest == keep:
                self._docs.move_to_end(keep)
                continue
            self.remove_chat(oldest)
        if self._size > self.capacity:
            tail = self._docs[keep][-self.capacity:]
            self.remove_chat(keep)
            self.extend_chat(keep, tail)
