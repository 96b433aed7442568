"""Addresses of RPC servers (``host:port``): parsing them and saying where a target runs.

Plain text handling, with no llama.cpp in it, so the configuration and the front ends can use it;
``chatapp.backends.rpc`` does the talking to the servers.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

DEFAULT_PORT = 50052  # ggml-rpc-server's default


@dataclass(frozen=True)
class Endpoint:
    """A server's address; ``str()`` is the ``host:port`` llama.cpp takes."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"

    @classmethod
    def parse(cls, text: str) -> "Endpoint":
        """``host:port``; raise ``ValueError`` saying what is wrong."""
        host, sep, port = text.strip().rpartition(":")
        if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise ValueError(f"{text!r} is not host:port (e.g. 192.168.1.20:{DEFAULT_PORT})")
        return cls(host, int(port))


def parse_endpoints(items: Iterable[str]) -> tuple[Endpoint, ...]:
    """Every ``host:port`` of ``items`` (each may hold several, comma-separated), in order,
    without repeats; raise ``ValueError`` on the first malformed one."""
    found: list[Endpoint] = []
    for item in items:
        for part in item.split(","):
            if part.strip():
                endpoint = Endpoint.parse(part)
                if endpoint not in found:
                    found.append(endpoint)
    return tuple(found)
