"""Weight layouts: the shipped GGUF files requantised into the layouts this CPU computes fastest.

A model's weights can be stored in several quantisation layouts, and llama.cpp's CPU kernels are
not equally fast on each: with AMX, Q8_0 and Q4_0 weights go through the tile kernels, which
verify a batch of tokens for little more than one token costs, while the shipped target's Q6_K
output layer and the shipped draft's Q5_0 tensors do not; without AMX, Q4_0 and Q4_K weights are
repacked for the vector kernels and Q6_K ones are not (measurements: docs/benchmarks.md).

``plan_layout`` chooses, for a catalog model in a role, the layout to run: the ``layout`` setting
("auto", "shipped" or "fast") and whether llama.cpp runs AMX here decide between the model's
``LayoutChoice``s. A target's layout changes the distribution the user gets, so only a layout
whose measured fidelity to the shipped file is within ``FAITHFUL`` is ever chosen by "auto";
a coarser one is offered as "fast", with its fidelity shown. Which layout is fastest depends on
the CPU and the llama.cpp build, AMX or not, so "fast" is the one measured cheapest here once
its candidates' evaluation costs were measured on this machine (``LayoutCosts``, measured at
first use by ``chatapp.assembly.layout_costs``); the catalog's per-CPU choice until then. A draft's
layout changes only how often the target accepts its tokens, never what the target emits.

``prepare_layout`` makes the file once, in the user cache beside the joined model: it checks the
free disk space first, runs llama.cpp's quantiser (``llama_model_quantize``, requantising) in a
child process while reporting progress from the growing file, hashes the result, renames it into
place only when complete, and records its sha256 in a marker, so an interrupted preparation
never leaves a file that is later used. ``python -m chatapp.backends.layouts SRC DST TYPE`` is
the child.
"""

from __future__ import annotations

import enum
import fcntl
import hashlib
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from chatapp.errors import UserFacingError
from chatapp.user_files import private_dir, write_private

ProgressCallback = Callable[[int, int], None]  # (bytes done, bytes expected)
SHIPPED = "shipped"  # the shipped file's name among measured layouts
LayoutCosts = Mapping[str, Mapping[int, float]]  # layout name (or SHIPPED) -> n -> seconds

DISK_MARGIN_BYTES = 256 << 20  # kept free beyond the new file
_PURE, _MIXED = "pure", "mixed"  # the child's last argument
_POLL_S = 0.5
_HASH_CHUNK = 8 << 20


class LayoutSetting(enum.Enum):
    AUTO = "auto"  # the fastest faithful layout on this CPU
    SHIPPED = "shipped"  # the files as shipped
    FAST = "fast"  # the fastest layout, faithful or not (its fidelity is shown)


@dataclass(frozen=True)
class Fidelity:
    """How close a layout's distribution is to the shipped file's, measured on the bench prompts
    (``specchat bench --fidelity``): mean KL(shipped || layout) in nats per token, and the share
    of positions where both pick the same most likely token."""

    kl_nats: float
    top1_agreement: float

    def __str__(self) -> str:
        return (f"KL {self.kl_nats:.4f} nats/token, same most likely token at "
                f"{self.top1_agreement:.1%} of positions")


# A target layout is faithful (chosen by "auto") within these bounds: a mean KL of 0.01 nats a
# token bounds the total variation distance between the two next-token distributions by
# sqrt(0.01 / 2) = 7% on average (Pinsker), and greedy decoding then follows the shipped file's
# choice at 95% of positions or more.
FAITHFUL = Fidelity(kl_nats=0.01, top1_agreement=0.95)


def is_faithful(fidelity: Fidelity | None) -> bool:
    """Whether a layout of this fidelity may stand in for the shipped file by default (None: the
    layout is a draft's, where fidelity does not matter)."""
    return fidelity is None or (fidelity.kl_nats <= FAITHFUL.kl_nats
                                and fidelity.top1_agreement >= FAITHFUL.top1_agreement)


@dataclass(frozen=True)
class Layout:
    """A requantisation of a shipped file: llama.cpp's file type (``LLAMA_FTYPE_MOSTLY_<type>``)
    and the bytes it stores per weight of a 2-D tensor (for the disk-space estimate)."""

    name: str  # "q8_0"; part of the prepared file's name
    ftype: str  # "Q8_0"
    bytes_per_weight: float
    fidelity: Fidelity | None = None  # to the shipped file; None for a draft's layout
    output_type: str | None = None  # the output layer's ggml type ("Q4_0"); None: llama.cpp's
    pure: bool = False  # every other 2-D tensor in ``ftype``'s base type (llama.cpp's "pure"),
    # instead of the mixture ``ftype`` names (Q4_K_M keeps some tensors in Q6_K)

    def file_name(self, shipped: str) -> str:
        stem = shipped.removesuffix(".gguf")
        return f"{stem}.{self.name}.gguf"

    @property
    def recipe(self) -> str:
        """What the quantiser is asked for; a prepared file of another recipe is made again."""
        mixture = "/pure" if self.pure else ""
        return f"{self.ftype}/{self.output_type or 'default'}{mixture}"


@dataclass(frozen=True)
class CpuLayouts:
    """What a model runs on one kind of CPU: for "auto" and for "fast" (None: the shipped
    file), and why "auto" is what it is."""

    auto: Layout | None
    fast: Layout | None
    why: str


@dataclass(frozen=True)
class LayoutChoice:
    """A model's layouts where llama.cpp runs AMX, and where it does not."""

    amx: CpuLayouts
    no_amx: CpuLayouts

    @property
    def candidates(self) -> list[Layout]:
        """Every layout either kind of CPU would run, each once: what "fast" measures."""
        found = [self.amx.auto, self.amx.fast, self.no_amx.auto, self.no_amx.fast]
        return list(dict.fromkeys(layout for layout in found if layout is not None))


@dataclass(frozen=True)
class LayoutPlan:
    """The layout a model runs with (None: shipped) and a sentence saying why."""

    layout: Layout | None
    reason: str


def plan_layout(choice: LayoutChoice | None, setting: LayoutSetting, amx: bool,
                measured: LayoutCosts | None = None) -> LayoutPlan:
    """The layout of a model with ``choice`` under ``setting`` on a CPU where llama.cpp runs AMX
    (``amx``) or not; "fast" is the cheapest layout of ``measured`` (the shipped file's and every
    candidate's costs on this machine) when it holds them all."""
    if choice is None:
        return LayoutPlan(None, "no other layout is known for this model in this role")
    if setting is LayoutSetting.SHIPPED:
        return LayoutPlan(None, 'layout = "shipped" in the settings')
    cpu = choice.amx if amx else choice.no_amx
    if setting is LayoutSetting.FAST and measured is not None and is_measured(choice, measured):
        return _measured_fast(choice, measured)
    if setting is LayoutSetting.FAST and cpu.fast is not None and cpu.fast != cpu.auto:
        return LayoutPlan(cpu.fast, f'layout = "fast" in the settings: {cpu.fast.name} is '
                                    f"faster, and not quite the shipped model "
                                    f"({cpu.fast.fidelity})")
    if cpu.auto is not None and not is_faithful(cpu.auto.fidelity):
        return LayoutPlan(None, f"{cpu.auto.name} is not faithful enough to be the default")
    return LayoutPlan(cpu.auto, cpu.why)


def is_measured(choice: LayoutChoice, measured: LayoutCosts) -> bool:
    """Whether ``measured`` holds the shipped file's costs and every candidate's."""
    return all(name in measured for name in [SHIPPED, *(c.name for c in choice.candidates)])


def relative_cost(costs: Mapping[int, float], shipped: Mapping[int, float]) -> float:
    """``costs`` against the shipped file's: the geometric mean over the sizes both timed of the
    ratio of their seconds (below 1: cheaper), so that one token and a batch weigh alike."""
    ratios = [costs[n] / shipped[n] for n in costs if n in shipped and shipped[n] > 0]
    if not ratios or min(ratios) <= 0:
        return math.inf
    return math.exp(sum(math.log(r) for r in ratios) / len(ratios))


def describe_costs(measured: LayoutCosts) -> str:
    """"ms for 1/4/16 tokens: shipped 50/122/413, q4_0 43/104/350"."""
    sizes = sorted({n for costs in measured.values() for n in costs})
    cells = [f"{name} " + "/".join(f"{costs[n] * 1000:.0f}" if n in costs else "-"
                                   for n in sizes) for name, costs in measured.items()]
    return f"ms for {'/'.join(map(str, sizes))} tokens: {', '.join(cells)}"


def _measured_fast(choice: LayoutChoice, measured: LayoutCosts) -> LayoutPlan:
    """The cheapest of the shipped file and the candidates as ``measured`` here."""
    shipped = measured[SHIPPED]
    best = min(choice.candidates, key=lambda c: relative_cost(measured[c.name], shipped))
    costs = describe_costs(measured)
    if relative_cost(measured[best.name], shipped) >= 1.0:
        return LayoutPlan(None, f'layout = "fast": no layout evaluates faster than the shipped '
                                f"file on this CPU (measured here, {costs})")
    if best.fidelity is None:
        closeness = "a draft's layout changes only how often its tokens are accepted"
    elif is_faithful(best.fidelity):
        closeness = f"within the fidelity bound of the shipped model ({best.fidelity})"
    else:
        closeness = f"not quite the shipped model ({best.fidelity})"
    return LayoutPlan(best, f'layout = "fast": {best.name} evaluates fastest on this CPU '
                            f"(measured here, {costs}); {closeness}")


class LayoutError(UserFacingError):
    """A layout could not be prepared; the message says why and how to go on."""


def estimated_size(source: Path, layout: Layout) -> int:
    """Bytes the requantised file takes: 2-D tensors at the layout's bytes per weight, the rest
    (norms, biases) as in the source."""
    import gguf

    reader = gguf.GGUFReader(str(source))
    size = reader.tensors[0].data_offset if reader.tensors else 0
    for tensor in reader.tensors:
        if len(tensor.shape) >= 2:
            size += int(tensor.n_elements * layout.bytes_per_weight)
        else:
            size += int(tensor.n_bytes)
    return size


def check_disk_space(folder: Path, needed: int) -> None:
    """Raise ``LayoutError`` unless ``folder`` has ``needed`` bytes free and a margin."""
    free = shutil.disk_usage(folder).free
    if free < needed + DISK_MARGIN_BYTES:
        raise LayoutError(
            f"Preparing the faster weight layout needs {_gib(needed + DISK_MARGIN_BYTES)} free in "
            f"{folder}, and {_gib(free)} is free. Free some space, or set layout = \"shipped\" "
            "in the config file (or --layout shipped) to run the shipped files as they are.")


def prepared_path(source: Path, layout: Layout) -> Path:
    """Where the layout of ``source`` lies once prepared: beside it."""
    return source.with_name(layout.file_name(source.name))


def prepared_sha256(source: Path, layout: Layout) -> str | None:
    """The recorded sha256 of the layout's file, if it was prepared and is unchanged since."""
    path = prepared_path(source, layout)
    try:
        sha256, *_ = _marker(path).read_text().split()
        matches = _marker(path).read_text() == _marker_text(path, sha256, layout)
    except (OSError, ValueError):
        return None
    return sha256 if matches else None


def prepare_layout(source: Path, layout: Layout, progress: ProgressCallback | None = None,
                   threads: int | None = None) -> Path:
    """The layout's file, made from ``source`` first if needed (see the module notes). Two
    processes preparing the same layout take turns (a lock file beside it): the second finds
    it prepared. ``LayoutError`` for anything that fails, a file operation included."""
    path = prepared_path(source, layout)
    if prepared_sha256(source, layout) is not None:
        return path
    try:
        private_dir(path.parent)
        expected = estimated_size(source, layout)
        check_disk_space(path.parent, expected)
        with _locked(path):
            if prepared_sha256(source, layout) is None:
                _prepare(source, path, layout, expected, progress, threads)
    except OSError as error:
        raise LayoutError(f"Preparing the {layout.name} layout of {source.name} failed: "
                          f"{error.strerror or error} ({error.filename or path.parent}). Set "
                          "layout = \"shipped\" in the config file (or --layout shipped) to run "
                          "the shipped files.") from None
    return path


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold the lock of ``path``'s preparation (waiting for another process's)."""
    fd = os.open(path.with_name(f".{path.name}.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _prepare(source: Path, path: Path, layout: Layout, expected: int,
             progress: ProgressCallback | None, threads: int | None) -> None:
    """(Under the lock.) Make ``path`` (about ``expected`` bytes) in a partial file of its own,
    then record its sha256."""
    for stale in path.parent.glob(f".{path.name}.*.partial"):
        stale.unlink(missing_ok=True)  # left by a preparation that was killed
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
    os.close(fd)
    partial = Path(name)
    try:
        _quantize_in_child(source, partial, layout, expected, progress, threads)
        digest = _sha256(partial)
        os.chmod(partial, 0o600)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    write_private(_marker(path), _marker_text(path, digest, layout).encode())


def _quantize_in_child(source: Path, out: Path, layout: Layout, expected: int,
                       progress: ProgressCallback | None, threads: int | None) -> None:
    """Run the quantiser in a child process, reporting the output's growth every ``_POLL_S``."""
    command = [sys.executable, "-m", "chatapp.backends.layouts", str(source), str(out),
               layout.ftype, layout.output_type or "", str(threads or os.cpu_count() or 1),
               _PURE if layout.pure else _MIXED]
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    done = threading.Event()
    watcher = threading.Thread(target=_watch_growth, args=(out, expected, progress, done),
                               daemon=True)
    watcher.start()
    try:
        _, errors = child.communicate()
    except BaseException:
        child.kill()
        child.wait()
        raise
    finally:
        done.set()
        watcher.join()
    if child.returncode != 0:
        tail = " | ".join(line.strip() for line in errors.splitlines()[-3:] if line.strip())
        raise LayoutError(f"Preparing the {layout.name} layout of {source.name} failed "
                          f"(exit {child.returncode}): {tail or 'no message'}. Set layout = "
                          "\"shipped\" in the config file (or --layout shipped) to run the "
                          "shipped files.")


def _watch_growth(path: Path, expected: int, progress: ProgressCallback | None,
                  done: threading.Event) -> None:
    while not done.wait(_POLL_S):
        if progress is not None:
            try:
                progress(min(path.stat().st_size, expected), expected)
            except OSError:
                pass


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _marker(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def _marker_text(path: Path, sha256: str, layout: Layout) -> str:
    stat = path.stat()
    return f"{sha256} {stat.st_size} {stat.st_mtime_ns} {layout.recipe}\n"


def _gib(size: int) -> str:
    return f"{size / (1 << 30):.1f} GiB"


def quantize(source: Path, out: Path, ftype: str, output_type: str, threads: int,
             pure: bool = False) -> None:
    """The child's work: ``llama_model_quantize`` of ``source`` into ``out`` as ``ftype``, the
    output layer as ``output_type`` (empty: llama.cpp's choice for ``ftype``), every other
    tensor in ``ftype``'s base type when ``pure``. A tensor already of the type it gets is
    copied as it is, not quantised again."""
    import llama_cpp as lib

    params = lib.llama_model_quantize_default_params()
    params.ftype = getattr(lib, f"LLAMA_FTYPE_MOSTLY_{ftype}")
    if output_type:
        params.output_tensor_type = getattr(lib, f"GGML_TYPE_{output_type}")
    params.pure = pure
    params.allow_requantize = True
    params.nthread = threads
    status = lib.llama_model_quantize(str(source).encode(), str(out).encode(), params)
    if status != 0:
        raise SystemExit(f"llama_model_quantize returned {status}")


if __name__ == "__main__":
    quantize(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5]),
             sys.argv[6] == _PURE)
