"""`specchat bench --against-llama-cpp`: llama.cpp's tools found, run and parsed (stand-in
scripts here), and every failure one clear message."""

from __future__ import annotations

from pathlib import Path

import pytest

from chatapp.bench.llama_cpp_compare import (
    SPEC_MODES,
    LlamaCpp,
    LlamaCppCompareError,
    parse_bench_output,
    parse_speculative_output,
    prompt_text,
)
from chatapp.errors import UserFacingError

SPEC_OUTPUT = """main: encoded   42 tokens in    0.700 seconds, speed:   60.000 t/s
main: decoded  129 tokens in    6.450 seconds, speed:   20.000 t/s
"""
BENCH_OUTPUT = """[
  {"n_prompt": 0, "n_gen": 128, "avg_ts": 15.25, "stddev_ts": 0.1}
]"""


def tools(tmp_path: Path, spec_output: str = SPEC_OUTPUT, bench_output: str = BENCH_OUTPUT,
          spec_exit: int = 0) -> LlamaCpp:
    for name, text, code in (("llama-speculative-simple", spec_output, spec_exit),
                             ("llama-bench", bench_output, 0)):
        script = tmp_path / name
        (tmp_path / f"{name}.out").write_text(text)
        script.write_text(f'#!/bin/sh\necho "$@" > "{tmp_path}/{name}.args"\n'
                          f'cat "{tmp_path}/{name}.out"\nexit {code}\n')
        script.chmod(0o755)
    return LlamaCpp(tmp_path, Path("target.gguf"), Path("draft.gguf"), 2, 4096)


def test_tools_are_run_with_the_same_prompt_models_threads_and_length(tmp_path: Path) -> None:
    llama = tools(tmp_path)
    run = llama.speculative(SPEC_MODES[0], "<|im_start|>user\nhi\\n<|im_end|>\n", 97, seed=0)
    assert (run.tokens, run.tokens_per_s, run.prompt_tokens) == (129, 20.0, 42)
    args = (tmp_path / "llama-speculative-simple.args").read_text().split()
    assert args[args.index("-n") + 1] == "97" and "--ignore-eos" in args and "--no-escape" in args
    assert args[args.index("-md") + 1] == "draft.gguf" and args[args.index("-t") + 1] == "2"
    assert args[args.index("--spec-draft-n-max") + 1] == "3"
    tg = llama.bench_tg(128, depth=42)
    assert (tg.tokens, tg.tokens_per_s) == (128, 15.25)
    args = (tmp_path / "llama-bench.args").read_text().split()
    assert args[args.index("-p") + 1] == "0" and args[args.index("-n") + 1] == "128"
    assert args[args.index("-d") + 1] == "42"  # decoding after the prompt's context


def test_a_missing_tool_is_a_clear_error(tmp_path: Path) -> None:
    llama = tools(tmp_path)
    (tmp_path / "llama-bench").unlink()
    with pytest.raises(LlamaCppCompareError, match="no executable llama-bench"):
        llama.bench_tg(8)
    assert issubclass(LlamaCppCompareError, UserFacingError)


def test_unparseable_or_failing_output_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(LlamaCppCompareError, match="cannot find its 'encoded"):
        tools(tmp_path, spec_output="something else\n").speculative(SPEC_MODES[1], "x", 8, 0)
    with pytest.raises(LlamaCppCompareError, match="failed \\(exit 3\\)"):
        tools(tmp_path, spec_exit=3).speculative(SPEC_MODES[2], "x", 8, 0)
    for text in ("no json here", "[]", '[{"n_prompt": 0}]', "[1, 2]"):
        with pytest.raises(LlamaCppCompareError, match="tg result"):
            parse_bench_output(text)
    with pytest.raises(LlamaCppCompareError):
        parse_speculative_output("m", "decoded 3 tokens in 1 seconds")


def test_prompt_text_spells_out_every_token() -> None:
    pieces = {1: b"<|im_start|>", 2: b"user\n", 3: b"\xc3\xa9"}
    assert prompt_text([1, 2, 3], pieces.__getitem__) == "<|im_start|>user\n\u00e9"


def test_the_flag_reaches_the_comparison_and_a_missing_tool_exits_1(tmp_path: Path,
                                                                      capsys) -> None:
    from chatapp.cli import build_parser, main

    args = build_parser().parse_args(["bench", "--against-llama-cpp", str(tmp_path)])
    assert args.against_llama_cpp == tmp_path and not args.conversation
    assert main(["bench", "--against-llama-cpp", str(tmp_path)]) == 1
    error = capsys.readouterr().err
    assert "no executable llama-bench" in error and "Traceback" not in error


def test_the_command_prints_one_table_and_checks_the_prompt_tokens(tmp_path: Path,
                                                                   monkeypatch) -> None:
    """Fake models, stand-in tools: a table row per prompt with every column; a llama.cpp
    prompt token count that differs from specchat's stops the comparison."""
    import io

    import chatapp.bench.llama_cpp_compare as compare
    import chatapp.bench.runner as runner
    from chatapp.backends.fake import FakeBackend
    from chatapp.bench.specs import BenchPrompt, RunSpec
    from chatapp.chat.message import ChatMessage
    from chatapp.settings.config import Config

    prompt = BenchPrompt("one", "code-edit", "the spec token is the draft token")
    count = len(FakeBackend().chat_prompt([ChatMessage("user", prompt.text)]))
    monkeypatch.setattr(compare, "resolve_name", lambda name, config: Path(f"{name}.gguf"))
    monkeypatch.setattr(compare, "runnable_layout",  # the layout specchat runs here
                        lambda name, role, path, config: path.with_suffix(f".{role}-layout.gguf"))

    def fake(model: str, role: str, config: Config, progress: object = None,
             n_ctx: int | None = None) -> FakeBackend:
        return FakeBackend(noise=1.0 if role == "draft" else 0.0)

    monkeypatch.setattr(compare, "load_backend", fake)
    monkeypatch.setattr(runner, "load_backend", fake)

    def run(encoded: int) -> str:
        tools(tmp_path, spec_output=SPEC_OUTPUT.replace("encoded   42", f"encoded {encoded}"))
        out = io.StringIO()
        assert compare.compare_command(Config(seed=0, threads=2), tmp_path, [prompt],
                                       [RunSpec("model", 2)], 12, warmup=False, out=out,
                                       log=io.StringIO()) == 0
        return out.getvalue()

    table = run(count).splitlines()
    header = next(line for line in table if line.startswith("| prompt |"))
    assert "llama.cpp none" in header and "llama.cpp ngram-mod" in header
    assert "specchat target" in header and "specchat K=2" in header
    row = next(line for line in table if line.startswith("| one ("))
    assert "| 15.2 (128) |" in row and row.count("|") == header.count("|")
    args = (tmp_path / "llama-bench.args").read_text().split()
    assert args[args.index("-m") + 1].endswith(".target-layout.gguf")  # the weights specchat runs
    assert args[args.index("-d") + 1] == str(count)  # plain decoding after this prompt
    assert args[args.index("-n") + 1] == row.split("(")[1].split("/")[0]  # as many tokens
    with pytest.raises(LlamaCppCompareError, match="prompts differ"):
        run(count + 1)
