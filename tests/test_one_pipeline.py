"""One reply pipeline: the chat app, `specchat run`, the web tab and the API server all reply
through ``ChatSession.reply``, and the same messages give the same greedy reply on each."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

import pytest

import chatapp.assembly.loader
import chatapp.web
from chatapp.api.exchange import ChatExchange, ExchangeDone, ExchangeRequest
from chatapp.chat.message import ChatMessage
from chatapp.chat.prompt import PromptPlan
from chatapp.chat.session import ChatSession
from chatapp.cli import run_command
from chatapp.engine.contracts import DraftPolicy
from chatapp.engine.events import Event, TokenEvent
from chatapp.settings.config import Config
from tests.conftest import ready, reply_done, send, tui_fake_factory

CONFIG = Config(draft="fake-draft", target="fake-target", draft_length="3", drafter="model",
                seed=0, temperature=0.0, max_tokens=60, system_prompt="Be brief.")
TEXT = "What is speculative decoding?"


class Replies:
    """Every reply ``ChatSession.reply`` made: its prompt tokens and its token ids."""

    def __init__(self) -> None:
        self.prompts: list[list[int]] = []
        self.tokens: list[list[int]] = []


@pytest.fixture
def replies(monkeypatch: pytest.MonkeyPatch) -> Replies:
    recorded = Replies()
    reply = ChatSession.reply

    def recording(self: ChatSession, messages: Sequence[ChatMessage], policy: DraftPolicy,
                  **options: object) -> tuple[PromptPlan, Iterator[Event]]:
        plan, events = reply(self, messages, policy, **options)  # type: ignore[arg-type]
        recorded.prompts.append(plan.tokens)
        tokens: list[int] = []
        recorded.tokens.append(tokens)

        def watched() -> Iterator[Event]:
            for event in events:
                if isinstance(event, TokenEvent):
                    tokens.append(event.id)
                yield event

        return plan, watched()

    monkeypatch.setattr(ChatSession, "reply", recording)
    factory = tui_fake_factory(max_tokens=CONFIG.max_tokens)
    monkeypatch.setattr(chatapp.assembly.loader, "build_session",
                        lambda config, progress, with_draft=True: factory(config, progress))
    return recorded  # run_command's Ctrl-C handler goes with the test (own_interrupt_handler)


async def test_the_app_run_web_and_api_reply_through_one_pipeline_alike(
        replies: Replies, capsys: pytest.CaptureFixture, tui_make_app) -> None:
    assert run_command(CONFIG, TEXT, as_json=False) == 0
    printed = capsys.readouterr().out

    app = tui_make_app(tui_fake_factory(max_tokens=CONFIG.max_tokens), config=CONFIG)
    async with app.run_test() as pilot:  # the chat app: the terminal's, and the web tab's
        await ready(pilot)
        await send(pilot, TEXT)
        await reply_done(pilot)
        app_text = app.chat.entries[-1].content
    # The web tab runs that same app (``specchat tui`` under Textual's web driver).
    assert chatapp.web.app_command(["-k", "3"])[2:4] == ["chatapp.cli", "tui"]

    exchange = ChatExchange(tui_fake_factory(max_tokens=CONFIG.max_tokens)(CONFIG, print), CONFIG)
    request = ExchangeRequest((ChatMessage("user", TEXT),))
    [done] = [e for e in exchange.run(request, threading.Event()) if isinstance(e, ExchangeDone)]
    exchange.close()

    assert len(replies.prompts) == 3  # run, the app (and so the web tab), the API
    assert replies.prompts[0] == replies.prompts[1] == replies.prompts[2]
    assert replies.tokens[0] == replies.tokens[1] == replies.tokens[2] != []
    assert printed == app_text + "\n" and app_text == done.result.text != ""
