"""The history-wide suffix index as a draft source: the open conversation is one of the corpus's
chats, kept in step with the context the engine drafts for.

``SuffixSource`` (a ``chatapp.drafters.sources.Source``) is one of the default drafter's free
sources (ranked by ``chatapp.drafters.sources.ranked``): it proposes only when the corpus has a
confident continuation (``HistoryCorpus.propose``), up to ``MAX_PROPOSAL`` tokens, one-hot.

Which document the context is comes with each reply's hints (``follow``: ``DraftHints.document``,
with the documents renamed or forgotten since the last reply); the context the drafter follows
(``reset``, then ``append`` per emitted token) is then that document in the corpus. Without a
document (the bench, ``specchat run`` without history) the context is kept under ``LIVE``,
replaced whenever the context is not an extension.
"""

from __future__ import annotations

from collections.abc import Sequence

from chatapp.drafters.sources import Candidate
from chatapp.drafters.suffix_index import MAX_PROPOSAL, ChatKey, HistoryCorpus
from chatapp.engine.contracts import DraftHints

LIVE = "live"  # the corpus key of a conversation that is not in the history


class SuffixSource:
    """Proposals from a ``HistoryCorpus`` that follows the context; see the module docstring."""

    def __init__(self, corpus: HistoryCorpus, chat: ChatKey = LIVE) -> None:
        self.corpus = corpus
        self.chat = chat

    def follow(self, hints: DraftHints) -> None:
        """A reply starts with ``hints``: the documents renamed since the last reply are indexed
        under their new keys, the forgotten ones are dropped, and the context is
        ``hints.document``'s text from now on (``open_chat``)."""
        for old, new in hints.renamed.items():
            self.corpus.rename_chat(old, new)  # type: ignore[arg-type]
            if self.chat == old:
                self.chat = new  # type: ignore[assignment]
        for chat in hints.forgotten:
            self.corpus.remove_chat(chat)  # type: ignore[arg-type]
            if chat == self.chat:
                self.chat = LIVE
        self.open_chat(hints.document)  # type: ignore[arg-type]

    def open_chat(self, chat: ChatKey | None) -> None:
        """From now on the context is the text of ``chat`` (None: a conversation not kept,
        ``LIVE``). Leaving ``LIVE`` (a new chat that has just been saved) keeps the text so far as
        that chat's; leaving another chat keeps its document in the corpus (the next context that
        is not an extension replaces the new chat's document)."""
        chat = LIVE if chat is None else chat
        if chat == self.chat:
            return
        if self.chat == LIVE:
            self.corpus.rename_chat(LIVE, chat)
        self.chat = chat

    def reset(self) -> None:
        """The context starts over (a new or edited conversation): empty the chat's document;
        ``append`` refills it."""
        self.corpus.remove_chat(self.chat)

    def append(self, token: int) -> None:
        """The context grew by ``token``."""
        self.corpus.extend_chat(self.chat, (token,))

    def propose(self, context: Sequence[int], k: int) -> Candidate:
        """Up to ``min(k, MAX_PROPOSAL)`` tokens continuing ``context``, of kind "suffix-long" or
        "suffix-short"; empty when the corpus is not confident."""
        proposal = self.corpus.propose(context, min(k, MAX_PROPOSAL))
        return Candidate(proposal.tokens, proposal.kind)
