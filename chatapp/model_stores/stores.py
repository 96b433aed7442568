"""Where other tools keep GGUF models, read without writing a byte there.

Each store gives ``FoundModel``s under names that say where they came from:

- Ollama (``$OLLAMA_MODELS``, else ``~/.ollama/models``): ``ollama:<name>:<tag>`` (the
  ``library/`` namespace of ``registry.ollama.ai`` implied; ``ollama:<ns>/<name>:<tag>`` and
  ``ollama:<host>/<ns>/<name>:<tag>`` otherwise); the manifest under
  ``manifests/<host>/<ns>/<name>/<tag>`` names the model layer, whose blob is
  ``blobs/sha256-<hex>``;
- LM Studio (``~/.lmstudio/models``, then the older ``~/.cache/lm-studio/models``):
  ``lmstudio:<publisher>/<repo>/<file>``;
- the Hugging Face cache (``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
  ``~/.cache/huggingface/hub``), read with ``huggingface_hub.scan_cache_dir``:
  ``hf:<org>/<repo>/<file>``;
- llama.cpp's download cache (``$LLAMA_CACHE``, else ``$XDG_CACHE_HOME/llama.cpp``, else
  ``~/.cache/llama.cpp``): ``llamacpp:<file>``;
- the config's ``model_dirs``: every ``.gguf`` below them, named by its path (a path is a model
  name, as always).

What cannot be read (a folder without permission, a manifest that is not JSON, a blob that is
missing, a damaged cache) becomes a ``Discovery.problems`` line, never an exception.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

OLLAMA_REGISTRY = "registry.ollama.ai"
OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"
OLLAMA_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")  # the blob's name; never a path of its own
GGUF_SUFFIX = ".gguf"
STORE_PREFIXES = ("ollama:", "lmstudio:", "hf:", "llamacpp:")


@dataclass(frozen=True)
class FoundModel:
    """A model file another tool (or a ``model_dirs`` folder) holds: its ``name`` (what
    ``--target`` and ``--draft`` take), its ``path``, the ``store`` it is in and its size."""

    name: str
    path: Path
    store: str
    size: int


@dataclass
class Discovery:
    """Everything found in the stores, and one line per thing that could not be read."""

    models: list[FoundModel] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def named(self, name: str) -> list[FoundModel]:
        """The models called ``name`` (more than one when two stores hold the same name)."""
        return [model for model in self.models if model.name == name]

    def add(self, other: Discovery) -> None:
        self.models += other.models
        self.problems += other.problems


def is_store_name(name: str) -> bool:
    """Whether ``name`` names a model of another tool's store (``ollama:``, ``lmstudio:``...)."""
    return name.startswith(STORE_PREFIXES)


def _home() -> Path:
    return Path(os.environ.get("HOME") or Path.home())


def ollama_root() -> Path:
    return Path(os.environ.get("OLLAMA_MODELS") or _home() / ".ollama" / "models")


def lmstudio_roots() -> tuple[Path, ...]:
    return (_home() / ".lmstudio" / "models", _home() / ".cache" / "lm-studio" / "models")


def hf_cache_root() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]) / "hub"
    return _home() / ".cache" / "huggingface" / "hub"


def llamacpp_root() -> Path:
    if os.environ.get("LLAMA_CACHE"):
        return Path(os.environ["LLAMA_CACHE"])
    cache = os.environ.get("XDG_CACHE_HOME")
    return (Path(cache) if cache else _home() / ".cache") / "llama.cpp"


def discover(model_dirs: Iterable[str] = ()) -> Discovery:
    """Every GGUF model of every store and of ``model_dirs``; read only, offline."""
    found = Discovery()
    found.add(ollama_models(ollama_root()))
    for root in lmstudio_roots():
        found.add(folder_models(root, "lmstudio", "lmstudio:", depth=3))
    found.add(hf_cache_models(hf_cache_root()))
    found.add(folder_models(llamacpp_root(), "llamacpp", "llamacpp:", depth=1))
    for folder in model_dirs:
        found.add(folder_models(Path(folder).expanduser(), "model_dirs", "", depth=None))
    found.problems += _same_names(found.models)
    return found


def _same_names(models: list[FoundModel]) -> list[str]:
    """One line per name that more than one store holds: which file the name runs."""
    places: dict[str, list[Path]] = {}
    for model in models:
        places.setdefault(model.name, []).append(model.path)
    return [f"{name} is in {len(paths)} places ({', '.join(map(str, paths))}); the name runs "
            f"the first, give a path to run another" for name, paths in places.items()
            if len(paths) > 1]


def ollama_models(root: Path) -> Discovery:
    """The models of the Ollama store at ``root`` (nothing when there is no store)."""
    found = Discovery()
    manifests = root / "manifests"
    if not root.exists():
        return found
    for manifest in _files(manifests, found, depth=4):
        relative = manifest.relative_to(manifests).parts
        name = _ollama_name(relative)
        try:
            layers = json.loads(manifest.read_text(encoding="utf-8")).get("layers", [])
            digest = next(layer["digest"] for layer in layers
                          if layer.get("mediaType") == OLLAMA_MODEL_LAYER)
        except (OSError, ValueError, AttributeError, KeyError, TypeError, StopIteration):
            found.problems.append(f"{name}: its manifest {manifest} names no model layer "
                                  "(not an Ollama manifest, or damaged); skipped")
            continue
        if not isinstance(digest, str) or not OLLAMA_DIGEST.fullmatch(digest):
            found.problems.append(f"{name}: its manifest {manifest} names the model layer "
                                  f"{digest!r}, which is no sha256 digest; skipped")
            continue
        blob = root / "blobs" / digest.replace(":", "-")
        if not blob.is_file():
            found.problems.append(f"{name}: the blob {blob.name} its manifest names is missing "
                                  f"from {blob.parent}; `ollama pull` it again")
            continue
        found.models.append(FoundModel(name, blob, "ollama", blob.stat().st_size))
    return found


def _ollama_name(parts: tuple[str, ...]) -> str:
    """The ``ollama:`` name of a manifest at ``<host>/<ns>/<name>/<tag>`` (relative parts)."""
    *where, tag = parts
    if len(where) != 3:
        return f"ollama:{'/'.join(where)}:{tag}"
    host, namespace, model = where
    if host != OLLAMA_REGISTRY:
        return f"ollama:{host}/{namespace}/{model}:{tag}"
    return f"ollama:{'' if namespace == 'library' else namespace + '/'}{model}:{tag}"


def folder_models(root: Path, store: str, prefix: str, depth: int | None) -> Discovery:
    """The ``.gguf`` files below ``root`` (at most ``depth`` folders down; None: any), named
    ``prefix`` + their path below ``root`` (no prefix: their full path)."""
    found = Discovery()
    if not root.exists():
        return found
    for path in _files(root, found, depth=depth):
        if path.name.endswith(GGUF_SUFFIX):
            name = f"{prefix}{path.relative_to(root).as_posix()}" if prefix else str(path)
            found.models.append(FoundModel(name, path, store, path.stat().st_size))
    return found


def hf_cache_models(root: Path) -> Discovery:
    """The ``.gguf`` files of the model repositories in the Hugging Face cache at ``root``
    (the newest revision's file where several revisions hold the same file name)."""
    found = Discovery()
    if not root.exists():
        return found
    from huggingface_hub import CacheNotFound, scan_cache_dir

    try:
        info = scan_cache_dir(root)
    except (CacheNotFound, OSError) as error:
        found.problems.append(f"the Hugging Face cache {root} cannot be read: {error}")
        return found
    found.problems += [f"the Hugging Face cache {root}: {warning}" for warning in info.warnings]
    for repo in sorted(info.repos, key=lambda repo: repo.repo_id):
        if repo.repo_type != "model":
            continue
        newest: dict[str, FoundModel] = {}
        for revision in sorted(repo.revisions, key=lambda revision: revision.last_modified):
            for file in revision.files:
                relative = file.file_path.relative_to(revision.snapshot_path).as_posix()
                if relative.endswith(GGUF_SUFFIX):
                    newest[relative] = FoundModel(f"hf:{repo.repo_id}/{relative}",
                                                  file.file_path, "hf", file.size_on_disk)
        found.models += newest.values()
    return found


def _files(root: Path, found: Discovery, depth: int | None) -> Iterator[Path]:
    """The files below ``root``, at most ``depth`` folders down (None: any), in name order;
    a folder that cannot be listed becomes a problem line of ``found``."""
    try:
        entries = sorted(root.iterdir())
    except OSError as error:
        found.problems.append(f"cannot read {root}: {error.strerror or error}; skipped")
        return
    for entry in entries:
        if entry.name.startswith("."):
            continue
        if entry.is_dir():
            if depth is None or depth > 1:
                yield from _files(entry, found, None if depth is None else depth - 1)
        elif entry.is_file():
            yield entry
