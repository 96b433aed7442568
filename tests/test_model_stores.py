"""Discovery of the models other tools keep, their GGUF facts, pairing and `--draft auto`, on
tiny GGUF files written here (the real models: tests/test_model_stores_real.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from chatapp import cli
from chatapp.assembly.local_models import choose_draft, resolve_name
from chatapp.backends.catalog import CATALOG, ModelNotFoundError
from chatapp.model_stores import gguf_facts
from chatapp.model_stores.gguf_facts import UnreadableModelError, model_facts, read_facts
from chatapp.model_stores.pairing import can_draft
from chatapp.model_stores.stores import discover
from chatapp.settings.config import Config, load_config
from tests.model_store_layouts import (
    add_hf_model,
    add_lmstudio_model,
    add_ollama_model,
    sha256_of,
    write_tiny_gguf,
)

TOKENS = [f"tok{i}" for i in range(64)] + ["<|fim_prefix|>"]
OTHER_TOKENS = [f"other{i}" for i in range(64)]


@pytest.fixture
def stores(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every store's folder under ``tmp_path`` (nothing from the real home), empty."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "ollama"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setenv("LLAMA_CACHE", str(tmp_path / "llama.cpp"))
    return tmp_path


def _tree(root: Path) -> dict[str, tuple[int, int, int]]:
    """Every entry below ``root``: (mode, size, mtime) as it lies, links not followed."""
    return {str(path): (st.st_mode, st.st_size, st.st_mtime_ns)
            for path in [root, *root.rglob("*")] for st in [path.lstat()]}


def test_every_store_is_found_under_its_own_names(stores: Path) -> None:
    tiny = write_tiny_gguf(stores / "files" / "tiny.gguf", TOKENS, 32)
    add_ollama_model(stores / "ollama", "tiny", "1b", tiny, sha256_of(tiny))
    add_ollama_model(stores / "ollama", "tiny", "q8", tiny, sha256_of(tiny), namespace="me")
    add_ollama_model(stores / "ollama", "tiny", "2b", tiny, sha256_of(tiny), namespace="ns",
                     host="example.com")
    add_lmstudio_model(stores / "home" / ".lmstudio" / "models", "pub", "repo", tiny)
    add_lmstudio_model(stores / "home" / ".cache" / "lm-studio" / "models", "old", "repo", tiny)
    add_hf_model(stores / "hf", "org/repo-GGUF", tiny, sha256_of(tiny))
    (stores / "llama.cpp").mkdir()
    os.link(tiny, stores / "llama.cpp" / "org_repo_tiny.gguf")
    (stores / "mine" / "deep" / "er").mkdir(parents=True)
    os.link(tiny, stores / "mine" / "deep" / "er" / "t.gguf")

    found = discover([str(stores / "mine")])

    assert sorted(m.name for m in found.models) == sorted([
        "ollama:tiny:1b", "ollama:me/tiny:q8", "ollama:example.com/ns/tiny:2b",
        "lmstudio:pub/repo/tiny.gguf", "lmstudio:old/repo/tiny.gguf",
        "hf:org/repo-GGUF/tiny.gguf", "llamacpp:org_repo_tiny.gguf",
        str(stores / "mine" / "deep" / "er" / "t.gguf")])
    assert found.problems == []
    assert {m.store for m in found.models} == {"ollama", "lmstudio", "hf", "llamacpp",
                                                "model_dirs"}


def test_facts_come_from_the_header(tmp_path: Path) -> None:
    facts = read_facts(write_tiny_gguf(tmp_path / "t.gguf", TOKENS, 100, basename="Fam"))
    assert (facts.architecture, facts.family, facts.parameters, facts.context) == (
        "llama", "Fam", 100, 2048)
    assert facts.chat_template and facts.fim and facts.vocab_size == len(TOKENS)
    plain = read_facts(write_tiny_gguf(tmp_path / "p.gguf", OTHER_TOKENS, 10,
                                       chat_template=False))
    assert not plain.chat_template and not plain.fim


def test_the_fingerprint_covers_the_tokens_and_the_special_ids(tmp_path: Path) -> None:
    one = read_facts(write_tiny_gguf(tmp_path / "a.gguf", TOKENS, 100))
    same = read_facts(write_tiny_gguf(tmp_path / "b.gguf", TOKENS, 7, basename="Other"))
    other = read_facts(write_tiny_gguf(tmp_path / "c.gguf", OTHER_TOKENS + ["x"], 100))
    assert one.vocab_fingerprint == same.vocab_fingerprint != other.vocab_fingerprint
    from gguf import GGUFWriter

    moved = GGUFWriter(str(tmp_path / "d.gguf"), "llama")
    moved.add_token_list(TOKENS)
    moved.add_bos_token_id(0)
    moved.add_eos_token_id(2)  # not 1
    moved.write_header_to_file()
    moved.write_kv_data_to_file()
    moved.write_tensors_to_file()
    moved.close()
    assert read_facts(tmp_path / "d.gguf").vocab_fingerprint != one.vocab_fingerprint


def test_facts_are_cached_in_the_state_dir_by_size_and_time(
        tmp_path: Path, private_state_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_tiny_gguf(tmp_path / "m" / "t.gguf", TOKENS, 100)
    first = model_facts(path)
    assert (private_state_dir / "specchat" / "model_facts.json").is_file()
    assert sorted(p.name for p in path.parent.iterdir()) == ["t.gguf"]

    def no_reading(path: Path) -> None:
        raise AssertionError("read again")

    monkeypatch.setattr(gguf_facts, "read_facts", no_reading)
    assert model_facts(path) == first
    os.utime(path, ns=(1, 1))
    with pytest.raises(AssertionError, match="read again"):
        model_facts(path)


def test_a_truncated_file_is_a_clear_error(tmp_path: Path) -> None:
    path = write_tiny_gguf(tmp_path / "t.gguf", TOKENS, 4096)
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(UnreadableModelError, match="not a complete GGUF model"):
        read_facts(path)
    path.write_bytes(b"GGUF\x03\x00")
    with pytest.raises(UnreadableModelError, match="not a complete GGUF model"):
        read_facts(path)


def test_a_draft_shares_the_vocabulary_at_about_a_third_of_the_size(tmp_path: Path) -> None:
    target = read_facts(write_tiny_gguf(tmp_path / "t.gguf", TOKENS, 3000))
    small = read_facts(write_tiny_gguf(tmp_path / "s.gguf", TOKENS, 1000))
    half = read_facts(write_tiny_gguf(tmp_path / "h.gguf", TOKENS, 1500))
    foreign = read_facts(write_tiny_gguf(tmp_path / "f.gguf", OTHER_TOKENS, 100))
    assert can_draft(small, target)
    assert not can_draft(half, target)
    assert not can_draft(foreign, target)
    assert not can_draft(target, small)


def test_bad_input_is_one_line_each_and_nothing_is_written(
        stores: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    tiny = write_tiny_gguf(stores / "files" / "tiny.gguf", TOKENS, 32)
    add_ollama_model(stores / "ollama", "gone", "1b", tiny, "0" * 64)
    (stores / "ollama" / "blobs" / f"sha256-{'0' * 64}").unlink()
    bad = stores / "ollama" / "manifests" / "registry.ollama.ai" / "library" / "bad" / "1b"
    bad.parent.mkdir(parents=True)
    bad.write_text("not json")
    escape = bad.parent.parent / "escape" / "1b"
    escape.parent.mkdir()
    escape.write_text(json.dumps({"layers": [{"mediaType": "application/vnd.ollama.image.model",
                                              "digest": "sha256:../../../files/tiny.gguf"}]}))
    lmstudio = stores / "home" / ".lmstudio" / "models"
    truncated = write_tiny_gguf(lmstudio / "pub" / "repo" / "cut.gguf", TOKENS, 4096)
    truncated.write_bytes(truncated.read_bytes()[:-64])
    write_tiny_gguf(lmstudio / "pub" / "repo" / "plain.gguf", OTHER_TOKENS, 8, chat_template=False)
    add_lmstudio_model(lmstudio, "pub", "twice", tiny)
    add_lmstudio_model(stores / "home" / ".cache" / "lm-studio" / "models", "pub", "twice", tiny)
    locked = lmstudio / "locked"
    locked.mkdir()
    real_iterdir = Path.iterdir

    def iterdir(path: Path):  # root reads any folder whatever its mode: refuse like the kernel
        if path == locked:
            raise PermissionError(13, "Permission denied", str(path))
        return real_iterdir(path)

    monkeypatch.setattr(Path, "iterdir", iterdir)
    before = _tree(stores / "ollama") | _tree(stores / "home")

    assert cli.main(["--config", str(stores / "none.toml"), "models"]) == 0

    out = capsys.readouterr()
    problems = out.out.split("Could not use:\n", 1)[1].splitlines()
    assert len(problems) == 7, problems
    text = "\n".join(problems)
    assert f"ollama:gone:1b: the blob sha256-{'0' * 64} its manifest names is missing" in text
    assert "ollama:bad:1b: its manifest" in text
    assert "ollama:escape:1b: its manifest" in text and "which is no sha256 digest" in text
    assert "lmstudio:pub/repo/cut.gguf:" in text and "not a complete GGUF model" in text
    assert "lmstudio:pub/repo/plain.gguf: the file has no chat template" in text
    assert "lmstudio:pub/twice/tiny.gguf is in 2 places" in text
    assert f"cannot read {locked}: Permission denied" in text
    assert "Traceback" not in out.out + out.err
    assert _tree(stores / "ollama") | _tree(stores / "home") == before


def test_models_json_lists_facts_and_drafts(stores: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    lmstudio = stores / "home" / ".lmstudio" / "models"
    write_tiny_gguf(lmstudio / "fam" / "big" / "big.gguf", TOKENS, 3000, basename="Fam")
    write_tiny_gguf(lmstudio / "fam" / "small" / "small.gguf", TOKENS, 900, basename="Fam")
    write_tiny_gguf(lmstudio / "kin" / "small" / "small.gguf", TOKENS, 1000, basename="Kin")
    write_tiny_gguf(lmstudio / "else" / "small" / "x.gguf", OTHER_TOKENS, 10)

    assert cli.main(["--config", str(stores / "none.toml"), "models", "--json"]) == 0

    data = json.loads(capsys.readouterr().out)
    assert [entry["alias"] for entry in data["catalog"]] == list(CATALOG)
    models = {m["name"]: m for m in data["models"] if m["store"] != "catalog"}
    big = models["lmstudio:fam/big/big.gguf"]
    assert big["drafts"] == ["lmstudio:fam/small/small.gguf", "lmstudio:kin/small/small.gguf"]
    assert (big["parameters"], big["family"], big["quantisation"], big["chat_template"]) == (
        3000, "Fam", "ALL_F32", True)
    assert models["lmstudio:else/small/x.gguf"]["drafts"] == []
    assert data["problems"] == []


def test_auto_picks_the_family_draft_or_says_there_is_none(stores: Path) -> None:
    lmstudio = stores / "home" / ".lmstudio" / "models"
    write_tiny_gguf(lmstudio / "fam" / "big" / "big.gguf", TOKENS, 3000, basename="Fam")
    write_tiny_gguf(lmstudio / "kin" / "small" / "small.gguf", TOKENS, 1000, basename="Kin")
    write_tiny_gguf(lmstudio / "fam" / "small" / "small.gguf", TOKENS, 900, basename="Fam")
    write_tiny_gguf(lmstudio / "else" / "big" / "x.gguf", OTHER_TOKENS, 3000)

    chosen, note = choose_draft(Config(target="lmstudio:fam/big/big.gguf"))  # the default draft
    assert chosen.draft == "lmstudio:fam/small/small.gguf" and chosen.drafter == "ngram+model"
    assert note is not None and "lmstudio:fam/small/small.gguf" in note

    alone, note = choose_draft(Config(target="lmstudio:else/big/x.gguf", draft="auto"))
    assert alone.drafter == "ngram"
    assert note is not None and "none for lmstudio:else/big/x.gguf" in note

    kept, note = choose_draft(Config(target="lmstudio:fam/big/big.gguf", draft="x.gguf"))
    assert (kept.draft, note) == ("x.gguf", None)


def test_a_store_name_resolves_to_its_file_or_says_it_is_unknown(stores: Path) -> None:
    tiny = write_tiny_gguf(stores / "files" / "tiny.gguf", TOKENS, 32)
    blob = add_ollama_model(stores / "ollama", "tiny", "1b", tiny, sha256_of(tiny))
    assert resolve_name("ollama:tiny:1b", Config()) == blob
    with pytest.raises(ModelNotFoundError, match="specchat models"):
        resolve_name("ollama:tiny:2b", Config())


def test_an_unknown_store_name_is_one_line(stores: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["--config", str(stores / "none.toml"), "run", "--target",
                     "ollama:nothing:1b", "hi"])
    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith("specchat: No model 'ollama:nothing:1b'") and "Traceback" not in err


def test_model_dirs_come_from_the_config(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text('model_dirs = ["~/models", "/srv/gguf"]\n')
    assert load_config(path).model_dirs == ("~/models", "/srv/gguf")
    path.write_text('model_dirs = "~/models"\n')
    with pytest.raises(Exception, match="model_dirs"):
        load_config(path)


async def test_settings_screen_lists_the_models_found_with_their_drafts(
        stores: Path, tui_make_app) -> None:
    from textual.widgets import Static

    from tests.conftest import open_settings, ready

    lmstudio = stores / "home" / ".lmstudio" / "models"
    write_tiny_gguf(lmstudio / "fam" / "big" / "big.gguf", TOKENS, 3000, basename="Fam")
    write_tiny_gguf(lmstudio / "fam" / "small" / "small.gguf", TOKENS, 900, basename="Fam")
    app = tui_make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        screen = await open_settings(pilot)
        await pilot.press("f5")
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()
        text = str(screen.query_one("#settings-models", Static).render())
    assert "lmstudio:fam/big/big.gguf" in text
    assert "drafts: lmstudio:fam/small/small.gguf" in text


def test_the_facts_cache_forgets_files_that_are_gone(tmp_path: Path,
                                                      private_state_dir: Path) -> None:
    gone = write_tiny_gguf(tmp_path / "gone.gguf", TOKENS, 10)
    model_facts(gone)
    gone.unlink()
    model_facts(write_tiny_gguf(tmp_path / "kept.gguf", TOKENS, 10))
    cache = json.loads((private_state_dir / "specchat" / "model_facts.json").read_text())
    assert list(cache) == [str(tmp_path / "kept.gguf")]


def test_bench_measures_the_draft_auto_chooses(stores: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    import chatapp.bench

    lmstudio = stores / "home" / ".lmstudio" / "models"
    write_tiny_gguf(lmstudio / "fam" / "big" / "big.gguf", TOKENS, 3000, basename="Fam")
    write_tiny_gguf(lmstudio / "fam" / "small" / "small.gguf", TOKENS, 900, basename="Fam")
    benched: list[Config] = []
    monkeypatch.setattr(chatapp.bench, "bench_command",
                        lambda config, *args, **kwargs: benched.append(config) or 0)
    assert cli.main(["--config", str(stores / "none.toml"), "bench", "--target",
                     "lmstudio:fam/big/big.gguf", "--draft", "auto"]) == 0
    assert [config.draft for config in benched] == ["lmstudio:fam/small/small.gguf"]
    assert "note: draft auto: lmstudio:fam/small/small.gguf" in capsys.readouterr().err
