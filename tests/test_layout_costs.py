"""layout = "fast" is the layout measured cheapest on this CPU, AMX or not: the candidates are timed
once per CPU, build and recipe, the choice follows the measured costs, and the default stays
within the fidelity bound whatever is measured."""

from __future__ import annotations

from pathlib import Path

import pytest

import chatapp.assembly.layout_costs as layout_costs
import chatapp.assembly.loader as loader
from chatapp.backends.catalog import CATALOG, ModelSpec
from chatapp.backends.layouts import (
    SHIPPED,
    CpuLayouts,
    Layout,
    LayoutChoice,
    LayoutSetting,
    is_faithful,
    plan_layout,
    relative_cost,
)
from chatapp.settings.config import Config
from tests.test_layouts import CLOSE, COARSE, TARGET_CHOICE

# The AMD EPYC of issue 37 (Zen 3, no AMX): the shipped Q4_K_M evaluates 1/4/16 tokens in 50/122/413
# ms; a coarser layout decodes 1.17x faster there, a Q8_0 slower (more bytes a token).
EPYC = {SHIPPED: {1: 0.050, 4: 0.122, 16: 0.413}, "close": {1: 0.062, 4: 0.140, 16: 0.420},
        "coarse": {1: 0.043, 4: 0.104, 16: 0.350}}


def test_fast_is_the_layout_measured_cheapest_without_amx() -> None:
    plan = plan_layout(TARGET_CHOICE, LayoutSetting.FAST, False, EPYC)
    assert plan.layout == COARSE
    assert "measured here" in plan.reason and "KL 0.0600" in plan.reason  # its fidelity
    assert "shipped 50/122/413" in plan.reason


def test_fast_is_the_shipped_file_where_nothing_measured_is_cheaper() -> None:
    dear = {SHIPPED: EPYC[SHIPPED], "close": {n: 2 * s for n, s in EPYC[SHIPPED].items()},
            "coarse": {n: 1.1 * s for n, s in EPYC[SHIPPED].items()}}
    plan = plan_layout(TARGET_CHOICE, LayoutSetting.FAST, True, dear)
    assert plan.layout is None and "no layout evaluates faster" in plan.reason


def test_fast_follows_the_costs_even_against_the_catalogs_choice() -> None:
    """With AMX the catalog's "fast" is the coarse layout; measured dearer here, it is not."""
    amx = {SHIPPED: {1: 0.050, 4: 0.060, 16: 0.090}, "close": {1: 0.052, 4: 0.030, 16: 0.040},
           "coarse": {1: 0.045, 4: 0.055, 16: 0.085}}
    plan = plan_layout(TARGET_CHOICE, LayoutSetting.FAST, True, amx)
    assert plan.layout == CLOSE and "within the fidelity bound" in plan.reason


def test_auto_stays_within_the_fidelity_bound_whatever_is_measured() -> None:
    for amx in (True, False):
        plan = plan_layout(TARGET_CHOICE, LayoutSetting.AUTO, amx, EPYC)
        assert plan.layout is None or is_faithful(plan.layout.fidelity)
        assert plan.layout == plan_layout(TARGET_CHOICE, LayoutSetting.AUTO, amx).layout


def test_an_incomplete_measurement_leaves_the_catalogs_choice() -> None:
    partial = {SHIPPED: EPYC[SHIPPED], "coarse": EPYC["coarse"]}
    assert plan_layout(TARGET_CHOICE, LayoutSetting.FAST, False, partial).layout is None
    assert plan_layout(TARGET_CHOICE, LayoutSetting.FAST, True, partial).layout == COARSE


def test_one_token_and_batches_weigh_alike() -> None:
    shipped = {1: 0.050, 16: 0.400}
    assert relative_cost({1: 0.025, 16: 0.800}, shipped) == pytest.approx(1.0)
    assert relative_cost({1: 0.045, 16: 0.380}, shipped) < 1.0
    assert relative_cost({1: 0.045}, {4: 0.1}) == float("inf")  # nothing comparable


def test_the_candidates_are_every_layout_either_cpu_would_run() -> None:
    assert TARGET_CHOICE.candidates == [CLOSE, COARSE]
    target = CATALOG["qwen2.5-coder-1.5b"].layouts("target")
    assert target is not None and [c.name for c in target.candidates] == ["q8_0", "q4_0", "q4_k"]


@pytest.fixture
def tiny(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    """A catalog model "tiny" with ``TARGET_CHOICE`` as the target, whose layouts are prepared
    as empty files and timed at the costs ``timings`` gives (counted in ``timed``)."""
    shipped = tmp_path / "tiny.gguf"
    shipped.write_bytes(b"GGUF")
    monkeypatch.setitem(CATALOG, "tiny", ModelSpec("tiny", "Tiny", "tiny.gguf", 4, "0" * 64, "MIT",
                                                   (), as_target=TARGET_CHOICE))
    monkeypatch.setattr(layout_costs, "assembled_path", lambda spec: shipped)
    state = {"shipped": shipped, "timings": EPYC, "timed": [], "build": "build-1"}

    def prepare(source: Path, layout: Layout, progress=None, threads=None) -> Path:
        path = source.with_name(layout.file_name(source.name))
        path.write_bytes(b"GGUF " + layout.name.encode())
        return path

    def time_layout(path: Path, config: Config) -> dict[int, float]:
        name = SHIPPED if path == shipped else path.name.split(".")[-2]
        state["timed"].append(name)
        return dict(state["timings"][name])

    import chatapp.backends.llama_runtime as runtime

    monkeypatch.setattr(layout_costs, "prepare_layout", prepare)
    monkeypatch.setattr(loader, "prepare_layout", prepare)
    monkeypatch.setattr(layout_costs, "time_layout", time_layout)
    monkeypatch.setattr(runtime, "build_identity", lambda: state["build"])
    monkeypatch.setattr(runtime, "amx_in_use", lambda: False)
    return state


def test_the_layouts_are_measured_once_per_cpu_and_build(tiny: dict) -> None:
    config = Config(target="tiny", layout="fast", threads=2)
    messages: list[str] = []
    path = loader.runnable_layout("tiny", "target", tiny["shipped"], config,
                                  lambda message, _: messages.append(message))
    assert path.name == "tiny.coarse.gguf"  # the cheapest measured, without AMX
    assert sorted(tiny["timed"]) == ["close", "coarse", SHIPPED]
    assert any("Measuring" in m and "once" in m for m in messages)
    loader.runnable_layout("tiny", "target", tiny["shipped"], config)
    assert len(tiny["timed"]) == 3  # remembered: not measured again
    assert layout_costs.layout_costs("tiny", "target", config) == EPYC
    tiny["build"] = "build-2"  # another llama.cpp build: measured again
    loader.runnable_layout("tiny", "target", tiny["shipped"], config)
    assert len(tiny["timed"]) == 6


def test_auto_and_shipped_measure_nothing(tiny: dict) -> None:
    for setting in ("auto", "shipped"):
        path = loader.runnable_layout("tiny", "target", tiny["shipped"],
                                      Config(target="tiny", layout=setting))
        assert path == tiny["shipped"]  # no faithful layout without AMX here
    assert tiny["timed"] == []


def test_the_choice_follows_the_costs_measured(tiny: dict) -> None:
    tiny["timings"] = {**EPYC, "close": {1: 0.030, 4: 0.060, 16: 0.200}}
    path = loader.runnable_layout("tiny", "target", tiny["shipped"],
                                  Config(target="tiny", layout="fast"))
    assert path.name == "tiny.close.gguf"


def test_a_recipe_changed_since_is_measured_again(tiny: dict, monkeypatch) -> None:
    config = Config(target="tiny", layout="fast")
    loader.runnable_layout("tiny", "target", tiny["shipped"], config)
    coarser = Layout("coarse", "Q4_1", 20 / 32, COARSE.fidelity)
    choice = LayoutChoice(amx=CpuLayouts(CLOSE, coarser, ""), no_amx=CpuLayouts(None, None, ""))
    monkeypatch.setitem(CATALOG, "tiny", ModelSpec("tiny", "Tiny", "tiny.gguf", 4, "0" * 64,
                                                   "MIT", (), as_target=choice))
    loader.runnable_layout("tiny", "target", tiny["shipped"], config)
    assert tiny["timed"][3:] == ["coarse"]


def test_specchat_models_says_what_was_measured(tiny: dict) -> None:
    from chatapp.assembly.models import _measured_lines

    config = Config(target="tiny", layout="fast")
    [before] = _measured_lines(CATALOG["tiny"], "target", config)
    assert "not measured on this CPU yet" in before and "shipped, close, coarse" in before
    loader.runnable_layout("tiny", "target", tiny["shipped"], config)
    [after] = _measured_lines(CATALOG["tiny"], "target", config)
    assert "measured on this CPU" in after and "coarse 43/104/350" in after
    assert "fast" in loader.layout_plan("tiny", "target", config).reason


@pytest.mark.real_models
@pytest.mark.slow
def test_the_layouts_of_a_real_model_are_timed_through_the_backend(tmp_path: Path,
                                                                    monkeypatch) -> None:
    """SmolLM2 with two candidate layouts: each is prepared, loaded and timed at 1, 4 and 16
    tokens; the second time nothing is timed."""
    from tests.test_layouts import smollm

    shipped = smollm(tmp_path)
    q8 = Layout("q8_0", "Q8_0", 34 / 32, CLOSE.fidelity)
    q4 = Layout("q4_0", "Q4_0", 18 / 32, COARSE.fidelity)
    choice = LayoutChoice(amx=CpuLayouts(q8, q4, ""), no_amx=CpuLayouts(None, q4, ""))
    monkeypatch.setitem(CATALOG, "smol", ModelSpec("smol", "Smol", shipped.name, 1, "0" * 64,
                                                   "MIT", (), as_target=choice))
    config = Config(target="smol", layout="fast", threads=1)
    costs = layout_costs.measure_layouts("smol", "target", shipped, config, lambda m, f: None)
    assert costs is not None and set(costs) == {SHIPPED, "q8_0", "q4_0"}
    for name, seconds in costs.items():
        assert set(seconds) == set(layout_costs.SIZES) and all(s > 0 for s in seconds.values())
    monkeypatch.setattr(layout_costs, "time_layout", lambda path, config: pytest.fail("again"))
    assert layout_costs.measure_layouts("smol", "target", shipped, config,
                                        lambda m, f: None) == costs
