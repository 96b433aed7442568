"""The conversation layer's stateless exchange (what `specchat serve` runs): the same reply as
`specchat run`'s path, stop sequences, predicted outputs as a draft source that never changes a
reply, what the server keeps of what it served."""

from __future__ import annotations

import threading

import pytest

from chatapp.api.exchange import (
    ChatExchange,
    ExchangeDone,
    ExchangeRequest,
    ExchangeResult,
    ExchangeStarted,
    PromptTooLongError,
    ReplyDelta,
    prediction_overlap,
)
from chatapp.api.served import SERVED, ServedChats
from chatapp.api.stops import StopScanner
from chatapp.chat.conversation import Conversation
from chatapp.chat.history import HistoryStore
from chatapp.chat.message import ChatMessage
from chatapp.drafters.suffix import SuffixSource
from chatapp.drafters.suffix_index import HistoryCorpus
from chatapp.engine.events import TokenSource
from chatapp.engine.stats import TurnStats
from chatapp.settings.config import Config
from tests.serve_launcher import fake_factory

CONFIG = Config(draft="fake-draft", target="fake-target", draft_length="3",
                drafter="ngram+model", seed=0, temperature=0.0)
A, B = TokenSource.ACCEPTED, TokenSource.TARGET


def exchange(max_tokens: int = 40, config: Config = CONFIG) -> ChatExchange:
    return ChatExchange(fake_factory(max_tokens, 0.0, False)(config, lambda *_: None), config)


def run(chat: ChatExchange, request: ExchangeRequest,
        cancel: threading.Event | None = None) -> tuple[list[object], ExchangeResult]:
    events = list(chat.run(request, cancel or threading.Event()))
    done = events[-1]
    assert isinstance(done, ExchangeDone)
    return events, done.result


def ask(text: str, **fields: object) -> ExchangeRequest:
    return ExchangeRequest((ChatMessage("user", text),), **fields)  # type: ignore[arg-type]


def test_an_exchange_replies_as_specchat_run_does_with_the_same_figures() -> None:
    session = fake_factory(40, 0.0, False)(CONFIG, lambda *_: None)
    chat = Conversation(CONFIG)
    chat.attach(session)
    expected = chat.run(chat.begin("the user asks"))
    events, result = run(exchange(), ask("the user asks"))
    assert isinstance(events[0], ExchangeStarted)
    assert events[0].prompt_tokens == expected.stats.prompt_tokens
    assert "".join(e.text for e in events if isinstance(e, ReplyDelta)) == result.text
    assert result.text == expected.content and result.finish_reason == expected.finish_reason
    for name in ("tokens", "prompt_tokens", "drafted", "accepted", "target_calls"):
        assert getattr(result.stats, name) == getattr(expected.stats, name), name
    assert sum(c.drafted for c in result.sources.values()) == result.stats.drafted
    assert sum(c.accepted for c in result.sources.values()) == result.stats.accepted


@pytest.mark.parametrize("prompt", ["the user asks", "spec ulative draft", "token is and"])
def test_a_prediction_can_make_a_reply_faster_never_different(prompt: str) -> None:
    """Greedy: the reply is the same with any prediction (right, wrong, edited, cut short,
    too long), and a right one is accepted."""
    plain = run(exchange(), ask(prompt))[1]
    text = plain.text
    half = len(text) // 2
    right = run(exchange(), ask(prompt, prediction=text))[1]
    wrong = run(exchange(), ask(prompt, prediction="zzz qqq kkk " * 20))[1]
    for predicted in (text[:half] + "xyz" + text[half + 3:], text[:half], text + text):
        assert run(exchange(), ask(prompt, prediction=predicted))[1].text == text
    assert right.text == wrong.text == text
    assert right.stats.target_calls < plain.stats.target_calls
    assert right.prediction_used and right.prediction_tokens
    assert right.accepted_prediction + right.rejected_prediction == right.prediction_tokens
    assert right.accepted_prediction > wrong.accepted_prediction
    assert right.sources["prediction"].accepted > 0
    assert plain.prediction_tokens is None and "prediction" not in plain.sources


def test_prediction_overlap_counts_the_predicted_tokens_in_the_reply_in_order() -> None:
    assert prediction_overlap([1, 2, 3, 4], [1, 2, 9, 3, 4]) == 4
    assert prediction_overlap([1, 2, 3], [7, 8]) == 0
    assert prediction_overlap([], [1]) == 0


def test_stop_sequences_cut_the_reply_before_them_across_pieces() -> None:
    stops = StopScanner(["END", "\n\n"])
    shown = []
    for piece in [("ab", A), ("cE", B), ("N", A), ("x", B), ("yE", A), ("ND", B), ("zz", A)]:
        shown += stops.push(piece)
    assert "".join(text for text, _ in shown) == "abcENxy"
    assert stops.matched and stops.flush() == []
    assert shown[-1] == ("y", A)  # a piece split at the stop keeps its source


def test_without_a_stop_sequence_the_held_back_text_comes_at_the_end() -> None:
    stops = StopScanner(["STOP"])
    assert stops.push(("xS", A)) == [("x", A)]
    assert stops.push(("TO", B)) == []
    assert stops.flush() == [("S", A), ("TO", B)]
    assert StopScanner([]).push(("a", A)) == [("a", A)]


def test_an_exchange_stops_at_its_stop_sequence() -> None:
    plain = run(exchange(), ask("the user asks"))[1]
    cut = plain.text[len(plain.text) // 2:len(plain.text) // 2 + 3]
    stopped = run(exchange(), ask("the user asks", stop=(cut,)))[1]
    assert stopped.finish_reason == "stop"
    assert stopped.text == plain.text[:plain.text.index(cut)]


def test_a_prompt_too_long_is_refused_not_trimmed() -> None:
    chat = exchange(config=Config(**{**CONFIG.__dict__, "n_ctx": 128}))
    with pytest.raises(PromptTooLongError) as refused:
        run(chat, ExchangeRequest((ChatMessage("user", "the " * 100),
                                   ChatMessage("assistant", "ok"),
                                   ChatMessage("user", "and?"))))
    assert refused.value.n_ctx == 128


def test_a_cancelled_exchange_ends_after_its_step() -> None:
    cancel = threading.Event()
    chat = exchange(max_tokens=400)
    events = chat.run(ask("the user asks"), cancel)
    for event in events:
        if isinstance(event, ReplyDelta):
            cancel.set()
        if isinstance(event, ExchangeDone):
            assert event.result.finish_reason == "cancelled"
            assert event.result.stats.tokens < 40
    assert run(chat, ask("again"))[1].finish_reason in ("stop", "length")


def serve(served: ServedChats, index: SuffixSource, messages: list[ChatMessage],
          token: int) -> int | None:
    """An exchange of ``messages`` whose reply is ``token``, as the drafter's index sees it."""
    chat, hints = served.hints(messages)
    served.begin(hints)
    index.follow(hints)
    index.append(token)
    return chat


def test_the_server_indexes_each_exchange_under_its_own_key() -> None:
    index = SuffixSource(HistoryCorpus())
    served = ServedChats()
    assert serve(served, index, [ChatMessage("user", "a")], 5) is None
    serve(served, index, [ChatMessage("user", "b")], 6)
    assert index.corpus.chats() == [(SERVED, 1), (SERVED, 2)]
    assert served.save([ChatMessage("user", "b")], None, "r", [], TurnStats(), "stop", {}) is None


def test_with_a_history_an_agent_continuing_its_conversation_stays_in_one_chat(tmp_path) -> None:
    store = HistoryStore(tmp_path / "history.sqlite3")
    index = SuffixSource(HistoryCorpus())
    served = ServedChats(store, "d", "t")
    first = [ChatMessage("system", "be brief"), ChatMessage("user", "write it")]
    assert serve(served, index, first, 1) is None
    chat = served.save(first, None, "done", [("done", A)], TurnStats(tokens=1), "stop", {})
    second = [*first, ChatMessage("assistant", "done"), ChatMessage("user", "now test it")]
    assert serve(served, index, second, 2) == chat
    assert served.save(second, chat, "tested", [], TurnStats(), "stop", {}) == chat
    assert serve(served, index, [ChatMessage("user", "something else")], 3) is None
    assert [m.content for m in store.messages(chat)] == ["be brief", "write it", "done",
                                                          "now test it", "tested"]
    assert index.corpus.document(chat) == [1, 2]
    store.close()
