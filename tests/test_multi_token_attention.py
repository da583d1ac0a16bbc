"""Multi-Token Attention (designs/multi_token_attention.td) and the `conv[...]` construct it is
written with: the compiled module and the reference evaluator against the paper's equations
written out here by hand (Golovneva et al. 2025, §3.1-3.3: the key-query convolution of the
logits, Mask_0 before and Mask_-inf after it under causal masking, head mixing within groups,
group norm with depth scaling), plain and causal, in float64; gradients; torch.compile; the
standalone file; the cost (N² · c_q · c_k per head, against more for the same design written with
one-hot shift tensors from index(), which the planner distributes over the query·key product into
N² · c_q · D work and N² · c_q shift entries); and with_causal_mask's reading of shifts."""

from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import sympy
import torch

import tdiag
from tdiag import TdiagError

SIZES = {"F": 16, "H": 4, "CQ": 3, "CK": 5}  # P = 2, CH = 2: two groups of two heads
LENGTH = 9


@pytest.fixture(scope="module")
def design() -> tdiag.Design:
    return tdiag.load("multi_token_attention", **SIZES)


@pytest.fixture(scope="module")
def modules(design):
    """(plain, causal) compiled modules in float64, built once."""
    return (
        design.module(seed=0, dtype=torch.float64),
        design.with_causal_mask().module(seed=0, dtype=torch.float64),
    )


def paper_mta(x: torch.Tensor, p: dict[str, torch.Tensor], causal: bool) -> torch.Tensor:
    """The paper's equations, term by term: Â = QKᵀ/√d per head; Mask_0 (causal: Â zeroed where
    the key is after the query); C[i, j] = Σ_{i'=0}^{c_q−1} Σ_{j'=−P}^{P} θ[i', j'] Â[i − i', j − j']
    with Â read as 0 outside; Mask_-inf; softmax over keys; A' = Σ_k w[g, k, c] A[(g k)]; O = A'V;
    each head's O RMS-normalized over its width (ε 1e-5) times the gain, times 1 − λ_init
    (λ_init = 0.8 − 0.6 exp(0) at the first layer); the output projection."""
    heads, cq, ck = p["theta"].shape
    half = (ck - 1) // 2
    groups, ch, _ = p["w"].shape
    width = p["WQ"].shape[-1]
    q = torch.einsum("bnf,fhd->bhnd", x, p["WQ"])
    k = torch.einsum("bnf,fhd->bhnd", x, p["WK"])
    v = torch.einsum("bnf,fhd->bhnd", x, p["WV"])
    logits = q @ k.transpose(-1, -2) / math.sqrt(width)
    n = logits.shape[-1]
    future = torch.ones(n, n, dtype=torch.bool).triu(1)
    if causal:
        logits = logits.masked_fill(future, 0.0)
    convolved = torch.zeros_like(logits)
    for back in range(cq):  # i'
        for offset in range(-half, half + 1):  # j'
            shifted = torch.zeros_like(logits)
            low, high = max(offset, 0), min(n + offset, n)  # keys j with 0 <= j - j' < n
            shifted[..., back:, low:high] = logits[..., : n - back, low - offset : high - offset]
            convolved = convolved + p["theta"][:, back, offset + half][:, None, None] * shifted
    if causal:
        convolved = convolved.masked_fill(future, -math.inf)
    attention = convolved.softmax(-1)
    b = x.shape[0]
    mixed = torch.einsum("bgknm,gkc->bgcnm", attention.reshape(b, groups, ch, n, n), p["w"]).reshape(b, heads, n, n)
    out = mixed @ v
    out = out * (out.pow(2).mean(-1, keepdim=True) + 1e-5).rsqrt() * p["gn"]
    depth = 1 - (0.8 - 0.6 * math.exp(0.0))
    return depth * torch.einsum("bhne,heo->bno", out, p["WO"])


def parameters(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return dict(module.named_parameters())


def test_plain_module_equals_the_papers_equations(modules) -> None:
    x = torch.randn(2, LENGTH, SIZES["F"], dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    plain, _ = modules
    torch.testing.assert_close(plain(x), paper_mta(x, parameters(plain), causal=False), rtol=0, atol=1e-10)


def test_causal_module_equals_the_papers_masked_equations(modules) -> None:
    x = torch.randn(2, LENGTH, SIZES["F"], dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    _, causal = modules
    torch.testing.assert_close(causal(x), paper_mta(x, parameters(causal), causal=True), rtol=0, atol=1e-10)


@pytest.mark.parametrize("causal", [False, True])
def test_reference_evaluator_equals_the_papers_equations(design, causal: bool) -> None:
    d = design.with_causal_mask() if causal else design
    reference = d.module(seed=0, dtype=torch.float64, impl="reference")
    x = torch.randn(1, 7, SIZES["F"], dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(reference(x), paper_mta(x, parameters(reference), causal), rtol=0, atol=1e-10)


def test_causal_output_of_a_token_ignores_the_later_tokens(modules) -> None:
    _, causal = modules
    x = torch.randn(1, LENGTH, SIZES["F"], dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    later = x.clone()
    later[:, 5:] += 1.0
    torch.testing.assert_close(causal(later)[:, :5], causal(x)[:, :5], rtol=0, atol=1e-12)


def test_gradients_of_input_and_kernel_pass_gradcheck() -> None:
    d = tdiag.load("multi_token_attention", F=4, H=2, CQ=2, CK=3, CH=2).with_causal_mask()
    module = d.module(seed=0, dtype=torch.float64)
    names = ("theta", "w")
    x = torch.randn(1, 4, 4, dtype=torch.float64, requires_grad=True, generator=torch.Generator().manual_seed(5))
    kernels = tuple(getattr(module, name).detach().clone().requires_grad_() for name in names)

    def run(x, *tensors):
        return torch.func.functional_call(module, dict(zip(names, tensors, strict=True)), (x,))

    assert torch.autograd.gradcheck(run, (x, *kernels), fast_mode=True)


def test_traces_as_one_graph(design) -> None:
    module = design.with_causal_mask().module(seed=0)
    x = torch.randn(2, LENGTH, SIZES["F"], generator=torch.Generator().manual_seed(6))
    compiled = torch.compile(module, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(x), module(x), rtol=1e-6, atol=1e-6)


@pytest.mark.slow
def test_compiles_with_fullgraph_to_the_eager_values(design) -> None:
    module = design.with_causal_mask().module(seed=0)
    x = torch.randn(2, LENGTH, SIZES["F"], generator=torch.Generator().manual_seed(6))
    compiled = torch.compile(module, fullgraph=True)
    torch.testing.assert_close(compiled(x), module(x), rtol=1e-5, atol=1e-5)


def test_standalone_file_equals_the_module(design, modules, tmp_path) -> None:
    causal = design.with_causal_mask()
    path = tmp_path / "mta_module.py"
    path.write_text(causal.source(N=LENGTH), encoding="utf-8")
    spec = importlib.util.spec_from_file_location("mta_module", path)
    loaded = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(loaded)  # type: ignore[union-attr]
    _, module = modules
    standalone = next(v for v in vars(loaded).values() if isinstance(v, type) and issubclass(v, torch.nn.Module))()
    standalone = standalone.to(torch.float64)
    standalone.load_state_dict(module.state_dict())
    x = torch.randn(2, LENGTH, SIZES["F"], dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    torch.testing.assert_close(standalone(x), module(x), rtol=0, atol=1e-12)


def test_convolution_step_costs_n_squared_times_the_kernel(design) -> None:
    plan = design.plan(N=256)
    (step,) = [s for s in plan.steps if s.kind == "conv"]
    for n in (256, 512, 1024):
        flops = design.graph.evaluate(step.flops, N=n).subs(sympy.Symbol("B", positive=True), 1)
        assert flops == 2 * SIZES["H"] * SIZES["CQ"] * SIZES["CK"] * n**2


def test_flops_are_quadratic_in_the_length(design) -> None:
    N = sympy.Symbol("N", positive=True)
    report = design.cost(N=1024)
    flops = [report.at(N=n)["flops"] for n in (256, 512, 768, 1024)]
    third = flops[3] - 3 * flops[2] + 3 * flops[1] - flops[0]  # zero for a polynomial of degree 2 in N
    assert third == 0
    assert sympy.degree(sympy.expand(report.flops), N) == 2


def test_cost_report_counts_the_kernel_taps_per_score(design) -> None:
    point = tdiag.load("multi_token_attention", **{**SIZES, "CQ": 1, "CK": 1})
    for n in (256, 1024):
        extra = design.cost(N=n).at(N=n)["flops"] - point.cost(N=n).at(N=n)["flops"]
        assert extra == 2 * SIZES["H"] * (SIZES["CQ"] * SIZES["CK"] - 1) * n**2


SHIFT_TENSORS = """
design mta_shift_tensors
size F = 16, H = 4, D = F / H, CQ = 3, CK = 5, P = (CK - 1) / 2
size N
input X[n: N, f: F]
param WQ[f: F, h: H, d: D]
param WK[f: F, h: H, d: D]
param WV[f: F, h: H, e: D]
param WO[h: H, e: D, o: F]
param theta[h: H, i: CQ, j: CK]
Q[n h d] = X[n f] WQ[f h d]
K[m h d] = X[m f] WK[f h d]
V[m h e] = X[m f] WV[f h e]
S[h a b] = Q[a h d] K[b h d] / sqrt(D)
Sq[n a i] = relu(1 - abs(index(n) - index(i) - index(a)))
Sk[m b j] = relu(1 - abs(index(m) - index(j) + P - index(b)))
A[h n m] = softmax[m](theta[h i j] Sq[n a i] Sk[m b j] S[h a b])
Y[n o] = A[h n m] V[m h e] WO[h e o]
output Y
"""


def test_shift_tensors_from_index_equal_the_convolution_at_more_flops(tmp_path) -> None:
    old = tmp_path / "mta_shift_tensors.td"
    new = tmp_path / "mta_conv.td"
    old.write_text(SHIFT_TENSORS, encoding="utf-8")
    new.write_text(
        SHIFT_TENSORS.replace("design mta_shift_tensors", "design mta_conv").replace(
            "softmax[m](theta[h i j] Sq[n a i] Sk[m b j] S[h a b])",
            "softmax[m](conv[n = n - i, m = m - j + P](S[h n m], theta[h i j]))",
        ),
        encoding="utf-8",
    )
    shifted, convolved = tdiag.load(old), tdiag.load(new)
    x = torch.randn(1, 6, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(8))
    torch.testing.assert_close(
        shifted.module(seed=0, dtype=torch.float64)(x), convolved.module(seed=0, dtype=torch.float64)(x)
    )
    for n in (256, 1024):
        assert convolved.cost(N=n).at(N=n)["flops"] < shifted.cost(N=n).at(N=n)["flops"]


def _design(tmp_path, statement: str) -> tdiag.Design:
    path = tmp_path / "shift.td"
    path.write_text(
        "design shift\nsize F = 8, H = 2, D = F / H, C = 3\nsize N\ninput X[n: N, f: F]\n"
        "param WQ[f: F, h: H, d: D]\nparam WK[f: F, h: H, d: D]\nparam WV[f: F, h: H, e: D]\n"
        "param w[h: H, i: C]\nparam u[f: F, i: C]\n"
        "Q[n h d] = X[n f] WQ[f h d]\nK[m h d] = X[m f] WK[f h d]\nV[m h e] = X[m f] WV[f h e]\n"
        f"{statement}\noutput Y\n",
        encoding="utf-8",
    )
    return tdiag.load(path)


def test_causal_mask_zeroes_the_scores_before_a_key_shift(design) -> None:
    from tdiag.ir import CausalMask, Convolution, walk

    causal = design.with_causal_mask()
    (conv,) = [n for s in causal.graph.statements for n in walk(s.expr) if isinstance(n, Convolution)]
    assert [(m.query, m.key) for m in conv.masks if isinstance(m, CausalMask)] == [("n", "m")]


def test_causal_mask_refuses_a_shift_that_reads_a_later_query(tmp_path) -> None:
    d = _design(
        tmp_path, "A[h n m] = softmax[m](conv[n = n + i](Q[n h d] K[m h d], w[h i]))\nY[n h e] = A[h n m] V[m h e]"
    )
    with pytest.raises(TdiagError, match=r"cannot mask the conv's shift n = n \+ i: it reads position n \+ 2") as err:
        d.with_causal_mask()
    assert err.value.diagnostics[0].spans[0].line == 13


def test_causal_mask_refuses_a_key_shift_ahead_without_the_query_leg(tmp_path) -> None:
    d = _design(
        tmp_path,
        "Ks[m h d] = conv[m = m + i - 1](K[m h d], w[h i])\nY[n h e] = softmax[m](Q[n h d] Ks[m h d]) V[m h e]",
    )
    with pytest.raises(TdiagError, match=r"shift m = m \+ i - 1: it reads position m \+ 1"):
        d.with_causal_mask()


def test_a_backward_token_shift_is_causal_as_it_is(tmp_path) -> None:
    d = _design(
        tmp_path,
        "Xs[n f] = conv[n = n - i](X[n f], u[f i])\nY[n h e] = softmax[m](Xs[n f] WQ[f h d] K[m h d]) V[m h e]",
    )
    module = d.with_causal_mask().module(seed=0, dtype=torch.float64)
    reference = d.with_causal_mask().module(seed=0, dtype=torch.float64, impl="reference")
    x = torch.randn(2, 6, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    later = x.clone()
    later[:, 3:] += 1.0
    torch.testing.assert_close(module(x), reference(x), rtol=0, atol=1e-12)
    torch.testing.assert_close(module(later)[:, :3], module(x)[:, :3], rtol=0, atol=1e-12)


def test_a_depthwise_token_shift_is_the_sum_of_earlier_tokens(tmp_path) -> None:
    d = _design(tmp_path, "Y[n f] = conv[n = n - i](X[n f], u[f i])")
    module = d.module(seed=0, dtype=torch.float64)
    x = torch.randn(2, 6, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(10))
    u = module.u
    expected = sum(u[:, i] * torch.nn.functional.pad(x, (0, 0, i, 0))[:, :6] for i in range(3))
    torch.testing.assert_close(module(x), expected, rtol=0, atol=1e-12)


def test_masks_written_out_equal_with_causal_mask(design, modules, tmp_path) -> None:
    text = Path(design.graph.file).read_text(encoding="utf-8")
    written = text.replace(
        "softmax[m](conv[n = n - i, m = m - j + (CK - 1) / 2](S[h n m]",
        "softmax[m, mask = causal(n, m)](conv[n = n - i, m = m - j + (CK - 1) / 2, mask = causal(n, m)](S[h n m]",
    )
    assert written != text
    path = tmp_path / "mta_causal.td"
    path.write_text(written, encoding="utf-8")
    module = tdiag.load(path, **SIZES).module(seed=0, dtype=torch.float64)
    _, causal = modules
    x = torch.randn(2, LENGTH, SIZES["F"], dtype=torch.float64, generator=torch.Generator().manual_seed(11))
    torch.testing.assert_close(module(x), causal(x), rtol=0, atol=1e-12)


def test_diagram_draws_the_shifts_on_their_legs(design) -> None:
    dot = design.dot()
    assert 'label="conv[n = n - i, m = m - j + (CK - 1)/2]"' in dot
    assert 'xlabel="n - i"' in dot


def test_a_convolution_along_three_position_legs_equals_the_reference_evaluator(tmp_path) -> None:
    d = _design(
        tmp_path,
        "param t[i: C, j: C, k: C]\n"
        "Y[n m p] = conv[n = n - i, m = m + j - 1, p = p + k](X[n f] X[m f] X[p f], t[i j k])",
    )
    module = d.module(seed=0, dtype=torch.float64)
    reference = d.module(seed=0, dtype=torch.float64, impl="reference")
    x = torch.randn(2, 5, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(12))
    torch.testing.assert_close(module(x), reference(x), rtol=0, atol=1e-12)


def test_causal_mask_sees_the_head_mixed_probabilities_as_masked(design) -> None:
    """M[(g c) n m] mixes heads of the masked softmax A[(g k) n m] (read with its head axis in
    pieces): M is zero above the diagonal already, so O = M V gets no causal factor of its own."""
    from tdiag.ir import CausalFactor, walk

    causal = design.with_causal_mask()
    (values,) = [s for s in causal.graph.statements if s.target == "O"]
    assert not [n for n in walk(values.expr) if isinstance(n, CausalFactor)]


def test_generated_code_does_not_depend_on_the_hash_seed():
    """Fresh region legs are numbered in a fixed order (the kernel's offset legs were numbered in a
    set's order), so the generated file, and the module name hashed from it, are the same in every
    process."""
    script = "import tdiag; print(tdiag.load('multi_token_attention').with_causal_mask().source())"
    root = Path(__file__).resolve().parent.parent
    texts = {
        subprocess.run(
            [sys.executable, "-c", script],
            cwd=root,
            env={**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(root)},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("1", "2", "3")
    }
    assert len(texts) == 1
