"""`specchat bench --against-llama-cpp DIR`: llama.cpp's own tools beside specchat, one table.

DIR holds binaries built from the llama.cpp source vendored by llama-cpp-python (``llama-bench``
and ``llama-speculative-simple``). Prompt by prompt, specchat's configurations run (interleaved, as
in ``specchat bench``) and right after them llama.cpp's rows on the same prompt, so that a shared
machine's noise hits both sides alike (specchat's models stay loaded meanwhile, idle). llama.cpp
uses the same models (the GGUF files specchat loads), the same threads, greedy:

- ``none``: ``llama-bench -p 0 -n N -d D -t T`` (plain decoding, ``tg``, after a context of D
  tokens, D the prompt's token count: decoding after a prompt costs more than from an empty
  context, 28.0 against 32.7 tok/s at D = 256 on the CPU of docs/benchmarks.md;
  ``llama-speculative-simple`` cannot run without a speculative type);
- ``draft-simple K3``, ``ngram-simple``, ``ngram-mod``: ``llama-speculative-simple`` with that
  ``--spec-type`` (the n-gram modes with llama.cpp's default sizes).

Same prompt tokens: specchat's chat-templated prompt tokens are written back as their exact text
(special tokens spelled out) and given with ``-p`` and ``--no-escape`` (``-f`` would drop the
template's final newline); llama.cpp's "encoded N tokens" must equal specchat's count, else the
run stops with a message. Equal lengths: each llama.cpp run is asked, with ``--ignore-eos``, for
as many tokens as specchat's target-only run of that prompt emitted (its last accepted draft may
overshoot by a few; the table shows its count then). Speed is decode tokens/s, the
prompt excluded (llama.cpp's "decoded ... speed" line, llama-bench's ``avg_ts``).

A missing tool, a tool that fails, or output that cannot be parsed is a ``LlamaCppCompareError``
(a ``UserFacingError``): one message, exit status 1, never a traceback.
"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from chatapp.assembly.loader import load_backend, runnable_layout
from chatapp.assembly.local_models import resolve_name
from chatapp.backends.context_size import MIN_AUTO_CONTEXT
from chatapp.backends.threads import available_cores
from chatapp.bench.report import Row
from chatapp.bench.runner import Bench, BenchBackends, progress_printer
from chatapp.bench.specs import TARGET, BenchPrompt, RunSpec
from chatapp.errors import UserFacingError
from chatapp.settings.config import Config

BENCH_TOOL = "llama-bench"
SPEC_TOOL = "llama-speculative-simple"
NONE = "llama.cpp none"
TOOL_TIMEOUT_S = 1800
BENCH_REPETITIONS = 3


class LlamaCppCompareError(UserFacingError):
    """The comparison cannot go on: a tool is missing, failed, or printed something unexpected."""


@dataclass(frozen=True)
class SpecMode:
    """One ``llama-speculative-simple`` row: its column name and its speculative flags
    (``{draft}`` is replaced by the draft model's path)."""

    name: str
    flags: tuple[str, ...]


SPEC_MODES = (
    SpecMode("llama.cpp draft-simple K3", ("--spec-type", "draft-simple", "-md", "{draft}",
                                           "--spec-draft-n-max", "3", "--spec-draft-n-min", "0")),
    SpecMode("llama.cpp ngram-simple", ("--spec-type", "ngram-simple")),
    SpecMode("llama.cpp ngram-mod", ("--spec-type", "ngram-mod")),
)
LLAMA_ROWS = (NONE, *(mode.name for mode in SPEC_MODES))  # llama.cpp's rows, in table order
DEFAULT_COMPARE_SPECS = ("target", "model:3", "model:auto", "ngram:auto", "ngram+model:auto")

_ENCODED = re.compile(r"encoded\s+(\d+)\s+tokens\s+in\s+([\d.]+)\s+seconds")
_DECODED = re.compile(r"decoded\s+(\d+)\s+tokens\s+in\s+([\d.]+)\s+seconds,"
                      r"\s+speed:\s+([\d.]+)\s+t/s")


@dataclass(frozen=True)
class LlamaCppRun:
    """One llama.cpp measurement: decode speed over ``tokens`` new tokens, prompt excluded."""

    mode: str
    tokens: int
    tokens_per_s: float
    prompt_tokens: int | None = None


def tool_path(directory: Path, name: str) -> Path:
    """The executable ``name`` in ``directory`` (or its ``bin/``); a clear error if absent."""
    for candidate in (directory / name, directory / "bin" / name):
        if candidate.is_file() and candidate.stat().st_mode & 0o111:
            return candidate
    raise LlamaCppCompareError(
        f"{directory} has no executable {name} (nor bin/{name}). Build llama.cpp's tools from "
        "the source vendored by llama-cpp-python (see docs/benchmarks.md: "
        f"cmake --build BUILD --target {BENCH_TOOL} {SPEC_TOOL}) and give that folder.")


def prompt_text(backend_tokens: Sequence[int], token_bytes: Callable[[int], bytes]) -> str:
    """The exact text of ``backend_tokens`` (special tokens spelled out), for llama.cpp's ``-p``."""
    return b"".join(token_bytes(t) for t in backend_tokens).decode("utf-8", errors="strict")


def _run_tool(command: Sequence[str]) -> tuple[str, str]:
    """Run ``command``; its stdout and stderr, or a clear error when it fails."""
    try:
        done = subprocess.run(list(command), capture_output=True, text=True, errors="replace",
                              timeout=TOOL_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise LlamaCppCompareError(f"{Path(command[0]).name} could not run: {error}") from None
    output = done.stdout + "\n" + done.stderr
    if done.returncode != 0:
        tail = "\n".join(output.strip().splitlines()[-5:])
        raise LlamaCppCompareError(f"{Path(command[0]).name} failed (exit {done.returncode}); "
                                   f"its last lines:\n{tail}")
    return done.stdout, done.stderr


def parse_speculative_output(mode: str, output: str) -> LlamaCppRun:
    """The "encoded" and "decoded ... speed" lines of ``llama-speculative-simple``."""
    encoded, decoded = _ENCODED.search(output), _DECODED.search(output)
    if encoded is None or decoded is None:
        raise LlamaCppCompareError(
            f"{SPEC_TOOL} ({mode}): cannot find its 'encoded N tokens' and 'decoded N tokens in "
            "S seconds, speed: X t/s' lines in its output; is the tool from another llama.cpp "
            "version?")
    return LlamaCppRun(mode, int(decoded.group(1)), float(decoded.group(3)),
                       int(encoded.group(1)))


def parse_bench_output(output: str) -> LlamaCppRun:
    """The ``tg`` entry of ``llama-bench -o json``'s stdout."""
    start, end = output.find("["), output.rfind("]")
    try:
        entries = json.loads(output[start:end + 1]) if 0 <= start < end else None
        entry = next(e for e in entries if int(e["n_gen"]) > 0 and int(e["n_prompt"]) == 0)
        return LlamaCppRun(NONE, int(entry["n_gen"]), float(entry["avg_ts"]))
    except (ValueError, TypeError, KeyError, StopIteration):
        raise LlamaCppCompareError(f"{BENCH_TOOL}: cannot find a tg result (n_gen > 0, avg_ts) "
                                   "in its JSON output") from None


@dataclass(frozen=True)
class LlamaCpp:
    """llama.cpp's tools in ``directory`` on the given GGUF files and CPU threads."""

    directory: Path
    target: Path
    draft: Path
    threads: int
    n_ctx: int

    def bench_tg(self, tokens: int, depth: int = 0,
                 repetitions: int = BENCH_REPETITIONS) -> LlamaCppRun:
        """``llama-bench -p 0 -n tokens -d depth -t threads``: plain decoding after ``depth``
        tokens of context, the ``none`` row."""
        command = [str(tool_path(self.directory, BENCH_TOOL)), "-m", str(self.target), "-p", "0",
                   "-n", str(tokens), "-d", str(depth), "-t", str(self.threads),
                   "-r", str(repetitions), "-o", "json"]
        return parse_bench_output(_run_tool(command)[0])  # the JSON is on stdout

    def speculative(self, mode: SpecMode, text: str, tokens: int, seed: int) -> LlamaCppRun:
        """``llama-speculative-simple`` in ``mode`` on the prompt ``text``, greedy, exactly
        ``tokens`` new tokens asked for (``--ignore-eos``)."""
        flags = [flag.replace("{draft}", str(self.draft)) for flag in mode.flags]
        command = [str(tool_path(self.directory, SPEC_TOOL)), "-m", str(self.target), *flags,
                   "-p", text, "--no-escape", "-n", str(tokens), "--ignore-eos",
                   "-t", str(self.threads), "-td", str(self.threads), "-c", str(self.n_ctx),
                   "--temp", "0", "--top-k", "1", "-s", str(seed)]
        return parse_speculative_output(mode.name, "\n".join(_run_tool(command)))


# -- the command ------------------------------------------------------------------------------

def compare_command(config: Config, directory: Path, prompts: Sequence[BenchPrompt],
                    specs: Sequence[RunSpec] | None, max_tokens: int, *, warmup: bool = True,
                    repeats: int = 1, out: TextIO | None = None,
                    log: TextIO | None = None) -> int:
    """Run specchat's ``specs`` (default ``DEFAULT_COMPARE_SPECS``) and llama.cpp's rows on
    ``prompts`` and print one decode tokens/s table to ``out``. Threads: the config's, else every
    available core, fixed on both sides. Raises ``LlamaCppCompareError`` (a tool missing or failing,
    unparseable output, a prompt token count that differs)."""
    out, log = out or sys.stdout, log or sys.stderr
    if config.threads is None:
        config = dataclasses.replace(config, threads=available_cores())
    specs = list(specs or [RunSpec.parse(s) for s in DEFAULT_COMPARE_SPECS])
    if RunSpec(None) not in specs:
        specs.insert(0, RunSpec(None))
    for tool in (BENCH_TOOL, SPEC_TOOL):
        tool_path(directory, tool)  # before any model is loaded
    llama = LlamaCpp(directory, _running_file(config.target, "target", config),
                     _running_file(config.draft, "draft", config), config.threads,
                     config.context_tokens or MIN_AUTO_CONTEXT)

    backends = BenchBackends(load_backend(config.target, "target", config, progress_printer(log)))
    rows: list[Row] = []
    runs: dict[tuple[str, str], LlamaCppRun] = {}  # (prompt id, llama.cpp row) -> its run
    counts: dict[str, int] = {}
    try:
        bench = Bench(config, backends, specs, max_tokens, log, repeats)
        if warmup:
            bench.warm_up(prompts[0])
        for prompt in prompts:  # interleaved per prompt: machine noise hits both sides alike
            mine = bench.run([prompt])
            if not mine:
                break
            rows.extend(mine)
            tokens = bench.prompt_tokens(prompt)
            counts[prompt.id] = len(tokens)
            length = next(row.tokens for row in mine if row.config == TARGET)
            text = prompt_text(tokens, backends.target.token_bytes)
            runs[(prompt.id, NONE)] = llama.bench_tg(length, depth=len(tokens))
            for mode in SPEC_MODES:
                runs[(prompt.id, mode.name)] = _checked(
                    prompt.id, len(tokens), llama.speculative(mode, text, length, config.seed or 0))
            for name in LLAMA_ROWS:
                print(f"{prompt.id:<16} {name:<26} {runs[(prompt.id, name)].tokens:4d} tokens "
                      f"{runs[(prompt.id, name)].tokens_per_s:6.1f} tok/s", file=log, flush=True)
    finally:
        for backend in (backends.target, backends.draft):
            if backend is not None:
                backend.close()
    prompts = [p for p in prompts if p.id in counts]
    print_comparison(out, config, prompts, rows, [s.name for s in specs], runs, counts)
    return 0


def _running_file(model: str, role: str, config: Config) -> Path:
    """The file specchat runs ``model`` from as ``role``: found as ``load_backend`` finds it (a
    catalog alias, a path or another tool's model) and in the weight layout it runs here
    (``layout`` setting), so that llama.cpp's tools time the same weights."""
    return runnable_layout(model, role, resolve_name(model, config), config)


def _checked(prompt_id: str, count: int, run: LlamaCppRun) -> LlamaCppRun:
    """``run`` when llama.cpp encoded ``count`` prompt tokens, as specchat did; else an error."""
    if run.prompt_tokens != count:
        raise LlamaCppCompareError(
            f"{prompt_id}: llama.cpp encoded {run.prompt_tokens} prompt tokens, specchat {count}: "
            "the prompts differ, the comparison would not be fair")
    return run


def print_comparison(out: TextIO, config: Config, prompts: Sequence[BenchPrompt],
                     rows: Sequence[Row], configs: Sequence[str],
                     runs: dict[tuple[str, str], LlamaCppRun], counts: dict[str, int]) -> None:
    """The side-by-side markdown table: decode tokens/s per prompt, llama.cpp then specchat."""
    by_key = {(row.prompt, row.config): row for row in rows}
    columns = [*LLAMA_ROWS] + [f"specchat {name}" for name in configs]
    print(f"Decode tokens/s (prompt excluded), greedy, {config.threads} threads, target "
          f"{config.target}, draft {config.draft}; llama.cpp none: llama-bench tgN @ dD, N the new "
          "tokens and D the prompt tokens; "
          "every other llama.cpp run is asked for as many tokens as specchat's target-only run "
          "made (new tokens / prompt tokens in the prompt column; a llama.cpp cell says in "
          "brackets how many it decoded where a last accepted draft overshot).", file=out)
    print("| prompt | " + " | ".join(columns) + " |", file=out)
    print("|---" * (len(columns) + 1) + "|", file=out)
    for prompt in prompts:
        length = by_key[(prompt.id, TARGET)].tokens
        cells = [_cell(runs[(prompt.id, name)], length) for name in LLAMA_ROWS]
        cells += [f"{by_key[(prompt.id, n)].tokens_per_s:.1f}" if (prompt.id, n) in by_key
                  else "-" for n in configs]
        print(f"| {prompt.id} ({length}/{counts[prompt.id]}) | " + " | ".join(cells) + " |",
              file=out)


def _cell(run: LlamaCppRun, length: int) -> str:
    return f"{run.tokens_per_s:.1f}" + ("" if run.tokens == length else f" ({run.tokens})")
