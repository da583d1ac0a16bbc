"""Integer positions (issue 24): floor, log, real and floor division, min, max and abs in a
gather's position, gathers from computed tensors, and the run-time check of a position read
into an axis of run-time length. Each position is computed by the compiled module and by the
reference evaluator and compared with the same formula in Python integers (its log in float32,
as the language computes a position's real part); the plan makes each position table once and
costs it as elementwise work, never FLOPs."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import DESIGNS

import tdiag

F64 = torch.float64
F, H, N = 4, 2, 9

TABLE = """
design p
size F = 4, H = 2, C = 3, R = 16
size N
input X[n: N, f: F]
param Rel[h: H, r: R] = normal(std = 1)
Y[n m h] = X[n f] X[m f] Rel[h, r = {position}]
output Y
"""


def log32(x: int) -> float:
    return torch.log(torch.tensor(float(x), dtype=torch.float32)).item()


POSITIONS = {  # name: (the position as written, the same in Python at query n and key m)
    "floor_division_rounds_down": ("floor(clamp(m - n, -6, 6) / C) + 2", lambda n, m: max(min(m - n, 6), -6) // 3 + 2),
    "min_max_abs": ("min(abs(m - n), 4) + clamp(m - n, 0, 1) * 5 + min(max(n, m), 6)", None),
    "floor_of_log": (
        "min(floor(log(max(abs(m - n), 1)) * 2), 5)",
        lambda n, m: min(math.floor(log32(max(abs(m - n), 1)) * 2), 5),
    ),
}
POSITIONS["min_max_abs"] = (
    POSITIONS["min_max_abs"][0],
    lambda n, m: min(abs(m - n), 4) + min(max(m - n, 0), 1) * 5 + min(max(n, m), 6),
)


def expected(x: torch.Tensor, rel: torch.Tensor, where) -> torch.Tensor:
    index = torch.tensor([[where(n, m) for m in range(x.shape[-2])] for n in range(x.shape[-2])])
    return torch.einsum("bnf,bmf->bnm", x, x)[..., None] * rel.T[index]


@pytest.mark.parametrize("name", POSITIONS)
def test_position_functions_compute_as_written(name: str):
    text, where = POSITIONS[name]
    design = tdiag.loads(TABLE.format(position=text))
    module = design.module(dtype=F64, seed=3)
    reference = design.module(dtype=F64, seed=3, impl="reference")
    reference.load_state_dict(module.state_dict(), strict=False)
    x = torch.randn(2, N, F, dtype=F64, generator=torch.Generator().manual_seed(1))
    want = expected(x, module.Rel.detach(), where)
    assert torch.equal(module(x), want)
    torch.testing.assert_close(reference(x), want, rtol=0, atol=1e-12)


def test_t5_bucket_position_is_proved_inside_its_table():
    """check bounds T5's log-spaced buckets by interval arithmetic: 0 .. R − 1 at any length."""
    design = tdiag.load(DESIGNS / "t5.td")
    (gather,) = [e for e in _walk(design.graph) if e.kind == "gather"]
    assert gather.checked is None  # proved before anything runs: no run-time check


def _walk(graph):
    from tdiag.ir import walk

    for tensor in graph.tensors.values():
        if tensor.statement is not None:
            yield from walk(tensor.statement.expr)


COMPUTED = """
design c
size F = 4, H = 2, C = 2, R = 2 * C + 1
size N
input X[n: N, f: F]
param W[f: F, h: H, r: R] = normal(std = 1)
T[h r] = X[k f] W[f h r]
Y[n m h] = X[n f] X[m f] T[h, r = clamp(m - n, -C, C) + C]
output Y
"""


def test_gather_reads_a_computed_tensor_per_batch_element():
    design = tdiag.loads(COMPUTED)
    module = design.module(dtype=F64, seed=2)
    reference = design.module(dtype=F64, seed=2, impl="reference")
    reference.load_state_dict(module.state_dict(), strict=False)
    x = torch.randn(3, N, F, dtype=F64, generator=torch.Generator().manual_seed(1))
    table = torch.einsum("bkf,fhr->bhr", x, module.W.detach())
    index = torch.tensor([[max(min(m - n, 2), -2) + 2 for m in range(N)] for n in range(N)])
    want = torch.einsum("bnf,bmf->bnm", x, x)[..., None] * table[:, :, index].permute(0, 2, 3, 1)
    torch.testing.assert_close(module(x), want, rtol=0, atol=1e-12)
    torch.testing.assert_close(reference(x), want, rtol=0, atol=1e-12)


RUNTIME = """
design r
size F = 4, H = 2, C = 5
size N
input X[n: N, f: F]
param W[f: F, h: H] = normal(std = 1)
T[k h] = X[k f] W[f h]
Y[n h] = T[k = min(n, C), h] + X[n f] W[f h]
output Y
"""


@pytest.mark.parametrize("impl", ["compiled", "reference"])
def test_position_past_a_run_time_length_is_a_value_error_naming_the_table(impl: str):
    """min(n, C) reaches C = 5: inside T's axis of N entries only when N > 5, which check cannot
    know, so the module checks it when it runs."""
    module = tdiag.loads(RUNTIME).module(dtype=F64, impl=impl)
    x = torch.randn(2, 6, F, dtype=F64)
    t = x @ module.W.detach()
    index = torch.tensor([min(n, 5) for n in range(6)])
    torch.testing.assert_close(module(x), t[:, index] + t, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match=r"^T\W.*position 5"):
        module(torch.randn(2, 5, F, dtype=F64))


TWICE = """
design t
size F = 4, H = 2, C = 2, R = 2 * C + 1
size N
input X[n: N, f: F]
param Rel[h: H, r: R] = zeros
param Rel2[h: H, r: R] = zeros
Y[n m h] = X[n f] X[m f] + Rel[h, r = clamp(m - n, -C, C) + C] + Rel2[h, r = clamp(m - n, -C, C) + C]
output Y
"""


def test_a_position_table_is_made_once_for_every_gather_that_reads_it():
    plan = tdiag.loads(TWICE).plan(N=16)
    assert [s.kind for s in plan.steps].count("positions") == 1
    assert [s.kind for s in plan.steps].count("gather") == 2


def test_t5_costs_its_buckets_per_offset_and_one_gather_per_score():
    """No FLOPs beyond MHSA's (no one-hot N·N·R contraction). T5's bucket depends on (n, m) only
    through m − n: its 17 operations (clamp(m − n, 0, 1)·NB: 3, min(|m − n|, E): 3, the log
    part: 9, two sums) run once per offset (2N − 1 of them), Rel is read at each offset, and the
    (h, n, m) bias is one gather of that at m − n + N − 1 (two operations per (n, m))."""
    sizes = {"F": 64, "H": 4, "D": 16}
    t5 = tdiag.load(DESIGNS / "t5.td", **sizes)
    mhsa = tdiag.load(DESIGNS / "mhsa.td", **sizes)
    assert t5.cost(N=128).at(N=128)["flops"] == mhsa.cost(N=128).at(N=128)["flops"]
    plan = t5.plan(N=128)
    at = {"N": 128, "H": 4}
    number = lambda e: int(e.subs({v: at[v.name] for v in e.free_symbols}))  # noqa: E731
    positions = [number(s.elementwise) for s in plan.steps if s.kind == "positions"]
    gathers = [number(s.elementwise) for s in plan.steps if s.kind == "gather"]
    assert positions == [17 * 255, 2 * 128**2]
    assert gathers == [4 * 255, 4 * 128**2]


def test_a_position_of_few_operations_is_built_over_both_legs():
    """clamp(m − n, −C, C) + C costs three operations per (n, m) either way: built directly."""
    plan = tdiag.load(DESIGNS / "relative_bias.td").plan(N=64)
    assert [s.kind for s in plan.steps].count("gather") == 1


T5_SIZES = {"F": 8, "H": 2, "D": 4, "R": 8, "MD": 12}


@pytest.fixture(scope="module")
def t5() -> tdiag.Design:
    return tdiag.load(DESIGNS / "t5.td", **T5_SIZES)


def t5_input(n: int = 20) -> torch.Tensor:
    return torch.randn(2, n, 8, dtype=F64, generator=torch.Generator().manual_seed(5))


def test_t5_on_flex_attention_reads_the_buckets_in_its_score_mod(t5):
    """The bucket position is index arithmetic in the score_mod (no (h, n, m) bias is built) and
    equals the SDPA module (eager FlexAttention forward on CPU)."""
    plan = t5.plan(N=20, attention="flex")
    assert "gather" not in [s.kind for s in plan.steps]
    sdpa = t5.module(dtype=F64, seed=4)
    torch.nn.init.normal_(sdpa.Rel)
    flex = t5.module(dtype=F64, seed=4, attention="flex")
    flex.load_state_dict(sdpa.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(flex(t5_input()), sdpa(t5_input()), rtol=0, atol=1e-10)


def test_t5_standalone_file_equals_the_in_process_module(t5, tmp_path):
    from conftest import standalone_module

    generated = standalone_module(t5.source(), "t5_positions_module", tmp_path)
    standalone = generated.T5(seed=7, dtype=F64)
    assert torch.equal(standalone(t5_input()), t5.module(seed=7, dtype=F64)(t5_input()))


def test_t5_under_torch_compile_fullgraph(t5):
    module = t5.module(seed=1)
    torch.nn.init.normal_(module.Rel)
    x = t5_input().float()
    torch.testing.assert_close(torch.compile(module, fullgraph=True, backend="eager")(x), module(x))


def test_t5_gradcheck_through_the_bucket_gathers(t5):
    """The input's and Rel's gradients (Rel's through both gathers: at each offset, then at
    m − n + N − 1)."""
    from conftest import perturbed

    module = t5.module(dtype=F64)
    perturbed(module)

    def run(x: torch.Tensor, rel: torch.Tensor) -> torch.Tensor:
        return torch.func.functional_call(module, {"Rel": rel}, (x,), strict=False)

    x = t5_input(4)[:1].requires_grad_()
    rel = module.Rel.detach().clone().requires_grad_()
    assert torch.autograd.gradcheck(run, (x, rel), eps=1e-6, atol=1e-7)


def _bounds(design: tdiag.Design, length: int) -> tuple[float, float]:
    """check's interval bounds of the design's gather position when every leg runs over
    0 .. length − 1."""
    from tdiag.graph.syntax import position_bounds

    (gather,) = [e for e in _walk(design.graph) if e.kind == "gather"]
    values = {design.graph.sizes[k].symbol: v for k, v in design.size_values.items()}
    return position_bounds(gather.position, lambda leg: length - 1, lambda e: float(e.xreplace(values)))


@pytest.mark.parametrize("name", POSITIONS)
def test_proved_bounds_hold_every_value_the_position_takes(name: str):
    text, where = POSITIONS[name]
    low, high = _bounds(tdiag.loads(TABLE.format(position=text)), N)
    values = [where(n, m) for n in range(N) for m in range(N)]
    assert low <= min(values) and max(values) <= high


def test_t5_bucket_bounds_are_exactly_the_buckets_hf_reads():
    """At a length past max_distance, check's bounds of T5's bucket are 0 .. R − 1, and HF's
    bucket function takes both values: the interval arithmetic is sound and tight here."""
    t5 = pytest.importorskip("transformers.models.t5.modeling_t5")
    low, high = _bounds(tdiag.load(DESIGNS / "t5.td"), 300)
    offsets = torch.arange(300)[None, :] - torch.arange(300)[:, None]
    buckets = t5.T5Attention._relative_position_bucket(offsets, True, 32, 128)
    assert (low, high) == (0, 31) == (buckets.min().item(), buckets.max().item())
