"""The functions a request declares to the model (OpenAI's ``tools``), and which of them the
reply must call (``tool_choice``).

``Tools.declared`` go to the chat template as OpenAI's function objects (``template_form``);
``Tools.choice`` is "none" (no tools shown, no call parsed), "auto" (the model may call),
"required" (it must call one) or a function's name (it must call that one). Tools with the
choice "none" are not shown to the model at all, as OpenAI's "none" asks for no call.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

AUTO, NONE, REQUIRED = "auto", "none", "required"


@dataclass(frozen=True)
class FunctionTool:
    """One declared function: ``name``, ``description``, ``parameters`` (a JSON schema)."""

    name: str
    description: str | None = None
    parameters: Mapping[str, Any] = field(default_factory=lambda: {"type": "object"})

    def template_form(self) -> dict[str, Any]:
        """OpenAI's ``{"type": "function", "function": {...}}`` object, as templates take it."""
        function: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            function["description"] = self.description
        function["parameters"] = dict(self.parameters)
        return {"type": "function", "function": function}

    @property
    def parameters_json(self) -> str:
        return json.dumps(self.parameters, ensure_ascii=False)


@dataclass(frozen=True)
class Tools:
    """``declared`` functions and the ``choice`` (see the module docstring); ``parallel``: more
    than one call per reply allowed."""

    declared: tuple[FunctionTool, ...] = ()
    choice: str = AUTO
    parallel: bool = True

    @property
    def shown(self) -> tuple[dict[str, Any], ...]:
        """What the template is given: the declared functions, none with the choice "none"."""
        if self.choice == NONE:
            return ()
        return tuple(tool.template_form() for tool in self.declared)

    @property
    def callable(self) -> bool:
        """Whether the reply may call a function (some declared, the choice not "none"): then
        its text is read for calls."""
        return bool(self.declared) and self.choice != NONE

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(tool.name for tool in self.declared)

    @property
    def forced(self) -> tuple[FunctionTool, ...]:
        """The functions the reply must call one of: all for "required", the named one, else
        none (the reply is free)."""
        if self.choice == REQUIRED:
            return self.declared
        return tuple(tool for tool in self.declared
                     if self.choice not in (AUTO, NONE) and tool.name == self.choice)


NO_TOOLS = Tools()
