"""The position designs of issue 13 (RoPE, partial RoPE, ALiBi, relative and absolute position
bias) and cross-attention, each equal (float64, 1e-10) to its paper's equation written here in
plain torch, plain and causal where causal makes sense; gradcheck at small sizes; the standalone
compiled file equals the in-process module; torch.compile(fullgraph)."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import DESIGNS, gradcheck_parameters, perturbed, standalone_module, visible

import tdiag

F64 = torch.float64
WIDTH = 16
SIZES = {"F": WIDTH, "H": 2}
EXTRA = {"absolute_bias": {"L": 12}, "relative_bias": {"C": 2}}
N = 5


def design(name: str, causal: bool = False) -> tdiag.Design:
    loaded = tdiag.load(DESIGNS / f"{name}.td", **SIZES, **EXTRA.get(name, {}))
    return loaded.with_causal_mask() if causal else loaded


def x_input(*batch: int, n: int = N, seed: int = 1) -> torch.Tensor:
    return torch.randn(*batch, n, WIDTH, dtype=F64, generator=torch.Generator().manual_seed(seed))


def attend(logits: torch.Tensor, allowed: torch.Tensor, v: torch.Tensor, wo: torch.Tensor) -> torch.Tensor:
    a = logits.masked_fill(~allowed, -math.inf).softmax(-1)
    return torch.einsum("...hnm,...hme,heg->...ng", a, v, wo)


def project(x, w):
    return torch.einsum("...nf,fhd->...hnd", x, w)


def rotate_interleaved(x: torch.Tensor) -> torch.Tensor:
    """RoFormer eq. (34): pairs (x_{2i}, x_{2i+1}) rotated by angle position · θ_i, θ_i =
    10000^(−2i/d), positions 0 .. n − 1 along the second-to-last axis."""
    n, d = x.shape[-2], x.shape[-1]
    theta = 10000.0 ** (-torch.arange(0, d, 2, dtype=F64) / d)
    angle = torch.arange(n, dtype=F64)[:, None] * theta[None, :]  # [n, d/2]
    cos, sin = angle.cos().repeat_interleave(2, -1), angle.sin().repeat_interleave(2, -1)
    swapped = torch.stack([-x[..., 1::2], x[..., 0::2]], -1).reshape(x.shape)  # (−x2, x1, −x4, x3, ...)
    return x * cos + swapped * sin


# ---- each paper's equation, written independently -------------------------------------------


def rope(p, x, allowed):
    q, k, v = project(x, p["WQ"]), project(x, p["WK"]), project(x, p["WV"])
    q, k = rotate_interleaved(q), rotate_interleaved(k)
    return attend(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), allowed, v, p["WO"])


def rope_partial(p, x, allowed):
    """GPT-NeoX rotary_pct: one projection W_q = [W_q,rot | W_q,pass] per head; the first Dr dims rotate."""
    wq = torch.cat([p["WQr"], p["WQp"]], -1)
    wk = torch.cat([p["WKr"], p["WKp"]], -1)
    dr = p["WQr"].shape[-1]
    q, k, v = project(x, wq), project(x, wk), project(x, p["WV"])
    q = torch.cat([rotate_interleaved(q[..., :dr]), q[..., dr:]], -1)
    k = torch.cat([rotate_interleaved(k[..., :dr]), k[..., dr:]], -1)
    return attend(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), allowed, v, p["WO"])


def alibi(p, x, allowed):
    """Press et al. 2022, Sec. 3: q_i Kᵀ + slope · [−(i − 1), ..., −1, 0], slopes 2^(−8h/H)."""
    q, k, v = project(x, p["WQ"]), project(x, p["WK"]), project(x, p["WV"])
    heads, n = q.shape[-3], x.shape[-2]
    slopes = torch.tensor([2.0 ** (-8 * (h + 1) / heads) for h in range(heads)], dtype=F64)
    i = torch.arange(n, dtype=F64)
    distance = (i[:, None] - i[None, :]).abs()
    bias = -slopes[:, None, None] * distance
    return attend(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + bias, allowed, v, p["WO"])


def relative_bias(p, x, allowed):
    """T5 Sec. 2.1 scalar per head and offset, offsets clipped to ±C (Shaw et al. 2018)."""
    q, k, v = project(x, p["WQ"]), project(x, p["WK"]), project(x, p["WV"])
    n, c = x.shape[-2], (p["Rel"].shape[-1] - 1) // 2
    bias = torch.empty(q.shape[-3], n, n, dtype=F64)
    for i in range(n):
        for j in range(n):
            bias[:, i, j] = p["Rel"][:, max(-c, min(c, j - i)) + c]
    return attend(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + bias, allowed, v, p["WO"])


def absolute_bias(p, x, allowed):
    q, k, v = project(x, p["WQ"]), project(x, p["WK"]), project(x, p["WV"])
    n = x.shape[-2]
    bias = p["Bias"][:, :n, :n]
    return attend(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + bias, allowed, v, p["WO"])


PAPERS = {
    "rope": rope,
    "rope_partial": rope_partial,
    "alibi": alibi,
    "relative_bias": relative_bias,
    "absolute_bias": absolute_bias,
}


def cross_attention(p, x, z, pad):
    """Vaswani et al. 2017 Sec. 3.2.3: queries from X, keys and values from the memory Z."""
    q, k, v = project(x, p["WQ"]), project(z, p["WK"]), project(z, p["WV"])
    allowed = pad[..., None, None, :]
    return attend(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), allowed, v, p["WO"])


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
@pytest.mark.parametrize("name", sorted(PAPERS))
def test_design_equals_its_papers_equation(name, causal):
    module = design(name, causal).module(N=N, dtype=F64)
    params = perturbed(module)
    x = x_input(2)
    torch.testing.assert_close(module(x), PAPERS[name](params, x, visible(N, causal)), rtol=0, atol=1e-10)


@pytest.mark.parametrize("name", sorted(PAPERS))
def test_design_runs_at_other_lengths_than_planned(name):
    module = design(name, True).module(N=N, dtype=F64)
    params = perturbed(module)
    x = x_input(3, n=9)
    torch.testing.assert_close(module(x), PAPERS[name](params, x, visible(9, True)), rtol=0, atol=1e-10)


@pytest.mark.parametrize("name", sorted(PAPERS))
def test_reference_evaluator_equals_the_compiled_module(name):
    loaded = design(name, True)
    module = loaded.module(N=N, dtype=F64)
    perturbed(module)
    reference = loaded.module(N=N, dtype=F64, impl="reference")
    reference.load_state_dict(module.state_dict(), strict=False)
    x = x_input(2)
    torch.testing.assert_close(reference(x), module(x), rtol=0, atol=1e-10)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PAPERS))
def test_gradcheck(name):
    module = design(name, True).module(N=3, dtype=F64)
    perturbed(module)
    x = x_input(1, n=3).requires_grad_()
    assert gradcheck_parameters(module, (x,))


@pytest.mark.parametrize("name", sorted(PAPERS))
def test_standalone_file_equals_in_process_module(name, tmp_path):
    loaded = design(name, True)
    generated = standalone_module(loaded.source(N=N), f"{name}_module", tmp_path)
    class_name = "".join(part.capitalize() for part in name.split("_"))
    standalone = getattr(generated, class_name)(seed=7, dtype=F64)
    in_process = loaded.module(seed=7, dtype=F64, N=N)
    x = x_input(2, n=7)
    assert torch.equal(standalone(x), in_process(x))


@pytest.mark.parametrize("name", sorted(PAPERS))
def test_torch_compile_fullgraph(name):
    module = design(name, True).module(N=N)
    compiled = torch.compile(module, fullgraph=True, backend="eager")
    x = torch.randn(2, 11, WIDTH)
    torch.testing.assert_close(compiled(x), module(x), rtol=1e-6, atol=1e-6)


# ---- the position constructs ------------------------------------------------------------------


def test_absolute_bias_longer_than_its_table_is_a_clear_error():
    module = design("absolute_bias").module(N=N, dtype=F64)
    with pytest.raises(ValueError, match="Bias: reads the first N = 13 entries of axis i of L = 12"):
        module(x_input(1, n=13))


def test_rope_stores_no_table_of_positions():
    """Positions are made in the forward; the rotation constant R is unrolled into the code."""
    module = design("rope").module(N=N, dtype=F64)
    assert {name for name, _ in module.named_buffers()} == set()


def test_rope_rotation_is_a_two_by_two_block_not_a_head_width_matrix():
    """No intermediate is larger than Q itself (N·H·D per sequence): the rotation never forms an
    N·D·D matrix, and SDPA never stores the H·N² scores."""
    n = 64
    plan = design("rope").plan(N=n)

    def entries(legs) -> int:
        return math.prod(int(plan.graph.evaluate(plan.leg_sizes[leg], N=n)) for leg in legs if leg != "#b")

    widest = max(entries(step.out.legs) for step in plan.steps if step.out is not None)
    assert widest <= n * WIDTH


@pytest.mark.parametrize("name", ["alibi", "relative_bias", "absolute_bias"])
def test_position_bias_goes_to_sdpa_as_a_float_attn_mask(name):
    plan = design(name, True).plan(N=64)
    assert any("additive bias as a float attn_mask" in note for note in plan.lowered), plan.lowered


def test_relative_bias_is_a_gather_not_a_one_hot_contraction():
    plan = design("relative_bias").plan(N=64)
    kinds = [step.kind for step in plan.steps]
    assert "gather" in kinds
    assert all(step.flops == 0 for step in plan.steps if step.kind in ("gather", "positions"))


@pytest.mark.parametrize("causal", [False], ids=["plain"])
def test_cross_attention_equals_its_papers_equation(causal):
    module = design("cross_attention").module(N=N, M=7, dtype=F64)
    params = perturbed(module)
    x, z = x_input(2), x_input(2, n=7, seed=3)
    pad = torch.ones(2, 7, dtype=torch.bool)
    pad[0, 5:] = False
    pad[1, 3:] = False
    torch.testing.assert_close(module(x, z, pad=pad), cross_attention(params, x, z, pad), rtol=0, atol=1e-10)


def test_cross_attention_reference_and_standalone_agree(tmp_path):
    loaded = design("cross_attention")
    module = loaded.module(N=N, M=7, dtype=F64, seed=7)
    reference = loaded.module(dtype=F64, seed=7, impl="reference")
    generated = standalone_module(loaded.source(N=N, M=7), "cross_module", tmp_path)
    standalone = generated.CrossAttention(seed=7, dtype=F64)
    x, z = x_input(2), x_input(2, n=6, seed=3)  # a memory length other than the planned M = 7
    pad = torch.tensor([[True] * 4 + [False] * 2, [True] * 6])
    torch.testing.assert_close(reference(x, z, pad=pad), module(x, z, pad=pad), rtol=0, atol=1e-10)
    assert torch.equal(standalone(x, z, pad=pad), module(x, z, pad=pad))


@pytest.mark.slow
def test_cross_attention_gradcheck_and_compile():
    module = design("cross_attention").module(N=3, M=4, dtype=F64)
    perturbed(module)
    x, z = x_input(1, n=3).requires_grad_(), x_input(1, n=4, seed=3).requires_grad_()
    pad = torch.tensor([[True, True, True, False]])
    assert gradcheck_parameters(module, (x, z), {"pad": pad})
    compiled = torch.compile(module, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(x, z, pad=pad), module(x, z, pad=pad), rtol=0, atol=1e-12)


def test_train_refuses_cross_attention_with_a_positioned_error(capsys):
    from tdiag.cli import main

    code = main(["train", "cross_attention", "--steps", "1"])
    out, err = capsys.readouterr()
    assert code == 1 and "Traceback" not in out + err
    second_input = next(
        i
        for i, line in enumerate((DESIGNS / "cross_attention.td").read_text().splitlines(), 1)
        if line.startswith("input Z")
    )
    assert f"cross_attention.td:{second_input}:7: error: design 'cross_attention' has 2 input(s) (X, Z)" in err


def test_rope_diagram_draws_the_index_nodes_and_the_rotation_constant():
    from tdiag.render import to_dot

    dot = to_dot(design("rope").graph)
    assert 'label="index"' in dot and 'label="R"' in dot


def test_relative_bias_diagram_draws_the_gather_at_its_position():
    from tdiag.render import to_dot

    dot = to_dot(design("relative_bias").graph)
    assert 'label="r = (clamp((m - n), -C, C) + C)"' in dot and 'label="Rel"' in dot


def test_absolute_bias_diagram_shows_the_slice():
    from tdiag.render import to_dot

    assert 'label="Bias[n: N, m: N]"' in to_dot(design("absolute_bias").graph)


def test_cost_counts_positions_and_gathers_as_elementwise_not_flops():
    report = design("relative_bias").cost(N=64)
    plain = tdiag.load(DESIGNS / "mhsa.td", **SIZES).cost(N=64)
    assert report.at(N=64)["flops"] == plain.at(N=64)["flops"]
    assert report.at(N=64)["elementwise"] > plain.at(N=64)["elementwise"]
