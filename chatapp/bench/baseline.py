"""`specchat bench --baseline PYTHON`: another installation's target-only decoding, prompt by
prompt, side by side with this one's configurations.

Speed claims such as "2.3x today's plain decoding" compare two builds (another llama-cpp-python,
other weights), which cannot share a process. So for every prompt, just before this bench's own
runs of it, ``baseline_row`` runs that installation's ``python -m chatapp bench`` on the same
prompt, target-only, in a child process, and reads its row from the JSON it writes; machine noise
then hits both alike, as it does the configurations of one bench. Only options that every version
of the bench understands are passed (the target, the prompt, the token count, threads, context,
seed).

The children are started by a ``Launcher``, a small process started before this bench loads any
model: a process started by one that holds a loaded model was measured to decode 10-15% faster
than the same process started from a shell (2-core Xeon, 2026-12-06), which would flatter the
baseline. The launcher's children start as a shell's do.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from chatapp.bench.report import Row
from chatapp.bench.specs import TARGET, BenchPrompt
from chatapp.settings.config import Config

BASELINE = "baseline target"  # the configuration name of the baseline's rows


class BaselineError(RuntimeError):
    """The baseline installation's bench failed; the message quotes it."""


_LAUNCHER = """
import json, subprocess, sys
for line in sys.stdin:
    command, cwd = json.loads(line)
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    print(json.dumps([result.returncode, result.stderr[-2000:]]), flush=True)
"""


class Launcher:
    """A process that runs commands for this one and reports their exit status and stderr; start
    it before loading models (see the module notes). Close it with ``close``."""

    def __init__(self) -> None:
        self._process = subprocess.Popen([sys.executable, "-c", _LAUNCHER], text=True,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def run(self, command: Sequence[str], cwd: Path) -> tuple[int, str]:
        """Run ``command`` in ``cwd`` to its end; its exit status and the end of its stderr."""
        assert self._process.stdin is not None and self._process.stdout is not None
        self._process.stdin.write(json.dumps([list(command), str(cwd)]) + "\n")
        self._process.stdin.flush()
        line = self._process.stdout.readline()
        if not line:
            raise BaselineError("the baseline launcher ended unexpectedly")
        status, errors = json.loads(line)
        return int(status), str(errors)

    def close(self) -> None:
        if self._process.stdin is not None:
            self._process.stdin.close()
        self._process.wait(timeout=10)


def baseline_command(python: Sequence[str], prompt_file: Path, prompt: BenchPrompt,
                     max_tokens: int, config: Config, json_path: Path) -> list[str]:
    """The child's command line for one prompt."""
    command = [*python, "-m", "chatapp", "bench", "--target", config.target,
               "--prompt-file", str(prompt_file),
               "--prompts", prompt.id, "--configs", TARGET, "--max-tokens", str(max_tokens),
               "--n-ctx", str(config.n_ctx), "--json", str(json_path)]
    if config.threads:
        command += ["--threads", str(config.threads)]
    if config.seed is not None:
        command += ["--seed", str(config.seed)]
    return command


def baseline_row(launcher: Launcher, python: Sequence[str], prompt: BenchPrompt,
                 max_tokens: int, config: Config) -> Row:
    """The baseline installation's target-only row for ``prompt``, named ``BASELINE``."""
    with tempfile.TemporaryDirectory(prefix="specchat-baseline-") as tmp:
        prompt_file, json_path = Path(tmp) / "prompts.json", Path(tmp) / "bench.json"
        prompt_file.write_text(json.dumps({"prompts": [
            {"id": prompt.id, "category": prompt.category, "text": prompt.text}]}),
            encoding="utf-8")
        command = baseline_command(python, prompt_file, prompt, max_tokens, config, json_path)
        status, errors = launcher.run(command, Path(tmp))
        if status != 0 or not json_path.is_file():
            raise BaselineError(f"the baseline bench ({' '.join(command[:3])} ...) failed: "
                                f"{errors.strip()[-500:]}")
        data = json.loads(json_path.read_text(encoding="utf-8"))
    row = next(r for r in data["rows"] if r["config"] == TARGET)
    known = Row.__dataclass_fields__
    return Row(**{**{k: v for k, v in row.items() if k in known}, "config": BASELINE})
