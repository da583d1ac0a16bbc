"""Scans (docs/language.md, Scans): cumsum and logcumsumexp along a position leg, inclusive or
exclusive, forward or reverse, masked; the segment sums segsum[n, m] with their causal semantics;
a contraction with a triangular causal factor lowered as the same prefix sum; and the two designs
written with them, FoX (forgetting_attention) and stick-breaking attention, each equal to its
paper's step-by-step form written here with plain torch loops."""

from __future__ import annotations

import math

import pytest
import sympy
import torch
from conftest import DESIGNS, gradcheck_parameters, perturbed, standalone_module

import tdiag
from tdiag.errors import TdiagError
from tdiag.ir import Scan, SegmentSum, walk
from tdiag.measure import saved_for_backward

F64 = torch.float64

HEAD = "design t\nsize F = 4, H = 2\nsize N\ninput X[n: N, f: F]\nparam W[f: F, h: H]\nL[n h] = X[n f] W[f h]\n"


def load(write_td, body: str, name: str = "t") -> tdiag.Design:
    return tdiag.load(write_td(HEAD + body + "output Y\n", name=f"{name}.td"))


def x_input(*batch: int, n: int, width: int = 4, seed: int = 1) -> torch.Tensor:
    return torch.randn(*batch, n, width, dtype=F64, generator=torch.Generator().manual_seed(seed))


def projected(module, x: torch.Tensor) -> torch.Tensor:
    """L[b n h] = X W, read from the module's parameter."""
    return x @ dict(module.named_parameters())["W"]


def running(values: list[torch.Tensor], exclusive: bool, reverse: bool, log: bool = False) -> list[torch.Tensor]:
    """Entry by entry: the sum (or log Σ exp) of the entries up to each (after it, when reversed),
    itself left out when exclusive."""
    order = list(range(len(values)))[::-1] if reverse else list(range(len(values)))
    out: list[torch.Tensor] = [torch.zeros(())] * len(values)
    total = None
    for i in order:
        before = total
        total = values[i] if total is None else (torch.logaddexp(total, values[i]) if log else total + values[i])
        empty = torch.full_like(values[i], -math.inf if log else 0.0)
        out[i] = (empty if before is None else before) if exclusive else total
    return out


# ---- the language -----------------------------------------------------------------------------


def test_cumsum_is_a_scan_node_that_keeps_its_leg(write_td):
    graph = load(write_td, "Y[n h] = cumsum[n, exclusive = 1, reverse = 1](L[n h])\n").graph
    (scan,) = [node for node in walk(graph.tensors["Y"].statement.expr) if isinstance(node, Scan)]
    assert (scan.name, scan.along, scan.exclusive, scan.reverse, scan.legs) == ("cumsum", "n", True, True, ("n", "h"))


def test_segsum_is_a_typed_node_over_the_position_leg_and_a_new_key_leg(write_td):
    graph = load(write_td, "S[h n m] = segsum[n, m](L[n h])\nY[n h] = exp(S[h n m]) L[m h]\n").graph
    (node,) = [node for node in walk(graph.tensors["S"].statement.expr) if isinstance(node, SegmentSum)]
    assert (node.along, node.key, set(node.legs)) == ("n", "m", {"n", "m", "h"})
    assert graph.legs["m"].size == graph.legs["n"].size


def errors(write_td, body: str) -> list[str]:
    with pytest.raises(TdiagError) as caught:
        load(write_td, body)
    return [f"{d.spans[0].line}:{d.spans[0].column} {d.message}" for d in caught.value.diagnostics]


def test_unknown_scan_option_is_an_error_at_the_option(write_td):
    (message,) = errors(write_td, "Y[n h] = cumsum[n, inclusive = 1](L[n h])\n")
    assert message == "7:20 unknown cumsum option 'inclusive'"


def test_scan_along_a_leg_its_argument_lacks_is_an_error_at_the_leg(write_td):
    (message,) = errors(write_td, "Y[n h] = cumsum[k](L[n h])\n")
    assert message == "7:17 cumsum along leg 'k', which its argument does not have"


def test_scan_along_a_leg_of_fixed_size_is_an_error(write_td):
    (message,) = errors(write_td, "Y[n h] = cumsum[h](L[n h])\n")
    assert message == "7:17 cumsum runs along a position leg, but 'h' has the fixed size H"


def test_scan_flag_other_than_zero_or_one_is_an_error(write_td):
    (message,) = errors(write_td, "Y[n h] = cumsum[n, reverse = 2](L[n h])\n")
    assert message == "7:30 cumsum option 'reverse' is a flag: 0 or 1, got 2"


def test_segsum_needs_a_new_key_leg(write_td):
    (message,) = errors(write_td, "Y[n h] = segsum[n, h](L[n h])\n")
    assert message == "7:20 segsum's key leg 'h' is a leg of its argument already"


def test_segsum_takes_two_legs(write_td):
    (message,) = errors(write_td, "Y[n h] = segsum[n](L[n h])\n")
    assert message == "7:17 segsum takes 2 legs in brackets, got 1"


# ---- values: compiled module, reference evaluator and loops agree -----------------------------


@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("name", ["cumsum", "logcumsumexp"])
def test_scan_equals_running_sums_entry_by_entry(write_td, name, exclusive, reverse):
    loaded = load(write_td, f"Y[n h] = {name}[n, exclusive = {exclusive}, reverse = {reverse}](L[n h])\n")
    for n in (1, 2, 6):
        module = loaded.module(N=n, dtype=F64)
        x = x_input(3, n=n)
        expected = torch.stack(
            running(list(projected(module, x).unbind(-2)), bool(exclusive), bool(reverse), name != "cumsum"), -2
        )
        torch.testing.assert_close(module(x), expected, rtol=0, atol=1e-12)
        reference = loaded.module(N=n, dtype=F64, impl="reference")
        reference.load_state_dict(module.state_dict())
        torch.testing.assert_close(reference(x), expected, rtol=0, atol=1e-12)


def test_masked_scan_along_the_key_leg_adds_only_the_keys_each_query_sees(write_td):
    body = "S[n m h] = L[n h] L[m h]\nY[n m h] = cumsum[m, reverse = 1, mask = causal(n, m)](S[n m h])\n"
    loaded = load(write_td, body)
    module = loaded.module(N=5, dtype=F64)
    x = x_input(2, n=5)
    p = projected(module, x)
    s = p.unsqueeze(-2) * p.unsqueeze(-3)  # [b n m h]
    expected = torch.zeros_like(s)
    for n in range(5):
        for m in range(5):
            expected[:, n, m] = sum((s[:, n, k] for k in range(m, n + 1)), torch.zeros_like(s[:, 0, 0]))
    torch.testing.assert_close(module(x), expected, rtol=0, atol=1e-12)


def test_masked_logcumsumexp_equals_the_reference_evaluator(write_td):
    body = (
        "mask pad[m: N]\nS[n m h] = L[n h] L[m h]\n"
        "Y[n m h] = logcumsumexp[m, reverse = 1, mask = causal(n, m), mask = pad[m]](S[n m h])\n"
    )
    loaded = load(write_td, body)
    module = loaded.module(N=5, dtype=F64)
    reference = loaded.module(N=5, dtype=F64, impl="reference")
    reference.load_state_dict(module.state_dict())
    x, pad = x_input(2, n=5), torch.tensor([True, False, True, True, False])
    torch.testing.assert_close(module(x, pad=pad), reference(x, pad=pad), rtol=0, atol=1e-12)


def test_segsum_is_the_sum_between_and_minus_infinity_above_the_diagonal(write_td):
    loaded = load(write_td, "Y[n m h] = segsum[n, m](L[n h])\n")
    for size in (1, 4):
        module = loaded.module(N=size, dtype=F64)
        x = x_input(2, n=size)
        a = projected(module, x)
        out = module(x)
        for n in range(size):
            for m in range(size):
                if m > n:
                    assert torch.all(out[:, n, m] == -math.inf)
                else:
                    between = sum((a[:, k] for k in range(m + 1, n + 1)), torch.zeros_like(a[:, 0]))
                    torch.testing.assert_close(out[:, n, m], between, rtol=0, atol=1e-12)


def test_segsum_of_neighbours_is_exact_at_long_lengths(write_td):
    """S[n, n−1] = a_n exactly: a masked running sum, not c_n − c_{n−1} of two long cumsums."""
    loaded = load(write_td, "Y[n m h] = segsum[n, m](L[n h])\n")
    module = loaded.module(N=2048)
    x = torch.randn(1, 2048, 4, generator=torch.Generator().manual_seed(3)) + 1.0
    a = projected(module, x)
    out = module(x)
    n = torch.arange(1, 2048)
    assert torch.equal(out[0, n, n - 1], a[0, 1:])


def test_scans_compile_with_fullgraph(write_td):
    body = "S[h n m] = segsum[n, m](L[n h])\nC[n h] = cumsum[n, exclusive = 1, reverse = 1](L[n h])\n"
    module = load(write_td, body + "Y[n h] = exp(S[h n m]) C[m h]\n").module(N=7)
    compiled = torch.compile(module, fullgraph=True, backend="eager")
    x = torch.randn(2, 9, 4)
    torch.testing.assert_close(compiled(x), module(x), rtol=1e-6, atol=1e-6)


def test_scan_runs_in_float32_under_autocast(write_td):
    loaded = load(write_td, "Y[n h] = cumsum[n](L[n h])\n")
    assert "enabled=False):  # a scan, in float32 under autocast" in loaded.source(N=8)
    module = loaded.module(N=8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert module(torch.randn(2, 8, 4)).dtype == torch.float32


# ---- cost and the triangular factor -------------------------------------------------------------


def grows_linearly(formula: sympy.Expr, loaded: tdiag.Design) -> bool:
    """The formula at N = 256, 512, 1024 (fixed widths) has constant differences: linear in N."""
    values = [loaded.graph.evaluate(formula, N=n) for n in (256, 512, 1024)]
    return 2 * (values[1] - values[0]) == values[2] - values[1]


def test_cumsum_counts_one_elementwise_operation_per_entry_and_no_flops(write_td):
    loaded = load(write_td, "Y[n h] = cumsum[n](L[n h])\n")
    formulas = loaded.cost(N=64).formulas()
    symbols = {s.name: s for s in formulas["flops"].free_symbols | formulas["elementwise"].free_symbols}
    assert formulas["flops"] == 2 * symbols["F"] * symbols["H"] * symbols["N"]  # the projection only
    assert formulas["elementwise"] == symbols["H"] * symbols["N"]


def test_contraction_with_a_causal_triangle_is_lowered_as_a_prefix_sum(write_td):
    loaded = load(write_td, "Y[n h] = causal(n, l) L[l h]\n")
    plan = loaded.plan(N=64)
    assert any(step.kind == "scan" for step in plan.steps)
    assert not any(step.kind == "mask" for step in plan.steps)
    cost = loaded.cost(N=64).formulas()
    assert grows_linearly(cost["flops"], loaded) and grows_linearly(cost["elementwise"], loaded)
    module = loaded.module(N=6, dtype=F64)
    x = x_input(2, n=6)
    torch.testing.assert_close(module(x), projected(module, x).cumsum(-2), rtol=0, atol=1e-12)


def test_triangle_summed_over_its_query_leg_is_a_suffix_sum(write_td):
    loaded = load(write_td, "Y[l h] = causal(n, l) L[n h] sigmoid(L[l h])\n")
    module = loaded.module(N=6, dtype=F64)
    x = x_input(2, n=6)
    p = projected(module, x)
    torch.testing.assert_close(module(x), p.flip(-2).cumsum(-2).flip(-2) * torch.sigmoid(p), rtol=0, atol=1e-12)
    assert grows_linearly(loaded.cost(N=64).formulas()["flops"], loaded)


def test_triangle_beside_a_sub_product_of_its_key_leg_scans_that_product(write_td):
    """Σ_l causal(n, l) X[l f] L[l h] V[f g]: the product over l first, scanned, then the rest."""
    body = "param V[f: F, g: F]\nY[n h g] = causal(n, l) X[l f] L[l h] V[f g]\n"
    loaded = load(write_td, body)
    assert grows_linearly(loaded.cost(N=64).formulas()["flops"], loaded)
    module = loaded.module(N=5, dtype=F64)
    perturbed(module)
    reference = loaded.module(N=5, dtype=F64, impl="reference")
    reference.load_state_dict(module.state_dict())
    x = x_input(2, n=5)
    torch.testing.assert_close(module(x), reference(x), rtol=0, atol=1e-12)


def test_triangle_whose_other_factor_carries_both_legs_stays_a_masked_product(write_td):
    loaded = load(write_td, "Y[n h] = causal(n, m) sigmoid(L[n h] L[m h]) L[m h]\n")
    plan = loaded.plan(N=64)
    assert not any(step.kind == "scan" for step in plan.steps)
    assert any(step.kind == "mask" for step in plan.steps)


def test_footprint_of_scans_equals_the_measured_saved_memory(write_td):
    body = (
        "E[n h] = cumsum[n, exclusive = 1, reverse = 1](L[n h])\n"
        "G[n h] = logcumsumexp[n, reverse = 1](L[n h])\n"
        "S[h n m] = segsum[n, m](L[n h])\n"
        "Y[n h] = E[n h] G[n h] + exp(S[h n m]) L[m h]\n"
    )
    loaded = load(write_td, body)
    module = loaded.module(N=32)
    measured = saved_for_backward(module, torch.randn(1, 32, 4))
    assert loaded.cost(N=32).saved_bytes_at(N=32, B=1) == measured.total_bytes


# ---- causal masking -------------------------------------------------------------------------------


def test_forward_cumsum_along_the_query_leg_is_left_as_it_is_by_with_causal_mask(write_td):
    body = "C[n h] = cumsum[n](L[n h])\nY[n h] = softmax[m](L[n h] L[m h] + C[m h]) L[m h]\n"
    masked = load(write_td, body).with_causal_mask()
    (scan,) = [node for node in walk(masked.graph.tensors["C"].statement.expr) if isinstance(node, Scan)]
    assert scan.masks == ()


def test_reverse_cumsum_along_a_position_leg_is_refused_at_its_position(write_td):
    body = "C[n h] = cumsum[n, reverse = 1](L[n h])\nY[n h] = softmax[m](L[n h] L[m h] + C[m h]) L[m h]\n"
    with pytest.raises(TdiagError) as caught:
        load(write_td, body).with_causal_mask()
    (diagnostic,) = caught.value.diagnostics
    assert (diagnostic.spans[0].line, diagnostic.spans[0].column) == (7, 10)
    assert "cannot mask the reverse cumsum along position leg 'n'" in diagnostic.message


def test_reverse_cumsum_along_the_key_beside_the_query_gets_the_causal_mask(write_td):
    body = "R[n m h] = cumsum[m, reverse = 1](L[n h] L[m h])\nY[n h] = softmax[m](R[n m h]) L[m h]\n"
    masked = load(write_td, body).with_causal_mask()
    (scan,) = [node for node in walk(masked.graph.tensors["R"].statement.expr) if isinstance(node, Scan)]
    assert [(m.query, m.key) for m in scan.masks] == [("n", "m")]


def test_diagram_draws_a_scan_node_on_its_leg(write_td, tmp_path):
    loaded = load(write_td, "S[h n m] = segsum[n, m](L[n h])\nY[n h] = exp(S[h n m]) cumsum[m](L[m h])\n")
    dot = loaded.render(tmp_path / "t.dot").read_text()
    assert 'xlabel="segsum"' in dot and 'xlabel="cumsum"' in dot and "cumsum along m" in dot


# ---- FoX: the forgetting transformer ------------------------------------------------------------

SIZES = {"F": 8, "H": 2}


def fox_recurrent(p, x, pad=None):
    """Lin et al. 2025, Sec. 3, query by query: o_i = Σ_{j ≤ i} F_ij exp(q_i·k_j/√d) v_j / Σ_j F_ij
    exp(q_i·k_j/√d), with F_ij = f_{j+1} ··· f_i multiplied out step by step; padded keys skipped."""
    q = torch.einsum("...nf,fhd->...hnd", x, p["WQ"])
    k = torch.einsum("...nf,fhd->...hnd", x, p["WK"])
    v = torch.einsum("...nf,fhe->...hne", x, p["WV"])
    f = torch.sigmoid(torch.einsum("...nf,fh->...hn", x, p["Wf"]) + p["bf"][:, None])
    d, size = q.shape[-1], x.shape[-2]
    rows = []
    for i in range(size):
        numerator, denominator = torch.zeros_like(v[..., 0, :]), torch.zeros_like(v[..., 0, 0])
        decay = torch.ones_like(f[..., 0])
        for j in range(i, -1, -1):  # F_ij grows one gate at a time, from j = i back to 0
            if j < i:
                decay = decay * f[..., j + 1]
            if pad is not None and not pad[j]:
                continue
            weight = decay * torch.exp((q[..., i, :] * k[..., j, :]).sum(-1) / math.sqrt(d))
            numerator = numerator + weight[..., None] * v[..., j, :]
            denominator = denominator + weight
        rows.append(numerator / denominator[..., None])
    o = torch.stack(rows, -2)  # [..., h, n, e]
    return torch.einsum("...hne,heg->...ng", o, p["WO"])


def fox(n: int = 5):
    loaded = tdiag.load(DESIGNS / "forgetting_attention.td", **SIZES)
    module = loaded.module(N=n, dtype=F64)
    return loaded, module, perturbed(module)


@pytest.mark.parametrize("n", [1, 2, 5, 9])
def test_forgetting_attention_equals_its_recurrent_form(n):
    _, module, params = fox(n)
    x = x_input(2, n=n, width=8)
    torch.testing.assert_close(module(x), fox_recurrent(params, x), rtol=0, atol=1e-10)


def test_forgetting_attention_with_padding_equals_its_recurrent_form():
    _, module, params = fox(7)
    x = x_input(2, n=7, width=8)
    pad = torch.tensor([True, True, False, True, True, False, False])
    torch.testing.assert_close(module(x, pad=pad), fox_recurrent(params, x, pad), rtol=0, atol=1e-10)


def test_forgetting_attention_reference_evaluator_equals_the_module():
    loaded, module, _ = fox(6)
    reference = loaded.module(N=6, dtype=F64, impl="reference")
    reference.load_state_dict(module.state_dict())
    x = x_input(2, n=6, width=8)
    torch.testing.assert_close(reference(x), module(x), rtol=0, atol=1e-10)


def test_forgetting_attention_takes_sdpa_with_the_cumulative_gate_as_a_key_bias():
    plan = tdiag.load(DESIGNS / "forgetting_attention.td").plan(N=1024)
    assert [step.kind for step in plan.steps].count("sdpa") == 1
    assert any("key bias as a feature" in note for note in plan.lowered)
    assert not any({"h", "n", "m"} <= set(step.out.legs) for step in plan.steps if step.out is not None)


# ---- stick-breaking attention -------------------------------------------------------------------


def stick_breaking_direct(p, x):
    """Tan et al. 2025, Sec. 2, as written: A_mn = β_mn Π_{m<k<n} (1 − β_kn) for keys m < n, the
    product taken factor by factor; o_n = Σ_{m<n} A_mn v_m (no normalization)."""
    q = torch.einsum("...nf,fhd->...hnd", x, p["WQ"])
    k = torch.einsum("...nf,fhd->...hnd", x, p["WK"])
    v = torch.einsum("...nf,fhe->...hne", x, p["WV"])
    beta = torch.sigmoid(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]))  # [..., h, n, m]
    size = x.shape[-2]
    rows = []
    for n in range(size):
        out = torch.zeros_like(v[..., 0, :])
        for m in range(n):
            weight = beta[..., n, m]
            for between in range(m + 1, n):
                weight = weight * (1 - beta[..., n, between])
            out = out + weight[..., None] * v[..., m, :]
        rows.append(out)
    return torch.einsum("...hne,heg->...ng", torch.stack(rows, -2), p["WO"])


def stick_breaking(n: int = 5):
    loaded = tdiag.load(DESIGNS / "stick_breaking.td", **SIZES)
    module = loaded.module(N=n, dtype=F64)
    return loaded, module, perturbed(module)


@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_stick_breaking_equals_its_direct_product_form(n):
    _, module, params = stick_breaking(n)
    x = x_input(2, n=n, width=8)
    torch.testing.assert_close(module(x), stick_breaking_direct(params, x), rtol=0, atol=1e-10)


def test_stick_breaking_is_quadratic_in_the_length_not_cubic():
    loaded = tdiag.load(DESIGNS / "stick_breaking.td")
    formulas = loaded.cost(N=1024).formulas()
    for key in ("flops", "elementwise"):
        n = next(s for s in formulas[key].free_symbols if s.name == "N")
        assert sympy.degree(sympy.expand(loaded.graph.expand(formulas[key])), n) == 2


def test_stick_breaking_reference_evaluator_equals_the_module():
    loaded, module, _ = stick_breaking(6)
    reference = loaded.module(N=6, dtype=F64, impl="reference")
    reference.load_state_dict(module.state_dict())
    x = x_input(2, n=6, width=8)
    torch.testing.assert_close(reference(x), module(x), rtol=0, atol=1e-10)


# ---- both designs: gradients, the standalone file, torch.compile ---------------------------------


@pytest.mark.parametrize("name", ["forgetting_attention", "stick_breaking"])
def test_scan_design_gradcheck(name):
    module = tdiag.load(DESIGNS / f"{name}.td", **SIZES).module(N=3, dtype=F64)
    perturbed(module)
    x = x_input(1, n=3, width=8).requires_grad_()
    assert gradcheck_parameters(module, (x,))


@pytest.mark.parametrize("name", ["forgetting_attention", "stick_breaking"])
def test_scan_design_standalone_file_equals_in_process_module(name, tmp_path):
    loaded = tdiag.load(DESIGNS / f"{name}.td", **SIZES)
    generated = standalone_module(loaded.source(N=5), f"{name}_module", tmp_path)
    class_name = "".join(part.capitalize() for part in name.split("_"))
    standalone = getattr(generated, class_name)(seed=7, dtype=F64)
    in_process = loaded.module(seed=7, dtype=F64, N=5)
    x = x_input(2, n=7, width=8)
    assert torch.equal(standalone(x), in_process(x))


@pytest.mark.parametrize("name", ["forgetting_attention", "stick_breaking"])
def test_scan_design_compiles_with_fullgraph(name):
    module = tdiag.load(DESIGNS / f"{name}.td", **SIZES).module(N=5)
    compiled = torch.compile(module, fullgraph=True, backend="eager")
    x = torch.randn(2, 11, 8)
    torch.testing.assert_close(compiled(x), module(x), rtol=1e-6, atol=1e-6)
