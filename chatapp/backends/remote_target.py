"""A target model whose layers live on RPC servers, run in a worker process of its own.

``RemoteTarget`` implements ``chatapp.backends.base.Backend`` as a proxy: the model is a
``LlamaCppBackend`` in a child process (``python -m chatapp.backends.remote_target FD``) that
registers the RPC servers and loads the target with exactly their devices. The vendored llama.cpp
aborts its process when a server dies mid-request; here that ends the worker only, and the next
call raises ``BackendError`` naming the server that stopped answering, so the app stays alive
and keeps the reply so far. The draft model and the verification stay in the calling process,
which never registers an RPC server (so nothing else it loads can land on one by accident).

Wire: a ``socket.socketpair`` wrapped in ``multiprocessing.connection.Connection``; requests are
pickled ``(method, args)``, replies ``("ok", value)`` or ``("error", kind, message)``. The
logits of ``evaluate`` (if any rows) follow their reply as raw float32 bytes (``send_bytes``),
read into a buffer the numpy array then owns: one copy each way (measured: 0.8 ms for the 5 rows
of a K = 4 verify on the 152k Qwen vocabulary, 3 MB, against ~100 ms for the target step, so no
shared memory). Everything that never changes (name, vocabulary size and fingerprint, stop ids,
every token's bytes, where the layers are) comes once, with the load, so ``token_bytes`` and
``vocab_fingerprint`` are local. ``cached_tokens`` is mirrored on this side from the calls that
succeeded.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np

from chatapp.backends.base import BackendError
from chatapp.backends.chat_template import TemplateMessage, Tools
from chatapp.backends.endpoints import Endpoint
from chatapp.backends.prompt_parts import PromptCancelled, PromptOverLimit
from chatapp.backends.rpc import ABORT_CALLBACK, ggml, probe, probe_all, require_rpc
from chatapp.errors import RequestRefused

_ALL_LAYERS = -1  # n_gpu_layers: every layer and the output go to the listed devices
_ERRORS: dict[str, type[Exception]] = {"BackendError": BackendError, "ValueError": ValueError,
                                       "RequestRefused": RequestRefused}
_WORKER_EXIT_WAIT_S = 5.0
_DEAD_PROBE_TIMEOUT_S = 1.0
_ABORT_MARK = "specchat worker abort: "


class RemoteTarget:
    """A GGUF target on RPC servers, through a worker process. One caller at a time."""

    uses_fallback_template: bool

    def __init__(self, path: str | os.PathLike[str], endpoints: Sequence[Endpoint],
                 n_ctx: int | None = 4096, threads: int | None = None,
                 tensor_split: Sequence[float] = ()) -> None:
        """Probe every endpoint, start the worker and load the model there; ``BackendError``
        (saying what to do) if a server is missing, busy or of another version, or the load
        fails. ``tensor_split``: one weight per server device (empty: by free memory)."""
        require_rpc()
        self._endpoints = tuple(endpoints)
        probe_all(self._endpoints)
        self._log = tempfile.TemporaryFile()
        self._conn, self._process = _start_worker(self._log)
        self._cache: list[int] = []
        self.uses_fallback_template = False
        try:
            info = self._call("load", str(path), [str(e) for e in self._endpoints], n_ctx,
                              threads, list(tensor_split))
        except BaseException:
            self.close()
            raise
        # The protocol's read-only properties, as plain attributes: they never change.
        self.name: str = info["name"]
        self.vocab_size: int = info["vocab_size"]
        self.n_ctx: int = info["n_ctx"]
        self.threads: int = info["threads"]  # fixed: the layers run on the servers
        self.stop_ids = frozenset(info["stop_ids"])
        fim = info["fim_ids"]
        self.fim_ids: tuple[int, int, int] | None = (fim[0], fim[1], fim[2]) if fim else None
        self._fingerprint: str = info["fingerprint"]
        self._pieces: list[bytes] = info["pieces"]
        self.devices: tuple[str, ...] = tuple(info["devices"])
        """Where the layers are: "RPC0 127.0.0.1:50052", ... in layer order."""

    @property
    def cached_tokens(self) -> Sequence[int]:
        return tuple(self._cache)

    @property
    def endpoints(self) -> tuple[Endpoint, ...]:
        return self._endpoints

    def tokenize(self, text: str, special: bool = False) -> list[int]:
        return self._call("tokenize", text, special)

    def token_bytes(self, token: int) -> bytes:
        return self._pieces[token] if 0 <= token < self.vocab_size else b""

    def vocab_fingerprint(self) -> str:
        return self._fingerprint

    def chat_prompt(self, messages: Sequence[TemplateMessage], limit: int | None = None,
                    cancel: threading.Event | None = None, tools: Tools = ()) -> list[int]:
        """As the protocol says; ``cancel`` is seen before the worker starts, not during."""
        if cancel is not None and cancel.is_set():
            raise PromptCancelled()
        tokens, self.uses_fallback_template, over = self._call("chat_prompt", list(messages),
                                                              limit, list(tools))
        if over is not None:
            raise PromptOverLimit(over, limit or 0)
        return tokens

    def evaluate(self, tokens: Sequence[int], n_logits: int) -> np.ndarray:
        """As ``LlamaCppBackend.evaluate``; a dead server raises ``BackendError`` (cache as
        before the call, from this side's view; the worker is gone)."""
        tokens = list(tokens)
        shape = self._call("evaluate", tokens, n_logits)
        logits = np.empty(shape, dtype=np.float32)
        if logits.size:
            self._receive_into(logits)
        self._cache.extend(tokens)
        return logits

    def truncate(self, n: int) -> None:
        if n < 0:
            raise ValueError(f"cannot truncate to {n} tokens")
        if n < len(self._cache):
            self._call("truncate", n)
            del self._cache[n:]

    def close(self) -> None:
        """Stop the worker (its model is freed with it). Safe to call twice."""
        if self._process is None:
            return
        try:
            self._conn.send(("close", ()))
        except OSError:
            pass
        self._conn.close()
        _reap(self._process)
        self._process = None
        self._log.close()

    # -- internals -----------------------------------------------------------------------------

    def _call(self, method: str, *args: Any) -> Any:
        if self._process is None:
            raise BackendError(f"The target on {self._where()} was closed: reload the models "
                               "(ctrl+r in the app).")
        try:
            self._conn.send((method, args))
            reply = self._conn.recv()
        except (EOFError, OSError):
            raise self._worker_died(loading=method == "load") from None
        if reply[0] == "error":
            raise _ERRORS.get(reply[1], BackendError)(reply[2])
        return reply[1]

    def _receive_into(self, logits: np.ndarray) -> None:
        try:
            self._conn.recv_bytes_into(memoryview(logits).cast("B"))
        except (EOFError, OSError):
            raise self._worker_died(loading=False) from None

    def _worker_died(self, loading: bool) -> BackendError:
        """Reap the worker; say which server stopped answering and how to go on."""
        assert self._process is not None
        status = _reap(self._process)
        self._conn.close()
        self._process = None
        said = _abort_reason(self._log)
        self._log.close()
        dead = [str(e) for e in self._endpoints if not _answers(e)]
        culprit = (f"the RPC server {', '.join(dead)} is not answering" if dead
                   else f"its servers ({self._where()}) answer again")
        kept = "" if loading else " What was generated so far is kept."
        return BackendError(
            f"The target's worker process ended (status {status}"
            + (f", llama.cpp: {said}" if said else "") + f") and {culprit}.{kept} Restart "
            "`specchat rpc-server` there, then reload the models (ctrl+r in the app, or run the "
            "command again).")

    def _where(self) -> str:
        return ", ".join(str(e) for e in self._endpoints)


def _start_worker(log: Any) -> tuple[Connection, subprocess.Popen[bytes]]:
    """The worker process and this side's end of its connection."""
    ours, theirs = socket.socketpair()
    package_root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [package_root, *filter(None, [os.environ.get("PYTHONPATH")])]))
    process = subprocess.Popen(
        [sys.executable, "-m", "chatapp.backends.remote_target", str(theirs.fileno())],
        pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
        start_new_session=True)  # the terminal's Ctrl-C stops the reply, not the worker
    theirs.close()  # the worker holds the only other end: its exit reads as EOF here
    return Connection(ours.detach()), process


def _reap(process: subprocess.Popen[bytes]) -> int:
    """Wait for the worker to end (killing it if it does not); its exit status."""
    try:
        return process.wait(_WORKER_EXIT_WAIT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait()


def _answers(endpoint: Endpoint) -> bool:
    try:
        probe(endpoint, _DEAD_PROBE_TIMEOUT_S)
    except BackendError:
        return False
    return True


def _abort_reason(log: Any) -> str:
    """What llama.cpp said when it aborted the worker ("" if it did not)."""
    log.seek(0)
    lines = log.read().decode("utf-8", "replace").splitlines()
    reasons = [line[len(_ABORT_MARK):] for line in lines if line.startswith(_ABORT_MARK)]
    return reasons[-1] if reasons else ""


# -- the worker process ------------------------------------------------------------------------

class _Worker:
    """The worker side: the target backend, and the calls the proxy may make on it."""

    def __init__(self) -> None:
        self.backend: Any = None

    def load(self, path: str, endpoints: list[str], n_ctx: int | None, threads: int | None,
             tensor_split: list[float]) -> dict[str, Any]:
        """Register the servers and load the target on exactly their devices."""
        from chatapp.backends.llama_cpp import LlamaCppBackend
        from chatapp.backends.rpc import add_servers

        devices = add_servers([Endpoint.parse(e) for e in endpoints])
        if tensor_split and len(tensor_split) != len(devices):
            raise BackendError(
                f"tensor_split has {len(tensor_split)} weights but the servers offer "
                f"{len(devices)} devices ({', '.join(d.name for d in devices)}): give one weight "
                "per device.")
        backend = LlamaCppBackend(path, n_ctx=n_ctx, threads=threads, gpu_layers=_ALL_LAYERS,
                                  devices=[d.pointer for d in devices], tensor_split=tensor_split)
        self.backend = backend
        return {"name": backend.name, "vocab_size": backend.vocab_size, "n_ctx": backend.n_ctx,
                "threads": backend.threads, "stop_ids": sorted(backend.stop_ids),
                "fim_ids": backend.fim_ids,
                "fingerprint": backend.vocab_fingerprint(),
                "pieces": [backend.token_bytes(t) for t in range(backend.vocab_size)],
                "devices": [f"{d.name} {d.description}" for d in devices]}

    def tokenize(self, text: str, special: bool) -> list[int]:
        return self._loaded().tokenize(text, special)

    def chat_prompt(self, messages: list[TemplateMessage], limit: int | None, tools: Tools
                    ) -> tuple[list[int], bool, int | None]:
        """The prompt, whether the fallback template made it, and (instead of the prompt) how
        many tokens it had when it passed ``limit``."""
        try:
            tokens = self._loaded().chat_prompt(messages, limit, tools=tools)
        except PromptOverLimit as over:
            return [], self.backend.uses_fallback_template, over.tokens
        return tokens, self.backend.uses_fallback_template, None

    def evaluate(self, tokens: list[int], n_logits: int) -> np.ndarray:
        return self._loaded().evaluate(tokens, n_logits)

    def truncate(self, n: int) -> None:
        self._loaded().truncate(n)

    def _loaded(self) -> Any:
        if self.backend is None:
            raise BackendError("The target model is not loaded.")
        return self.backend


_WORKER_CALLS = ("load", "tokenize", "chat_prompt", "evaluate", "truncate")


def _serve(conn: Connection) -> None:
    """Answer requests until "close" or the other side goes away; then free the model."""
    worker = _Worker()
    while True:
        try:
            method, args = conn.recv()
        except EOFError:
            break
        if method not in _WORKER_CALLS:
            break  # "close"
        try:
            value = getattr(worker, method)(*args)
        except (BackendError, ValueError, RequestRefused) as error:
            conn.send(("error", type(error).__name__, str(error)))
            continue
        if method == "evaluate":
            conn.send(("ok", value.shape))
            if value.size:
                conn.send_bytes(value)
        else:
            conn.send(("ok", value))
    if worker.backend is not None:
        worker.backend.close()


def _report_aborts() -> Any:
    """Make ggml's abort write one marked line (its reason, without the source location) instead
    of a gdb backtrace, which takes seconds; the process still aborts. Keep the result alive."""
    def report(message: bytes | None) -> None:
        reason = re.sub(r"^.*?:\d+: ", "", (message or b"").decode("utf-8", "replace")).strip()
        os.write(2, f"{_ABORT_MARK}{reason}\n".encode())

    callback = ABORT_CALLBACK(report)
    ggml().set_abort_callback(callback)
    return callback


if __name__ == "__main__":
    _keep = _report_aborts()
    _serve(Connection(int(sys.argv[1])))
