"""`specchat serve` on the real default pair (Qwen2.5-Coder 1.5B target, 0.5B draft) through the
official `openai` client: fill-in-the-middle fills `return a + b`, streamed equal to whole; a
4,600-token conversation (past the old 4,096 window) is answered, and its follow-up, which
re-sends it with a new question, gets its first token in under 0.3 of the first request's time
(the KV cache of the common prefix is kept); and on SmolLM2, which has no FIM tokens, a suffix is
refused with a 400 that says why."""

from __future__ import annotations

import sys

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")

from tests.conftest import NEEDS_DEFAULT_PAIR  # noqa: E402
from tests.serve_launcher import ServeProcess  # noqa: E402
from tests.test_llama_backend import _smollm_path  # noqa: E402

pytestmark = [
    pytest.mark.real_models, pytest.mark.slow,
    NEEDS_DEFAULT_PAIR,
]
SERVE = [sys.executable, "-m", "chatapp.cli", "serve", "--temperature", "0", "--seed", "0"]
PREFIX = "def add(a, b):\n    "
SUFFIX = "\n\nprint(add(1, 2))\n"
FUNCTIONS = 73  # about 4,600 tokens of source with the chat template


def long_source(functions: int = FUNCTIONS) -> str:
    """A Python module of ``functions`` small functions (about 63 tokens each)."""
    return "".join(f'''def metric_{i}(values, scale={i}):
    """Scale the values by {i} and average the ones above {i * 7 % 13}."""
    kept = [v * scale for v in values if v * scale > {i * 7 % 13}]
    return sum(kept) / max(len(kept), 1)


''' for i in range(functions))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    process = ServeProcess(tmp_path_factory.mktemp("serve-pair"), command=SERVE, timeout=900)
    try:
        yield process
    finally:
        process.stop()


def api(server: ServeProcess) -> "openai.OpenAI":
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0,
                         timeout=900)


def test_fill_in_the_middle_fills_the_body_and_streams_the_same_text(server) -> None:
    """The stop at a blank line is an editor's (the 1.5B model goes on to write more functions
    before the `print`, valid code too)."""
    fields = {"model": "specchat", "prompt": PREFIX, "suffix": SUFFIX, "max_tokens": 32,
              "temperature": 0, "stop": ["\n\n"]}
    whole = api(server).completions.create(**fields)
    text = whole.choices[0].text
    assert text.strip() == "return a + b", text
    assert whole.choices[0].finish_reason == "stop"
    streamed = "".join(c.choices[0].text for c in
                       api(server).completions.create(**fields, stream=True) if c.choices)
    assert streamed == text


def test_a_middle_that_the_suffix_closes_ends_at_the_end_of_text_token(server) -> None:
    reply = api(server).completions.create(
        model="specchat", prompt="import math\n\ndef circle_area(r):\n    ",
        suffix="\n    return result\n\n\nprint(circle_area(2))\n", max_tokens=40, temperature=0)
    assert reply.choices[0].text.startswith("result = ")
    assert reply.choices[0].finish_reason == "stop" and reply.usage.completion_tokens < 40


def ask(server: ServeProcess, messages: list[dict[str, str]]) -> tuple[str, dict]:
    """A streamed greedy reply: its text and the server's figures (the last chunk's)."""
    chunks = list(api(server).chat.completions.create(
        model="specchat", messages=messages, max_tokens=24, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    figures = next(c.model_extra["specchat"] for c in chunks
                   if c.choices and c.choices[0].finish_reason)
    return text, {**figures, "prompt_tokens": chunks[-1].usage.prompt_tokens}


def test_a_long_conversation_is_answered_and_its_follow_up_reuses_the_cache(server) -> None:
    question = {"role": "user", "content": "Here is a module:\n\n```python\n" + long_source()
                + "```\n\nWhat does metric_3 return? One sentence."}
    first, first_figures = ask(server, [question])
    assert first_figures["prompt_tokens"] >= 4600 and first.strip()
    follow_up = [question, {"role": "assistant", "content": first},
                 {"role": "user", "content": "And metric_40? One sentence."}]
    second, second_figures = ask(server, follow_up)
    assert second.strip()
    ratio = second_figures["ttft_s"] / first_figures["ttft_s"]
    assert ratio < 0.3, (first_figures, second_figures)


SMOLLM = _smollm_path()


@pytest.mark.skipif(SMOLLM is None, reason="SmolLM2 test model not installed")
def test_a_model_without_fim_tokens_refuses_a_suffix_saying_why(tmp_path) -> None:
    process = ServeProcess(tmp_path, command=[
        sys.executable, "-m", "chatapp.cli", "serve", "--target", str(SMOLLM), "--draft",
        str(SMOLLM), "-k", "3", "--n-ctx", "2048"])
    try:
        with pytest.raises(openai.BadRequestError) as refused:
            api(process).completions.create(model="specchat", prompt=PREFIX, suffix=SUFFIX,
                                             max_tokens=8)
        assert refused.value.body["param"] == "suffix"
        assert "no fill-in-the-middle tokens" in refused.value.body["message"]
        plain = api(process).completions.create(model="specchat", prompt=PREFIX, max_tokens=8)
        assert plain.usage.completion_tokens > 0
    finally:
        assert process.stop() == 0
