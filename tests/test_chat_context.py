"""The next turn's context window through the conversation (chatapp.chat.context): exact token
counts on the fake backend, which turns leave the prompt under ``overflow = "drop-oldest"``, what
``"refuse"`` refuses (and that nothing is saved then), and the session's bisection against a
plain scan."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterator

import pytest

from chatapp.chat.context import ContextFullError, ContextUse, view_start_note
from chatapp.chat.conversation import Conversation
from chatapp.chat.history import HistoryStore
from chatapp.chat.message import ChatMessage
from chatapp.chat.session import ChatSession
from chatapp.chat.turns import PlanEvent
from chatapp.engine.loop import ContextOverflowError
from chatapp.settings.config import Config
from tests.conftest import tui_fake_factory

# The fake's chat format is "role: content\n" per message, then "assistant: " for the reply.
# Every "the " is one token, so a message of n of them is n + 3 tokens (the role, ": ", "\n"),
# the system prompt "K" is 9 ("s", "y", "s", "t", "e", "m", ": ", "K", "\n") and the reply's
# header 2. The reply's room is min(max_tokens 40, max(64, 200 // 4)) = 40: a prompt may have
# 160 of the 200 tokens.
N_CTX = 200
CONFIG = Config(draft_length="3", drafter="model", seed=0, temperature=0.9, max_tokens=40,
                system_prompt="K")
REFUSE = dataclasses.replace(CONFIG, overflow="refuse")
TURN = "the " * 20  # 23 tokens a message, 46 a turn
NEW = "the " * 10  # 13 tokens
SYSTEM, HEADER = 9, 2


@pytest.fixture
def chat(tmp_path) -> Iterator[Conversation]:
    history = HistoryStore(tmp_path / "history.sqlite3")
    conversation = Conversation(CONFIG, history)
    conversation.attach(tui_fake_factory(max_tokens=40, n_ctx=N_CTX)(CONFIG, lambda *_: None))
    conversation.reconfigure(CONFIG)  # the system prompt
    yield conversation
    conversation.close()
    history.close()


def open_saved(chat: Conversation, texts: list[tuple[str, str]]) -> None:
    """Save a chat of ``texts`` (role, text) and open it."""
    chat_id = chat.history.create_chat("saved")
    for role, text in texts:
        chat.history.add_message(chat_id, role, text)
    chat.open_chat(chat_id)


def turns(n: int, user: str = TURN, reply: str = TURN) -> list[tuple[str, str]]:
    return [(role, text) for _ in range(n) for role, text in (("user", user), ("assistant", reply))]


def saved(chat: Conversation) -> list[tuple[str, str]]:
    return [(m.role, m.content) for m in chat.history.messages(chat.chat_id)]


def test_the_meter_counts_the_next_prompt_exactly(chat):
    assert chat.context_use() == ContextUse(SYSTEM + 3 + HEADER, N_CTX, 160)  # "user: \n"
    assert chat.context_use(NEW) == ContextUse(SYSTEM + 13 + HEADER, N_CTX, 160)
    open_saved(chat, turns(4))  # 9 + 4 * 46 + 13 + 2 = 208 tokens in all
    # drop-oldest: without the first turn 162 > 160; without the first two, 116.
    use = chat.context_use(NEW)
    assert use == ContextUse(116, N_CTX, 160, left_out=4) and not use.over and not use.warning
    assert use.used == len(chat.session.prompt([*chat.messages[4:], ChatMessage("user", NEW)]))
    chat.reconfigure(REFUSE)  # refuse: the whole chat, over by 48
    use = chat.context_use(NEW)
    assert use == ContextUse(208, N_CTX, 160) and use.over == 48 and use.warning
    assert Conversation(CONFIG).context_use() is None  # no models yet


def test_the_warning_starts_at_80_percent() -> None:
    assert ContextUse(160, 200, 160).warning and not ContextUse(159, 200, 160).warning
    assert ContextUse(3277, 4096, 3072).warning and not ContextUse(3276, 4096, 3072).warning


def test_drop_oldest_leaves_whole_turns_out_never_the_system_prompt_or_the_new_message(chat):
    open_saved(chat, turns(4))
    turn = chat.begin(NEW)
    events: list = []
    chat.run(turn, events.append)
    plan = events[0]
    assert isinstance(plan, PlanEvent) and (plan.prompt_tokens, plan.dropped_messages) == (116, 4)
    kept = turn.messages[4:]
    assert [(m.role, m.content) for m in kept] == turns(2) + [("user", NEW)]
    prompt = chat.session.prompt(kept)
    assert list(chat.session._engine.target.cached_tokens[:116]) == prompt
    assert prompt[:SYSTEM] == chat.session.prompt([])[:SYSTEM]  # the system prompt stays
    assert len(saved(chat)) == 10  # out of the prompt, never out of the chat
    note = view_start_note(plan.dropped_messages)
    assert note.startswith("Earlier messages are outside the model's view (context full)")
    assert "the 4 messages above" in note and "the message above is" in view_start_note(1)


def test_a_turn_leaves_with_its_reply_even_when_its_question_alone_would_do(chat):
    # 9 + 8 + 133 + 13 + 2 = 165 > 160; without the first question alone 157 would fit, but a
    # prompt starts at a user message: the whole first turn leaves.
    open_saved(chat, turns(1, user="the " * 5, reply="the " * 130))
    assert chat.context_use(NEW) == ContextUse(SYSTEM + 13 + HEADER, N_CTX, 160, left_out=2)


def test_refuse_sends_nothing_and_says_how_many_tokens_are_over(chat):
    open_saved(chat, turns(4))
    chat.reconfigure(REFUSE)
    before = saved(chat)
    with pytest.raises(ContextFullError, match=r"needs 208 tokens, 48 more than the 160 a prompt "
                                               r"may have \(the context window holds 200, 40"):
        chat.begin(NEW)
    assert saved(chat) == before and len(chat.entries) == 8 and chat.turn is None
    with pytest.raises(ContextFullError, match=r"Start a new chat.*--n-ctx.*drop-oldest"):
        chat.begin(NEW)
    # the last reply again: 9 + 7 * 23 + 2 = 172 tokens, 12 over
    with pytest.raises(ContextFullError, match=r"needs 172 tokens, 12 more"):
        chat.regenerate()
    assert chat.entries[-1].role == "assistant" and saved(chat) == before
    # the last question edited: 9 + 6 * 23 + 13 + 2 = 162, 2 over; no copy of the chat is kept
    with pytest.raises(ContextFullError, match=r"needs 162 tokens, 2 more"):
        chat.edit(chat.entries[6], NEW)
    assert len(chat.history.list_chats()) == 1 and saved(chat) == before


def test_refuse_sends_what_fits_whole(chat):
    chat.reconfigure(REFUSE)
    open_saved(chat, turns(2))  # 9 + 92 + 13 + 2 = 116
    events: list = []
    chat.run(chat.begin(NEW), events.append)
    assert (events[0].prompt_tokens, events[0].dropped_messages) == (116, 0)


@pytest.mark.parametrize("config", [CONFIG, REFUSE])
def test_a_message_too_long_even_alone_is_the_sessions_error(chat, config):
    chat.reconfigure(config)
    open_saved(chat, turns(1))
    turn = chat.begin("the " * 170)
    with pytest.raises(ContextOverflowError, match="Shorten the message"):
        chat.run(turn)
    assert turn.not_sent and len(chat.entries) == 2 and len(saved(chat)) == 2


def scan(session: ChatSession, history: list[ChatMessage]) -> tuple[int, int] | None:
    """The documented rule, the slow way: the first start (the first message, a user message,
    or the newest alone) whose prompt fits; (start, prompt length) or None."""
    for start in range(len(history)):
        if start in (0, len(history) - 1) or history[start].role == "user":
            length = len(session.prompt(history[start:]))
            if length <= session.prompt_room:
                return start, length
    return None


def test_the_bisection_finds_what_a_plain_scan_finds(chat):
    rng = random.Random(0)
    session = chat.session
    found_drops = set()
    for _ in range(300):
        size = rng.randrange(1, 14)
        roles = [rng.choice(["user", "user", "assistant"]) for _ in range(size - 1)] + ["user"]
        history = [ChatMessage(role, "the " * rng.randrange(0, 60)) for role in roles]
        plan = session.fit(history)
        expected = scan(session, history)
        assert (None if plan is None else (plan.dropped_messages, len(plan.tokens))) == expected
        if plan is not None:
            assert plan.tokens == session.prompt(history[plan.dropped_messages:])
            found_drops.add(plan.dropped_messages)
    assert len(found_drops) > 5  # the chats were long enough to drop many ways
