"""The evaluation costs of a target's weight layouts on this machine, measured once, at first use.

Which layout llama.cpp evaluates fastest depends on the CPU and the build, AMX or not (numbers:
docs/benchmarks.md), so ``layout = "fast"`` measures it rather than trusting one machine's table:
the first time a target with candidate layouts is loaded that way, ``measure_layouts`` prepares
each candidate (``prepare_layout``, once), loads it and the shipped file one at a time through
``LlamaCppBackend`` on the threads the config gives (all cores when adaptive), and times
evaluating ``SIZES`` tokens after a short context (median of ``REPEATS``; seconds in all). The
costs are kept in ``<user state dir>/layout-costs/<key>.json``, the key made of the shipped file,
the CPU (model name and features), its core count, the thread count, the GPU layers and the
llama.cpp build, and each layout under its name and recipe: another CPU, build or recipe is
measured again; this one never. ``plan_layout`` then offers the cheapest as "fast"; the
fidelity, a property of the quantisation, stays the catalog's. A file that is missing or
unreadable counts as nothing measured, and a write that fails is skipped.
"""

from __future__ import annotations

import hashlib
import os
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path

from chatapp.backends.amx_guard import cpu_description
from chatapp.backends.catalog import CATALOG, assembled_path
from chatapp.backends.layouts import SHIPPED, Layout, LayoutCosts, LayoutSetting, prepare_layout
from chatapp.backends.threads import available_cores
from chatapp.engine.calibration import measure_verify_costs
from chatapp.settings.config import Config
from chatapp.user_files import read_json_object, remember_json, state_dir

SIZES = (1, 4, 16)  # one decoding step, a short draft, a long one
REPEATS = 3
CONTEXT_TOKENS = 64  # evaluated before the timings, as a short chat would be
MEASURE_N_CTX = 256
_TEXT = ("def parse_address(text: str) -> tuple[int, int, int, int]:\n"
         '    """The four numbers of a dotted IPv4 address; ValueError for anything else."""\n'
         "    parts = text.strip().split('.')\n    if len(parts) != 4:\n"
         "        raise ValueError(f'not an address: {text!r}')\n"
         "    return tuple(int(part) for part in parts)\n")

Progress = Callable[[str, float | None], None]


def measured_threads(config: Config) -> int:
    """The thread count the layouts are timed with: the config's, or every core."""
    return config.threads or available_cores()


def costs_path(shipped: Path, config: Config, build: str) -> Path:
    """Where the layout costs of ``shipped`` on this machine and ``build`` are kept."""
    try:
        size = shipped.stat().st_size
    except OSError:
        size = -1
    what = [shipped.name, str(size), cpu_description(), str(os.cpu_count()),
            str(measured_threads(config)), str(config.gpu_layers), build]
    key = hashlib.sha256("\0".join(what).encode()).hexdigest()[:24]
    return state_dir() / "layout-costs" / f"{key}.json"


def _entry(layout: Layout | None) -> str:
    """A layout's key in the file: its name and recipe (the shipped file: ``SHIPPED``)."""
    return SHIPPED if layout is None else f"{layout.name} {layout.recipe}"


def recall_costs(path: Path, candidates: Sequence[Layout]) -> dict[str, dict[int, float]]:
    """The costs kept in ``path`` of the shipped file and of ``candidates`` (by name), each
    entry of its current recipe; those never measured, or unreadable, are left out."""
    data = read_json_object(path)
    costs = {}
    for layout in [None, *candidates]:
        entry = data.get(_entry(layout))
        try:
            costs[layout.name if layout else SHIPPED] = {int(n): float(s)
                                                         for n, s in entry.items()}
        except (AttributeError, TypeError, ValueError):
            continue
    return costs


def remember_costs(path: Path, layout: Layout | None, costs: dict[int, float]) -> None:
    """Add one layout's costs to ``path`` (failures skipped)."""
    data = read_json_object(path)
    data[_entry(layout)] = {str(n): s for n, s in costs.items()}
    remember_json(path, data, indent=1)


def time_layout(path: Path, config: Config) -> dict[int, float]:
    """Seconds to evaluate each of ``SIZES`` tokens after ``CONTEXT_TOKENS`` with the model file
    ``path`` loaded on its own (median of ``REPEATS``)."""
    from chatapp.backends.llama_cpp import LlamaCppBackend

    backend = LlamaCppBackend(path, n_ctx=MEASURE_N_CTX, threads=measured_threads(config),
                              gpu_layers=config.gpu_layers)
    try:
        tokens = backend.tokenize(_TEXT)
        tokens = (tokens * (1 + (CONTEXT_TOKENS + max(SIZES)) // max(len(tokens), 1)))
        context, feed = tokens[:CONTEXT_TOKENS], tokens[CONTEXT_TOKENS:][:max(SIZES)]
        costs = measure_verify_costs(backend, context, feed, SIZES, REPEATS, statistics.median)
    finally:
        backend.close()
    return {cost.tokens: cost.seconds for cost in costs}


def layout_costs(model: str, role: str, config: Config) -> LayoutCosts | None:
    """What was measured here of the layouts ``model`` (an alias) may run in as ``role``
    (None: nothing to measure: no candidates, or not a catalog model)."""
    candidates = _candidates(model, role)
    if not candidates:
        return None
    from chatapp.backends.llama_runtime import build_identity

    path = costs_path(assembled_path(CATALOG[model]), config, build_identity())
    return recall_costs(path, candidates)


def measure_layouts(model: str, role: str, shipped: Path, config: Config,
                    progress: Progress) -> LayoutCosts | None:
    """The costs of ``model``'s layouts as ``role`` here, each one measured first if it never
    was (its file prepared from ``shipped`` first if needed); None as ``layout_costs``."""
    candidates = _candidates(model, role)
    if not candidates:
        return None
    from chatapp.backends.llama_runtime import build_identity

    path = costs_path(shipped, config, build_identity())
    known = recall_costs(path, candidates)
    missing = [layout for layout in [None, *candidates]
               if (layout.name if layout else SHIPPED) not in known]
    for done, layout in enumerate(missing):
        name = layout.name if layout else "shipped"
        progress(f"Measuring the {name} layout of the {role} model on this CPU (once)",
                 done / len(missing))
        file = shipped if layout is None else prepare_layout(shipped, layout, _preparing(
            f"Preparing the {name} layout of the {role} model to measure it (once)", progress))
        remember_costs(path, layout, time_layout(file, config))
    return recall_costs(path, candidates)


def needs_measuring(config: Config, role: str) -> bool:
    """Whether ``config`` asks for the layout measured fastest (``layout = "fast"``) of a
    local target."""
    return role == "target" and LayoutSetting(config.layout) is LayoutSetting.FAST and (
        not config.rpc)


def _candidates(model: str, role: str) -> list[Layout]:
    """The layouts measured for ``model`` as ``role``: a target's candidates (a draft's layout
    is the catalog's: it changes no reply)."""
    spec = CATALOG.get(model)
    choice = spec.layouts(role) if spec and role == "target" else None
    return choice.candidates if choice else []


def _preparing(message: str, progress: Progress) -> Callable[[int, int], None]:
    """``prepare_layout``'s progress (bytes) as the loader's (a share, with ``message``)."""
    def report(done: int, total: int) -> None:
        progress(message, done / total if total else None)
    return report
