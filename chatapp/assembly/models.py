"""`specchat models`: the catalog's models, what is installed, and which weight layout runs here."""

from __future__ import annotations

from chatapp.assembly.layout_costs import layout_costs
from chatapp.assembly.loader import layout_plan
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
from chatapp.settings.config import Config


def model_report(config: Config) -> list[str]:
    """A few lines per catalog model: name, size, licence, whether it is installed, and for the
    roles ``config`` gives it, which file runs (its weight layout) and why."""
    lines = []
    for spec in CATALOG.values():
        if is_ready(spec):
            status = "ready"
        elif not missing_parts(spec):
            status = "installed (joined and verified on first use)"
        else:
            status = f"not installed: {install_hint(spec)}"
        roles = [r for r, alias in (("draft", config.draft), ("target", config.target))
                 if alias == spec.alias]
        role = f" [{', '.join(roles)}]" if roles else ""
        text = licence_text(spec)
        licence = f"{spec.licence}, text in {text}" if text else spec.licence
        lines += [f"{spec.alias}{role}",
                  f"  {spec.display_name}, {spec.size / 1e6:.0f} MB, {licence}", f"  {status}"]
        lines += [f"  {line}" for line in _layout_lines(spec, roles, config)]
    return lines


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
