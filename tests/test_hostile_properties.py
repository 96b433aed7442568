"""Property-based hostile input (issue 35): whatever a client, a chat file or a config file
holds, the request schema, the chat import parser and the config reader answer with the
project's own refusal (an OpenAI-shaped 400, ``ChatFileError``, ``ConfigError``) or a value
that the rest of specchat can use, never another exception."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from chatapp.chat.chat_file import ChatFileError, chat_from_json
from chatapp.chat.history import HistoryStore
from chatapp.serve.errors import ApiError, from_validation
from chatapp.serve.schemas import ChatCompletionRequest
from chatapp.settings.config import ConfigError, load_config
from chatapp.settings.options import OPTIONS

PROPERTY = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])

# Any Unicode text, lone surrogates included (JSON's "\ud800" decodes to one).
TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=12)
NUMBER = (st.integers() | st.integers(-10**400, 10**400) | st.floats()
          | st.sampled_from([0, -1, 2**63, 2**64, -(2**63), 10**400, 1e308, -0.0]))
SCALAR = st.none() | st.booleans() | NUMBER | TEXT | st.just("lone \ud800 surrogate")
JSON = st.recursive(SCALAR, lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(TEXT, inner, max_size=4), max_leaves=12)


# What broke 015be51's readers, drawn often.
HOSTILE = st.sampled_from([10**400, -(10**400), -1, 2**64, float("nan"), float("inf"),
                           "\ud800", ["\udfff"], {"\ud800": 1}, [], {}, None, True, "x"])
VALUE = HOSTILE | JSON


def json_text(value: Any) -> str:
    return json.dumps(value, allow_nan=True)  # ensure_ascii: surrogates go as \ud800 escapes


# -- the request schema ---------------------------------------------------------------------------

REQUEST_FIELDS = ["model", "messages", "stream", "stream_options", "temperature", "top_p",
                  "top_k", "seed", "max_tokens", "max_completion_tokens", "stop", "n",
                  "prediction", "response_format", "tools", "logit_bias", "metadata", "user"]
MESSAGE = st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant",
                                                          "developer", "tool"]) | TEXT},
                                optional={"content": JSON | TEXT, "name": JSON,
                                          "tool_calls": JSON})
USER_MESSAGE = st.fixed_dictionaries({"role": st.just("user"), "content": TEXT})
REQUEST = st.fixed_dictionaries(
    {"model": st.just("specchat") | JSON,
     "messages": st.lists(USER_MESSAGE, min_size=1, max_size=2) | st.lists(MESSAGE, max_size=3)
     | JSON},
    optional={name: JSON for name in REQUEST_FIELDS[2:]})
PLAUSIBLE_REQUEST = st.fixed_dictionaries(
    {"model": st.just("specchat"), "messages": st.lists(USER_MESSAGE, min_size=1, max_size=2)},
    optional={"seed": VALUE, "temperature": VALUE, "max_tokens": VALUE, "stream": VALUE,
              "stop": VALUE, "prediction": VALUE})


def check_request(data: bytes) -> None:
    try:
        body = ChatCompletionRequest.model_validate_json(data)
    except ValidationError as error:
        refusal = from_validation(error)
        assert isinstance(refusal, ApiError) and refusal.status == 400
        json.dumps(refusal.body())  # the refusal can be sent
        return
    request = body.exchange()
    assert request.seed is None or 0 <= request.seed < 2**64
    for message in request.messages:
        message.content.encode("utf-8", "surrogatepass")


@PROPERTY
@given(REQUEST | PLAUSIBLE_REQUEST)
@example({"model": "specchat", "messages": [{"role": "user", "content": "x"}], "seed": -1})
def test_any_request_is_served_or_refused_with_a_400(request: dict[str, Any]) -> None:
    check_request(json_text(request).encode())


@PROPERTY
@given(st.binary(max_size=200) | JSON.map(lambda value: json_text(value).encode()))
def test_any_body_is_served_or_refused_with_a_400(data: bytes) -> None:
    check_request(data)


def test_a_deeply_nested_body_is_refused_with_a_400() -> None:
    check_request(b'{"model": "specchat", "messages": ' + b"[" * 100_000 + b"]" * 100_000
                  + b"}")


# -- the chat import parser -----------------------------------------------------------------------

def chat_file() -> dict[str, Any]:
    return {"format": "specchat-chat", "version": 1, "title": "t", "draft": "d", "target": "t",
            "created_at": 1.0, "settings": None, "messages": [
                {"role": "user", "content": "hi", "created_at": 2.0, "runs": None,
                 "finish_reason": None, "stats": None, "meta": {}, "attachments": []},
                {"role": "assistant", "content": "ok", "created_at": 3.0,
                 "runs": [["ok", "target"]], "finish_reason": "stop",
                 "stats": {"tokens": 1, "per_position_accepted": []}, "meta": {"k": 3},
                 "attachments": []}]}


CHAT_FIELDS = ["title", "draft", "target", "created_at", "settings", "messages"]
MESSAGE_FIELDS = ["role", "content", "created_at", "runs", "finish_reason", "stats", "meta",
                  "attachments"]


@st.composite
def damaged_chat_files(draw: st.DrawFn) -> dict[str, Any]:
    """A chat export with a few of its fields (of the chat, a message, the stats) replaced."""
    data = chat_file()
    messages = data["messages"]
    for _ in range(draw(st.integers(1, 3))):
        where = draw(st.sampled_from(["chat", "message", "stats"]))
        if where == "chat":
            data[draw(st.sampled_from(CHAT_FIELDS))] = draw(VALUE)
        elif where == "message":
            message = messages[draw(st.integers(0, len(messages) - 1))]
            message[draw(st.sampled_from(MESSAGE_FIELDS))] = draw(VALUE)
        else:
            messages[-1]["stats"] = draw(st.dictionaries(
                st.sampled_from(["tokens", "per_position_accepted", "total_s", "nonsense"]),
                VALUE, max_size=3))
    return data


@PROPERTY
@given(damaged_chat_files() | JSON)
def test_any_chat_file_is_imported_or_refused_with_a_chat_file_error(data: Any) -> None:
    try:
        chat, messages = chat_from_json(json_text(data))
    except ChatFileError:
        return
    with tempfile.TemporaryDirectory() as folder:  # what parses, the history can hold
        store = HistoryStore(Path(folder) / "history.sqlite3")
        try:
            store.insert_chat(chat, messages)
        finally:
            store.close()


def test_the_chat_file_refusals_name_the_field() -> None:
    cases = {"created_at": ("created_at", 10**400), "stats": ("stats", {"tokens": [1]}),
             "content": ("content", "\ud800")}
    for name, (field, value) in cases.items():
        data = chat_file()
        data["messages"][1][field] = value
        try:
            chat_from_json(json_text(data))
        except ChatFileError as error:
            assert name in str(error) or "Unicode" in str(error), error
        else:
            raise AssertionError(f"{name}: accepted")
    data = chat_file()
    data["messages"][1]["stats"] = {"per_position_accepted": 5}
    try:
        chat_from_json(json_text(data))
    except ChatFileError as error:
        assert "stats" in str(error)


# -- the config reader ----------------------------------------------------------------------------

TOML_VALUE = st.one_of(
    st.integers(-10**30, 10**30).map(str), st.floats().map(repr),
    TEXT.map(lambda text: json.dumps(text)),
    st.sampled_from(["true", "false", "[1, 2]", '"a"', "{}", "[]", "nan", "-inf", "1979-05-27"]))
TOML_LINE = st.tuples(st.sampled_from([*OPTIONS, "presets", "unknown"]), TOML_VALUE).map(
    lambda pair: f"{pair[0]} = {pair[1]}")
CONFIG_TEXT = st.lists(TOML_LINE, max_size=5).map("\n".join)


def check_config(data: bytes) -> bool:
    """Whether a config file of ``data`` loads (False: refused with a ``ConfigError``)."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "config.toml"
        path.write_bytes(data)
        try:
            load_config(path)
        except ConfigError:
            return False
        return True


@PROPERTY
@given(CONFIG_TEXT.map(lambda text: text.encode("utf-8", "surrogatepass"))
       | st.binary(max_size=100))
def test_any_config_file_loads_or_is_refused_with_a_config_error(data: bytes) -> None:
    check_config(data)


def test_a_deeply_nested_config_and_a_negative_seed_are_config_errors() -> None:
    for text in (b"rpc = " + b"[" * 5000 + b"]" * 5000, b"seed = -1",
                 b"seed = 18446744073709551616", b"system_prompt = \"\xff\xfe\""):
        assert not check_config(text), text[:30]
