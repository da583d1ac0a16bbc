"""The repeated-query SDPA form (tdiag/plan/forms/sdpa_repeated.py, issue 22): a causal softmax
box over several keys per position (MGK's (m r), mgk spec) as one is_causal SDPA whose query
rows are repeated over the keys of a position, without the N×(N·M) attn_mask of the ordinary
SDPA form. Values and gradients equal the reference evaluation, its memory is what autograd
keeps, and the chooser weighs it against the other forms on a fixed nominal device."""

import pytest
import torch
from conftest import DESIGNS

import tdiag
from tdiag.measure import saved_for_backward
from tdiag.plan import BATCH_SIZE, forms
from tdiag.plan.footprint import footprint
from tdiag.plan.forms import FORMS, Unfit

TOL = 1e-10
F64 = torch.float64
SMALL = {"F": 8, "H": 2, "D": 4, "M": 3}


@pytest.fixture
def repeated_only(monkeypatch):
    """The registry without the ordinary SDPA form, so that the repeated form is the fused one
    taken wherever it applies and is cheaper than the materialized box."""
    monkeypatch.setattr(forms, "FORMS", [form for form in FORMS if form.name != "sdpa"])


def causal(name: str, **sizes: int) -> tdiag.Design:
    return tdiag.load(DESIGNS / f"{name}.td", **sizes).with_causal_mask()


def candidate(choice, form: str):
    return next(c for c in choice.candidates if c.form == form)


def the_choice(design: tdiag.Design, **options):
    (choice,) = design.plan(**options).choices
    return choice


def run(module, x: torch.Tensor):
    """The output and the gradients of x and of every parameter for a fixed cotangent."""
    x = x.clone().requires_grad_()
    y = module(x)
    y.backward(torch.cos(torch.arange(y.numel(), dtype=F64)).reshape(y.shape))
    return y.detach(), x.grad, {k: p.grad for k, p in module.named_parameters()}


# ---- values and gradients ------------------------------------------------------------------


@pytest.mark.parametrize("name", ["mgk", "smgk"])
def test_causal_values_and_gradients_equal_the_reference(repeated_only, name):
    design = causal(name, **SMALL)
    module = design.module(dtype=F64, N=7)
    assert [c.taken for c in module.tdiag_plan.choices] == ["sdpa_repeated"]
    reference = design.module(impl="reference", dtype=F64, N=7)
    reference.load_state_dict(module.state_dict())
    x = torch.randn(2, 7, 8, dtype=F64, generator=torch.Generator().manual_seed(1))
    (y, dx, dp), (y_ref, dx_ref, dp_ref) = run(module, x), run(reference, x)
    assert torch.allclose(y, y_ref, atol=TOL, rtol=0)
    assert torch.allclose(dx, dx_ref, atol=TOL, rtol=0)
    assert all(torch.allclose(dp[k], dp_ref[k], atol=TOL, rtol=0) for k in dp)


@pytest.mark.parametrize("name", ["mgk", "smgk"])
def test_causal_form_passes_gradcheck(repeated_only, name):
    module = causal(name, F=4, H=1, D=2, M=2).module(dtype=F64, N=4)
    names = [k for k, _ in module.named_parameters()]

    def forward(x, *params):
        return torch.func.functional_call(module, dict(zip(names, params, strict=True)), (x,))

    x = torch.randn(1, 4, 4, dtype=F64, requires_grad=True, generator=torch.Generator().manual_seed(2))
    params = [p.detach().clone().requires_grad_() for p in module.parameters()]
    assert torch.autograd.gradcheck(forward, (x, *params))


def test_the_generated_call_is_causal_over_repeated_queries_with_no_attn_mask(repeated_only):
    source = causal("mgk", **SMALL).source(N=7)
    call = next(line for line in source.splitlines() if "scaled_dot_product_attention(" in line)
    assert ".repeat_interleave(3, dim=-2)" in call and "is_causal=True" in call and "[..., 2::3, :]" in call
    assert "attn_mask" not in call and "visible" not in source


# ---- memory ------------------------------------------------------------------------------


@pytest.mark.parametrize("batch", [1, 2])
def test_the_footprint_model_is_what_autograd_keeps(repeated_only, batch):
    design = causal("mgk", F=32, H=2)
    module = design.module(seed=0, N=64, B=batch)
    assert [c.taken for c in module.tdiag_plan.choices] == ["sdpa_repeated"]
    x = torch.randn(batch, 64, 32, generator=torch.Generator().manual_seed(0))
    plan = module.tdiag_plan
    modelled = plan.graph.evaluate(footprint(plan, plan.sizes | {"B": batch}).saved_bytes, **plan.sizes)
    assert saved_for_backward(module, x).total_bytes == int(modelled.xreplace({BATCH_SIZE: batch}))


def test_at_a_long_sequence_it_keeps_less_than_the_attn_mask_form():
    choice = the_choice(causal("mgk", F=256, H=4), N=4096)
    assert candidate(choice, "sdpa_repeated").cost.kept < candidate(choice, "sdpa").cost.kept


# ---- the choice ------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1024, 4096])
def test_causal_mgk_lists_the_form_with_its_cost(n):
    choice = the_choice(causal("mgk", F=256, H=4), N=n)
    cost = candidate(choice, "sdpa_repeated").cost
    assert cost is not None and cost.time > 0 and cost.kept > 0


def test_causal_mgk_at_a_long_sequence_takes_it_under_the_default_objective():
    choice = the_choice(causal("mgk", F=256, H=4), N=4096)
    assert choice.taken == "sdpa_repeated"


def test_the_form_is_credited_with_the_blocks_the_kernel_skips(repeated_only):
    plan = causal("mgk", F=256, H=4).plan(N=4096)
    (step,) = [step for step in plan.steps if step.kind == "sdpa"]
    ratio = float(plan.graph.evaluate(step.kernel_flops / step.flops, N=4096))
    assert ratio == pytest.approx(2 * (8192 + 512) / (2 * 8192))  # M = 2 times the rows, the upper blocks skipped


# ---- refusals ----------------------------------------------------------------------------


def refusal(design: tdiag.Design, **options) -> str | None:
    return candidate(the_choice(design, **options), "sdpa_repeated").refusal


def test_refused_as_unfit_without_a_causal_mask():
    reason = refusal(tdiag.load(DESIGNS / "mgk.td", **SMALL), N=8)
    assert isinstance(reason, Unfit) and reason.startswith("no causal mask")


def test_refused_as_unfit_for_one_key_per_position():
    reason = refusal(causal("mhsa"), N=64)
    assert isinstance(reason, Unfit) and reason.startswith("one key per position")


def test_refused_for_several_query_legs(write_td):
    """MGK whose G query heads share each key head: the query legs n and g."""
    text = (DESIGNS / "mgk.td").read_text(encoding="utf-8")
    for old, new in [
        ("size N ", "size G = 2\nsize N "),
        ("WQ[f: F, h: H, d: D]", "WQ[f: F, h: H, g: G, d: D]"),
        ("WO[h: H, e: D, g: F]", "WO[h: H, g: G, e: D, o: F]"),
        ("Q[n h d] = X[n f] WQ[f h d]", "Q[n h g d] = X[n f] WQ[f h g d]"),
        ("Y[n g] = sum[r](A[h n m r] V[m h e] WO[h e g])", "Y[n o] = sum[r](A[h g n m r] V[m h e] WO[h g e o])"),
        ("A[h n m r]", "A[h g n m r]"),
        ("Q[n h d], K", "Q[n h g d], K"),
    ]:
        assert old in text
        text = text.replace(old, new)
    design = tdiag.load(write_td(text, "mgk_grouped.td"), **SMALL).with_causal_mask()
    assert refusal(design, N=8).startswith("several query legs")


def test_refused_with_a_padding_mask(write_td):
    text = (DESIGNS / "mgk.td").read_text(encoding="utf-8")
    text = text.replace("input X[n: N, f: F]", "input X[n: N, f: F]\nmask pad[m: N]")
    text = text.replace("softmax[m r](", "softmax[m r, mask = pad[m]](")
    design = tdiag.load(write_td(text, "mgk_padded.td"), **SMALL).with_causal_mask()
    assert refusal(design, N=8).startswith("a padding mask needs a float attn_mask")


# ---- the time model's charge for a boolean attn_mask -------------------------------------------


def sdpa_record(design: tdiag.Design, **sizes: int):
    plan = design.plan(objective="memory", **sizes)
    (k,) = [k for k, step in enumerate(plan.steps) if step.kind == "sdpa"]
    return footprint(plan).steps[k]


def test_a_boolean_attn_mask_is_recorded_as_converted_to_floats():
    assert sdpa_record(causal("mgk", F=256, H=4), N=1024).converted_mask


def test_a_float_attn_mask_is_not_recorded_as_converted():
    assert not sdpa_record(tdiag.load(DESIGNS / "absolute_bias.td"), N=256).converted_mask
