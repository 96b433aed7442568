"""Who may talk to the server: the address it listens on, the Host, the Origin and the API key.

- It listens on 127.0.0.1 unless told otherwise; any other address needs an API key
  (``--api-key`` or ``SPECCHAT_API_KEY``), since anyone who can reach the port could use it.
  The transport is plain HTTP: the key and the text cross the network readable.
- ``Host`` must name the address it serves, with its port: the bound address, or for a loopback
  address ``localhost`` / ``127.0.0.1`` / ``[::1]``, or for every interface (0.0.0.0, ::) an IP
  address. A DNS-rebinding page reaches 127.0.0.1 under its own host name, which is refused (421).
- A request that carries an ``Origin`` (a browser page's) is refused (403) unless that origin was
  allowed with ``--cors``; an allowed one gets the CORS headers, and its preflight is answered.
- With a key, every request but a CORS preflight needs ``Authorization: Bearer KEY``, compared
  in constant time (401). A header that is not UTF-8 is compared as its bytes, and a ``Host``
  port that is not 1 to 5 ASCII digits matches no port: no header makes the guard raise.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

from chatapp.serve.errors import ApiError

API_KEY_ENV = "SPECCHAT_API_KEY"
CORS_HEADERS = "Authorization, Content-Type"
CORS_METHODS = "GET, POST, OPTIONS"


class UnsafeAddress(ValueError):
    """Listening there would expose the models without a key."""


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    return ipaddress.ip_address("127.0.0.1" if host == "localhost" else host)


def bind_address(host: str) -> str:
    """The IP address to listen on for ``host`` (an IP address, or localhost)."""
    try:
        return str(_address(host))
    except ValueError:
        raise UnsafeAddress(f"--host must be an IP address (or localhost), got {host!r}") from None


def check_exposure(host: str, api_key: str | None) -> None:
    """Refuse to listen on a non-loopback address without an API key."""
    if not _address(bind_address(host)).is_loopback and not api_key:
        raise UnsafeAddress(
            f"specchat serve listens on {host} only with an API key: anyone who can reach "
            f"that address could use the models. Set {API_KEY_ENV} (or --api-key) and give it "
            "to the clients; the transport is plain HTTP, so use it on networks you trust.")


def _split_host(header: str) -> tuple[str, int | None]:
    """``Host`` as (name, port): "localhost:8000", "[::1]:8000", "10.0.0.2"."""
    name, port = header, None
    if header.startswith("["):
        end = header.find("]")
        name, rest = header[1:end], header[end + 1:]
        if rest.startswith(":"):
            port = _port(rest[1:])
    elif header.count(":") == 1:
        name, text = header.split(":")
        port = _port(text)
    return name.lower(), port


def _port(text: str) -> int:
    """A ``Host`` header's port: 1 to 5 ASCII digits, else -1 (no port matches it)."""
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 5 else -1


@dataclass(frozen=True)
class Guard:
    """The checks of one server bound at ``host``:``port``."""

    host: str
    port: int
    api_key: str | None = None
    cors: Sequence[str] = ()

    def host_allowed(self, header: str | None) -> bool:
        if not header:
            return False
        name, port = _split_host(header)
        if (port or 80) != self.port:
            return False
        bound = _address(self.host)
        if name == "localhost":
            return bound.is_loopback or bound.is_unspecified
        try:
            named = ipaddress.ip_address(name)
        except ValueError:
            return False  # a host name: what a DNS-rebinding page sends
        if bound.is_unspecified:
            return True
        return named == bound or (bound.is_loopback and named.is_loopback)

    def check(self, method: str, headers: dict[str, str] | object) -> None:
        """Raise the refusal of a request with these ``headers``, if any."""
        get = headers.get  # type: ignore[attr-defined]
        if not self.host_allowed(get("Host")):
            raise ApiError(421, "This server answers only for the address it listens on "
                           f"(Host: {self.host}:{self.port}).", code="misdirected_request")
        origin = get("Origin")
        if origin is not None and origin not in self.cors:
            raise ApiError(403, "Requests from web pages are refused unless their origin is "
                           "allowed with --cors.", code="origin_not_allowed")
        if self.api_key is None or (method == "OPTIONS" and origin is not None):
            return
        given = get("Authorization") or ""
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
                token.strip().encode("utf-8", "surrogatepass"),
                self.api_key.encode("utf-8", "surrogatepass")):
            raise ApiError(401, "Incorrect or missing API key: send Authorization: Bearer KEY.",
                           code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})

    def cors_headers(self, origin: str | None) -> dict[str, str]:
        """The CORS headers of an answer to an allowed ``origin`` (none for other requests)."""
        if origin is None or origin not in self.cors:
            return {}
        return {"Access-Control-Allow-Origin": origin, "Vary": "Origin",
                "Access-Control-Allow-Headers": CORS_HEADERS,
                "Access-Control-Allow-Methods": CORS_METHODS, "Access-Control-Max-Age": "600"}
