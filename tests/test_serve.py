"""`specchat serve` through the official `openai` client and raw HTTP, on fake backends: replies
whole and streamed, usage and the speculative statistics, every refusal with its status and
shape, the queue, disconnects, the key, Host and Origin checks, metrics, SIGTERM mid-reply.

Each server is a subprocess (tests/serve_launcher.py) on a free port of 127.0.0.1."""

from __future__ import annotations

import http.client
import json
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

openai = pytest.importorskip("openai")

from chatapp.chat.conversation import Conversation  # noqa: E402
from tests.serve_launcher import REPO, ServeProcess, fake_factory  # noqa: E402
from tests.test_exchange import CONFIG  # noqa: E402

PROMPT = "the user asks"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    process = ServeProcess(tmp_path_factory.mktemp("serve"))
    try:
        yield process
    finally:
        process.stop()


def client(server: ServeProcess, key: str = "unused") -> "openai.OpenAI":
    return openai.OpenAI(base_url=server.base_url, api_key=key, max_retries=0, timeout=30)


def ask(server: ServeProcess, text: str = PROMPT, **fields: object):  # noqa: ANN201
    return client(server).chat.completions.create(
        model=server.model, messages=[{"role": "user", "content": text}], **fields)


def raw(server: ServeProcess, method: str, path: str, body: bytes | None = None,
        headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    """One request with exactly these headers (Host included: the server's unless given)."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    connection.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
    headers = {"Host": server.host, **(headers or {})}
    if body is not None:
        headers.setdefault("Content-Type", "application/json")
        headers["Content-Length"] = str(len(body))
    for name, value in headers.items():
        connection.putheader(name, value)
    connection.endheaders(body)
    response = connection.getresponse()
    data = response.read()
    connection.close()
    return response.status, dict(response.getheaders()), data


def post(server: ServeProcess, payload: object, **headers: str) -> tuple[int, dict]:
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    status, _, data = raw(server, "POST", "/v1/chat/completions", body, headers)
    return status, json.loads(data)


def expected_reply():  # noqa: ANN201
    """The reply `specchat run`'s path (Conversation.run) makes on the same fakes."""
    chat = Conversation(CONFIG)
    chat.attach(fake_factory(40, 0.0, False)(CONFIG, lambda *_: None))
    return chat.run(chat.begin(PROMPT))


def test_the_models_are_the_pair_and_its_aliases(server: ServeProcess) -> None:
    models = [model.id for model in client(server).models.list()]
    assert models == ["fake-target+fake-draft", "specchat", "fake-target"]
    assert client(server).models.retrieve("specchat").model_extra["specchat"] == {
        "alias_of": "fake-target+fake-draft"}


def test_a_reply_and_its_usage_are_the_engines_as_specchat_run_makes_them(tmp_path) -> None:
    server = ServeProcess(tmp_path)
    try:
        reply = ask(server)
    finally:
        server.stop()
    expected = expected_reply()
    assert reply.choices[0].message.content == expected.content
    assert reply.choices[0].finish_reason == expected.finish_reason == "length"
    assert reply.object == "chat.completion"
    usage, stats = reply.usage, expected.stats
    assert (usage.prompt_tokens, usage.completion_tokens) == (stats.prompt_tokens, stats.tokens)
    assert usage.total_tokens == stats.prompt_tokens + stats.tokens
    assert usage.completion_tokens_details.accepted_prediction_tokens == 0
    extension = reply.model_extra["specchat"]
    assert (extension["drafted"], extension["accepted"], extension["target_calls"]) == (
        stats.drafted, stats.accepted, stats.target_calls)
    assert extension["tokens_per_target_call"] == pytest.approx(stats.mean_accepted_length,
                                                                abs=1e-4)
    assert sum(s["accepted"] for s in extension["sources"].values()) == stats.accepted


def test_a_streamed_reply_is_the_whole_reply_with_each_tokens_source(server) -> None:
    whole_reply = ask(server, "stream me")
    whole = whole_reply.choices[0].message.content
    chunks = list(ask(server, "stream me", stream=True,
                      stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole
    pieces = [p for c in chunks if c.choices and c.model_extra.get("specchat", {}).get("tokens")
              for p in c.model_extra["specchat"]["tokens"]]
    assert "".join(t for t, _ in pieces) == whole
    assert {s for _, s in pieces} <= {"accepted", "resampled", "bonus", "target"}
    finish = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish[0].choices[0].finish_reason == whole_reply.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(pieces)
    assert finish[0].model_extra["specchat"]["drafted"] >= 0


def test_a_wrong_prediction_changes_nothing_and_is_reported(server) -> None:
    plain = ask(server, "predict me")
    wrong = ask(server, "predict me", prediction={"type": "content", "content": "qqq zzz " * 9})
    right = ask(server, "predict me",
                prediction={"type": "content", "content": plain.choices[0].message.content})
    for reply in (wrong, right):
        assert reply.choices[0].message.content == plain.choices[0].message.content
    details = wrong.usage.completion_tokens_details
    assert details.rejected_prediction_tokens > 0
    assert (right.usage.completion_tokens_details.accepted_prediction_tokens
            > details.accepted_prediction_tokens)
    assert right.model_extra["specchat"]["prediction"]["used_as_draft_source"]


def test_malformed_json_and_a_body_that_is_not_an_object_are_refused(server) -> None:
    for body in (b"{not json", b"[1, 2]", b""):
        status, answer = post(server, body)
        assert status == 400 and answer["error"]["type"] == "invalid_request_error", answer
        assert set(answer["error"]) == {"message", "type", "param", "code"}


@pytest.mark.parametrize(("fields", "param", "words"), [
    ({"temperature": "hot"}, "temperature", "valid number"),
    ({"temperature": 3}, "temperature", "less than or equal"),
    ({"max_tokens": 0}, "max_tokens", "greater than"),
    ({"stop": 5}, "stop", ""),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content", ""),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role", ""),
    ({"messages": []}, "messages", ""),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {
        "url": "data:image/png;base64,AA"}}]}]}, "messages[0].content", "images are not"),
    ({"messages": [{"role": "function", "content": "x", "name": "f"}]}, "messages[0]",
     "function messages (the legacy form of tool messages) are not"),
    ({"tools": [{"type": "function", "function": {"name": "f g"}}]},
     "tools[0].function.name", "pattern"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}],
      "tool_choice": {"type": "function", "function": {"name": "g"}}}, None, "not among"),
    ({"tool_choice": "required"}, None, "needs tools"),
    ({"max_tokens": -2}, "max_tokens", "greater than"),
    ({"n": 2}, None, "n > 1 is not supported"),
    ({"logprobs": True}, None, "log probabilities are not"),
    ({"response_format": {"type": "regex"}}, "response_format", "type 'regex' are not"),
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "bad", "schema": {"type": "objec"}}}}, None,
     "cannot be used as a grammar: at 1(8): failed to compile JSON schema: Invalid type"),
])
def test_each_refusal_is_an_openai_error_that_names_the_parameter(
        server, fields: dict, param: str | None, words: str) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client(server).chat.completions.create(  # extra_body: the client checks nothing
            model=server.model, messages=[{"role": "user", "content": "x"}], extra_body=fields)
    error = refused.value
    assert error.status_code == 400 and error.type == "invalid_request_error"
    assert words in error.message and (param is None or error.param == param), error.body
    assert set(error.body) == {"message", "type", "param", "code"}


def test_a_prompt_longer_than_the_context_and_an_unknown_route_are_refused(server) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        ask(server, "the " * 5000)
    assert refused.value.code == "context_length_exceeded" and "4096" in refused.value.message
    status, _, data = raw(server, "GET", "/v1/nothing")
    assert status == 404 and json.loads(data)["error"]["code"] == "not_found"
    status, headers, _ = raw(server, "GET", "/v1/chat/completions")
    assert status == 405 and headers["Allow"] == "POST"
    status, answer = post(server, b'{"model": "' + b"x" * (17 * 1024 * 1024) + b'"}')
    assert status == 413 and "16 MiB" in answer["error"]["message"]


def test_text_parts_developer_messages_and_stop_sequences_are_served(server) -> None:
    whole = ask(server, "parts").choices[0].message.content
    parts = client(server).chat.completions.create(
        model="specchat", messages=[{"role": "user", "content": [
            {"type": "text", "text": "par"}, {"type": "text", "text": "ts"}]}])
    assert parts.choices[0].message.content == whole
    stop = whole[5:8]
    cut = ask(server, "parts", stop=[stop, "never there"], max_completion_tokens=100)
    assert cut.choices[0].message.content == whole[:whole.index(stop)]
    assert cut.choices[0].finish_reason == "stop"
    short = ask(server, "parts", max_tokens=3)
    assert short.choices[0].finish_reason == "length" and short.usage.completion_tokens <= 3


def test_metrics_count_requests_tokens_and_sources(server) -> None:
    ask(server, "count me")
    status, headers, data = raw(server, "GET", "/metrics")
    text = data.decode()
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    assert 'specchat_requests_total{endpoint="/v1/chat/completions",status="200"}' in text
    for name in ("specchat_queue_waiting", "specchat_generating",
                 "specchat_prompt_tokens_total", "specchat_completion_tokens_total",
                 "specchat_drafted_tokens_total", "specchat_accepted_tokens_total",
                 "specchat_time_per_output_token_seconds_count"):
        assert name in text


def slow_server(tmp_path: Path, *args: str) -> ServeProcess:
    """A server whose replies go on (an endless fake) at about 50 target calls a second."""
    return ServeProcess(tmp_path, ["--fake-endless", "--fake-delay", "0.02",
                                   "--fake-max-tokens", "100000", *args])


def open_stream(server: ServeProcess, text: str = PROMPT) -> tuple[socket.socket, bytes]:
    """A streamed request on a raw socket, read until its first text chunk."""
    body = json.dumps({"model": "specchat", "stream": True,
                       "messages": [{"role": "user", "content": text}]}).encode()
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: " + server.host.encode()
                 + b"\r\nContent-Type: application/json\r\nContent-Length: "
                 + str(len(body)).encode() + b"\r\n\r\n" + body)
    seen = b""
    while b'"content": "' not in seen.replace(b'"content": ""', b""):
        chunk = sock.recv(65536)
        assert chunk, seen
        seen += chunk
    return sock, seen


def wait_until_queued(server: ServeProcess, waiting: int) -> None:
    """Wait until the server's metrics show this many requests queued (a busy machine is slow)."""
    deadline = time.monotonic() + 20
    while f"specchat_queue_waiting {waiting:.1f}" not in raw(server, "GET", "/metrics")[2].decode():
        assert time.monotonic() < deadline, f"{waiting} request(s) never queued"
        time.sleep(0.05)


def test_a_third_request_waits_for_no_place_and_gets_429(tmp_path) -> None:
    server = slow_server(tmp_path, "--queue", "1")
    try:
        first, _ = open_stream(server)
        waiting: dict[str, object] = {}
        second = threading.Thread(target=lambda: waiting.update(
            reply=ask(server, "second", max_tokens=5)))
        second.start()
        wait_until_queued(server, 1)
        with pytest.raises(openai.RateLimitError) as refused:
            ask(server, "third")
        assert refused.value.code == "queue_full"
        assert int(refused.value.response.headers["Retry-After"]) >= 1
        first.close()  # the first client goes: the second is answered
        second.join(15)
        assert waiting["reply"].usage.completion_tokens == 5
    finally:
        assert server.stop() == 0


def test_a_client_that_disconnects_frees_the_engine_at_once(tmp_path) -> None:
    server = slow_server(tmp_path)
    try:
        for _ in range(2):
            sock, _ = open_stream(server)
            sock.close()
            started = time.monotonic()
            reply = ask(server, "next", max_tokens=3)
            assert reply.usage.completion_tokens == 3
            assert time.monotonic() - started < 2.0
        # a reply reaches its client only once the models' thread has ended its turn
        assert "specchat_generating 0.0" in raw(server, "GET", "/metrics")[2].decode()
    finally:
        assert server.stop() == 0


def test_the_api_key_is_required_when_set(tmp_path) -> None:
    server = ServeProcess(tmp_path, env={"SPECCHAT_API_KEY": "s3cret-key"})
    try:
        for key in ("wrong", "s3cret-ke", "s3cret-key-"):
            with pytest.raises(openai.AuthenticationError) as refused:
                client(server, key).models.list()
            assert refused.value.code == "invalid_api_key"
        status, headers, _ = raw(server, "GET", "/metrics")
        assert status == 401 and headers["WWW-Authenticate"] == "Bearer"
        assert [m.id for m in client(server, "s3cret-key").models.list()][1] == "specchat"
    finally:
        server.stop()


def test_a_foreign_host_or_origin_is_refused_and_an_allowed_origin_gets_cors(tmp_path) -> None:
    server = ServeProcess(tmp_path, ["--cors", "http://app.example"])
    try:
        port = server.port
        for host in (f"evil.example:{port}", "evil.example", f"127.0.0.1:{port + 1}",
                     f"localhost.evil.example:{port}", ""):
            status, _, data = raw(server, "GET", "/v1/models", headers={"Host": host})
            assert status == 421 and json.loads(data)["error"]["code"] == "misdirected_request"
        for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}"):
            assert raw(server, "GET", "/v1/models", headers={"Host": host})[0] == 200
        for origin in ("http://evil.example", f"http://127.0.0.1:{port}", "null"):
            status, _, data = raw(server, "GET", "/v1/models", headers={"Origin": origin})
            assert status == 403 and json.loads(data)["error"]["code"] == "origin_not_allowed"
        status, headers, _ = raw(server, "OPTIONS", "/v1/chat/completions", headers={
            "Origin": "http://app.example", "Access-Control-Request-Method": "POST"})
        assert status == 204 and headers["Access-Control-Allow-Origin"] == "http://app.example"
        status, headers, _ = raw(server, "GET", "/v1/models",
                                 headers={"Origin": "http://app.example"})
        assert status == 200 and headers["Access-Control-Allow-Origin"] == "http://app.example"
    finally:
        server.stop()


def test_another_address_than_loopback_needs_an_api_key() -> None:
    done = subprocess.run([sys.executable, "-m", "tests.serve_launcher", "--host", "0.0.0.0",
                           "--port", "0"], cwd=REPO, capture_output=True, timeout=60,
                          env={**__import__("os").environ, "SPECCHAT_API_KEY": ""})
    assert done.returncode == 2
    assert b"only with an API key" in done.stderr and b"plain HTTP" in done.stderr


def test_sigterm_mid_reply_ends_the_reply_answers_the_waiting_and_exits(tmp_path) -> None:
    server = slow_server(tmp_path, "--queue", "2")
    outcome: dict[str, BaseException] = {}

    def waiting() -> None:
        try:
            ask(server, "waiting")
        except openai.APIStatusError as error:
            outcome["error"] = error

    first, seen = open_stream(server)
    thread = threading.Thread(target=waiting)
    thread.start()
    wait_until_queued(server, 1)
    started = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    first.settimeout(10)
    while b"server_stopping" not in seen:
        chunk = first.recv(65536)
        assert chunk, seen[-500:]
        seen += chunk
    thread.join(10)
    assert server.stop(None) == 0  # the first SIGTERM is enough
    assert time.monotonic() - started < 10
    assert outcome["error"].status_code == 503
    assert b"[DONE]" not in seen and b"stopping" in server.stderr
