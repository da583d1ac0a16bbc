"""Windows as masks (docs/language.md, "Masks"): `window(n, m, W)` keeps key m from query n where
n − W < m ≤ n (HF's sliding_window), `window(n, m, L, R)` where n − L < m < n + R. Each lowering
of a windowed softmax box (the materialized box, SDPA with the band as its boolean attn_mask,
FlexAttention with it as mask_mod, the banded form) equals in float64 the reference evaluator and
a dense masked softmax written here, at lengths below, at and above the window and over several
blocks, with and without a padding mask; the banded form's cost is linear in N."""

from __future__ import annotations

import contextlib
import functools

import pytest
import sympy
import torch
from conftest import standalone_module

import tdiag
from tdiag.plan.footprint import footprint
from tdiag.plan.forms import only_forms

F64 = torch.float64
F, H, W, L, R = 8, 2, 5, 4, 3
LENGTHS = (3, 5, 21)  # below, at and above W; 21 queries are two blocks of the banded form's 16

DESIGN = """
design windowed
size F = 8, H = 2, D = F / H, W = 5, L = 4, R = 3
size N
input X[n: N, f: F]
mask pad[m: N]
param WQ[f: F, h: H, d: D]
param WK[f: F, h: H, d: D]
param WV[f: F, h: H, e: D]
param WO[h: H, e: D, g: F]
Q[n h d] = X[n f] WQ[f h d]
K[m h d] = X[m f] WK[f h d]
V[m h e] = X[m f] WV[f h e]
A[h n m] = softmax[m, scale = 1 / sqrt(D), mask = {window}, mask = pad[m]](Q[n h d] K[m h d])
Y[n g] = A[h n m] V[m h e] WO[h e g]
output Y
"""
WINDOWS = {"one-sided": ("window(n, m, W)", W, 1), "two-sided": ("window(n, m, L, R)", L, R)}


def load(window: str, tmp_path_factory, text: str = DESIGN) -> tdiag.Design:
    path = tmp_path_factory.mktemp("window") / "windowed.td"
    path.write_text(text.format(window=WINDOWS[window][0]))
    return tdiag.load(path)


@functools.cache
def _module(window: str, form: str, folder) -> torch.nn.Module:
    path = folder / f"{window}.td"
    path.write_text(DESIGN.format(window=WINDOWS[window][0]))
    attention = "flex" if form == "flex" else "sdpa"
    with only_forms(form):
        module = tdiag.load(path).module(N=64, dtype=F64, attention=attention, objective="flops")
    assert [choice.taken for choice in module.tdiag_plan.choices] == [form]
    return module


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("windows")


def inputs(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x, and a padding mask: the second half of the keys of sequence 0, key 0 of sequence 1."""
    x = torch.randn(2, n, F, dtype=F64, generator=torch.Generator().manual_seed(n))
    pad = torch.ones(2, n, dtype=torch.bool)
    pad[0, n // 2 :] = False
    pad[1, 0] = False
    return x, pad


def dense_masked_softmax(module: torch.nn.Module, x: torch.Tensor, pad, before: int, after: int) -> torch.Tensor:
    """The window written out: scores of every (n, m), a padded key at the lowest number, a key
    outside n − before < m < n + after at −inf, softmax, values, output projection."""
    q = torch.einsum("bnf,fhd->bhnd", x, module.WQ)
    k = torch.einsum("bmf,fhd->bhmd", x, module.WK)
    v = torch.einsum("bmf,fhe->bhme", x, module.WV)
    scores = q @ k.mT / (F // H) ** 0.5
    if pad is not None:
        scores = scores.masked_fill(~pad[:, None, None, :], torch.finfo(F64).min)
    n = torch.arange(x.shape[1])
    offset = n[None, :] - n[:, None]
    scores = scores.masked_fill((offset <= -before) | (offset >= after), float("-inf"))
    return torch.einsum("bhne,heg->bng", scores.softmax(-1) @ v, module.WO)


@pytest.mark.parametrize("padded", [False, True], ids=["no padding", "padding"])
@pytest.mark.parametrize("form", ["materialized", "sdpa", "banded", "flex"])
@pytest.mark.parametrize("window", sorted(WINDOWS))
def test_each_lowering_equals_the_dense_masked_softmax_and_the_reference(window, form, padded, folder):
    module = _module(window, form, folder)
    path = folder / f"{window}.td"
    reference = tdiag.load(path).module(dtype=F64, impl="reference")
    reference.load_state_dict(module.state_dict())
    _, before, after = WINDOWS[window]
    for n in LENGTHS:
        x, pad = inputs(n)
        masks = {"pad": pad} if padded else {}
        with torch.no_grad() if form == "flex" else contextlib.nullcontext():  # flex: no CPU backward
            actual = module(x, **masks)
        expected = dense_masked_softmax(module, x, pad if padded else None, before, after)
        torch.testing.assert_close(actual, expected, rtol=0, atol=1e-12)
        torch.testing.assert_close(actual, reference(x, **masks), rtol=0, atol=1e-12)


@pytest.mark.parametrize("form", ["sdpa", "banded"])
def test_gradients_equal_the_reference(form, folder):
    module = _module("one-sided", form, folder)
    reference = tdiag.load(folder / "one-sided.td").module(dtype=F64, impl="reference")
    reference.load_state_dict(module.state_dict())
    x, pad = inputs(21)
    x.requires_grad_(True)
    (actual,) = torch.autograd.grad(module(x, pad=pad).square().sum(), x)
    (expected,) = torch.autograd.grad(reference(x, pad=pad).square().sum(), x)
    torch.testing.assert_close(actual, expected, rtol=0, atol=1e-12)


def test_banded_form_passes_gradcheck(folder):
    module = _module("two-sided", "banded", folder)
    x, pad = inputs(5)
    x, pad = x[1:].requires_grad_(True), pad[1:]  # one sequence: its first key padded
    assert torch.autograd.gradcheck(lambda x: module(x, pad=pad), (x,))


def test_banded_module_compiles_fullgraph(folder):
    module = _module("one-sided", "banded", folder)
    compiled = torch.compile(module, fullgraph=True, backend="eager")
    x, pad = inputs(21)
    torch.testing.assert_close(compiled(x, pad=pad), module(x, pad=pad), rtol=0, atol=1e-12)


def test_banded_standalone_file_equals_the_in_process_module(folder, tmp_path):
    module = _module("one-sided", "banded", folder)
    with only_forms("banded", "materialized"):  # the file holds the masked variants too (docs/module.md)
        design = tdiag.load(folder / "one-sided.td")
        assert [choice.taken for choice in design.plan(N=64, objective="flops").choices] == ["banded"]
        source = design.source(N=64, objective="flops")
    standalone = standalone_module(source, "windowed_banded", tmp_path).Windowed(dtype=F64)
    standalone.load_state_dict(module.state_dict())
    x, pad = inputs(21)
    assert torch.equal(standalone(x, pad=pad), module(x, pad=pad))


def test_a_map_masked_by_a_window_zeroes_the_keys_outside_it(tmp_path):
    path = tmp_path / "relu.td"
    path.write_text(
        "design relu_window\nsize F = 4, W = 2\nsize N\ninput X[n: N, f: F]\n"
        "Y[n f] = relu[m, mask = window(n, m, W)](X[n g] X[m g]) X[m f]\noutput Y\n"
    )
    module = tdiag.load(path).module(dtype=F64)
    x = torch.randn(1, 6, 4, dtype=F64)
    n = torch.arange(6)
    visible = (n[None, :] <= n[:, None]) & (n[None, :] > n[:, None] - 2)
    expected = ((x @ x.mT).relu() * visible) @ x
    torch.testing.assert_close(module(x), expected, rtol=0, atol=1e-12)


def test_with_causal_mask_takes_a_one_sided_window_as_causal(tmp_path_factory):
    design = load("one-sided", tmp_path_factory)
    assert design.with_causal_mask().graph is design.graph


def test_with_causal_mask_closes_a_two_sided_window_at_the_query(tmp_path_factory, folder):
    causal = load("two-sided", tmp_path_factory).with_causal_mask()
    module = causal.module(dtype=F64)
    x, pad = inputs(9)
    torch.testing.assert_close(module(x, pad=pad), dense_masked_softmax(module, x, pad, L, 1), rtol=0, atol=1e-12)


def test_the_banded_form_is_taken_at_long_lengths_and_its_flops_are_linear_in_n(tmp_path_factory):
    design = load("one-sided", tmp_path_factory, DESIGN.replace("W = 5", "W = 64"))
    plan = design.plan(N=4096, objective="flops")
    assert [choice.taken for choice in plan.choices] == ["banded"]
    flops = design.cost(N=4096, objective="flops").flops
    n = sympy.Symbol("N", positive=True)
    values = [flops.subs(n, length) for length in (4096, 8192, 12288)]
    assert values[2] - 2 * values[1] + values[0] == 0 and values[1] > values[0]


def test_sdpa_keeps_the_boolean_band_as_float32_for_backward(tmp_path_factory):
    unpadded = DESIGN.replace("mask pad[m: N]\n", "").replace(", mask = pad[m]", "")
    design = load("one-sided", tmp_path_factory, unpadded)
    with only_forms("sdpa"):
        plan = design.plan(N=256)
    fp = footprint(plan)
    (record,) = [r for step, r in zip(plan.steps, fp.steps, strict=False) if step.kind == "sdpa"]
    assert record.converted_mask
    kept = [fp.storages[s] for s in record.saved if fp.storages[s].what == "attn_mask as float"]
    assert [sympy.sympify(s.bytes).subs(sympy.Symbol("N", positive=True), 256) for s in kept] == [4 * 256 * 256]


def test_the_plan_says_why_the_banded_form_does_not_apply(tmp_path_factory):
    biased = DESIGN.replace("(Q[n h d] K[m h d])", "(Q[n h d] K[m h d] - abs(index(n) - index(m)))")
    plan = load("one-sided", tmp_path_factory, biased).plan(N=256)
    (banded,) = [c for c in plan.choices[0].candidates if c.form == "banded"]
    assert banded.refusal == "an additive term of the scores (the banded form takes query·key products alone)"


def test_the_documented_bias_equals_a_window_one_wider(tmp_path_factory):
    # docs/language.md: causal(n, m) with -10000 relu(index(n) - index(m) - W) is window(n, m, W + 1)
    # wherever some key of a query's window is visible
    bias = "mask = causal(n, m), mask = pad[m]](Q[n h d] K[m h d] - 10000 relu(index(n) - index(m) - W))"
    biased = load(
        "one-sided", tmp_path_factory, DESIGN.replace("mask = {window}, mask = pad[m]](Q[n h d] K[m h d])", bias)
    )
    windowed = load("one-sided", tmp_path_factory, DESIGN.replace("W = 5", "W = 6"))
    a, b = biased.module(dtype=F64, objective="flops"), windowed.module(dtype=F64, objective="flops")
    b.load_state_dict(a.state_dict())
    x, _ = inputs(12)  # unpadded: where padding hides a whole window, the bias attends outside it
    torch.testing.assert_close(a(x), b(x), rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ["logsumexp", "mean"])
def test_a_reduction_masked_by_a_window_sees_only_the_window(name, tmp_path):
    path = tmp_path / "reduced.td"
    path.write_text(
        "design reduced\nsize F = 4, W = 3\nsize N\ninput X[n: N, f: F]\n"
        f"Y[n] = {name}[m, mask = window(n, m, W)](X[n g] X[m g])\noutput Y\n"
    )
    module = tdiag.load(path).module(dtype=F64)
    x = torch.randn(1, 7, 4, dtype=F64)
    scores = x @ x.mT
    n = torch.arange(7)
    visible = (n[None, :] <= n[:, None]) & (n[None, :] > n[:, None] - 3)
    if name == "logsumexp":
        expected = scores.masked_fill(~visible, torch.finfo(F64).min).logsumexp(-1)
    else:
        expected = (scores * visible).sum(-1) / visible.sum(-1)
    torch.testing.assert_close(module(x), expected, rtol=0, atol=1e-12)


def test_the_plan_command_lists_the_banded_form_with_its_costs(capsys):
    from tdiag.cli import main

    assert main(["plan", "mistral", "--at", "N=4096"]) == 0
    out = capsys.readouterr().out
    (row,) = [line for line in out.splitlines() if line.split()[:2] == ["*", "banded"]]
    assert row.endswith("taken") and "MB" in row
    assert "softmax box over m in blocks of C = 128 queries, each with its 383 keys of the window" in out


def test_flex_attention_prices_only_the_key_blocks_along_the_band():
    plan = tdiag.load("mistral").plan(N=4096, attention="flex")
    (step,) = [s for s in plan.steps if s.kind == "flex"]
    n = sympy.Symbol("N", positive=True)
    kernel = [step.kernel_flops.subs(n, length) for length in (4096, 8192, 12288)]
    assert kernel[2] - 2 * kernel[1] + kernel[0] == 0
    assert sympy.simplify(kernel[0] / step.flops.subs(n, 4096)) == sympy.Rational(384, 4096)  # 3 blocks of 128 a row
