"""The conversation layer (chatapp.chat.conversation) without a front end: fake backends, a real
history."""

from __future__ import annotations

import dataclasses

import pytest

from chatapp.chat.conversation import ChatActionError, Conversation
from chatapp.chat.events import StepEvent, TokenEvent, TurnStats
from chatapp.chat.history import HistoryStore
from chatapp.chat.reply_values import Ending, k_label
from chatapp.chat.turns import ChatEntry, PlanEvent, Turn
from chatapp.settings.config import Config
from tests.conftest import tui_fake_factory

CONFIG = Config(draft_length="3", drafter="model", seed=0, temperature=0.9)


@pytest.fixture
def chat(tmp_path):
    history = HistoryStore(tmp_path / "history.sqlite3")
    conversation = Conversation(CONFIG, history)
    conversation.attach(tui_fake_factory()(CONFIG, lambda *_: None))
    yield conversation
    conversation.close()
    history.close()


def run(chat: Conversation, turn: Turn) -> ChatEntry:
    """Run ``turn`` through the conversation's own path (``Conversation.run``)."""
    events = []
    entry = chat.run(turn, events.append)
    plans = [event for event in events if isinstance(event, PlanEvent)]
    assert plans == [events[0]] and plans[0].prompt_tokens > 0 and plans[0].dropped_messages == 0
    return entry


def saved(chat: Conversation, chat_id: int | None = None) -> list[tuple[str, str]]:
    return [(m.role, m.content) for m in chat.history.messages(chat_id or chat.chat_id)]


def test_a_turn_is_saved_with_its_stats_and_added_to_the_chat(chat):
    turn = chat.begin("hello")
    run(chat, turn)
    assert chat.turn is None and [e.role for e in chat.entries] == ["user", "assistant"]
    reply = chat.entries[1]
    assert saved(chat) == [("user", "hello"), ("assistant", reply.content)] and reply.content
    stored = chat.history.messages(chat.chat_id)[1]
    assert stored.stats == reply.stats and reply.k_label == "3"
    assert stored.meta["k"] == {"mode": "fixed", "start": 3, "ks": [3]}  # numbers, not a label
    assert reply.finish_reason in (Ending.STOP, Ending.LENGTH)


def test_run_applies_every_event_and_fails_the_turn_when_a_front_end_raises(chat):
    turn = chat.begin("hello")
    entry = run(chat, turn)
    assert entry is chat.entries[-1] and entry.content == turn.text != ""
    assert entry.stats == turn.stats() and len(turn.steps) > 1
    assert dataclasses.replace(turn.steps[-1].stats, total_s=entry.stats.total_s) == entry.stats

    def broken(event: object) -> None:
        if isinstance(event, TokenEvent) and event.step == 1:
            raise OSError("stdout is gone")

    turn = chat.begin("again")
    with pytest.raises(OSError, match="stdout is gone"):
        chat.run(turn, broken)
    kept = chat.entries[-1]
    assert chat.turn is None and kept.finish_reason == turn.finish_reason == "error"
    assert kept.content == turn.text != "" and saved(chat)[-1] == ("assistant", turn.text)


def test_the_k_label_is_formatted_from_numbers() -> None:
    assert k_label(3, adaptive=False) == "3" and k_label(4, adaptive=True) == "auto(4)"
    assert k_label(3, False, [3, 3]) == "3" and k_label(3, False, [3, 4, 2]) == "3→2"
    assert k_label(3, True, [2, 5, 3]) == "auto 2–5" and k_label(3, True, [4, 4]) == "auto 4"


def test_a_regeneration_that_fails_before_a_token_keeps_the_old_reply(chat):
    run(chat, chat.begin("hello"))
    before = saved(chat)
    old = chat.entries[-1]
    turn = chat.regenerate()
    assert chat.entries[-1].role == "user"  # the old reply is out of the prompt
    assert chat.fail(turn) is None
    assert chat.entries[-1] is old and saved(chat) == before


def test_a_failed_first_message_is_rolled_back_with_its_empty_chat(chat):
    turn = chat.begin("hello")
    chat_id = chat.chat_id
    assert chat.fail(turn) is None
    assert chat.entries == [] and chat.chat_id is None
    assert chat.history.get_chat(chat_id) is None


def test_one_turn_at_a_time(chat):
    chat.begin("hello")
    with pytest.raises(ChatActionError, match="still streaming"):
        chat.begin("again")
    with pytest.raises(ChatActionError, match="still streaming"):
        chat.regenerate()


def test_editing_keeps_the_chat_as_it_was_as_its_own_chat(chat):
    run(chat, chat.begin("one"))
    run(chat, chat.begin("two"))
    before = saved(chat)
    turn, backup = chat.edit(chat.entries[2], "two, again")
    run(chat, turn)
    assert backup == "one (before edit)"
    assert saved(chat)[:3] == before[:2] + [("user", "two, again")] and len(saved(chat)) == 4
    kept = next(c for c in chat.history.list_chats() if c.title == backup)
    assert saved(chat, kept.id) == before


def test_reconfigure_says_when_the_models_must_load_again(chat):
    assert not chat.reconfigure(dataclasses.replace(CONFIG, temperature=0.2, seed=7))
    assert chat.session.settings.sampling.temperature == 0.2 and chat.session.seed == 7
    assert chat.reconfigure(dataclasses.replace(CONFIG, n_ctx=1024))


def test_the_drafters_history_index_follows_the_open_chat_and_forgets_deleted_ones(tmp_path):
    """The default drafter's suffix index holds the saved chats' text: a new chat's text is kept
    under its id once saved, and a deleted chat leaves it with the next reply (each reply's
    ``DraftHints`` say which chat it is and which were deleted)."""
    from chatapp.assembly.loader import load_history_index, make_drafter
    from chatapp.backends.fake import FakeBackend
    from chatapp.chat.reply_settings import generation_settings
    from chatapp.chat.session import ChatSession
    from chatapp.engine.loop import SpeculativeEngine

    config = dataclasses.replace(CONFIG, drafter="ngram")
    history = HistoryStore(tmp_path / "history.sqlite3")
    old = history.create_chat("earlier", "d", "t")
    history.add_message(old, "user", "the spec token")
    target = FakeBackend()
    index = load_history_index(history, target, config)
    assert index.corpus.chats() == [old]
    engine = SpeculativeEngine(target, make_drafter(config, target, history_index=index))
    conversation = Conversation(config, history)
    conversation.attach(ChatSession(engine, generation_settings(config), 0))
    conversation.open_chat(None)
    run(conversation, conversation.begin("the draft token"))
    new = conversation.chat_id
    assert new is not None and index.chat == new
    assert set(index.corpus.chats()) == {old, new} and len(index.corpus.document(new)) > 0
    conversation.chats.delete(old)
    assert history.get_chat(old) is None
    run(conversation, conversation.begin("the spec"))
    assert index.corpus.chats() == [new]
    conversation.open_chat(other := history.create_chat("another", "d", "t"))
    run(conversation, conversation.begin("the draft"))
    assert index.chat == other and set(index.corpus.chats()) == {new, other}
    conversation.close()
    history.close()


def test_k_plus_or_minus_one_turns_an_adaptive_policy_into_a_fixed_k_that_stays():
    """K ± 1 on an adaptive policy: a fixed K from the K the policy chose (while a reply
    streams, its latest step's), which a load of the models keeps; auto comes back on request."""
    config = dataclasses.replace(CONFIG, draft_length="auto")
    chat = Conversation(config)
    chosen = chat.policy.current_k()
    assert chat.policy.adaptive and chat.k_label == f"auto({chosen})"
    assert chat.adjust_draft_length(-1) == chosen - 1
    assert not chat.policy.adaptive and chat.k_label == str(chosen - 1)
    for _load in range(2):  # the user's K outlives a load, and the load of another pair
        chat.release()
        chat.attach(tui_fake_factory()(config, lambda *_: None))
        assert chat.k_label == str(chosen - 1)
    chat.set_auto_draft_length()
    assert chat.policy.adaptive and chat.k_label.startswith("auto(")
    turn = chat.begin("hello")
    turn.apply(StepEvent(step=0, k=7, drafted=7, accepted=2, draft_s=0.0, verify_s=0.0,
                         source="model", adaptive=True, stats=TurnStats()))
    assert chat.adjust_draft_length(1) == 8 and chat.k_label == "8"
    chat.close()


def test_an_ending_reads_as_its_value() -> None:
    # `specchat run` writes "(length)" after its statistics, never "(Ending.LENGTH)"
    from chatapp.chat.reply_values import Ending

    assert f"{Ending.LENGTH}" == "length" and str(Ending.ERROR) == "error"
