"""A compiled module called like scaled_dot_product_attention and nn.MultiheadAttention: attn_mask
(bool True = attend, float added after the scale), key_padding_mask (True = ignore) and is_causal
at call time (call_plans.py, graph/call_masks.py, codegen_calls.py), against torch's own modules
on the same weights in float64; every mistake named by its argument."""

from __future__ import annotations

import inspect

import pytest
import torch

import tdiag
from tdiag.resources import design_file

TOL = 1e-10
F, H, N, B = 8, 2, 6, 3


@pytest.fixture(scope="module")
def mhsa() -> torch.nn.Module:
    return tdiag.load("mhsa", F=F, H=H).module(seed=0, dtype=torch.float64)


@pytest.fixture(scope="module")
def mha(mhsa) -> torch.nn.MultiheadAttention:
    """nn.MultiheadAttention with mhsa's weights: in_proj rows are (h d) per projection."""
    module = torch.nn.MultiheadAttention(F, H, bias=False, batch_first=True, dtype=torch.float64)
    with torch.no_grad():
        module.in_proj_weight.copy_(torch.cat([w.reshape(F, F).T for w in (mhsa.WQ, mhsa.WK, mhsa.WV)]))
        module.out_proj.weight.copy_(mhsa.WO.reshape(F, F).T)
    return module


@pytest.fixture(scope="module")
def x() -> torch.Tensor:
    return torch.randn(B, N, F, dtype=torch.float64, generator=torch.Generator().manual_seed(1))


def _sdpa_reference(mhsa, x, attn_mask=None, is_causal=False):
    """mhsa written with scaled_dot_product_attention (its attn_mask and is_causal as given; a
    mask of 3 axes is (batch, queries, keys), as the module takes it, given SDPA as (batch, 1, ...))."""
    if attn_mask is not None and attn_mask.dim() == 3:
        attn_mask = attn_mask[:, None]
    q, k, v = (torch.einsum("bnf,fhd->bhnd", x, w) for w in (mhsa.WQ, mhsa.WK, mhsa.WV))
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)
    return torch.einsum("bhne,heg->bng", out, mhsa.WO)


def _bool_mask(*shape, seed=2) -> torch.Tensor:
    """A random bool mask with every query seeing its own key (no row all hidden)."""
    mask = torch.rand(*shape, generator=torch.Generator().manual_seed(seed)) > 0.4
    return mask | torch.eye(shape[-2], shape[-1], dtype=torch.bool)


def _float_mask(*shape, seed=3) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


# ---- against nn.MultiheadAttention and SDPA ---------------------------------------------------


def test_plain_call_equals_multihead_attention(mhsa, mha, x):
    expected, _ = mha(x, x, x, need_weights=False)
    assert torch.allclose(mhsa(x), expected, atol=TOL, rtol=0)


def test_is_causal_equals_multihead_attention_with_causal_mask(mhsa, mha, x):
    causal = torch.nn.Transformer.generate_square_subsequent_mask(N, dtype=torch.float64)
    expected, _ = mha(x, x, x, attn_mask=causal, need_weights=False)
    assert torch.allclose(mhsa(x, is_causal=True), expected, atol=TOL, rtol=0)


def test_key_padding_mask_bool_equals_multihead_attention(mhsa, mha, x):
    ignore = torch.zeros(B, N, dtype=torch.bool)
    ignore[0, 4:], ignore[2, 1] = True, True
    expected, _ = mha(x, x, x, key_padding_mask=ignore, need_weights=False)
    assert torch.allclose(mhsa(x, key_padding_mask=ignore), expected, atol=TOL, rtol=0)


def test_key_padding_mask_float_is_added_as_multihead_attention_adds_it(mhsa, mha, x):
    added = _float_mask(B, N)
    expected, _ = mha(x, x, x, key_padding_mask=added, need_weights=False)
    assert torch.allclose(mhsa(x, key_padding_mask=added), expected, atol=TOL, rtol=0)


@pytest.mark.parametrize("shape", [(N, N), (B, N, N), (B, 1, N, N), (1, N, N)], ids=str)
def test_bool_attn_mask_equals_sdpa(mhsa, x, shape):
    mask = _bool_mask(*shape)
    assert torch.allclose(mhsa(x, attn_mask=mask), _sdpa_reference(mhsa, x, mask), atol=TOL, rtol=0)


@pytest.mark.parametrize("shape", [(N, N), (B, N, N), (B, 1, N, N)], ids=str)
def test_float_attn_mask_is_added_after_the_scale_as_sdpa(mhsa, x, shape):
    bias = _float_mask(*shape)
    assert torch.allclose(mhsa(x, attn_mask=bias), _sdpa_reference(mhsa, x, bias), atol=TOL, rtol=0)


CAPPED = "softmax[m, scale = 1 / sqrt(D)](20 * tanh(Q[n h d] K[m h d] / 20))"  # SDPA refuses a map of the scores


@pytest.fixture(scope="module")
def capped() -> torch.nn.Module:
    """mhsa with its scores soft-capped (Gemma 2's c·tanh(s / c)): the materialized box."""
    text = design_file("mhsa").read_text()
    design = tdiag.loads(text.replace("softmax[m, scale = 1 / sqrt(D)](Q[n h d] K[m h d])", CAPPED), F=F, H=H)
    return design.module(seed=0, dtype=torch.float64, plan_calls=True)


def _capped_reference(module, x, mask):
    """The soft-capped attention by hand, `mask` added to the scores after the scale."""
    q, k, v = (torch.einsum("bnf,fhd->bhnd", x, w) for w in (module.WQ, module.WK, module.WV))
    scores = 20 * torch.tanh(q @ k.mT / 20) / (F // H) ** 0.5 + mask
    return torch.einsum("bhne,heg->bng", scores.softmax(-1) @ v, module.WO)


def test_a_float_attn_mask_on_a_materialized_box_is_added_after_the_scale(capped, x):
    assert "functional.scaled_dot_product_attention(" not in capped.tdiag_source
    bias = _float_mask(B, N, N)
    assert torch.allclose(capped(x, attn_mask=bias), _capped_reference(capped, x, bias[:, None]), atol=TOL, rtol=0)


def test_a_bool_attn_mask_on_a_materialized_box_hides_the_keys(capped, x):
    mask = _bool_mask(N, N)
    hidden = torch.zeros(N, N, dtype=torch.float64).masked_fill(~mask, -torch.inf)
    assert torch.allclose(capped(x, attn_mask=mask), _capped_reference(capped, x, hidden), atol=TOL, rtol=0)


@pytest.mark.parametrize("which", ["sdpa", "materialized"])
def test_a_query_whose_keys_are_all_hidden_averages_the_values(mhsa, capped, x, which):
    module = mhsa if which == "sdpa" else capped
    mask = _bool_mask(N, N)
    mask[2] = False
    v = torch.einsum("bnf,fhd->bhnd", x, module.WV)
    average = torch.einsum("bhe,heg->bg", v.mean(-2), module.WO)
    got = module(x, attn_mask=mask)
    assert torch.allclose(got[:, 2], average, atol=TOL, rtol=0)


@pytest.mark.parametrize("kind", ["bool", "float"])
def test_a_mask_per_head_equals_sdpa(mhsa, x, kind):
    mask = _bool_mask(B, H, N, N) if kind == "bool" else _float_mask(B, H, N, N)
    assert torch.allclose(mhsa(x, attn_mask=mask), _sdpa_reference(mhsa, x, mask), atol=TOL, rtol=0)


def test_a_mask_per_head_combines_with_key_padding_and_is_causal(mhsa, x):
    bias = _float_mask(B, H, N, N)
    ignore = torch.zeros(B, N, dtype=torch.bool)
    ignore[2, 1:3] = True
    causal = torch.zeros(N, N, dtype=torch.float64).masked_fill(torch.ones(N, N, dtype=torch.bool).triu(1), -torch.inf)
    padding = torch.zeros(B, 1, 1, N, dtype=torch.float64).masked_fill(ignore[:, None, None, :], -torch.inf)
    expected = _sdpa_reference(mhsa, x, bias + causal + padding)
    got = mhsa(x, attn_mask=bias, key_padding_mask=ignore, is_causal=True)
    assert torch.allclose(got, expected, atol=TOL, rtol=0)


def test_attn_mask_with_is_causal_intersects(mhsa, x):
    mask = _bool_mask(N, N)
    causal = torch.ones(N, N, dtype=torch.bool).tril()
    expected = _sdpa_reference(mhsa, x, mask & causal)
    assert torch.allclose(mhsa(x, attn_mask=mask, is_causal=True), expected, atol=TOL, rtol=0)


def test_both_masks_and_is_causal_combine_as_multihead_attention(mhsa, mha, x):
    bias = _float_mask(N, N)
    ignore = torch.zeros(B, N, dtype=torch.bool)
    ignore[1, 3:] = True
    causal = torch.nn.Transformer.generate_square_subsequent_mask(N, dtype=torch.float64)
    expected, _ = mha(x, x, x, attn_mask=bias + causal, key_padding_mask=ignore, need_weights=False)
    got = mhsa(x, attn_mask=bias, key_padding_mask=ignore, is_causal=True)
    assert torch.allclose(got, expected, atol=TOL, rtol=0)


def test_bool_masks_intersect(mhsa, x):
    mask = _bool_mask(B, N, N)
    mask[:, :, 0] = True  # every query sees key 0, which no padding hides
    ignore = torch.zeros(B, N, dtype=torch.bool)
    ignore[:, -1] = True
    expected = _sdpa_reference(mhsa, x, mask & ~ignore[:, None, :])
    assert torch.allclose(mhsa(x, attn_mask=mask, key_padding_mask=ignore), expected, atol=TOL, rtol=0)


# ---- is_causal and attn_mask on bundled designs ------------------------------------------------

DESIGNS = {  # small sizes of each: softmax, GQA with RoPE, linear attention, a map, a sink, MGK, MTA
    "mhsa": {"F": 8, "H": 2},
    "llama": {"F": 8, "H": 2},
    "thsa_elu": {"F": 8, "H": 2},
    "sigmoid_attention": {"F": 8, "H": 2},
    "gpt_oss": {"F": 8, "H": 2, "D": 4},
    "mgk": {"F": 8, "H": 2, "D": 4},
    "multi_token_attention": {"F": 8, "H": 2},  # a convolution of the scores, masked before its shift
}


@pytest.fixture(scope="module")
def modules() -> dict[str, tuple[torch.nn.Module, torch.nn.Module]]:
    """Each design's module and the module compiled causal, with the same weights."""
    built = {}
    for name, sizes in DESIGNS.items():
        design = tdiag.load(name, **sizes)
        plain = design.module(seed=0, dtype=torch.float64, N=N)
        causal = design.with_causal_mask().module(seed=0, dtype=torch.float64, N=N)
        causal.load_state_dict(plain.state_dict())
        built[name] = plain, causal
    return built


@pytest.mark.parametrize("name", DESIGNS)
def test_is_causal_at_call_equals_the_module_compiled_causal(modules, name, x):
    plain, causal = modules[name]
    assert torch.allclose(plain(x, is_causal=True), causal(x), atol=TOL, rtol=0)


@pytest.mark.parametrize("name", DESIGNS)
def test_a_causal_bool_attn_mask_equals_is_causal(modules, name, x):
    plain, _ = modules[name]
    lower = torch.ones(N, N, dtype=torch.bool).tril()
    assert torch.allclose(plain(x, attn_mask=lower), plain(x, is_causal=True), atol=TOL, rtol=0)


@pytest.mark.parametrize("name", DESIGNS)
def test_is_causal_with_an_attn_mask_equals_their_intersection(modules, name, x):
    plain, _ = modules[name]
    mask = _bool_mask(B, N, N)
    lower = torch.ones(N, N, dtype=torch.bool).tril()
    expected = plain(x, attn_mask=mask & lower)
    assert torch.allclose(plain(x, attn_mask=mask, is_causal=True), expected, atol=TOL, rtol=0)


@pytest.mark.parametrize("name", DESIGNS)
def test_a_module_compiled_causal_stays_causal_without_is_causal(modules, name, x):
    _, causal = modules[name]
    assert torch.allclose(causal(x, is_causal=False), causal(x, is_causal=True), atol=TOL, rtol=0)
    visible = torch.ones(N, N, dtype=torch.bool)
    assert torch.allclose(causal(x, attn_mask=visible), causal(x), atol=TOL, rtol=0)


@pytest.mark.parametrize("name", DESIGNS)
def test_key_padding_mask_equals_the_same_keys_hidden_by_attn_mask(modules, name, x):
    plain, _ = modules[name]
    ignore = torch.zeros(B, N, dtype=torch.bool)
    ignore[0, 2], ignore[1, 4:] = True, True
    expected = plain(x, attn_mask=~ignore[:, None, :].expand(B, N, N))
    assert torch.allclose(plain(x, key_padding_mask=ignore), expected, atol=TOL, rtol=0)


def test_is_causal_changes_the_result_of_each_design(modules, x):
    for name, (plain, _) in modules.items():
        assert not torch.allclose(plain(x), plain(x, is_causal=True), atol=1e-6), name


@pytest.mark.parametrize("name", ["thsa_elu", "sigmoid_attention", "multi_token_attention"])
def test_a_float_attn_mask_is_refused_where_the_attention_is_not_a_softmax_box(modules, name, x):
    plain, _ = modules[name]
    with pytest.raises(TypeError, match=r"attn_mask is torch.float64: design .* not a softmax box.* bool mask"):
        plain(x, attn_mask=torch.zeros(N, N, dtype=torch.float64))
    with pytest.raises(TypeError, match=r"key_padding_mask is torch\.float64"):
        plain(x, key_padding_mask=torch.zeros(B, N, dtype=torch.float64))


def test_a_bool_mask_per_head_on_linear_attention_is_over_its_score_maps(modules, x):
    """thsa_elu's normalize box A[r n m] has R = H·D score maps: a mask per head is over r (one per
    map; tests/test_call_masks_heads.py has the other designs), and 2 heads are refused."""
    plain, _ = modules["thsa_elu"]
    maps = plain.C.shape[0]
    mask = _bool_mask(B, N, N)
    per_map = plain(x, attn_mask=mask[:, None].expand(B, maps, N, N))
    assert torch.allclose(per_map, plain(x, attn_mask=mask), atol=TOL, rtol=0)
    with pytest.raises(ValueError, match=f"attn_mask has a heads axis of size 2 .* the design has {maps} heads"):
        plain(x, attn_mask=torch.ones(B, 2, N, N, dtype=torch.bool))


# ---- mistakes, named by their argument -------------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "error", "message"),
    [
        ({"attn_mask": torch.ones(N, N, dtype=torch.int64)}, TypeError, "attn_mask must be a bool or floating-point"),
        ({"attn_mask": [[True]]}, TypeError, "attn_mask must be a torch.Tensor, got list"),
        ({"attn_mask": torch.ones(N, N + 1, dtype=torch.bool)}, ValueError, r"attn_mask must end in \(queries, keys\)"),
        ({"attn_mask": torch.ones(N, dtype=torch.bool)}, ValueError, r"attn_mask must end in .* got shape \(6,\)"),
        ({"attn_mask": torch.ones(B, H + 1, N, N, dtype=torch.bool)}, ValueError, "heads axis of size 3.*has 2 heads"),
        ({"attn_mask": torch.ones(B + 1, N, N, dtype=torch.bool)}, ValueError, r"attn_mask .* do not broadcast"),
        ({"attn_mask": torch.ones(2, B, 1, N, N, dtype=torch.bool)}, ValueError, "attn_mask .* more leading axes"),
        ({"key_padding_mask": torch.ones(B, N - 1, dtype=torch.bool)}, ValueError, r"key_padding_mask must end in"),
        ({"key_padding_mask": torch.ones(B, N, dtype=torch.int32)}, TypeError, "key_padding_mask must be a bool"),
        ({"key_padding_mask": torch.ones(B + 1, N, dtype=torch.bool)}, ValueError, "key_padding_mask .* broadcast"),
        ({"is_causal": 1}, TypeError, "is_causal must be a bool, got int"),
    ],
    ids=lambda v: "" if isinstance(v, dict | type) else v.split(" ")[0] + "..." + v[-12:],
)
def test_mistakes_are_errors_naming_the_argument(mhsa, x, arguments, error, message):
    with pytest.raises(error, match=message):
        mhsa(x, **arguments)


def test_a_design_without_query_and_key_legs_takes_no_mask_arguments():
    design = tdiag.loads(
        "design proj\nsize N, F = 4\ninput X[n: N, f: F]\nparam W[f: F, g: F]\nY[n g] = X[n f] W[f g]\noutput Y\n"
    )
    module = design.module(N=3)
    assert list(inspect.signature(module.forward).parameters) == ["X"]
    with pytest.raises(TypeError, match="unexpected keyword argument 'is_causal'"):
        module(torch.randn(3, 4), is_causal=True)


# ---- the design's own masks, torch.compile and the standalone file ---------------------------


@pytest.fixture(scope="module")
def bert() -> torch.nn.Module:
    return tdiag.load("bert", F=8, H=2).module(seed=0, dtype=torch.float64, N=N)


def test_a_designs_own_mask_keeps_working_beside_the_call_masks(bert, x):
    pad = torch.ones(B, N, dtype=torch.bool)
    pad[0, 3:] = False
    assert torch.allclose(bert(x, pad=pad), bert(x, key_padding_mask=~pad), atol=TOL, rtol=0)
    mask = _bool_mask(N, N)
    both = bert(x, pad=pad, attn_mask=mask, is_causal=True)
    lower = torch.ones(N, N, dtype=torch.bool).tril()
    assert torch.allclose(both, bert(x, attn_mask=mask & lower & pad[:, None, :]), atol=TOL, rtol=0)


def test_a_designs_own_mask_of_the_wrong_length_is_named(bert, x):
    with pytest.raises(ValueError, match="mask pad: leg m has size N = 6, got 5"):
        bert(x, pad=torch.ones(B, N - 1, dtype=torch.bool), attn_mask=torch.ones(N, N, dtype=torch.bool))


def test_torch_compile_fullgraph_with_a_mask_on_a_module_built_with_its_call_plans(x):
    module = tdiag.load("mhsa", F=F, H=H).module(seed=0, dtype=torch.float64, plan_calls=True)
    compiled = torch.compile(module, fullgraph=True, backend="eager")
    mask = _bool_mask(B, N, N)
    expected = module(x, attn_mask=mask, is_causal=True)
    assert torch.allclose(compiled(x, attn_mask=mask, is_causal=True), expected, atol=TOL, rtol=0)


def test_torch_compile_takes_a_mask_after_a_call_at_another_length(x):
    """Dynamo marks the length dynamic after a second length; the mask's shape check still holds."""
    module = tdiag.load("mhsa", F=F, H=H).module(seed=0, dtype=torch.float64, plan_calls=True)
    compiled = torch.compile(module, fullgraph=True, backend="eager")
    compiled(torch.randn(2, N + 3, F, dtype=torch.float64))
    mask = _bool_mask(B, N, N)
    expected = module(x, attn_mask=mask, is_causal=True)
    assert torch.allclose(compiled(x, attn_mask=mask, is_causal=True), expected, atol=TOL, rtol=0)


def test_a_module_runs_the_source_tdiag_compile_writes_once_a_call_has_planned_its_variants(x):
    design = tdiag.load("mhsa", F=F, H=H)
    module = design.module(seed=0, dtype=torch.float64)
    module(x, is_causal=True)
    assert module.tdiag_source == design.source()


def test_the_standalone_file_takes_the_masks_as_the_module_does(tmp_path, x):
    from conftest import standalone_module

    design = tdiag.load("mhsa", F=F, H=H)
    module = design.module(seed=0, dtype=torch.float64)
    standalone = standalone_module(design.source(), "mhsa_call_masks", tmp_path).Mhsa(seed=0, dtype=torch.float64)
    mask, ignore = _float_mask(N, N), torch.zeros(B, N, dtype=torch.bool)
    ignore[1, 0] = True
    expected = module(x, attn_mask=mask, key_padding_mask=ignore, is_causal=True)
    assert torch.allclose(standalone(x, attn_mask=mask, key_padding_mask=ignore, is_causal=True), expected, atol=TOL)


def test_a_design_with_its_own_input_named_attn_mask_keeps_it():
    text = (
        "design own\nsize N, F = 4\ninput X[n: N, f: F]\nmask attn_mask[m: N]\nparam W[f: F, g: F]\n"
        "A[n m] = softmax[m, mask = attn_mask[m]](X[n f] X[m f])\nY[n g] = A[n m] X[m f] W[f g]\noutput Y\n"
    )
    module = tdiag.loads(text).module(N=3)
    assert list(inspect.signature(module.forward).parameters) == ["X", "attn_mask"]


def test_source_without_calls_is_the_plain_forward_alone():
    source = tdiag.load("mhsa", F=F, H=H).source(N=N, calls=False)
    assert "def forward(self, X: torch.Tensor) -> torch.Tensor:" in source and "_tdiag_" not in source


def test_an_unbatched_input_takes_unbatched_masks(mhsa, x):
    mask, ignore = _bool_mask(N, N), torch.zeros(N, dtype=torch.bool)
    ignore[3] = True
    expected = mhsa(x[:1], attn_mask=mask, key_padding_mask=ignore[None])[0]
    assert torch.allclose(mhsa(x[0], attn_mask=mask, key_padding_mask=ignore), expected, atol=TOL, rtol=0)


def test_a_float_mask_of_another_dtype_is_taken_in_the_modules_dtype(mhsa, x):
    bias = _float_mask(B, N, N)
    assert torch.allclose(mhsa(x, attn_mask=bias.float()), mhsa(x, attn_mask=bias.float().double()), atol=TOL)


def test_masks_cannot_come_with_a_decoding_cache(x):
    module = tdiag.load("mhsa", F=F, H=H).with_causal_mask().module(seed=0, dtype=torch.float64)
    with pytest.raises(ValueError, match="attn_mask and key_padding_mask cannot be given with a cache"):
        module(x, cache=module.new_cache(), attn_mask=_bool_mask(N, N))


def test_a_module_compiled_causal_decodes_through_forward(x):
    module = tdiag.load("mhsa", F=F, H=H).with_causal_mask().module(seed=0, dtype=torch.float64)
    cache = module.new_cache()
    steps = torch.cat([module(x[:, k : k + 1], cache=cache) for k in range(N)], dim=1)
    assert torch.allclose(steps, module(x), atol=TOL, rtol=0)
