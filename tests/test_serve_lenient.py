"""`specchat serve` lenient where clients differ, on fake backends: unknown fields accepted and
named in ``x-specchat-ignored``, message-level nulls, many stops, ``max_tokens`` null and -1,
any model name (and ``--served-model-name``), ``GET /health``, tools given to the template."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time

import pytest

openai = pytest.importorskip("openai")

from tests.serve_launcher import ServeProcess  # noqa: E402
from tests.test_serve import client, post, raw  # noqa: E402

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    process = ServeProcess(tmp_path_factory.mktemp("serve"),
                           ["--served-model-name", "gpt-4o-mini", "--served-model-name", "x"])
    try:
        yield process
    finally:
        process.stop()


def chat(**fields: object) -> dict:
    return {"model": "specchat", "messages": [{"role": "user", "content": "the user asks"}],
            "max_tokens": 5, **fields}


def test_unknown_fields_are_ignored_and_named_in_a_header(server) -> None:
    body = chat(repetition_penalty=1.1, chat_template_kwargs={"enable_thinking": False},
                messages=[{"role": "system", "content": "be brief", "cache_control": {}},
                          {"role": "user", "content": "hi", "id": "m1", "tool_calls": None,
                           "annotations": [], "refusal": None},
                          {"role": "assistant", "content": "hello", "tool_calls": None},
                          {"role": "user", "content": [{"type": "text", "text": "more",
                                                        "cache_control": {"type": "x"}}]}],
                stop=["a", "b", "c", "d", "e", "f"])
    status, headers, data = raw(server, "POST", "/v1/chat/completions",
                                json.dumps(body).encode())
    assert status == 200, data
    ignored = headers["x-specchat-ignored"].split(", ")
    assert set(ignored) == {"repetition_penalty", "chat_template_kwargs",
                            "messages[0].cache_control", "messages[1].id",
                            "messages[1].annotations"}
    status, headers, _ = raw(server, "POST", "/v1/chat/completions",
                             json.dumps(chat()).encode())
    assert status == 200 and "x-specchat-ignored" not in headers


def test_max_tokens_null_or_minus_one_runs_past_the_servers_limit(server) -> None:
    """The fake server's replies stop at 40 tokens; null and -1 mean "until the context ends"
    (the fake target never ends a reply by itself before)."""
    for value in (None, -1):
        status, answer = post(server, chat(max_tokens=value))
        assert status == 200, answer
        assert answer["usage"]["completion_tokens"] > 40
    status, answer = post(server, {"model": "specchat",
                                   "messages": [{"role": "user", "content": "the user asks"}]})
    assert answer["usage"]["completion_tokens"] == 40


def test_any_model_name_is_served_and_the_served_names_are_listed(server) -> None:
    models = [model.id for model in client(server).models.list()]
    assert models[-2:] == ["gpt-4o-mini", "x"]
    reply = client(server).chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}], max_tokens=3,
        extra_body={"prediction": {"type": "content", "content": "the user"}})
    assert reply.model == "gpt-4o-mini"
    other = client(server).chat.completions.create(
        model="some-model-nobody-listed", messages=[{"role": "user", "content": "hi"}],
        max_tokens=3, extra_body={"min_p": 0.1})
    assert other.model == "some-model-nobody-listed"


def test_health_answers_503_while_loading_then_200(tmp_path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    started = threading.Event()
    loading = []

    def poll() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not started.is_set():
            try:
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                connection.request("GET", "/health", headers={"Host": f"127.0.0.1:{port}"})
                response = connection.getresponse()
                loading.append((response.status, json.loads(response.read())))
                connection.request("POST", "/v1/chat/completions", json.dumps(chat()),
                                   {"Host": f"127.0.0.1:{port}",
                                    "Content-Type": "application/json"})
                response = connection.getresponse()
                loading.append((response.status, json.loads(response.read())))
                connection.close()
                return
            except OSError:
                time.sleep(0.05)

    poller = threading.Thread(target=poll)
    poller.start()
    server = ServeProcess(tmp_path, ["--fake-load-delay", "3", "--port", str(port)])
    started.set()
    poller.join()
    try:
        assert loading[0] == (503, {"status": "loading"})
        assert loading[1][0] == 503 and loading[1][1]["error"]["code"] == "loading"
        status, _, data = raw(server, "GET", "/health")
        assert status == 200 and json.loads(data)["status"] == "ok"
    finally:
        server.stop()


def test_tools_and_tool_messages_are_taken(server) -> None:
    """The fake's "template" shows the tools; its replies are no calls: text, "stop"/"length"."""
    messages = [{"role": "user", "content": "weather in Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {
                        "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}]
    for choice in ("auto", "none"):  # a forced call is a grammar: the fake cannot spell it
        reply = client(server).chat.completions.create(
            model="specchat", messages=messages, tools=[WEATHER], tool_choice=choice,
            max_tokens=5)
        assert reply.choices[0].finish_reason == "length"
        assert reply.choices[0].message.tool_calls is None
        chunks = list(client(server).chat.completions.create(
            model="specchat", messages=messages, tools=[WEATHER], tool_choice=choice,
            max_tokens=5, stream=True))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == (reply.choices[0].message.content or "")
