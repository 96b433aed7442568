"""Other tools' model stores, laid out in a folder as those tools write them, from model files
that are hard-linked in (never copied), and tiny GGUF files written with the ``gguf`` package."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

OLLAMA_MANIFEST_TYPE = "application/vnd.docker.distribution.manifest.v2+json"
HF_COMMIT = "0123456789abcdef0123456789abcdef01234567"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as source:
        while chunk := source.read(8 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _blob(root: Path, data: bytes) -> dict[str, object]:
    """A small blob (config, template) of the Ollama store at ``root``: its layer entry."""
    digest = hashlib.sha256(data).hexdigest()
    (root / "blobs" / f"sha256-{digest}").write_bytes(data)
    return {"digest": f"sha256:{digest}", "size": len(data)}


def add_ollama_model(root: Path, name: str, tag: str, model: Path, sha256: str,
                     namespace: str = "library", host: str = "registry.ollama.ai") -> Path:
    """Add ``model`` to the Ollama store at ``root`` as ``name:tag``: its blob (a hard link named
    by ``sha256``), a config and a template blob, and the manifest naming them; the blob's path."""
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    blob = root / "blobs" / f"sha256-{sha256}"
    if not blob.exists():
        os.link(model, blob)
    manifest = {
        "schemaVersion": 2,
        "mediaType": OLLAMA_MANIFEST_TYPE,
        "config": {"mediaType": "application/vnd.docker.container.image.v1+json",
                   **_blob(root, json.dumps({"model_format": "gguf"}).encode())},
        "layers": [
            {"mediaType": "application/vnd.ollama.image.model", "digest": f"sha256:{sha256}",
             "size": model.stat().st_size},
            {"mediaType": "application/vnd.ollama.image.template",
             **_blob(root, b"{{ .Prompt }}")},
        ],
    }
    path = root / "manifests" / host / namespace / name / tag
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest))
    return blob


def add_lmstudio_model(root: Path, publisher: str, repo: str, model: Path,
                       filename: str | None = None) -> Path:
    """Hard-link ``model`` into the LM Studio models folder ``root``; the new path."""
    path = root / publisher / repo / (filename or model.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    os.link(model, path)
    return path


def add_hf_model(cache: Path, repo_id: str, model: Path, sha256: str,
                 filename: str | None = None) -> Path:
    """Add ``model`` to the Hugging Face cache ``cache`` as ``hf_hub_download`` lays it out:
    the blob (a hard link named by its sha256), the snapshot's link to it and ``refs/main``."""
    storage = cache / f"models--{repo_id.replace('/', '--')}"
    blob = storage / "blobs" / sha256
    blob.parent.mkdir(parents=True, exist_ok=True)
    os.link(model, blob)
    snapshot = storage / "snapshots" / HF_COMMIT / (filename or model.name)
    snapshot.parent.mkdir(parents=True, exist_ok=True)
    snapshot.symlink_to(os.path.relpath(blob, snapshot.parent))
    (storage / "refs").mkdir(exist_ok=True)
    (storage / "refs" / "main").write_text(HF_COMMIT)
    return snapshot


def write_tiny_gguf(path: Path, tokens: Sequence[str], weights: int,
                    chat_template: bool = True, basename: str = "Tiny") -> Path:
    """A small, valid GGUF file: a llama header with ``tokens``, one tensor of ``weights``
    float32 values, and a chat template if asked."""
    from gguf import GGUFWriter

    path.parent.mkdir(parents=True, exist_ok=True)
    writer = GGUFWriter(str(path), "llama")
    writer.add_basename(basename)
    writer.add_context_length(2048)
    writer.add_file_type(0)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(list(tokens))
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(1)
    if chat_template:
        writer.add_chat_template("{% for m in messages %}{{ m.content }}{% endfor %}")
    writer.add_tensor("token_embd.weight", np.ones(weights, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
