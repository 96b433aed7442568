"""Refusals as the OpenAI API makes them: an HTTP status and a JSON body
``{"error": {"message", "type", "param", "code"}}``, which the official clients turn into their
exception classes (400 ``BadRequestError``, 401 ``AuthenticationError``, 404 ``NotFoundError``,
429 ``RateLimitError``, ...)."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web
from pydantic import ValidationError

INVALID_REQUEST = "invalid_request_error"
UNSUPPORTED = "unsupported"  # the pydantic error type of a feature specchat does not serve


class ApiError(Exception):
    """A refusal; ``response()`` is what the client gets."""

    def __init__(self, status: int, message: str, type: str = INVALID_REQUEST,
                 code: str | None = None, param: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.param = param
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}

    def response(self) -> web.Response:
        return web.Response(status=self.status, text=json.dumps(self.body()),
                            content_type="application/json", headers=self.headers)


def _param(location: tuple[int | str, ...]) -> str:
    """A pydantic location as the API names a parameter: ``messages[0].content``."""
    text = ""
    for part in location:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def from_validation(error: ValidationError) -> ApiError:
    """The first problem pydantic found, as a 400 refusal that names the parameter."""
    first = error.errors(include_url=False)[0]
    kind, location, message = first["type"], tuple(first["loc"]), first["msg"]
    param = _param(tuple(part for part in location if not _is_union_tag(part))) or None
    if kind == "json_invalid":
        return ApiError(400, f"The body is not valid JSON: {first['ctx']['error']}.",
                        code="invalid_json")
    if kind in ("model_type", "dict_type") and not location:
        return ApiError(400, "The body must be a JSON object.", code="invalid_json")
    if kind == "extra_forbidden":
        return ApiError(400, f"Unrecognized request argument supplied: {param}.",
                        code="unknown_parameter", param=param)
    if kind == "missing":
        return ApiError(400, f"Missing required parameter: '{param}'.",
                        code="missing_required_parameter", param=param)
    if kind == UNSUPPORTED:
        return ApiError(400, message, code="unsupported_value", param=param)
    return ApiError(400, f"Invalid value for '{param}': {message}.", code="invalid_value",
                    param=param)


def _is_union_tag(part: int | str) -> bool:
    """pydantic names the member of a union it tried in the location ("str", "list[...]")."""
    return isinstance(part, str) and (part in ("str", "int", "float", "bool") or "[" in part)


def unsupported(feature: str, param: str) -> ApiError:
    """A 400 refusal of a feature the server does not have."""
    return ApiError(400, f"{feature} are not supported by specchat serve (text chat "
                    "completions only).", code="unsupported_value", param=param)


def not_found(what: str) -> ApiError:
    return ApiError(404, what, code="not_found")


def server_error(message: str, code: str = "server_error", status: int = 500) -> ApiError:
    return ApiError(status, message, type="server_error", code=code)
