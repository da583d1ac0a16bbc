"""Weights from linear layers (issue 25): `tdiag.load_linear` lays [out, in] matrices (nn.Linear,
fused QKV) onto a compiled design's leg-shaped tensors, `tdiag.linear_weight` reads them back;
both are checked against the module's legs and shapes with errors naming the argument."""

from __future__ import annotations

import re

import pytest
import torch
from conftest import DESIGNS, standalone_module

import tdiag

F, H = 16, 4

BIASED = """design biased
size F = 8, H = 2, D = F / H
size N
input X[n: N, f: F]
param WQ[f: F, h: H, d: D] = normal(std = 1)
param bq[h: H, d: D] = zeros
Y[n h d] = X[n f] WQ[f h d] + bq[h d]
output Y
"""


@pytest.fixture(scope="module")
def mhsa():
    return tdiag.load(DESIGNS / "mhsa.td", F=F, H=H).module(dtype=torch.float64)


@pytest.fixture(scope="module")
def grouped():
    return tdiag.load(DESIGNS / "grouped_query.td", F=F, H=H, G=2).module(dtype=torch.float64)


def test_nn_multihead_attention_weights_loaded_by_legs_give_its_outputs(mhsa):
    mha = torch.nn.MultiheadAttention(F, H, bias=False, batch_first=True, dtype=torch.float64)
    tdiag.load_linear(mhsa, ["WQ", "WK", "WV"], mha.in_proj_weight, cols="f")
    tdiag.load_linear(mhsa, "WO", mha.out_proj.weight, cols="h e")
    x = torch.randn(2, 5, F, dtype=torch.float64)
    expected, _ = mha(x, x, x, need_weights=False)
    assert torch.allclose(mhsa(x), expected, rtol=1e-10, atol=1e-12)


def test_a_loaded_matrix_reads_back_unchanged(grouped):
    weight = torch.randn(H * F // H, F, dtype=torch.float64)
    tdiag.load_linear(grouped, "WQ", weight, cols="f")
    assert torch.equal(tdiag.linear_weight(grouped, "WQ", cols="f"), weight)


def test_rows_flatten_their_legs_first_leg_slowest_as_a_head_major_projection(grouped):
    """q_proj's row (g·R + r)·D + d is query head (g r), feature d: x @ Wᵀ equals Σ_f x_f WQ[f g r d]."""
    weight = torch.randn(F, F, dtype=torch.float64)
    tdiag.load_linear(grouped, "WQ", weight, cols="f")
    x = torch.randn(3, F, dtype=torch.float64)
    assert torch.allclose((x @ weight.T).view(3, 2, 2, F // H), torch.einsum("nf,fgrd->ngrd", x, grouped.WQ))


def test_rows_may_be_named_in_another_order_than_the_tensors_axes(mhsa):
    weight = torch.randn(F // H * H, F, dtype=torch.float64)
    tdiag.load_linear(mhsa, "WK", weight, cols="f", rows="d h")
    assert torch.equal(mhsa.WK[:, 2, 1], weight[1 * H + 2])


def test_a_fused_matrix_splits_into_each_tensors_rows_in_turn(mhsa):
    weight = torch.randn(3 * F, F, dtype=torch.float64)
    tdiag.load_linear(mhsa, ["WQ", "WK", "WV"], weight, cols="f")
    assert torch.equal(tdiag.linear_weight(mhsa, "WK", cols="f"), weight[F : 2 * F])
    assert torch.equal(tdiag.linear_weight(mhsa, ["WQ", "WK", "WV"], cols="f"), weight)


def test_a_bias_loads_as_a_vector_with_no_column_legs():
    module = tdiag.loads(BIASED).module(dtype=torch.float64)
    bias = torch.arange(8, dtype=torch.float64)
    tdiag.load_linear(module, "bq", bias, cols="")
    assert torch.equal(module.bq, bias.view(2, 4))


def test_loading_takes_the_modules_dtype_and_leaves_its_parameters_trainable(mhsa):
    tdiag.load_linear(mhsa, "WO", torch.randn(F, F, dtype=torch.float32), cols="h e")
    assert mhsa.WO.dtype == torch.float64 and mhsa.WO.requires_grad


def test_a_standalone_compiled_file_carries_its_tensors_legs(tmp_path):
    source = tdiag.load(DESIGNS / "mhsa.td", F=F, H=H).source()
    generated = standalone_module(source, "weights_mhsa", tmp_path)
    module = generated.Mhsa()
    assert module.tdiag_legs["WO"] == ("h", "e", "g")
    weight = torch.randn(F, F)
    tdiag.load_linear(module, "WO", weight, cols="h e")
    assert torch.equal(tdiag.linear_weight(module, "WO", cols="h e"), weight)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda m: tdiag.load_linear(m, "WZ", torch.zeros(F, F), cols="f"), "names: 'WZ' is not a stored tensor"),
        (lambda m: tdiag.load_linear(m, "WQ", torch.zeros(F, F), cols="x"), "cols: WQ[f h d] has no leg 'x'"),
        (lambda m: tdiag.load_linear(m, "WQ", torch.zeros(F, F), cols="f f"), "cols: leg 'f' is named twice"),
        (lambda m: tdiag.load_linear(m, "WQ", torch.zeros(F, F), cols="f", rows="h"), "leaves leg 'd' in neither"),
        (
            lambda m: tdiag.load_linear(m, "WQ", torch.zeros(F, F), cols="f", rows="f h d"),
            "leg 'f' of WQ is named in both",
        ),
        (lambda m: tdiag.load_linear(m, "WQ", torch.zeros(F, F + 1), cols="f"), "weight: expected shape (16, 16)"),
        (lambda m: tdiag.load_linear(m, "WQ", [[0.0]], cols="f"), "weight: expected a torch.Tensor"),
        (
            lambda m: tdiag.load_linear(torch.nn.Linear(2, 2), "weight", torch.zeros(2, 2), cols="f"),
            "module compiled by tdiag",
        ),
    ],
    ids=[
        "unknown-name",
        "unknown-leg",
        "repeated-leg",
        "missing-leg",
        "leg-in-both",
        "wrong-shape",
        "not-a-tensor",
        "not-tdiag",
    ],
)
def test_a_bad_argument_is_an_error_naming_it(mhsa, call, message):
    with pytest.raises((ValueError, TypeError, KeyError), match=re.escape(message)):
        call(mhsa)


def test_a_wrong_shape_says_which_rows_and_columns_were_expected(mhsa):
    with pytest.raises(ValueError) as error:
        tdiag.load_linear(mhsa, ["WQ", "WK"], torch.zeros(3 * F, F), cols="f")
    assert "rows WQ (h d: 16) + WK (h d: 16) and 16 columns (f)" in str(error.value)
