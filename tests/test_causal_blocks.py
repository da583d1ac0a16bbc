"""The CPU flash kernel under is_causal skips whole key blocks of 512 (tdiag/plan/program.py
`sdpa_causal_block`): a query block visits every key block that starts at or before its last
row, so up to N = 512 the kernel computes every score entry, and the time model prices a causal
SDPA as a plain one there (docs/results/bench-cpu/time-model, section 9)."""

import pytest
from conftest import DESIGNS

import tdiag
from tdiag import device
from tdiag.plan.footprint import footprint
from tdiag.plan.program import BATCH_SIZE, executed_flops
from tdiag.plan.timing import op_time

ARITHMETIC_ONLY = device.DeviceModel("toy", 1e9, 1e15, 0.0)


def mhsa(causal: bool, n: int):
    design = tdiag.load(DESIGNS / "mhsa.td", F=256, H=4)
    return (design.with_causal_mask() if causal else design).plan(N=n, objective="flops")


def kernel_share(plan) -> float:
    """The kernel's FLOPs over the dense ones, for the plan's one SDPA step."""
    (step,) = [s for s in plan.steps if s.kind == "sdpa"]
    dense, kernel = (
        float(plan.graph.evaluate(f, N=plan.sizes["N"]).subs(BATCH_SIZE, 1)) for f in (step.flops, executed_flops(step))
    )
    return kernel / dense


def sdpa_seconds(plan) -> float:
    """The predicted seconds of the plan's SDPA step on a device where arithmetic alone counts."""
    records = footprint(plan).steps
    (k,) = [k for k, s in enumerate(plan.steps) if s.kind == "sdpa"]

    def number(expr):
        return float(plan.graph.evaluate(expr, N=plan.sizes["N"]).xreplace({BATCH_SIZE: 1}))

    return op_time(ARITHMETIC_ONLY, plan.steps[k], records[k], number)


@pytest.mark.parametrize("n", [256, 512])
def test_a_causal_sdpa_within_one_key_block_computes_every_entry(n):
    assert kernel_share(mhsa(True, n)) == pytest.approx(1.0)


@pytest.mark.parametrize(("n", "share"), [(1024, 0.75), (2048, 0.625), (4096, 0.5625)])
def test_a_causal_sdpa_skips_the_key_blocks_above_each_query_block(n, share):
    assert kernel_share(mhsa(True, n)) == pytest.approx(share)


def test_a_causal_sdpa_at_n_512_is_timed_as_the_plain_one():
    assert sdpa_seconds(mhsa(True, 512)) == pytest.approx(sdpa_seconds(mhsa(False, 512)))


def test_a_causal_sdpa_at_n_2048_is_timed_below_the_plain_one_by_its_skipped_blocks():
    assert sdpa_seconds(mhsa(True, 2048)) / sdpa_seconds(mhsa(False, 2048)) == pytest.approx(0.625)


def test_the_global_head_form_at_n_512_is_credited_with_no_skipped_block():
    plan = tdiag.load(DESIGNS / "hard_fish.td").with_causal_mask().plan(N=512, objective="memory")
    step = next(s for s in plan.steps if "global-head form" in s.description)
    assert plan.graph.evaluate(step.kernel_flops, **plan.sizes) == plan.graph.evaluate(step.flops, **plan.sizes)
