"""Hostile input through the command line (issue 35, items 4 and 12): seeds out of range,
`specchat web`'s secret kept off the browser's command line and its default port accepted,
`rpc-server` off loopback only when told the protocol has no authentication."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from chatapp import web
from chatapp.cli import build_parser, main


@pytest.mark.parametrize("seed", ["-1", "18446744073709551616", "1" * 5000])
def test_a_seed_out_of_range_is_a_usage_error(seed: str, capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["run", "--seed", seed, "hi"])
    assert exited.value.code == 2
    assert "seed" in capsys.readouterr().err


def test_web_takes_its_default_port_zero() -> None:
    assert build_parser().parse_args(["web", "--port", "0"]).port == 0


def test_the_browser_is_opened_without_the_secret_on_its_command_line(monkeypatch) -> None:
    opened: list[str] = []
    monkeypatch.setattr(web.webbrowser, "open", opened.append)
    url = "http://127.0.0.1:8123/s3cretS3cret/"
    folder = web.open_privately(url)
    try:
        [argument] = opened
        assert "s3cretS3cret" not in argument and argument.startswith("file://")
        page = folder / "open.html"
        assert page.as_uri() == argument and url in page.read_text()
        assert stat.S_IMODE(page.stat().st_mode) == 0o600
        assert stat.S_IMODE(Path(folder).stat().st_mode) == 0o700
    finally:
        import shutil

        shutil.rmtree(folder)


@pytest.mark.parametrize("host", ["0.0.0.0", "10.0.0.5"])
def test_rpc_server_off_loopback_needs_the_unauthenticated_network_flag(
        host, capsys, monkeypatch) -> None:
    from chatapp.backends import rpc

    served: list[object] = []  # ggml's loop never runs here, whatever the check says
    monkeypatch.setattr(rpc, "require_rpc", lambda: None)
    monkeypatch.setattr(rpc, "server_devices", lambda names: [])
    monkeypatch.setattr(rpc, "serve", lambda *args: served.append(args))
    status = main(["rpc-server", "--host", host, "--port", "50999"])
    err = capsys.readouterr().err
    assert not served
    assert status != 0 and "--unauthenticated-network" in err and "no authentication" in err
    main(["rpc-server", "--host", host, "--port", "50999", "--unauthenticated-network"])
    assert len(served) == 1
