"""Experiments run from the repository root with ``python -m benchmarks.<name>`` (not shipped in
the wheel: ``specchat bench`` is what users run). docs/benchmarks.md and docs/serve.md give each
one's command and what it measured."""
