"""Every experiment under benchmarks/ still imports: they are not shipped, so nothing else
notices when a refactor moves what they use."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import benchmarks

MODULES = sorted(info.name for info in pkgutil.iter_modules(benchmarks.__path__))


@pytest.mark.parametrize("name", MODULES)
def test_the_benchmark_imports(name: str) -> None:
    importlib.import_module(f"benchmarks.{name}")
