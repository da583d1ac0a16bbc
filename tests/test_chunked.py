"""Causal linear attention in chunks (tdiag/plan/chunked.py; MGK P12, spec mgk §6.6): the chunk
size C chosen by the objective on trial and named in the plan's notes, the free factors placed
by cost, the exclusive prefix sum over chunks, and values and gradients equal to the masked
quadratic form (the reference evaluator) at any length: a multiple of C or not, shorter than
one chunk. Devices are fixed through the TDIAG_DEVICE_* figures (as in test_timing.py)."""

import re

import pytest
import torch
from conftest import DESIGNS

import tdiag
from tdiag.codegen import CALLED_HELPERS

TOL = 1e-10
CHUNKED = ["lfish", "mlk", "performer", "smlk", "thsa_elu"]  # the bundled designs that take the form


def memory_bound(cpu) -> None:
    cpu(1e13, 1e9, 0.0)


def causal(name: str, **sizes) -> tdiag.Design:
    small = {"F": 8, "H": 2} | ({"D": 4} if "mlk" in name else {})
    return tdiag.load(DESIGNS / f"{name}.td", **(small | sizes)).with_causal_mask()


def chunk_note(plan) -> str:
    (note,) = [note for note in plan.lowered if "in chunks of C = " in note]
    return note


def chunk_size(plan) -> int:
    return int(re.search(r"in chunks of C = (\d+)", chunk_note(plan)).group(1))


def tried(plan) -> list[int]:
    return [int(c) for c in re.findall(r"(\d+): [\d.,e+-]+", chunk_note(plan).split(" at C = ")[1])]


def test_the_plan_note_names_the_chunk_size_taken_and_the_cost_of_each_size_tried():
    plan = causal("mlk").plan(N=1024, objective="flops")
    note = chunk_note(plan)
    assert note.startswith("causal prefix sums over n in chunks of C = ")
    assert tried(plan) == [4, 8, 16, 32, 64, 128, 256]
    assert any(step.op.__class__.__name__ == "SplitChunks" and step.op.size == chunk_size(plan) for step in plan.steps)


def test_counting_flops_the_largest_chunk_size_within_a_tenth_of_the_fewest_flops_is_taken():
    """FLOPs fall as C shrinks to a few positions, where each chunk's small matmuls run slowly."""
    plan = causal("lfish", F=64, H=4).plan(N=1024, objective="flops")
    costs = {
        int(c): int(v.replace(",", ""))
        for c, v in re.findall(r"(\d+): ([\d,]+)", chunk_note(plan).split(" at C = ")[1])
    }
    assert chunk_size(plan) == max(c for c, v in costs.items() if v <= 1.1 * min(costs.values())) > min(costs)


def test_by_time_the_largest_chunk_size_within_a_twentieth_of_the_least_estimate_is_taken(cpu):
    """Many small chunks cost more than the roofline sees (an add per chunk, small matmuls)."""
    cpu(5.57e10, 1.12e10, 1e-6)
    plan = causal("performer", F=64, H=4).plan(N=1024, objective="time")
    costs = {int(c): float(v) for c, v in re.findall(r"(\d+): ([\d.e+-]+)", chunk_note(plan).split(" at C = ")[1])}
    least = min(costs, key=costs.get)
    assert chunk_size(plan) == max(c for c, v in costs.items() if v <= 1.05 * costs[least]) != least


def test_no_chunk_size_above_the_planned_length_is_tried():
    assert tried(causal("mlk").plan(N=16, objective="flops")) == [4, 8, 16]


def test_a_device_where_memory_traffic_dominates_takes_larger_chunks_than_one_where_arithmetic_does(cpu):
    def design() -> tdiag.Design:  # a fresh one: a design caches its plans by size, not by device
        return tdiag.load(DESIGNS / "mlk.td", F=64, H=2, D=16).with_causal_mask()

    cpu(1e9, 1e12, 0.0)
    arithmetic = chunk_size(design().plan(N=1024, objective="time"))
    memory_bound(cpu)
    memory = chunk_size(design().plan(N=1024, objective="time"))
    assert arithmetic == 4 < 32 <= memory


def test_only_the_chunk_count_of_the_size_taken_is_bound_at_run_time():
    plan = causal("lfish").plan(N=1024, objective="flops")
    assert [chunk.size for chunk in plan.chunks] == [chunk_size(plan)]
    assert len(re.findall(r"^\s+chunks_\d+_?\d* = ", causal("lfish").source(N=1024, objective="flops"), re.M)) == 1


def test_a_core_common_to_both_parts_of_a_causal_thsa_denominator_is_applied_once_to_their_sum():
    """THSA-elu's denominator Σ_{m ≤ n} Σ_s C[r s] φ(Q)[n s] φ(K)[m s]: the core C[r s] carries
    neither position, so it multiplies the sum of the within- and across-chunk parts once."""
    plan = causal("thsa_elu", F=64, H=4).plan(N=1024, objective="flops")
    names = [step.out.var for step in plan.steps]
    numerator = next(k for k, name in enumerate(names) if name.startswith("numerator"))
    denominator = next(k for k, name in enumerate(names) if name.startswith("denominator"))
    assert len([step for step in plan.steps[numerator:denominator] if "self.C[" in step.description]) == 1


def test_a_causal_linear_box_takes_numerator_and_denominator_from_one_chunked_pass_over_values_and_ones():
    """Σ_{m ≤ n} x [v, 1] holds the numerator and, in its last entry, the denominator: one
    prefix sum, one triangle, and the quotient reading the last column."""
    plan = causal("lfish", F=64, H=4).plan(N=1024, objective="flops")
    (ones,) = [step for step in plan.steps if type(step.op).__name__ == "OnesColumn"]
    (ratio,) = [step.op for step in plan.steps if type(step.op).__name__ == "Ratio"]
    assert [step.kind for step in plan.steps].count("prefix") == 1
    assert [type(step.op).__name__ for step in plan.steps].count("Triangle") == 1
    assert ratio.column is not None and ratio.denominator.value == ratio.numerator
    assert plan.leg_sizes[ratio.numerator.legs[ratio.column]] == plan.leg_sizes[ones.op.x.legs[ones.op.axis]] + 1


def test_a_denominator_column_on_an_inner_axis_is_read_there(cpu, monkeypatch):
    """lfish with its head mixing placed after the chunked sums gets a numerator whose widened
    value leg is not its last axis: the quotient divides by the last entry along that axis."""
    from tdiag.plan import chunked

    monkeypatch.setattr(chunked, "PLACEMENTS", ("after",))
    memory_bound(cpu)
    design = causal("lfish")
    module = design.module(dtype=torch.float64, N=64, objective="flops")
    (ratio,) = [step.op for step in module.tdiag_plan.steps if type(step.op).__name__ == "Ratio"]
    assert ratio.column < len(ratio.numerator.legs) - 1
    reference = design.module(impl="reference", dtype=torch.float64, N=37)
    reference.load_state_dict(module.state_dict())
    x = torch.randn(2, 37, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    assert torch.allclose(module(x), reference(x), atol=TOL, rtol=0)


def test_a_causal_box_whose_value_side_has_no_leg_of_its_own_keeps_a_separate_denominator():
    """THSA-elu's values are indexed by r, a leg of the content's core C[r s]: no column to widen."""
    plan = causal("thsa_elu", F=64, H=4).plan(N=1024, objective="flops")
    assert not any(type(step.op).__name__ == "OnesColumn" for step in plan.steps)
    assert [step.kind for step in plan.steps].count("prefix") == 2


@pytest.mark.parametrize("n", [3, 5, 37], ids=["shorter-than-a-chunk", "one-partial-chunk", "not-a-multiple"])
@pytest.mark.parametrize("name", CHUNKED)
def test_values_and_gradients_equal_the_masked_quadratic_form(cpu, name, n):
    memory_bound(cpu)
    design = causal(name)
    module = design.module(dtype=torch.float64, N=64, objective="time")
    assert chunk_size(module.tdiag_plan) > 3 and any(step.kind == "prefix" for step in module.tdiag_plan.steps)
    reference = design.module(impl="reference", dtype=torch.float64, N=n)
    reference.load_state_dict(module.state_dict())
    x = torch.randn(2, n, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    outputs = []
    for m in (module, reference):
        xg = x.clone().requires_grad_()
        y = m(xg)
        y.backward(torch.cos(torch.arange(y.numel(), dtype=torch.float64)).reshape(y.shape))
        outputs.append((y.detach(), xg.grad, {k: p.grad for k, p in m.named_parameters()}))
    (y, dx, dp), (y_ref, dx_ref, dp_ref) = outputs
    assert torch.allclose(y, y_ref, atol=TOL, rtol=0)
    assert torch.allclose(dx, dx_ref, atol=TOL, rtol=0)
    assert all(torch.allclose(dp[k], dp_ref[k], atol=TOL, rtol=0) for k in dp)


def earlier_helper():
    namespace = {"torch": torch}
    exec(CALLED_HELPERS["_earlier"], namespace)
    return namespace["_earlier"]


@pytest.mark.parametrize("dim", [0, 1, 2])
def test_the_exclusive_prefix_sum_over_chunks_is_the_sum_of_the_chunks_before_each(dim):
    x = torch.randn(4, 5, 3, dtype=torch.float64)
    assert torch.allclose(earlier_helper()(x, dim), x.cumsum(dim) - x, atol=TOL, rtol=0)


def test_the_exclusive_prefix_sum_over_chunks_passes_gradcheck():
    x = torch.randn(2, 6, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: earlier_helper()(t, 1), (x,))


def test_a_causal_box_whose_chunked_form_is_tried_and_not_taken_binds_no_chunk_count(cpu):
    cpu(1e11, 1e10, 1.0)  # each op dear: the materialized box wins
    design = tdiag.load(DESIGNS / "mlk.td", F=64, H=2, D=16).with_causal_mask()
    plan = design.plan(N=1024, objective="time")
    assert not any(step.kind == "prefix" for step in plan.steps)
    assert plan.chunks == [] and "chunks_" not in design.source(N=1024, objective="time")
