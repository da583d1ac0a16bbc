"""The linear-time order of a normalize box whose content is a sum of multilinear terms
(tdiag/plan/linear.py, hoist_sum): Σ_m (Σ_i x_i / Σ_m Σ_i x_i) v = Σ_i Σ_m x_i v / Σ_i Σ_m x_i,
O(N). cosFormer (designs/cosformer.td) against its paper's formula written out here with the
cos re-weighting of eq. 9 itself (not the decomposition the design writes), plain and causal;
Based (designs/based.td: the Taylor sum 1 + s/√d′ + s²/2d′, a constant term among its terms)
against the official code's concatenated features; the FLOPs linear in N; and the refusal
naming the term and the reason when the order does not apply."""

from __future__ import annotations

import math

import pytest
import sympy
import torch
from conftest import DESIGNS

import tdiag

F64 = torch.float64
F, H = 16, 2
LONG = 256  # planned for: the linear order is taken (chunks of 32 when causal); run at other lengths

TEMPLATE = """design box
size F = 16, H = 2, D = 4
size N
input X[n: N, f: F]
param WQ[f: F, h: H, d: D] = normal(std = 1 / sqrt(F))
param WK[f: F, h: H, d: D] = normal(std = 1 / sqrt(F))
param WV[f: F, h: H, e: D] = normal(std = 1 / sqrt(F))
Q[n h d] = X[n f] WQ[f h d]
K[m h d] = X[m f] WK[f h d]
A[h n m] = normalize[m]({content})
Y[n h e] = A[h n m] X[m f] WV[f h e]
output Y
"""


def cosformer(params: dict[str, torch.Tensor], x: torch.Tensor, causal: bool) -> torch.Tensor:
    """Qin et al. 2022, eq. 6, 9 and 11: s_ij = ReLU(q_i)·ReLU(k_j) cos(π/2 · (i − j)/M), M = N,
    O_i = Σ_j s_ij v_j / (Σ_j s_ij + 1e-6), j ≤ i when causal; then W_O."""
    n = x.shape[-2]
    q = torch.relu(torch.einsum("bnf,fhd->bhnd", x, params["WQ"]))
    k = torch.relu(torch.einsum("bmf,fhd->bhmd", x, params["WK"]))
    v = torch.einsum("bmf,fhe->bhme", x, params["WV"])
    i = torch.arange(1, n + 1, dtype=F64)
    s = (q @ k.transpose(-1, -2)) * torch.cos(math.pi / 2 * (i[:, None] - i[None, :]) / n)
    if causal:
        s = s * torch.ones(n, n, dtype=F64).tril()
    a = s / (s.sum(-1, keepdim=True) + 1e-6)
    return torch.einsum("bhne,heg->bng", a @ v, params["WO"])


def based(params: dict[str, torch.Tensor], x: torch.Tensor, causal: bool) -> torch.Tensor:
    """Arora et al. 2024, Sec. 4, as the official code computes it: the Taylor feature map
    φ(x) = [1, x / d′^(1/4), (x ⊗ x) / (√2 · √d′)] concatenated, then
    y_i = φ(q_i)·Σ_j φ(k_j) v_j / (φ(q_i)·Σ_j φ(k_j) + 1e-12), prefix sums over j ≤ i when causal."""

    def taylor(z: torch.Tensor) -> torch.Tensor:
        d = z.shape[-1]
        square = (z.unsqueeze(-1) * z.unsqueeze(-2)).flatten(-2) / math.sqrt(2)
        return torch.cat([torch.ones_like(z[..., :1]), z / d**0.25, square / math.sqrt(d)], -1)

    q = taylor(torch.einsum("bnf,fhd->bhnd", x, params["WQ"]))
    k = taylor(torch.einsum("bmf,fhd->bhmd", x, params["WK"]))
    v = torch.einsum("bmf,fhe->bhme", x, params["WV"])
    kv = k.unsqueeze(-1) * v.unsqueeze(-2)  # [b h m feature e]
    if causal:
        state, total = kv.cumsum(2), k.cumsum(2)
    else:
        state, total = kv.sum(2, keepdim=True), k.sum(2, keepdim=True)
    y = (q.unsqueeze(-1) * state).sum(-2) / ((q * total).sum(-1, keepdim=True) + 1e-12)
    return torch.einsum("bhne,heg->bng", y, params["WO"])


def planned(design: tdiag.Design, causal: bool) -> tdiag.Design:
    return design.with_causal_mask() if causal else design


def takes_linear_order(design: tdiag.Design) -> bool:
    return any("linear-time order" in line for line in design.plan(N=LONG).lowered)


def flops_degree_in_n(design: tdiag.Design) -> int:
    flops = design.cost(N=LONG).formulas()["flops"]
    return sympy.degree(sympy.expand(flops), design.graph.sizes["N"].symbol)


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
def test_cosformer_equals_its_paper_formula(causal: bool):
    design = planned(tdiag.load(DESIGNS / "cosformer.td", F=F, H=H), causal)
    module = design.module(N=LONG, dtype=F64)
    assert takes_linear_order(design)
    params = {name: value.detach() for name, value in module.named_parameters()}
    for n in (5, 37):
        x = torch.randn(2, n, F, dtype=F64, generator=torch.Generator().manual_seed(n))
        torch.testing.assert_close(module(x), cosformer(params, x, causal), rtol=0, atol=1e-10)


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
def test_cosformer_costs_linear_flops_in_n(causal: bool):
    assert flops_degree_in_n(planned(tdiag.load(DESIGNS / "cosformer.td", F=F, H=H), causal)) == 1


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
def test_based_equals_its_concatenated_taylor_features(causal: bool):
    design = planned(tdiag.load(DESIGNS / "based.td", F=F, H=H, Dk=4), causal)
    module = design.module(N=LONG, dtype=F64)
    assert takes_linear_order(design) and flops_degree_in_n(design) == 1
    params = {name: value.detach() for name, value in module.named_parameters()}
    for n in (6, 41):
        x = torch.randn(2, n, F, dtype=F64, generator=torch.Generator().manual_seed(n))
        torch.testing.assert_close(module(x), based(params, x, causal), rtol=0, atol=1e-10)


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (
            "Q[n h d] K[m h d] + (Q[n h d] K[m h d]) ^ 0.5",
            "term 2 of the box's content (a sum of 2) is not multilinear: a power 1/2 "
            "(integer powers 1 to 4 are expanded into products)",
        ),
        (
            "(Q[n h d] K[m h d]) ^ 0.5",
            "the box's content is not multilinear: a power 1/2 (integer powers 1 to 4 are expanded into products)",
        ),
        ("max[d](Q[n h d] K[m h d])", "the box's content is not multilinear: a reduction, not a product"),
    ],
    ids=["term_of_a_sum", "power", "reduction"],
)
def test_the_refusal_names_the_reason(content: str, reason: str):
    plan = tdiag.loads(TEMPLATE.format(content=content), "box.td").plan(N=LONG)
    assert f"normalize box over m: linear-time order refused: {reason}" in str(plan)
