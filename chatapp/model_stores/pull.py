"""`specchat models pull REPO[:QUANT]`: one GGUF file from the Hugging Face hub into the Hugging
Face cache, where other tools find it too. The only code of specchat that uses the network.

Contract of ``pull``: the repository's file list (``HfApi.model_info`` with file metadata) gives
the GGUF files and the hub's sha256 of each; ``choose_file`` picks the one of the quantisation
asked for (none asked: Q4_K_M, else the only one). The file streams (``huggingface_hub``'s
``http_get``: a progress bar, and a dropped connection resumed with a Range request) into
``blobs/<sha256>.incomplete`` of the cache, which a later pull resumes after an interruption
(under the lock ``hf_hub_download`` takes for that blob, so two pulls never write it at once).
The whole file's sha256 must be the hub's, else the download is deleted and
``PullError`` says so; only then does it become the blob, with the snapshot link and the ref, as
``hf_hub_download`` lays them out. ``HF_ENDPOINT`` names another hub (tests serve one locally).
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chatapp.errors import UserFacingError

PREFERRED_QUANT = "Q4_K_M"
_CHUNK = 8 << 20
_SHARD = re.compile(r"-\d{5}-of-\d{5}\.gguf$")
_SHA256 = re.compile(r"[0-9a-f]{64}")  # names the blob
_COMMIT = re.compile(r"[0-9a-f]{40}")  # names the snapshot folder


class PullError(UserFacingError):
    """The pull cannot be done; the message says why and what to do."""


@dataclass(frozen=True)
class HubFile:
    """A GGUF file of a repository: its name, size and the hub's sha256."""

    name: str
    size: int
    sha256: str


def parse_request(text: str) -> tuple[str, str | None]:
    """``REPO[:QUANT]`` as (repo id, quantisation or None); ``PullError`` unless the repo is
    ``org/name``."""
    repo, _, quant = text.partition(":")
    if repo.count("/") != 1 or not all(repo.split("/")):
        raise PullError(f"'{text}' is not a repository: give ORG/NAME[:QUANT], e.g. "
                        "Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF:Q4_K_M")
    return repo, quant or None


def choose_file(files: list[HubFile], quant: str | None, repo: str) -> HubFile:
    """The file of quantisation ``quant`` (case-insensitive, a whole part of the name: Q4_K is
    not Q4_K_M), or for None Q4_K_M or the only file; ``PullError`` listing the choices
    otherwise."""
    wanted = quant or PREFERRED_QUANT
    pattern = re.compile(rf"(^|[-_.]){re.escape(wanted)}([-.]|$)", re.IGNORECASE)
    matching = [f for f in files if pattern.search(f.name)]
    if len(matching) == 1:
        return matching[0]
    if quant is None and len(files) == 1:
        return files[0]
    choices = ", ".join(sorted(f.name for f in files)) or "none"
    if matching:
        raise PullError(f"{repo} has {len(matching)} files of {wanted}: {choices}. Name one "
                        "quantisation exactly (files split in shards cannot be pulled yet).")
    raise PullError(f"{repo} has no single GGUF file of {wanted}; its GGUF files: {choices}. "
                    f"Give one with {repo}:QUANT.")


def hub_files(info: Any) -> list[HubFile]:
    """The single-file GGUF models of a ``ModelInfo`` with file metadata (shards, and files
    without a sha256 or whose name would leave the snapshot folder, left out)."""
    files = []
    for sibling in info.siblings or ():
        name = sibling.rfilename
        if not name.endswith(".gguf") or _SHARD.search(name):
            continue
        sha256 = sibling.lfs.sha256 if sibling.lfs is not None else None
        if not _SHA256.fullmatch(sha256 or "") or sibling.size is None or not _plain(name):
            continue
        files.append(HubFile(name, int(sibling.size), sha256))
    return files


def _plain(name: str) -> bool:
    """Whether the hub's file name ``name`` stays inside a snapshot folder."""
    parts = name.split("/")
    return not name.startswith("/") and "\\" not in name and all(
        part not in ("", ".", "..") for part in parts)


def pull(request: str, say: Callable[[str], None]) -> Path:
    """Fetch ``request`` (``REPO[:QUANT]``) into the Hugging Face cache and return the file's
    path there; ``say`` gets the lines to show (the endpoint, the file chosen)."""
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    repo, quant = parse_request(request)
    endpoint = os.environ.get("HF_ENDPOINT", constants.ENDPOINT).rstrip("/")
    say(f"specchat models pull uses the network (the only command that does): {endpoint}")
    try:
        info = HfApi(endpoint=endpoint).model_info(repo, files_metadata=True)
        if not _COMMIT.fullmatch(str(info.sha)):
            raise PullError(f"cannot pull {repo}: the hub named no commit for it")
        chosen = choose_file(hub_files(info), quant, repo)
        say(f"{repo}: {chosen.name}, {chosen.size / 1e6:.0f} MB, sha256 {chosen.sha256}")
        return _download(repo, info.sha, chosen, endpoint)
    except OfflineModeIsEnabled:
        raise PullError("the Hugging Face libraries are set offline (HF_HUB_OFFLINE or "
                        "TRANSFORMERS_OFFLINE): unset it to pull from the hub") from None
    except (HfHubHTTPError, OSError) as error:
        raise PullError(f"cannot pull {repo}: {_first_line(error)}") from None


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def _download(repo: str, commit: str, chosen: HubFile, endpoint: str) -> Path:
    """Stream ``chosen`` of ``repo`` at ``commit`` into the cache (resuming a partial download),
    check it, and lay it out as the cache does; the snapshot path."""
    from huggingface_hub import constants, hf_hub_url
    from huggingface_hub.file_download import http_get, repo_folder_name
    from huggingface_hub.utils import WeakFileLock

    folder = repo_folder_name(repo_id=repo, repo_type="model")
    storage = Path(constants.HF_HUB_CACHE) / folder
    blob = storage / "blobs" / chosen.sha256
    snapshot = storage / "snapshots" / commit / chosen.name
    lock = Path(constants.HF_HUB_CACHE) / ".locks" / folder / f"{chosen.sha256}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with WeakFileLock(lock):  # the lock hf_hub_download takes for the same blob
        if not blob.is_file():
            blob.parent.mkdir(parents=True, exist_ok=True)
            partial = blob.with_name(blob.name + ".incomplete")
            url = hf_hub_url(repo, chosen.name, revision=commit, endpoint=endpoint)
            with partial.open("ab") as out:
                http_get(url, out, resume_size=out.tell(), expected_size=chosen.size,
                         displayed_filename=chosen.name, headers={"Accept-Encoding": "identity"})
            _check_sha256(partial, chosen)
            os.replace(partial, blob)
    snapshot.parent.mkdir(parents=True, exist_ok=True)
    if not snapshot.exists():
        snapshot.unlink(missing_ok=True)  # a dangling link
        snapshot.symlink_to(os.path.relpath(blob, snapshot.parent))
    ref = storage / "refs" / "main"
    ref.parent.mkdir(parents=True, exist_ok=True)
    ref.write_text(commit)
    return snapshot


def _check_sha256(path: Path, chosen: HubFile) -> None:
    """Delete ``path`` and raise ``PullError`` unless its sha256 is the hub's."""
    digest = hashlib.sha256()
    with path.open("rb") as source:
        while chunk := source.read(_CHUNK):
            digest.update(chunk)
    if digest.hexdigest() != chosen.sha256:
        path.unlink()
        raise PullError(f"refused {chosen.name}: its sha256 is {digest.hexdigest()}, the hub "
                        f"says {chosen.sha256}; the download was deleted, pull again")
