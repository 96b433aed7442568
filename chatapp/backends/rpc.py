"""llama.cpp's RPC backend (ggml-rpc): endpoints, the HELLO probe, devices, and the server loop.

A ``specchat rpc-server`` process serves its machine's CPU or GPU through ggml's own server loop
(``ggml_backend_rpc_start_server``, reached through the RPC registry's proc address, as the
upstream ``ggml-rpc-server`` does), so both sides run the same llama.cpp by construction. A
client registers each server (``ggml_backend_rpc_add_server`` + ``ggml_backend_register``); the
server's devices then appear as ggml devices named ``RPC<n>`` whose description is the endpoint,
and a model loaded with those devices in ``llama_model_params.devices`` keeps its layers there.

The vendored client (protocol 7.0.0) aborts the process when a server cannot be reached, speaks
another protocol, or dies mid-request. So ``probe`` checks every endpoint first with the same
HELLO the client sends (``ggml-rpc.cpp`` ``negotiate_hello``; wire format below), with a
timeout, and only a process that can afford to die (``chatapp.backends.remote_target``'s worker)
ever registers a server. The protocol has no authentication and no encryption.

HELLO on the wire: request ``| cmd u8 = 14 | size u64 LE = 24 | conn_caps[24] |`` (all-zero
caps: plain TCP); response ``| size u64 LE = 28 | major u8 | minor u8 | patch u8 | pad u8 |
conn_caps[24] |``. The server serves one client at a time, so a busy server accepts the TCP
connection (the kernel's backlog) but never answers; one of another protocol generation drops
the connection.
"""

from __future__ import annotations

import ctypes
import ipaddress
import signal
import socket
import struct
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chatapp.backends.base import BackendError
from chatapp.backends.endpoints import Endpoint
from chatapp.backends.llama_build import FULL_BUILD_COMMAND
from chatapp.backends.threads import available_cores

# RPC_PROTO_MAJOR/MINOR_VERSION of the vendored ggml-rpc.h (llama-cpp-python 0.3.36)
PROTOCOL = (7, 0)
PROBE_TIMEOUT_S = 3.0
SECURITY_NOTE = ("The RPC protocol has no authentication and no encryption: whoever reaches this "
                 "port can run computations on this machine and see the prompts' activations. "
                 "Serve on a trusted network only (loopback, a LAN you control, a VPN).")

_CMD_HELLO = 14
_CAPS_SIZE = 24
_HELLO_RESPONSE_SIZE = 4 + _CAPS_SIZE
_GGML_SOVERSION = 0
_DEVICE_TYPE_CPU = 0
_DEVICE_TYPE_ACCEL = 3


def require_rpc() -> None:
    """Raise ``BackendError`` with the install command unless llama.cpp was built with RPC."""
    from chatapp.backends.llama_runtime import lib

    if not lib().llama_supports_rpc():
        raise BackendError("This llama-cpp-python was built without the RPC backend, so the "
                           f"target cannot run on other machines. Reinstall it with: "
                           f"{FULL_BUILD_COMMAND}")


def probe(endpoint: Endpoint, timeout: float = PROBE_TIMEOUT_S) -> tuple[int, int, int]:
    """Send the RPC HELLO to ``endpoint``; return the server's (major, minor, patch) protocol.

    Raise ``BackendError`` naming the endpoint and the fix when nothing listens there, it cannot
    be reached, it does not answer within ``timeout`` (busy with another client, or not an RPC
    server), or it speaks another protocol version. Costs the server one accept and nothing else.
    """
    sock = _connect(endpoint, timeout)
    with sock:
        try:
            sock.sendall(bytes([_CMD_HELLO]) + struct.pack("<Q", _CAPS_SIZE) + bytes(_CAPS_SIZE))
            size = struct.unpack("<Q", _recv_exact(sock, 8))[0]
            body = _recv_exact(sock, size) if size == _HELLO_RESPONSE_SIZE else b""
        except TimeoutError:
            raise BackendError(
                f"The RPC server {endpoint} accepted the connection but did not answer within "
                f"{timeout:g} s: it serves one client at a time and another one holds it, or it "
                "is not an RPC server. Stop the other client, or start another "
                f"`specchat rpc-server --port {endpoint.port + 1}` and use that.") from None
        except (EOFError, ConnectionResetError, BrokenPipeError):
            body = b""  # a server of another protocol generation drops the connection
    version = (body[0], body[1], body[2]) if body else None
    if version is None or version[0] != PROTOCOL[0] or version[1] > PROTOCOL[1]:
        theirs = ("an older protocol" if version is None
                  else "protocol " + ".".join(map(str, version)))
        raise BackendError(
            f"The RPC server {endpoint} speaks {theirs}, this specchat "
            f"{PROTOCOL[0]}.{PROTOCOL[1]}: "
            "install the same llama-cpp-python on both machines and start the server with "
            "`specchat rpc-server`.")
    return version


def _connect(endpoint: Endpoint, timeout: float) -> socket.socket:
    try:
        return socket.create_connection((endpoint.host, endpoint.port), timeout=timeout)
    except ConnectionRefusedError:
        raise BackendError(
            f"Nothing listens at {endpoint}: start `specchat rpc-server --host {endpoint.host} "
            f"--port {endpoint.port}` on that machine (the host must be one of its addresses), "
            "or fix --rpc.") from None
    except OSError as error:  # unknown host, no route, timed out
        reason = error.strerror or str(error) or "timed out"
        raise BackendError(f"Cannot reach the RPC server {endpoint}: {reason}. Check the host "
                           "and port in --rpc, and the network.") from None


def probe_all(endpoints: Sequence[Endpoint], timeout: float = PROBE_TIMEOUT_S) -> None:
    """``probe`` each endpoint in order; raise on the first that fails."""
    for endpoint in endpoints:
        probe(endpoint, timeout)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise EOFError(f"connection closed after {len(data)} of {n} bytes")
        data += chunk
    return data


# -- ggml's device registry, through ctypes (llama-cpp-python binds none of it) ----------------

ABORT_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_char_p)  # ggml_abort_callback_t


class _Ggml:
    """The registry functions of the ggml libraries libllama already loaded.

    The wheel holds copies, not links (libggml.so, .so.0, .so.0.25.3): only the file libllama
    links against (its NEEDED name, .so.0) is the loaded library; opening another copy would
    load a second ggml, with its own registry and abort callback.
    """

    def __init__(self) -> None:
        from chatapp.backends.llama_runtime import lib

        lib_dir = Path(lib().__file__).parent / "lib"
        ggml = ctypes.CDLL(str(lib_dir / f"libggml.so.{_GGML_SOVERSION}"))
        base = ctypes.CDLL(str(lib_dir / f"libggml-base.so.{_GGML_SOVERSION}"))
        vp, cp, size = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t
        self.reg_by_name = _bind(ggml.ggml_backend_reg_by_name, vp, cp)
        self.register = _bind(ggml.ggml_backend_register, None, vp)
        self.dev_count = _bind(ggml.ggml_backend_dev_count, size)
        self.dev_get = _bind(ggml.ggml_backend_dev_get, vp, size)
        self.dev_by_name = _bind(ggml.ggml_backend_dev_by_name, vp, cp)
        self.proc_address = _bind(base.ggml_backend_reg_get_proc_address, vp, vp, cp)
        self.reg_dev_count = _bind(base.ggml_backend_reg_dev_count, size, vp)
        self.reg_dev_get = _bind(base.ggml_backend_reg_dev_get, vp, vp, size)
        self.dev_name = _bind(base.ggml_backend_dev_name, cp, vp)
        self.dev_description = _bind(base.ggml_backend_dev_description, cp, vp)
        self.dev_type = _bind(base.ggml_backend_dev_type, ctypes.c_int, vp)
        self.set_abort_callback = _bind(base.ggml_set_abort_callback, vp, ABORT_CALLBACK)

    def rpc_function(self, name: str, prototype: Any) -> Any:
        """A function the RPC registry exports, e.g. ``ggml_backend_rpc_add_server``."""
        reg = self.reg_by_name(b"RPC")
        address = self.proc_address(reg, name.encode()) if reg else None
        if not address:
            require_rpc()
            raise BackendError(f"The RPC backend of this llama.cpp has no {name}.")
        return prototype(address)


def _bind(function: Any, restype: Any, *argtypes: Any) -> Any:
    function.restype = restype
    function.argtypes = list(argtypes)
    return function


_ggml: _Ggml | None = None


def ggml() -> _Ggml:
    global _ggml
    if _ggml is None:
        _ggml = _Ggml()
    return _ggml


@dataclass(frozen=True)
class Device:
    """A ggml device: the pointer llama.cpp takes, its name and description."""

    pointer: int
    name: str
    description: str

    @classmethod
    def of(cls, pointer: int) -> "Device":
        lib = ggml()
        return cls(pointer, lib.dev_name(pointer).decode(), lib.dev_description(pointer).decode())


def add_servers(endpoints: Sequence[Endpoint]) -> list[Device]:
    """Register each server with ggml and return its devices, in order. Only for a process that
    may die: llama.cpp aborts it when a server is unreachable (``probe`` first)."""
    lib = ggml()
    add = lib.rpc_function("ggml_backend_rpc_add_server",
                           ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p))
    devices: list[Device] = []
    for endpoint in endpoints:
        reg = add(str(endpoint).encode())
        if not reg:
            raise BackendError(f"The RPC server {endpoint} offers no device; start it with "
                               "`specchat rpc-server --device ...` naming one.")
        lib.register(reg)
        devices += [Device.of(lib.reg_dev_get(reg, i)) for i in range(lib.reg_dev_count(reg))]
    return devices


# -- the server --------------------------------------------------------------------------------

def local_devices() -> list[Device]:
    """Every device of this machine's registry (CPU, GPUs...), RPC devices left out."""
    lib = ggml()
    found = [Device.of(lib.dev_get(i)) for i in range(lib.dev_count())]
    return [d for d in found if not d.name.startswith("RPC")]


def server_devices(names: Sequence[str]) -> list[Device]:
    """The devices named (``CPU``, ``CUDA0``...), or by default every accelerator, else the CPU
    (as ``ggml-rpc-server`` chooses); ``BackendError`` lists the available ones."""
    available = local_devices()
    if names:
        by_name = {d.name.lower(): d for d in available}
        unknown = [n for n in names if n.lower() not in by_name]
        if unknown:
            raise BackendError(f"No device {', '.join(unknown)} on this machine; available: "
                               f"{', '.join(d.name for d in available)}.")
        return [by_name[n.lower()] for n in names]
    lib = ggml()
    accelerators = [d for d in available
                    if lib.dev_type(d.pointer) not in (_DEVICE_TYPE_CPU, _DEVICE_TYPE_ACCEL)]
    return accelerators or [d for d in available if lib.dev_type(d.pointer) == _DEVICE_TYPE_CPU]


def check_server_host(host: str, unauthenticated_network: bool = False) -> None:
    """ggml's server binds an IPv4 address given as digits (it uses ``inet_addr``); one off
    loopback only with ``unauthenticated_network`` (the protocol has no authentication)."""
    try:
        address = ipaddress.IPv4Address(host)
    except ValueError:
        raise BackendError(f"--host must be an IPv4 address of this machine, like 127.0.0.1 or "
                           f"0.0.0.0 (all), got {host!r}.") from None
    if not address.is_loopback and not unauthenticated_network:
        raise BackendError(f"specchat rpc-server listens on {host} only with "
                           f"--unauthenticated-network. {SECURITY_NOTE}")


def serve(endpoint: Endpoint, threads: int, devices: Sequence[Device]) -> None:
    """Run ggml's RPC server loop on ``endpoint`` for ``devices``; returns only if it could not
    listen (the caller says so). One client at a time; each connection starts with fresh buffers."""
    start = ggml().rpc_function("ggml_backend_rpc_start_server", ctypes.CFUNCTYPE(
        None, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t,
        ctypes.POINTER(ctypes.c_void_p)))
    pointers = (ctypes.c_void_p * len(devices))(*(d.pointer for d in devices))
    start(str(endpoint).encode(), None, threads, len(devices), pointers)


def serve_command(host: str, port: int, threads: int | None, device_names: list[str],
                  unauthenticated_network: bool = False) -> int:
    """`specchat rpc-server`: ggml's RPC server loop on ``host:port``, in the foreground until
    killed (Ctrl-C); 1 when it could not listen. An address off loopback needs
    ``unauthenticated_network`` (``check_server_host``)."""
    check_server_host(host, unauthenticated_network)
    require_rpc()
    endpoint = Endpoint(host, port)
    devices = server_devices(device_names)
    threads = threads or available_cores()
    print(f"specchat rpc-server on {endpoint}: {', '.join(d.name for d in devices)}, "
          f"{threads} threads. {SECURITY_NOTE}", file=sys.stderr, flush=True)
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # the C loop never returns to Python's handler
    serve(endpoint, threads, devices)
    print(f"specchat rpc-server: could not listen on {endpoint}: the port is in use or the "
          "address is not one of this machine's. Pick another --port or --host.", file=sys.stderr)
    return 1
