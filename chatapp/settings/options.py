"""Every setting's type, allowed values and error text, in one place.

``OPTIONS`` has one ``Option`` per ``Config`` field but ``presets`` (the presets' tables are
``chatapp.settings.presets``'s). Its three readers share the rules here:
``chatapp.settings.config`` (the TOML file: ``from_toml``; a ``Config``: ``problems``),
``chatapp.cli`` (argparse: ``arg_type``, ``choices``) and the Settings screen (its text fields:
``parse``).
Rules that tie several settings together (``rpc`` with ``backend`` and ``tensor_split``) are
``chatapp.settings.config``'s.

Error texts: a problem of a whole ``Config`` starts with the setting's name ("top_p must be in
(0, 1], got 1.5."), which is how ``load_config`` finds its line; an ``OptionError`` of one value
leaves the name out ("must be in (0, 1], got 1.5"), as argparse and the screen put it in front.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from chatapp.backends.endpoints import DEFAULT_PORT, parse_endpoints
from chatapp.engine.contracts import MAX_DRAFT_LENGTH

BACKENDS = ("llama", "hf")
DRAFT_BACKENDS = ("same", *BACKENDS)
DRAFTERS = ("model", "ngram", "ngram+model")
DTYPES = ("auto", "float32", "bfloat16", "float16")
LAYOUTS = ("auto", "shipped", "fast")
OVERFLOWS = ("drop-oldest", "refuse")  # what a turn that would not fit the context does
MAX_SEED = 2**64 - 1  # the random generators take any seed from 0 up; this bounds the number
DEFAULT_RPC_PORT = DEFAULT_PORT  # `specchat rpc-server --port`: the CLI imports no backend
AUTO = "auto"  # the word an option with ``Option.auto`` takes besides its numbers
MIN_CONTEXT = 64  # the smallest context window, in tokens


class OptionError(ValueError):
    """A value a setting does not allow; the message says what is allowed, without the name."""


@dataclass(frozen=True)
class Rule:
    """What a setting allows: ``text`` completes "must be ...", ``allows`` checks a value."""

    text: str
    allows: Callable[[Any], bool]


def at_least(minimum: int | float, note: str = "") -> Rule:
    """``>= minimum``, with an optional note such as "(0 = off)"."""
    return Rule(f">= {minimum}" + (f" {note}" if note else ""), lambda value: value >= minimum)


def one_of(choices: tuple[str, ...], text: str | None = None) -> Rule:
    """One of ``choices``; ``text`` replaces the default "one of a, b, c"."""
    return Rule(text or f"one of {', '.join(choices)}", lambda value: value in choices)


def _is_draft_length(value: str) -> bool:
    return value == "auto" or (value.isdigit() and int(value) <= MAX_DRAFT_LENGTH)


def _is_context(value: Any) -> bool:
    """``AUTO``, or a whole number of at least ``MIN_CONTEXT`` tokens."""
    if value == AUTO:
        return True
    return isinstance(value, int) and not isinstance(value, bool) and value >= MIN_CONTEXT


def _is_device(value: str) -> bool:
    return value in ("auto", "cpu", "cuda") or value.startswith("cuda:")


@dataclass(frozen=True)
class Option:
    """One setting: its ``Config`` field ``name``, the type of its value (of each item when
    ``items`` describes a list), its ``rule`` (None: any value of the type) and its ``choices``
    (for argparse and the screen's menus; empty when the values are open)."""

    name: str
    kind: type
    rule: Rule | None = None
    choices: tuple[str, ...] = ()
    items: str = ""  # a list setting: what its items are, for error texts
    auto: bool = False  # the value may also be the word ``AUTO`` (n_ctx)

    def problem(self, value: Any) -> str | None:
        """The problem of ``value`` as a whole-config text starting with the name, or None."""
        if value is None or self.rule is None or self.items or self.rule.allows(value):
            return None
        return f"{self.name} must be {self.rule.text}, got {_shown(value)}."

    def parse(self, text: str) -> Any:
        """The value of the text ``text`` (a flag or a form field); ``OptionError`` when it is
        not of the type or breaks the rule."""
        return parse_value(text, self.kind, self.rule, self.auto)

    def arg_type(self) -> Callable[[str], Any]:
        """``parse`` as an argparse ``type``: its errors become argparse's usage errors."""
        return arg_type(self.kind, self.rule, self.name, self.auto)

    def from_toml(self, value: Any) -> Any:
        """The Config value of the TOML value ``value``: an int is taken for a float, a list
        becomes a tuple, draft_length takes a whole number or "auto". ``OptionError`` (its text
        starting with the quoted name) for a value of another type; ranges are ``problem``'s."""
        if self.items:
            if not isinstance(value, list) or not all(_is_a(item, self.kind) for item in value):
                raise OptionError(f"'{self.name}' must be a list of {self.items}, got {value!r}.")
            return tuple(self.kind(item) for item in value)
        if self.name == "draft_length":
            if _is_a(value, int):
                return str(value)
            if value == "auto":
                return value
            raise OptionError(f"'draft_length' must be a whole number 0..{MAX_DRAFT_LENGTH} "
                              f"or \"auto\", got {value!r}.")
        if self.auto and value == AUTO:
            return value
        if _is_a(value, self.kind):
            return self.kind(value)
        raise OptionError(f"'{self.name}' must be {self.kind.__name__}, "
                          f"got {type(value).__name__} {value!r}.")


def parse_value(text: str, kind: type, rule: Rule | None = None, auto: bool = False) -> Any:
    """``text`` as a ``kind`` (int, float or str) that ``rule`` allows (with ``auto``, also the
    word ``AUTO``); ``OptionError`` (its text "must be ..., got ...") otherwise. Also for
    command-line numbers that are no setting."""
    if auto and text == AUTO:
        return text
    try:
        value = kind(text)
    except ValueError:
        noun = "a whole number" if kind is int else "a number"
        raise OptionError(f"must be {noun}, got {text!r}") from None
    if rule is not None and not rule.allows(value):
        raise OptionError(f"must be {rule.text}, got {_shown(value) if kind is str else text}")
    return value


def arg_type(kind: type, rule: Rule | None, name: str, auto: bool = False
             ) -> Callable[[str], Any]:
    """``parse_value`` as an argparse ``type`` called ``name``: an ``OptionError`` becomes an
    ``ArgumentTypeError``, which argparse reports as a usage error (exit status 2)."""
    def parse(text: str) -> Any:
        try:
            return parse_value(text, kind, rule, auto)
        except OptionError as error:
            raise argparse.ArgumentTypeError(str(error)) from None
    parse.__name__ = name
    return parse


def _is_a(value: Any, kind: type) -> bool:
    """``value`` is of ``kind`` (an int counts as a float; a bool is never a number)."""
    if isinstance(value, bool):
        return kind is bool
    return isinstance(value, kind) or (kind is float and isinstance(value, int))


def _shown(value: Any) -> str:
    return repr(value) if isinstance(value, str) else str(value)


OPTIONS: dict[str, Option] = {option.name: option for option in (
    Option("draft", str),
    Option("target", str),
    Option("backend", str, one_of(BACKENDS), BACKENDS),
    Option("draft_backend", str, one_of(DRAFT_BACKENDS), DRAFT_BACKENDS),
    Option("drafter", str, one_of(DRAFTERS), DRAFTERS),
    Option("draft_length", str, Rule(f"0..{MAX_DRAFT_LENGTH} or auto", _is_draft_length)),
    Option("temperature", float, at_least(0)),
    Option("top_k", int, at_least(0, "(0 = off)")),
    Option("top_p", float, Rule("in (0, 1]", lambda value: 0 < value <= 1)),
    Option("min_p", float, Rule("in [0, 1]", lambda value: 0 <= value <= 1)),
    Option("seed", int, Rule(f"in 0..{MAX_SEED}", lambda value: 0 <= value <= MAX_SEED)),
    Option("max_tokens", int, at_least(1)),
    Option("system_prompt", str),
    Option("n_ctx", int, Rule(f">= {MIN_CONTEXT} or {AUTO}", _is_context), auto=True),
    Option("overflow", str, one_of(OVERFLOWS, "drop-oldest or refuse"), OVERFLOWS),
    Option("threads", int, at_least(1)),
    Option("gpu_layers", int),
    Option("dtype", str, one_of(DTYPES, "auto, float32, bfloat16 or float16"), DTYPES),
    Option("layout", str, one_of(LAYOUTS, "auto, shipped or fast"), LAYOUTS),
    Option("device", str, Rule("auto, cpu or cuda[:N]", _is_device)),
    Option("rpc", str, items='strings "host:port"'),
    Option("tensor_split", float, items="numbers, one per RPC device"),
    Option("model_dirs", str, items="folder paths"),
    Option("preset", str),
)}


def endpoint_list(text: str) -> tuple[str, ...]:
    """Every ``host:port`` of ``text`` (comma-separated), checked and written the one way;
    ``ValueError`` for a malformed one."""
    return tuple(str(endpoint) for endpoint in parse_endpoints([text]))


def problems(values: Any) -> list[str]:
    """Every setting of ``values`` (a ``Config``) that its rule does not allow, in the order of
    ``OPTIONS``, each text starting with the setting's name."""
    found = (option.problem(getattr(values, name)) for name, option in OPTIONS.items())
    return [problem for problem in found if problem is not None]
