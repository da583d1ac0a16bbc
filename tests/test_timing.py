"""The `time` objective: plans chosen by a roofline estimate of a training step on the planning
device (tdiag/plan/timing.py, tdiag/device.py). Devices are fixed through the TDIAG_DEVICE_*
figures so that the choices do not depend on the machine the tests run on."""

import pytest
import torch
from conftest import DESIGNS

import tdiag
from tdiag import device
from tdiag.cli import main

TOL = 1e-10


def causal_mlk() -> tdiag.Design:
    return tdiag.load(DESIGNS / "mlk.td", F=64, H=2, D=16).with_causal_mask()


def chunked(plan) -> bool:
    return any(step.kind == "prefix" for step in plan.steps)


def test_a_device_where_each_op_costs_a_lot_takes_the_materialized_causal_box(cpu):
    cpu(1e11, 1e10, 1.0)
    assert not chunked(causal_mlk().plan(N=1024, objective="time"))


def test_a_device_where_arithmetic_dominates_takes_the_chunked_causal_order(cpu):
    cpu(1e9, 1e12, 0.0)
    assert chunked(causal_mlk().plan(N=1024, objective="time"))


def test_the_flops_objective_does_not_depend_on_the_device(cpu):
    cpu(1e11, 1e10, 1.0)
    assert chunked(causal_mlk().plan(N=1024, objective="flops"))


@pytest.mark.parametrize(("name", "causal"), [("mgk", False), ("smgk", True), ("mlk", True), ("fish", False)])
def test_a_plan_for_time_computes_the_same_function(cpu, name, causal):
    cpu(1e11, 1e10, 2e-5)
    sizes = {"mgk": {"F": 8, "H": 2, "D": 3}, "smgk": {"F": 8, "H": 2, "D": 3}, "mlk": {"F": 8, "H": 2, "D": 3}}
    design = tdiag.load(DESIGNS / f"{name}.td", **sizes.get(name, {"F": 8, "H": 4, "M": 2}))
    design = design.with_causal_mask() if causal else design
    module = design.module(dtype=torch.float64, N=16, objective="time").eval()
    reference = design.module(dtype=torch.float64, N=16, impl="reference").eval()
    reference.load_state_dict(module.state_dict())
    x = torch.randn(2, 16, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(module(x), reference(x), atol=TOL, rtol=0)


def test_the_planning_device_is_a_gpu_s_data_sheet_when_named(monkeypatch):
    monkeypatch.setenv(device.DEVICE_ENV, "NVIDIA H100 80GB HBM3")
    for variable in (device.PEAK_FLOPS_ENV, device.BANDWIDTH_ENV, device.OVERHEAD_ENV):
        monkeypatch.delenv(variable, raising=False)
    assert device.planning_device().name == "H100"


def test_the_planning_device_without_a_measurement_is_the_nominal_cpu(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv(device.DEVICE_ENV, raising=False)
    for variable in (device.PEAK_FLOPS_ENV, device.BANDWIDTH_ENV, device.OVERHEAD_ENV):
        monkeypatch.delenv(variable, raising=False)
    assert device.planning_device() == device.NOMINAL_CPU


def test_a_refusal_under_time_says_the_rewrite_is_estimated_slower(cpu, capsys):
    cpu(1e11, 1e10, 1.0)
    main(["plan", str(DESIGNS / "mlk.td"), "--causal", "--at", "N=1024", "--objective", "time"])
    out = capsys.readouterr().out
    assert "linear-time order refused: is estimated slower than the materialized box" in out


def test_modules_are_planned_for_time_unless_told(cpu):
    cpu(1e11, 1e10, 1.0)  # a device where ops cost a lot: the time plan differs from the FLOPs plan
    design = causal_mlk()
    assert design.plan(N=1024) is design.plan(N=1024, objective="time")
    assert not chunked(design.plan(N=1024)) and chunked(design.plan(N=1024, objective="flops"))


def test_cost_reports_the_plan_of_fewest_flops_whatever_the_device(cpu):
    cpu(1e11, 1e10, 1.0)
    design = causal_mlk()
    assert design.cost(N=1024).flops == design.cost(N=1024, objective="flops").flops
    assert design.cost(N=1024).flops != design.cost(N=1024, objective="time").flops


def test_a_step_of_a_calibrated_kind_costs_its_factor_times_the_roofline():
    from tdiag.plan.program import Normalize, Operand, Value
    from tdiag.plan.timing import op_kind, step_time

    model = device.DeviceModel("toy", 1e9, 1e9, 0.0, kinds=(("normalize", 4.0),))
    normalize = Normalize(Operand(Value("x", ("n", "m"))), 1, 0)
    assert op_kind(normalize) == "normalize"
    assert step_time(model, 0.0, 1e9, "normalize") == pytest.approx(4 * step_time(model, 0.0, 1e9))


def test_a_device_whose_normalize_is_dear_takes_the_chunked_causal_order(cpu, monkeypatch):
    """The materialized normalize box pays its division's backward (measured ~4x its roofline
    on the project CPU): priced so, the chunked linear-time order wins at a length where the
    plain roofline keeps the materialized box."""
    from tdiag.plan import context  # where the lowering finds its planning device

    def planning_device_with(normalize: float):
        return lambda: device.DeviceModel("cpu", 1e11, 1e10, 1e-6, kinds=(("normalize", normalize),))

    cpu(1e11, 1e10, 1e-6)
    monkeypatch.setattr(context, "planning_device", planning_device_with(1.0))
    assert not chunked(causal_mlk().plan(N=96, objective="time"))
    monkeypatch.setattr(context, "planning_device", planning_device_with(4.0))
    assert chunked(causal_mlk().plan(N=96, objective="time"))


# ---- fused attention in the time model ---------------------------------------------------------


def attention_time(plan, model):
    """The estimated seconds of the plan's one SDPA step, and its inputs to the roofline."""
    from tdiag.plan.footprint import footprint
    from tdiag.plan.program import BATCH_SIZE
    from tdiag.plan.timing import op_time

    records = footprint(plan).steps
    (k,) = [k for k, s in enumerate(plan.steps) if s.kind == "sdpa"]

    def number(expr):
        return float(plan.graph.evaluate(expr, **{"N": plan.sizes["N"]}).xreplace({BATCH_SIZE: plan.sizes["B"]}))

    return op_time(model, plan.steps[k], records[k], number), plan.steps[k], records[k], number


def test_a_causal_sdpa_is_timed_for_the_flops_its_kernel_does():
    model = device.DeviceModel("toy", 1e9, 1e15, 0.0)  # arithmetic alone counts
    plain = tdiag.load(DESIGNS / "mhsa.td", F=256, H=4).plan(N=1024, objective="flops")
    causal = tdiag.load(DESIGNS / "mhsa.td", F=256, H=4).with_causal_mask().plan(N=1024, objective="flops")
    assert attention_time(causal, model)[0] / attention_time(plain, model)[0] == pytest.approx((1024 + 512) / 2048)


def test_a_fused_attention_pays_the_softmax_of_its_entries():
    """The kernel stores no scores but still exponentiates and normalizes each, forward and backward."""
    from tdiag.plan.timing import softmax_seconds, step_time

    model = device.DeviceModel("toy", 1e11, 1e10, 0.0, kinds=(("softmax", 2.0),))
    plan = tdiag.load(DESIGNS / "mhsa.td", F=256, H=4).plan(N=512, objective="flops")
    seconds, step, record, number = attention_time(plan, model)
    roofline = step_time(model, number(step.flops), number(record.moved))
    assert seconds == pytest.approx(roofline + softmax_seconds(model, number(step.entries)))
    assert softmax_seconds(model, 1e6) == pytest.approx(2 * softmax_seconds(device.DeviceModel("toy", 1e11, 1e10), 1e6))


def test_sdpa_on_its_math_kernel_adds_its_arithmetic_and_its_traffic():
    from tdiag.plan.timing import softmax_seconds, step_time

    model = device.DeviceModel("toy", 1e11, 1e10, 0.0)
    plan = tdiag.load(DESIGNS / "single_head.td", F=256).plan(N=512, objective="memory")  # 3-D: the math kernel
    seconds, step, record, number = attention_time(plan, model)
    assert record.kernel.startswith("math") and record.math_kernel  # the time model reads the field
    arithmetic, traffic = step_time(model, number(step.flops), 0.0), step_time(model, 0.0, number(record.moved))
    assert seconds == pytest.approx(arithmetic + traffic + softmax_seconds(model, number(step.entries)))


def test_a_causal_sdpa_on_its_math_kernel_is_timed_for_the_dense_flops():
    """The math kernel masks the causal product and skips no block (head sizes of q and v
    differ here: no flash kernel), so causal costs what plain does."""
    model = device.DeviceModel("toy", 1e9, 1e15, 0.0)  # arithmetic alone counts
    single = tdiag.load(DESIGNS / "single_head.td", F=256)
    plain = attention_time(single.plan(N=512, objective="memory"), model)
    causal = attention_time(single.with_causal_mask().plan(N=512, objective="memory"), model)
    assert causal[2].kernel.startswith("math") and causal[1].kernel_flops is not None
    assert causal[0] == pytest.approx(plain[0])


# ---- sums over short innermost rows ------------------------------------------------------------


def test_a_sum_over_an_innermost_axis_of_few_entries_is_a_short_row():
    from tdiag.plan.footprint import row_extent

    assert row_extent((4, 512, 512, 2), (524288, 1024, 2, 1), (3,)) == 2
    assert row_extent((4, 512, 2, 512), (524288, 1024, 512, 1), (2,)) == 0  # an outer axis: vector adds
    assert row_extent((4, 512, 512), (262144, 512, 1), (2,)) == 0  # a long row runs at the bandwidth
    assert row_extent((4, 512, 4, 2), (4096, 8, 2, 1), (2, 3)) == 8  # two innermost axes, one row of 8


SHORT_ROWS = """design short_rows
size N, F = 8, R = 2
input X[n: N, f: F]
param W[f: F, g: F, r: R] = normal(std = 1)
Y[n g] = exp(X[n f] W[f g r])
output Y
"""  # Σ over r of two entries, innermost: the kept leg g before it is short as well


def short_row_steps(plan) -> list[tuple[str, int]]:
    from tdiag.plan.footprint import footprint

    records = footprint(plan).steps
    return [(s.description, r.short_rows) for s, r in zip(plan.steps, records, strict=True) if r.short_rows]


def test_a_sum_over_short_innermost_rows_is_recorded_by_the_footprint():
    assert short_row_steps(tdiag.loads(SHORT_ROWS).plan(N=4096, B=1)) == [("Σ over r", 2)]


def test_the_materialized_mgk_box_is_laid_out_with_its_keys_before_the_positions():
    """MGK's softmax over m r: r (M = 2 keys) goes before m, so Σ over r adds rows of N entries
    instead of N² rows of two (layout.py `_summed_placed`)."""
    plan = tdiag.load(DESIGNS / "smgk.td", F=256, H=4).plan(N=256, objective="flops")
    (box,) = [s for s in plan.steps if s.kind == "softmax"]
    assert [leg.split("'")[0] for leg in box.out.legs[-2:]] == ["r", "m"] and short_row_steps(plan) == []


def test_a_device_whose_short_rows_are_slow_prices_them_and_one_without_the_figure_does_not():
    from tdiag.plan.footprint import footprint
    from tdiag.plan.program import BATCH_SIZE
    from tdiag.plan.timing import op_time, short_rows_factor

    plan = tdiag.loads(SHORT_ROWS).plan(N=4096, B=1)
    records = footprint(plan).steps
    (k,) = [k for k, r in enumerate(records) if r.short_rows]

    def number(expr):
        return float(plan.graph.evaluate(expr, N=4096).xreplace({BATCH_SIZE: 1}))

    plain = device.DeviceModel("toy", 1e11, 1e10, 0.0)
    slow = device.DeviceModel("toy", 1e11, 1e10, 0.0, kinds=(("rows", 4.0),))
    assert short_rows_factor(plain, 2, 1e6) == 1.0
    assert short_rows_factor(slow, 2, 1e6) == 4.0 and short_rows_factor(slow, 4, 1e6) == 2.0
    assert short_rows_factor(slow, 16, 1e6) == 1.0
    moved = number(records[k].short_bytes)
    extra = op_time(slow, plan.steps[k], records[k], number) - op_time(plain, plan.steps[k], records[k], number)
    assert extra == pytest.approx(3 * 3 * moved / 1e10)
