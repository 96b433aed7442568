"""The auto draft length's measurements are kept between starts: in a private file per machine and
pair, read back by the app and `specchat run`, and never in the way when damaged."""

from __future__ import annotations

import dataclasses
import json
import stat
from pathlib import Path

import numpy as np
import pytest

import chatapp.assembly.loader as loader
from chatapp.backends.fake import FakeBackend
from chatapp.chat.session import ChatSession
from chatapp.drafters.model import ModelDrafter
from chatapp.engine.contracts import MODEL_SOURCE, StepOutcome
from chatapp.engine.loop import GenerationSettings, SpeculativeEngine
from chatapp.policy.auto import AutoDraftLength
from chatapp.policy.measurements import memory_path, recall, remember
from chatapp.settings.config import Config
from tests.conftest import ready, reply_done, send, tui_fake_factory
from tests.test_draft_policy import cheap, simulate

SIZE = (100, 30)


def trained() -> AutoDraftLength:
    policy = AutoDraftLength()
    simulate(policy, 100, cheap, 0.002, lambda _: 0.8, np.random.default_rng(0))
    return policy


def test_remembered_measurements_are_recalled(private_state_dir: Path) -> None:
    path = memory_path(Config().measured_setup())
    assert path.is_relative_to(private_state_dir)
    first = trained()
    remember(first, path)
    policy = AutoDraftLength()
    assert recall(policy, path)
    assert policy.learnt()["arms"].keys() == first.learnt()["arms"].keys()
    assert policy.current_k() == first.current_k() > 0


def test_a_write_keeps_the_sources_another_process_wrote(private_state_dir: Path) -> None:
    """The app and a server of the same pair share the file: the server's prediction kinds,
    written after the app recalled it, survive the app's next write; the writer's own sources
    are its own."""
    path = memory_path(Config().measured_setup())
    app, server = trained(), trained()
    server.observe(StepOutcome("prediction-run", 4, 4, 0.0, 0.01))
    remember(server, path)
    remember(app, path)
    both = AutoDraftLength()
    assert recall(both, path)
    kinds = both.learnt()["arms"]
    assert "prediction-run" in kinds and kinds[MODEL_SOURCE] == pytest.approx(
        recalled(app)["arms"][MODEL_SOURCE])


def recalled(policy: AutoDraftLength) -> dict:
    """``policy``'s learnt data as a policy that recalls it has it."""
    copy = AutoDraftLength()
    copy.resume(policy.learnt())
    return copy.learnt()


def test_the_file_is_private(private_state_dir: Path) -> None:
    path = memory_path(Config().measured_setup())
    remember(trained(), path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left


def test_each_pair_drafter_and_backend_has_its_own_memory() -> None:
    base = Config()
    others = [dataclasses.replace(base, draft="other"), dataclasses.replace(base, drafter="model"),
              dataclasses.replace(base, backend="hf"), dataclasses.replace(base, threads=1)]
    paths = {memory_path(config.measured_setup()) for config in [base, *others]}
    assert len(paths) == 5
    warmer = dataclasses.replace(base, temperature=0.7)
    assert memory_path(warmer.measured_setup()) == memory_path(base.measured_setup())


@pytest.mark.parametrize("content", [None, "", "{not json", "[]", '{"version": 1}',
                                     json.dumps({"version": 99, "max_k": 8})])
def test_a_missing_or_damaged_file_is_ignored(content: str | None) -> None:
    path = memory_path(Config().measured_setup())
    if content is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    policy = AutoDraftLength()
    assert not recall(policy, path)
    assert policy.learnt() == AutoDraftLength().learnt()


def test_a_failed_write_is_skipped(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("a file where the folder should be")
    remember(trained(), blocker / "auto-policy" / "x.json")  # no exception


def _fake_session(config, progress, with_draft=True) -> ChatSession:
    engine = SpeculativeEngine(FakeBackend(), ModelDrafter(FakeBackend(noise=1.0)))
    return ChatSession(engine, GenerationSettings(max_tokens=40), seed=0)


def test_specchat_run_starts_from_the_last_runs_measurements(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    from chatapp.cli import main

    monkeypatch.setattr(loader, "build_session", _fake_session)
    path = memory_path(Config(draft_length="auto").measured_setup())
    assert main(["run", "-k", "auto", "hello"]) == 0
    saved = json.loads(path.read_text())
    assert saved["arms"]["model"]["drafted_steps"] > 0
    recalled = []
    monkeypatch.setattr("chatapp.policy.measurements.AutoDraftLength.resume",
                        lambda self, data: recalled.append(data))
    assert main(["run", "-k", "auto", "hello again"]) == 0
    assert recalled[0] == saved  # at the start (a write reads the file again: see remember)
    capsys.readouterr()


async def test_the_app_remembers_after_a_reply_and_recalls_at_the_next_start(
        tui_make_app, monkeypatch: pytest.MonkeyPatch) -> None:
    config = Config(draft_length="auto", drafter="model", seed=0, temperature=0.0)
    path = memory_path(config.measured_setup())
    app = tui_make_app(tui_fake_factory(), config=config)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert not path.exists()
        await send(pilot, "hello")
        await reply_done(pilot)
        assert path.exists()
    learnt = json.loads(path.read_text())
    assert learnt["arms"]["model"]["drafted_steps"] > 0
    recalled = []
    monkeypatch.setattr("chatapp.policy.measurements.AutoDraftLength.resume",
                        lambda self, data: recalled.append(data))
    again = tui_make_app(tui_fake_factory(), config=config)
    async with again.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert recalled and recalled[0] == learnt
