"""The installed `specchat` command, run from outside the source tree as a new user runs it.

CI installs the project as the README says (not editable), so a file the code needs at run time
that is not package data (bench prompts, licence texts, styles) fails here. Also: a batch
evaluation on the real default pair survives in a child process (on a CPU with AMX, llama.cpp's
AMX kernels crash there unless specchat keeps llama.cpp off them).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from chatapp.backends.catalog import DEFAULT_DRAFT
from tests.conftest import NEEDS_DEFAULT_PAIR

SOURCE_TREE = Path(__file__).resolve().parent.parent

pytestmark = [
    pytest.mark.real_models,
    NEEDS_DEFAULT_PAIR,
]


@pytest.fixture(scope="module")
def user_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A new user's environment: own config, data and state folders; the shared model cache."""
    home = tmp_path_factory.mktemp("user")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SPECCHAT_CRASH_LOG")}
    env.update(XDG_CONFIG_HOME=str(home / "config"), XDG_DATA_HOME=str(home / "data"),
               XDG_STATE_HOME=str(home / "state"), PYTHONUNBUFFERED="1")
    return env


def specchat(env: dict[str, str], cwd: Path, *args: str,
             timeout: float = 300) -> subprocess.CompletedProcess[str]:
    script = shutil.which("specchat", path=str(Path(sys.executable).parent))
    assert script, "the specchat console script is not installed next to this Python"
    return subprocess.run([script, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def installed_package(env: dict[str, str], cwd: Path) -> Path:
    code = "import chatapp, pathlib; print(pathlib.Path(chatapp.__file__).parent)"
    out = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True,
                         text=True, timeout=60, check=True).stdout
    return Path(out.strip())


def test_ci_tests_the_installed_package_not_the_source(user_env, tmp_path: Path) -> None:
    package = installed_package(user_env, tmp_path)
    from_source = package == SOURCE_TREE / "chatapp"
    if os.environ.get("CI") != "true" and from_source:
        pytest.skip("an editable install: only a regular install (CI's) checks the package data")
    assert not from_source and "site-packages" in package.parts, f"chatapp came from {package}"


def test_models_lists_the_pair_and_its_licence_text(user_env, tmp_path: Path) -> None:
    result = specchat(user_env, tmp_path, "models")
    assert result.returncode == 0, result.stderr
    assert "qwen2.5-coder-1.5b [target]" in result.stdout
    licence = Path(result.stdout.split("text in ")[1].split()[0].rstrip(","))
    assert licence.is_file() and "Apache License" in licence.read_text()


def test_run_streams_a_reply(user_env, tmp_path: Path) -> None:
    result = specchat(user_env, tmp_path, "run", "--max-tokens", "8", "--seed", "1",
                      "Write a haiku about tea")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() and "tok/s" in result.stderr and "thread" in result.stderr


def test_bench_runs_on_its_packaged_prompts(user_env, tmp_path: Path) -> None:
    result = specchat(user_env, tmp_path, "bench", "--prompts", "1", "--configs", "target",
                      "--max-tokens", "8", "--no-warmup")
    assert result.returncode == 0, result.stderr
    assert "target" in result.stdout and "Peak RSS" in result.stdout


def test_a_batch_evaluation_survives_in_a_child_process(tmp_path: Path) -> None:
    """The first batched evaluation is where llama.cpp's AMX kernels crash (issue 20824)."""
    code = f"""
from chatapp.backends.llama_cpp import LlamaCppBackend
from chatapp.backends.llama_runtime import runtime_notes
from chatapp.backends.catalog import resolve_model
backend = LlamaCppBackend(resolve_model({DEFAULT_DRAFT!r}), n_ctx=512)
tokens = backend.tokenize("def add(a, b):\\n    return a + b\\n" * 4)
logits = backend.evaluate(tokens, 5)
assert logits.shape == (5, backend.vocab_size)
print("survived", len(tokens), runtime_notes())
"""
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, (
        f"exit status {result.returncode} (-11 is a segfault){result.stderr[-2000:]}")
    assert result.stdout.startswith("survived")
