"""Rules of the source that a move or a new feature could break without any other test noticing:
one reply pipeline, drafters reached only through the engine, small functions, one class per
public name, and no stale dotted name in a docstring or in docs/."""

from __future__ import annotations

import ast
import importlib
import re
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "chatapp"
LONGEST_FUNCTION = 60  # lines, decorators and docstring included
FRONT_AND_CHAT = ("chat", "serve", "tui", "cli.py", "web.py", "chats_command.py")
POLICY_CLASSES = {"FixedDraftLength", "AutoDraftLength", "DraftLength"}
DOTTED = re.compile(r"\bchatapp(?:\.[A-Za-z_][A-Za-z0-9_]*)+")


def modules(under: Path = PACKAGE) -> Iterator[tuple[Path, ast.Module]]:
    for path in sorted(under.rglob("*.py")):
        yield path, ast.parse(path.read_text(encoding="utf-8"), str(path))


def relative(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def in_front_or_chat(path: Path) -> bool:
    return relative(path).removeprefix("chatapp/").startswith(FRONT_AND_CHAT)


def test_no_function_is_longer_than_sixty_lines() -> None:
    long = [f"{relative(path)}:{node.lineno} {node.name} ({length} lines)"
            for path, tree in modules() for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and (length := node.end_lineno - min(
                [node.lineno, *(d.lineno for d in node.decorator_list)]) + 1) > LONGEST_FUNCTION]
    assert long == []


def test_no_two_public_classes_share_a_name() -> None:
    where: dict[str, list[str]] = defaultdict(list)
    for path, tree in modules():
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                where[node.name].append(relative(path))
    assert {name: paths for name, paths in where.items() if len(paths) > 1} == {}


def engine_generate_callers() -> set[str]:
    """The modules outside engine/ that call a ``generate`` method (transformers' own model
    ``generate`` in the bench's reference row aside)."""
    callers = set()
    for path, tree in modules():
        if relative(path).startswith(("chatapp/engine/", "chatapp/bench/hf_reference.py")):
            continue
        if any(isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
               and node.func.attr == "generate" for node in ast.walk(tree)):
            callers.add(relative(path))
    return callers


def test_outside_the_engine_only_the_reply_pipeline_runs_an_engine() -> None:
    # specchat bench, the TUI, the CLI, the web tab and the API all reply through ChatSession
    assert engine_generate_callers() == {"chatapp/chat/session.py"}


def test_chat_serve_tui_and_cli_never_reach_an_engine_a_drafter_or_a_policy_class() -> None:
    found = []
    for path, tree in modules():
        if not in_front_or_chat(path):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in ("engine", "predict"):
                found.append(f"{relative(path)}:{node.lineno} .{node.attr}")
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "isinstance":
                named = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)}
                if named & POLICY_CLASSES:
                    found.append(f"{relative(path)}:{node.lineno} isinstance on a policy")
    assert found == []


def docstrings() -> Iterator[tuple[str, str]]:
    for path, tree in modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef
                          | ast.AsyncFunctionDef):
                text = ast.get_docstring(node, clean=False)
                if text:
                    yield relative(path), text


def cited_names() -> dict[str, str]:
    """Every dotted ``chatapp.`` name cited in a docstring of the package or in docs/ and the
    README, with one place that cites it."""
    texts = list(docstrings()) + [(relative(path), path.read_text(encoding="utf-8"))
                                  for path in [REPO / "README.md", *(REPO / "docs").glob("*.md")]]
    return {name.rstrip("."): where for where, text in texts for name in DOTTED.findall(text)}


def resolves(name: str) -> bool:
    """Whether ``name`` is a module of the package, or an attribute (a class's too) of one."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for part in parts[cut:]:
            if not hasattr(found, part):
                return False
            found = getattr(found, part)
        return True
    return False


@pytest.mark.parametrize("name", sorted(cited_names()))
def test_every_cited_dotted_name_imports(name: str) -> None:
    assert resolves(name), f"{name} (cited in {cited_names()[name]}) does not import"
