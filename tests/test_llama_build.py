"""The llama-cpp-python build script: the AMX fixes go in exactly where they belong, once."""

from __future__ import annotations

from pathlib import Path

import pytest

from chatapp.backends import llama_build
from chatapp.backends.llama_build import (
    AMX_ANCHOR,
    AMX_FIX,
    MMQ_PATH,
    RELOAD_ANCHOR,
    RELOAD_FIX,
    BuildError,
    apply_amx_fix,
)

CONFIG_INIT = ("inline void ggml_tile_config_init(void) {\n"
               "    static thread_local bool done = false;\n\n"
               + RELOAD_ANCHOR +
               "\n    alignas(64) tile_config_t tc = {};\n"
               "    tc.palette_id = 1;\n"
               + AMX_ANCHOR +
               "    done = true;\n}\n")


def source_tree(tmp_path: Path, text: str) -> Path:
    mmq = tmp_path / MMQ_PATH
    mmq.parent.mkdir(parents=True)
    mmq.write_text(text)
    return tmp_path


def test_the_fix_goes_right_before_the_tile_configuration_is_loaded(tmp_path: Path) -> None:
    tree = source_tree(tmp_path, CONFIG_INIT)
    apply_amx_fix(tree)
    lines = (tree / MMQ_PATH).read_text().splitlines(keepends=True)
    at = lines.index(AMX_ANCHOR)
    assert lines[at - 1] == AMX_FIX
    assert '"m"(tc)' in lines[at - 1]  # the asm reads the whole configuration
    text = (tree / MMQ_PATH).read_text()
    assert RELOAD_ANCHOR not in text and "return" not in text  # loaded at every call
    assert RELOAD_FIX in text
    apply_amx_fix(tree)  # a second run changes nothing
    assert (tree / MMQ_PATH).read_text() == text


@pytest.mark.parametrize("text", ["no tile configuration here\n", CONFIG_INIT + CONFIG_INIT,
                                  CONFIG_INIT.replace(RELOAD_ANCHOR, "")])
def test_another_llama_cpp_is_refused_rather_than_patched_blindly(tmp_path: Path, text) -> None:
    tree = source_tree(tmp_path, text)
    with pytest.raises(BuildError, match="not the llama.cpp the fixes were written for"):
        apply_amx_fix(tree)
    assert (tree / MMQ_PATH).read_text() == text


def test_an_sdist_with_another_checksum_is_not_built(tmp_path: Path, monkeypatch) -> None:
    def fake_download(command, check):
        (tmp_path / llama_build.SDIST_NAME).write_bytes(b"not the pinned sdist")

    monkeypatch.setattr(llama_build.subprocess, "run", fake_download)
    with pytest.raises(BuildError, match="not the pinned"):
        llama_build.fetch_sdist(tmp_path)


def test_the_readme_installs_llama_cpp_python_with_this_script() -> None:
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    install = readme.split("## Install and run", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    assert llama_build.FULL_BUILD_COMMAND in install
    assert install.index("torch==") < install.index(llama_build.FULL_BUILD_COMMAND)
