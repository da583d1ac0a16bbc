"""The whole-plan guard of the `time` objective (tdiag/plan/objective.py): the plans of the
`flops` and `memory` objectives are built too and the fastest whole plan on the planning device
is taken. The device is the nominal CPU, fixed through the TDIAG_DEVICE_* figures (conftest.py);
nothing here runs a model."""

import pytest
from conftest import DESIGN_FILES, DESIGNS

import tdiag
from tdiag.cli import main
from tdiag.device import NOMINAL_CPU, planning_device
from tdiag.plan.objective import fastest_plan
from tdiag.plan.timing import plan_time


def designs():
    for path in DESIGN_FILES:
        for causal in (False, True):
            yield pytest.param(path, causal, id=f"{path.stem}{'-causal' if causal else ''}")


def load(path, causal: bool) -> tdiag.Design:
    design = tdiag.load(path)
    return design.with_causal_mask() if causal else design


@pytest.mark.parametrize(("path", "causal"), designs())
@pytest.mark.parametrize("n", [128, 1024])
def test_the_time_plan_is_never_estimated_slower_than_the_flops_or_memory_plan(path, causal, n):
    design = load(path, causal)
    sizes = {k: n for k, size in design.graph.sizes.items() if size.is_free}
    time_plan = design.plan(objective="time", **sizes)
    for objective in ("flops", "memory"):
        other = design.plan(objective=objective, **sizes)
        assert plan_time(time_plan, NOMINAL_CPU) <= plan_time(other, NOMINAL_CPU) * (1 + 1e-12), objective


def test_a_time_plan_records_its_device_and_the_compared_plans_estimates():
    plan = tdiag.load(DESIGNS / "hard_fish.td").plan(N=512, objective="time")
    assert plan.device == planning_device()
    assert set(plan.compared) == {"time", "flops", "memory"}
    assert plan.compared["flops"] == plan_time(
        tdiag.load(DESIGNS / "hard_fish.td").plan(N=512, objective="flops"), plan.device
    )


def test_a_flops_plan_records_no_device():
    assert tdiag.load(DESIGNS / "hard_fish.td").plan(N=512, objective="flops").device is None


def test_a_design_without_a_choice_the_objective_decides_compares_no_other_plan():
    plan = tdiag.load(DESIGNS / "sigmoid_attention.td").plan(N=512, objective="time")
    assert list(plan.compared) == ["time"]


def plans(name: str, causal: bool = False):
    design = load(DESIGNS / f"{name}.td", causal)
    return {o: design.plan(N=512, objective=o) for o in ("time", "flops", "memory")}


def test_the_fastest_whole_plan_is_taken_and_said_so():
    """Offered the memory plan of hard_fish as the time plan (the SDPA form with folded query
    legs, estimated slower), the guard takes the flops plan and notes it."""
    built = plans("hard_fish")
    slow, fast = built["memory"], built["flops"]
    assert plan_time(slow, NOMINAL_CPU) > plan_time(fast, NOMINAL_CPU)
    taken = fastest_plan(slow, NOMINAL_CPU, ["flops"], lambda objective: fast)
    assert taken is fast and "whole plan: the flops objective's plan taken" in taken.lowered[-1]


def test_on_a_tie_the_time_plan_is_kept():
    built = plans("mhsa")
    assert fastest_plan(built["time"], NOMINAL_CPU, ["flops"], lambda objective: built["flops"]) is built["time"]


def test_plan_prints_the_device_and_the_compared_plans(capsys):
    assert main(["plan", str(DESIGNS / "hard_fish.td"), "--at", "N=512"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == f"planning device: {NOMINAL_CPU.describe()}"
    assert (
        lines[2].startswith("time objective, a step at B=8: ")
        and "flops plan" in lines[2]
        and "memory plan" in lines[2]
    )


def test_a_design_whose_boxes_cannot_be_fused_compares_the_flops_plan_alone():
    """lfish's boxes match no fused attention: `memory` would choose as `flops` does."""
    plan = tdiag.load(DESIGNS / "lfish.td").with_causal_mask().plan(N=256, objective="time")
    assert list(plan.compared) == ["time", "flops"]


def test_the_objective_names_live_in_a_core_module_and_tdiag_design_still_gives_them():
    from tdiag import design, objectives, planning
    from tdiag.plan import build

    names = (objectives.OBJECTIVES, objectives.DEFAULT_OBJECTIVE, objectives.COST_OBJECTIVE)
    assert (design.OBJECTIVES, design.DEFAULT_OBJECTIVE, design.COST_OBJECTIVE) == names
    assert build.OBJECTIVES is objectives.OBJECTIVES and planning.DEFAULT_OBJECTIVE is objectives.DEFAULT_OBJECTIVE
    assert {objectives.DEFAULT_OBJECTIVE, objectives.COST_OBJECTIVE} <= set(objectives.OBJECTIVES)
