"""`specchat models`: the catalog's models, what is installed, and which weight layout runs here;
then the models other tools keep on this machine (``chatapp.model_stores``), each with the local
models that can draft for it, and one line per thing that could not be read."""

from __future__ import annotations

import dataclasses
from typing import Any

from chatapp.assembly.layout_costs import layout_costs
from chatapp.assembly.loader import layout_plan
from chatapp.assembly.local_models import local_models
from chatapp.backends.catalog import (
    CATALOG,
    ModelSpec,
    assembled_path,
    install_hint,
    is_ready,
    licence_text,
    missing_parts,
)
from chatapp.backends.layouts import describe_costs, prepared_path, prepared_sha256
from chatapp.model_stores.pairing import Surveyed, drafts_for, survey
from chatapp.settings.config import Config


def model_report(config: Config) -> list[str]:
    """A few lines per catalog model: name, size, licence, whether it is installed, and for the
    roles ``config`` gives it, which file runs (its weight layout) and why."""
    lines = []
    for spec in CATALOG.values():
        status = install_status(spec)
        roles = [r for r, alias in (("draft", config.draft), ("target", config.target))
                 if alias == spec.alias]
        role = f" [{', '.join(roles)}]" if roles else ""
        text = licence_text(spec)
        licence = f"{spec.licence}, text in {text}" if text else spec.licence
        lines += [f"{spec.alias}{role}",
                  f"  {spec.display_name}, {spec.size / 1e6:.0f} MB, {licence}", f"  {status}"]
        lines += [f"  {line}" for line in _layout_lines(spec, roles, config)]
    return lines


def install_status(spec: ModelSpec) -> str:
    """Whether the catalog model ``spec`` is ready, installed, or how to install it."""
    if is_ready(spec):
        return "ready"
    if not missing_parts(spec):
        return "installed (joined and verified on first use)"
    return f"not installed: {install_hint(spec)}"


def _layout_lines(spec: ModelSpec, roles: list[str], config: Config) -> list[str]:
    """Which file runs for ``spec`` in each of its ``roles`` on llama.cpp here, and why."""
    backends = {"target": config.backend, "draft": config.draft_backend_name}
    lines = []
    for role in roles:
        if backends[role] != "llama" or (role == "target" and config.rpc):
            continue
        plan = layout_plan(spec.alias, role, config)
        shipped = assembled_path(spec)
        lines += _measured_lines(spec, role, config)
        if plan.layout is None:
            lines.append(f"as the {role}: runs the shipped file ({plan.reason})")
            continue
        path = prepared_path(shipped, plan.layout)
        sha256 = prepared_sha256(shipped, plan.layout)
        state = (f"prepared, sha256 {sha256}" if sha256 else "prepared from the shipped file on "
                 "first use (once)")
        lines.append(f"as the {role}: runs the {plan.layout.name} layout, {path.name} "
                     f"({plan.reason}); {state}")
    return lines


def _measured_lines(spec: ModelSpec, role: str, config: Config) -> list[str]:
    """What was measured of ``spec``'s layouts as ``role`` on this machine, or how to measure
    them (nothing for a model without candidate layouts in that role)."""
    measured = layout_costs(spec.alias, role, config)
    if measured is None:
        return []
    choice = spec.layouts(role)
    names = ", ".join(["shipped", *(c.name for c in choice.candidates)]) if choice else ""
    if not measured:
        return [f"as the {role}: layouts not measured on this CPU yet (layout = \"fast\" "
                f"measures {names} once, at first use)"]
    return [f"as the {role}: measured on this CPU, {describe_costs(measured)}"]


@dataclasses.dataclass(frozen=True)
class FoundReport:
    """The local models with their facts and drafts (best first), and the problem lines."""

    models: list[tuple[Surveyed, list[Surveyed]]]
    problems: list[str]


def found_report(config: Config) -> FoundReport:
    """Every local model (``local_models``) that could be read, with the models that can draft
    for it; what could not be read as lines. With no model of another tool found, no file is
    read (the catalog's pair is known; reading a large header the first time takes seconds)."""
    found = local_models(config)
    if all(model.store == "catalog" for model in found.models):
        return FoundReport([], found.problems)
    surveyed, problems = survey(found.models)
    return FoundReport([(model, drafts_for(model, surveyed)) for model in surveyed],
                       found.problems + problems)


def found_lines(report: FoundReport) -> list[str]:
    """``report`` as text: the drafts of the catalog's models (listed above), the models other
    tools keep with their facts and drafts, then the problems."""
    lines = [f"{model.model.name} drafts: {_names(drafts)}" for model, drafts in report.models
             if model.model.store == "catalog" and drafts]
    lines += ["", "Found on this machine (read only; `specchat models pull` adds from the hub):"]
    others = [_model_lines(model, drafts) for model, drafts in report.models
              if model.model.store != "catalog"]
    lines += [line for model in others for line in model] or [
        "  none (looked in Ollama's and LM Studio's folders, the Hugging Face and llama.cpp "
        "caches, and model_dirs)"]
    if report.problems:
        lines += ["", "Could not use:"] + [f"  {problem}" for problem in report.problems]
    return lines


def _model_lines(model: Surveyed, drafts: list[Surveyed]) -> list[str]:
    facts = model.facts
    context = f"context {facts.context}" if facts.context else "context unknown"
    extras = "".join(f", {label}" for label, present in (("chat template", facts.chat_template),
                                                          ("FIM", facts.fim)) if present)
    none = "none found (same vocabulary, at most about a third of the size)"
    return [model.model.name, f"  {model.model.path}",
            f"  {model.model.size / 1e6:.0f} MB, {facts.quantisation}, {facts.family} "
            f"({facts.architecture}), {facts.parameters / 1e9:.2f}B parameters, {context}{extras}",
            f"  drafts: {_names(drafts) if drafts else none}"]


def found_text(config: Config) -> str:
    """``found_lines`` of ``config``'s local models, as one text (the settings screen's)."""
    return "\n".join(found_lines(found_report(config))).strip()


def _names(drafts: list[Surveyed]) -> str:
    return ", ".join(draft.model.name for draft in drafts)


def found_json(report: FoundReport) -> dict[str, Any]:
    """``report`` for scripts: the catalog (alias, name, size, install status), one object per
    local model (name, store, path, size, the GGUF facts, drafts by name, best first; the
    catalog's ready models among them, store "catalog") and the problem lines."""
    return {"catalog": [{"alias": spec.alias, "display_name": spec.display_name,
                         "size": spec.size, "status": install_status(spec)}
                        for spec in CATALOG.values()],
            "models": [{"name": model.model.name, "store": model.model.store,
                        "path": str(model.model.path), "size": model.model.size,
                        **dataclasses.asdict(model.facts), "drafts": [d.model.name for d in drafts]}
                       for model, drafts in report.models],
            "problems": report.problems}
