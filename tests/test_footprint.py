"""The memory model (tdiag/plan/footprint.py): what the lowered program keeps for backward,
predicted without running it, against what autograd keeps when it runs (tdiag.measure)."""

import itertools

import pytest
import sympy
import torch
from conftest import DESIGN_FILES

import tdiag
from tdiag.measure import saved_for_backward
from tdiag.plan import BATCH_SIZE
from tdiag.plan.footprint import Meta, footprint
from tdiag.plan.program import Matmul
from tdiag.plan.strides import contiguous, elementwise_strides, view_strides

B = 2
SIZES = {"F": 32, "H": 2}


def design_at(path, causal: bool, n: int) -> tdiag.Design:
    """The design at small sizes; N fixed to `n` where the design fixes its length."""
    declared = tdiag.load(path).graph.sizes
    sizes = {k: v for k, v in (SIZES | {"N": n}).items() if k in declared and not declared[k].is_free}
    design = tdiag.load(path, **sizes)
    return design.with_causal_mask() if causal else design


def measured_and_modelled(design: tdiag.Design, n: int, objective: str) -> tuple[int, int]:
    # every run-time length at n (a cross-attention's memory length M too)
    lengths = {"N": n} | {k: n for k, size in design.graph.sizes.items() if size.is_free}
    module = design.module(seed=0, B=B, objective=objective, **lengths)
    torch.manual_seed(0)
    inputs = [
        torch.randn(B, *(int(design.graph.evaluate(a.size, **lengths)) for a in x.axes)) for x in design.graph.inputs
    ]
    report = design.cost(objective=objective, B=B, **lengths)
    return saved_for_backward(module, *inputs).total_bytes, report.saved_bytes_at(B=B, **lengths)


# ---- every bundled design, plain and causal, at two sizes ------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("objective", ["flops", "time"])
@pytest.mark.parametrize("n", [32, 64])
@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
@pytest.mark.parametrize("path", DESIGN_FILES, ids=lambda p: p.stem)
def test_saved_memory_in_the_report_is_within_ten_percent_of_what_autograd_keeps(path, causal, n, objective):
    measured, modelled = measured_and_modelled(design_at(path, causal, n), n, objective)
    assert abs(modelled - measured) <= 0.1 * measured, f"model {modelled:,} vs measured {measured:,} bytes"


def test_an_sdpa_output_is_laid_out_as_its_query_so_a_later_reshape_may_copy():
    """skip_left's time plan feeds SDPA a contiguous (b, heads, n, f) query; the CPU flash kernel
    returns its output in that layout, and the value contraction's reshape then copies it."""
    path = next(p for p in DESIGN_FILES if p.stem == "skip_left")
    measured, modelled = measured_and_modelled(design_at(path, False, 32), 32, "time")
    assert modelled == measured


@pytest.mark.parametrize("name", ["mgk", "smgk", "hard_fish", "mhsa"])
def test_the_memory_objective_plan_keeps_what_the_report_says(name):
    path = next(p for p in DESIGN_FILES if p.stem == name)
    measured, modelled = measured_and_modelled(design_at(path, True, 64), 64, "memory")
    assert abs(modelled - measured) <= 0.1 * measured


def test_peak_memory_is_the_saved_bytes_per_sequence_in_float32_entries():
    report = tdiag.load(next(p for p in DESIGN_FILES if p.stem == "mhsa")).cost(N=256)
    assert report.at(N=256)["peak_memory"] * 4 == report.saved_bytes_at(N=256, B=1)


def test_mhsa_keeps_q_k_v_the_attention_output_and_its_log_sum_exp():
    design = tdiag.load(next(p for p in DESIGN_FILES if p.stem == "mhsa"))
    n, h, d = (design.graph.sizes[s].symbol for s in ("N", "H", "D"))
    assert sympy.simplify(design.cost().peak_memory - (4 * n * h * d + h * n)) == 0


def test_sdpa_at_head_size_one_runs_the_fused_kernel_the_model_expects():
    design = tdiag.load(next(p for p in DESIGN_FILES if p.stem == "heads_only"))
    plan = design.plan(N=64)
    (kernel,) = [fp.kernel for fp in footprint(plan).steps if fp.kernel]
    module = design.module(N=64)
    with torch.profiler.profile() as profile:
        module(torch.randn(1, 64, design.size_values["F"]))
    names = {event.name for event in profile.events()}
    fused = any(name.endswith("_scaled_dot_product_flash_attention_for_cpu") for name in names)
    assert kernel == "flash" and fused


# ---- torch's layout rules, as the model applies them -----------------------------------------


RESHAPES = [
    ((2, 3, 4), (0, 1, 2), (6, 4)),
    ((2, 3, 4), (1, 0, 2), (6, 4)),
    ((2, 3, 4), (0, 2, 1), (2, 12)),
    ((2, 3, 4), (2, 0, 1), (4, 6)),
    ((2, 1, 4), (1, 0, 2), (8,)),
    ((5, 3, 4), (0, 2, 1), (5, 4, 3)),
    ((5, 3, 4), (2, 1, 0), (60,)),
]


@pytest.mark.parametrize(("shape", "permutation", "new"), RESHAPES)
def test_a_reshape_is_a_view_exactly_when_torch_makes_it_one(shape, permutation, new):
    x = torch.empty(shape).permute(*permutation)
    strides = view_strides(x.shape, x.stride(), new)
    reshaped = x.reshape(new)
    assert (strides is not None) == (reshaped.data_ptr() == x.data_ptr() and reshaped._base is not None)
    if strides is not None:
        assert strides == reshaped.stride()


@pytest.mark.parametrize("permutation", list(itertools.permutations(range(3))))
def test_an_elementwise_result_is_laid_out_like_its_operand(permutation):
    x = torch.empty(2, 3, 4).permute(*permutation)
    meta = Meta(tuple(x.shape), x.stride(), 0, False, sympy.Integer(1))
    assert elementwise_strides(tuple(x.shape), [meta]) == (x * 2).stride()


def test_a_broadcast_sum_is_laid_out_like_its_full_operand():
    x, y = torch.empty(2, 3, 4).permute(0, 2, 1), torch.empty(4, 1)
    metas = [Meta(tuple(t.shape), t.stride(), 0, False, sympy.Integer(1)) for t in (x, y)]
    assert elementwise_strides(tuple(x.shape), metas) == (x + y).stride() == (y + x).stride()


def test_contiguous_strides_are_torch_s():
    assert contiguous((2, 3, 4)) == torch.empty(2, 3, 4).stride()


def test_a_matrix_times_a_batched_operand_counts_the_copy_of_its_result():
    """torch computes it as (bᵀ aᵀ)ᵀ and copies the transposed result contiguous (torch 2.13)."""
    plan = tdiag.load(next(p for p in DESIGN_FILES if p.stem == "hard_gfish"), F=32, H=2).plan(N=64, objective="flops")
    records = footprint(plan).steps
    mixes = [
        (step, record)
        for step, record in zip(plan.steps, records, strict=True)
        if isinstance(step.op, Matmul) and not step.op.a.value.is_batched and step.op.b.value.is_batched
    ]
    assert mixes

    def number(expr):
        sizes = {k: v for k, v in plan.sizes.items() if k in plan.graph.sizes}
        return int(plan.graph.evaluate(sympy.sympify(expr), **sizes).xreplace({BATCH_SIZE: 1}))

    for step, record in mixes:
        assert number(record.copies) >= number(sympy.Mul(*(plan.leg_sizes[leg] for leg in step.out.legs)))
