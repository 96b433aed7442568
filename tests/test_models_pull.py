"""`specchat models pull` against a local hub (``HF_ENDPOINT``): an aiohttp server with the
routes huggingface_hub calls (model info with file metadata; HEAD and GET of resolve with ETag,
X-Repo-Commit and Content-Length; Range for resuming), serving a tiny GGUF file."""

from __future__ import annotations

import asyncio
import hashlib
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web

from chatapp.model_stores.pull import HubFile, PullError, choose_file, parse_request
from chatapp.offline import OFFLINE_ENVIRONMENT
from tests.model_store_layouts import write_tiny_gguf

REPO = "org/Tiny-GGUF"
COMMIT = "fedcba9876543210fedcba9876543210fedcba98"
ROOT = Path(__file__).resolve().parent.parent
DOWNLOAD_CHUNK = 10 * 1024 * 1024  # huggingface_hub writes what it streams in chunks this big


@dataclass
class Hub:
    """What the local hub serves and what it was asked."""

    files: dict[str, bytes]
    url: str = ""
    ranges: list[str | None] = field(default_factory=list)
    cut_first_get_at: int | None = None  # drop the connection after this many bytes, once
    corrupt: bool = False  # serve one byte changed (the metadata keeps the true sha256)

    def sha256(self, name: str) -> str:
        return hashlib.sha256(self.files[name]).hexdigest()


def _app(hub: Hub) -> web.Application:
    async def info(request: web.Request) -> web.Response:
        siblings = [{"rfilename": name, "size": len(data), "blobId": hub.sha256(name)[:40],
                     "lfs": {"sha256": hub.sha256(name), "size": len(data), "pointerSize": 134}}
                    for name, data in hub.files.items()]
        return web.json_response({"id": REPO, "modelId": REPO, "sha": COMMIT, "private": False,
                                  "siblings": siblings + [{"rfilename": "README.md"}]})

    def headers(name: str) -> dict[str, str]:
        return {"X-Repo-Commit": COMMIT, "ETag": f'"{hub.sha256(name)}"',
                "X-Linked-Etag": f'"{hub.sha256(name)}"',
                "X-Linked-Size": str(len(hub.files[name])), "Accept-Ranges": "bytes"}

    async def resolve(request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        if name not in hub.files:
            return web.Response(status=404, headers={"X-Error-Code": "EntryNotFound"})
        data = hub.files[name]
        if hub.corrupt:
            data = bytes([data[0] ^ 1]) + data[1:]
        if request.method == "HEAD":
            return web.Response(headers={**headers(name), "Content-Length": str(len(data))})
        asked = request.headers.get("Range")
        hub.ranges.append(asked)
        start = int(asked.removeprefix("bytes=").split("-")[0]) if asked else 0
        response = web.StreamResponse(status=206 if asked else 200, headers={
            **headers(name), "Content-Length": str(len(data) - start),
            **({"Content-Range": f"bytes {start}-{len(data) - 1}/{len(data)}"} if asked else {})})
        await response.prepare(request)
        if hub.cut_first_get_at is not None:
            cut, hub.cut_first_get_at = hub.cut_first_get_at, None
            await response.write(data[start:cut])
            await asyncio.sleep(0.05)
            request.transport.close()
            return response
        await response.write(data[start:])
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get(f"/api/models/{REPO}", info)
    app.router.add_get(f"/api/models/{REPO}/revision/{{rev}}", info)
    app.router.add_route("*", f"/{REPO}/resolve/{{rev}}/{{name}}", resolve)
    return app


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[Hub]:
    """The local hub, on a free port in a thread of its own, with a Q4_K_M file of 12 MB (more
    than one of huggingface_hub's 10 MiB download chunks) and a small Q8_0 file."""
    tokens = [f"t{i}" for i in range(50)]
    files = {f"tiny-{quant}.gguf": write_tiny_gguf(tmp_path / f"{quant}.gguf", tokens,
                                                   weights).read_bytes()
             for quant, weights in (("Q4_K_M", 3_000_000), ("Q8_0", 200_000))}
    served = Hub(files)
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(_app(served))
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    served.url = f"http://127.0.0.1:{port}"
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield served
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.run_until_complete(runner.cleanup())
    loop.close()


def _pull(hub: Hub, cache: Path, request: str,
          **extra_env: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()  # an earlier test's stay_offline leaves these
           if not k.startswith("HF_") and k not in OFFLINE_ENVIRONMENT}
    env.update(HF_ENDPOINT=hub.url, HF_HUB_CACHE=str(cache), HF_HUB_DISABLE_XET="1",
               HF_HUB_DISABLE_TELEMETRY="1", PYTHONPATH=str(ROOT), HOME=str(cache.parent),
               **extra_env)
    return subprocess.run([sys.executable, "-m", "chatapp", "models", "pull", request],
                          capture_output=True, text=True, env=env, timeout=120, cwd=ROOT)


def _blob(cache: Path, hub: Hub, name: str) -> Path:
    return cache / "models--org--Tiny-GGUF" / "blobs" / hub.sha256(name)


def test_pull_fetches_the_quantisation_into_the_hub_cache(hub: Hub, tmp_path: Path) -> None:
    cache = tmp_path / "hf"
    result = _pull(hub, cache, f"{REPO}:q8_0")
    assert result.returncode == 0, result.stderr
    snapshot = Path(result.stdout.strip())
    assert snapshot == cache / "models--org--Tiny-GGUF" / "snapshots" / COMMIT / "tiny-Q8_0.gguf"
    assert snapshot.read_bytes() == hub.files["tiny-Q8_0.gguf"]
    assert snapshot.resolve() == _blob(cache, hub, "tiny-Q8_0.gguf")
    assert "uses the network" in result.stderr and hub.url in result.stderr
    from huggingface_hub import scan_cache_dir

    (repo,) = scan_cache_dir(cache).repos
    assert repo.repo_id == REPO and set(repo.refs) == {"main"}
    from chatapp.model_stores.stores import hf_cache_models

    assert [m.name for m in hf_cache_models(cache).models] == [f"hf:{REPO}/tiny-Q8_0.gguf"]


def test_pull_resumes_a_dropped_connection(hub: Hub, tmp_path: Path) -> None:
    hub.cut_first_get_at = 11_000_000  # past the first download chunk
    result = _pull(hub, tmp_path / "hf", REPO)  # no quantisation: Q4_K_M
    assert result.returncode == 0, result.stderr
    assert hub.ranges == [None, f"bytes={DOWNLOAD_CHUNK}-"]
    assert Path(result.stdout.strip()).read_bytes() == hub.files["tiny-Q4_K_M.gguf"]


def test_pull_resumes_the_download_an_earlier_pull_left(hub: Hub, tmp_path: Path) -> None:
    cache = tmp_path / "hf"
    blob = _blob(cache, hub, "tiny-Q4_K_M.gguf")
    blob.parent.mkdir(parents=True)
    blob.with_name(blob.name + ".incomplete").write_bytes(hub.files["tiny-Q4_K_M.gguf"][:123_456])
    result = _pull(hub, cache, f"{REPO}:Q4_K_M")
    assert result.returncode == 0, result.stderr
    assert hub.ranges == ["bytes=123456-"]
    assert blob.read_bytes() == hub.files["tiny-Q4_K_M.gguf"]
    assert not blob.with_name(blob.name + ".incomplete").exists()


def test_pull_refuses_a_corrupted_download(hub: Hub, tmp_path: Path) -> None:
    hub.corrupt = True
    cache = tmp_path / "hf"
    result = _pull(hub, cache, f"{REPO}:Q8_0")
    assert result.returncode == 1
    assert "refused tiny-Q8_0.gguf: its sha256 is" in result.stderr
    assert "Traceback" not in result.stderr
    blobs = cache / "models--org--Tiny-GGUF" / "blobs"
    assert list(blobs.iterdir()) == []
    assert not (cache / "models--org--Tiny-GGUF" / "snapshots").exists()


def test_pull_of_an_unknown_repo_or_quantisation_is_one_line(hub: Hub, tmp_path: Path) -> None:
    missing = _pull(hub, tmp_path / "hf", "org/None-GGUF")
    assert missing.returncode == 1 and "cannot pull org/None-GGUF" in missing.stderr
    assert "Traceback" not in missing.stderr
    quant = _pull(hub, tmp_path / "hf", f"{REPO}:Q2_K")
    assert quant.returncode == 1 and "no single GGUF file of Q2_K" in quant.stderr
    assert "tiny-Q4_K_M.gguf, tiny-Q8_0.gguf" in quant.stderr


def test_requests_and_file_choice() -> None:
    assert parse_request("a/b:Q8_0") == ("a/b", "Q8_0")
    assert parse_request("a/b") == ("a/b", None)
    with pytest.raises(PullError, match="ORG/NAME"):
        parse_request("just-a-name")
    files = [HubFile("m-Q4_K_M.gguf", 1, "a"), HubFile("m-Q4_K_S.gguf", 1, "b"),
             HubFile("m.Q8_0.gguf", 1, "c")]
    assert choose_file(files, None, "r").name == "m-Q4_K_M.gguf"
    assert choose_file(files, "q8_0", "r").name == "m.Q8_0.gguf"
    with pytest.raises(PullError, match="no single GGUF file of Q4_K"):
        choose_file(files, "Q4_K", "r")
    assert choose_file([HubFile("only.gguf", 1, "a")], None, "r").name == "only.gguf"


def test_pull_says_when_the_hub_libraries_are_set_offline(hub: Hub, tmp_path: Path) -> None:
    result = _pull(hub, tmp_path / "hf", REPO, TRANSFORMERS_OFFLINE="1")
    assert result.returncode == 1
    assert "set offline (HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE)" in result.stderr
    assert hub.ranges == []


def test_hub_files_that_would_leave_the_cache_are_left_out() -> None:
    from types import SimpleNamespace

    from chatapp.model_stores.pull import hub_files

    def sibling(name: str, sha256: str | None = "a" * 64) -> SimpleNamespace:
        lfs = SimpleNamespace(sha256=sha256) if sha256 is not None else None
        return SimpleNamespace(rfilename=name, size=10, lfs=lfs)

    info = SimpleNamespace(siblings=[
        sibling("ok-Q4_K_M.gguf"), sibling("sub/ok-Q8_0.gguf"), sibling("../evil-Q4_K_M.gguf"),
        sibling("/abs-Q4_K_M.gguf"), sibling("a/../b-Q4_K_M.gguf"),
        sibling("nohash-Q4_K_M.gguf", None), sibling("badhash-Q4_K_M.gguf", "../x"),
        sibling("m-00001-of-00002.gguf"), sibling("README.md")])
    assert [f.name for f in hub_files(info)] == ["ok-Q4_K_M.gguf", "sub/ok-Q8_0.gguf"]
