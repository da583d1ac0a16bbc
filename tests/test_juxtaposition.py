"""Juxtaposition multiplies wherever `*` does (docs/language.md, "Statements"): a number or size
formula juxtaposed with a call, a box, a parenthesized expression or another scalar is a scalar
factor of the product, with the precedence of `*` (issue 24: `10000 sqrt(D) relu(...)` was refused
as "expected a number or size expression" while `10000 * sqrt(D) relu(...)` compiled)."""

from __future__ import annotations

import math

import pytest
import sympy
import torch

import tdiag

F64 = torch.float64
N = 4

PREFIX = """design t
size F = 3, D = 9
size N
input X[n: N, f: F]
"""


def run(body: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input, compiled output, reference output) of the design `body` at N, float64."""
    design = tdiag.loads(PREFIX + body, "t.td")
    x = torch.randn(2, N, 3, dtype=F64, generator=torch.Generator().manual_seed(3))
    compiled = design.module(N=N, dtype=F64)(x)
    reference = design.module(N=N, dtype=F64, impl="reference")(x)
    return x, compiled, reference


def assert_computes(body: str, expected) -> None:
    x, compiled, reference = run(body)
    torch.testing.assert_close(compiled, expected(x), rtol=0, atol=1e-9)
    torch.testing.assert_close(reference, expected(x), rtol=0, atol=1e-9)


def test_a_number_juxtaposed_with_a_scalar_call_and_a_map_is_their_product():
    assert_computes("Y[n f] = 10000 sqrt(D) relu(X[n f])\noutput Y", lambda x: 30000 * torch.relu(x))


def test_a_number_juxtaposed_with_a_box_call_scales_the_box():
    assert_computes(
        "Y[n m] = 2 softmax[m](X[n f] X[m f])\noutput Y",
        lambda x: 2 * torch.softmax(x @ x.transpose(-1, -2), -1),
    )


def test_a_number_juxtaposed_with_a_parenthesized_scalar_is_their_product():
    assert_computes("Y[n f] = 2 (3 + 1) X[n f]\noutput Y", lambda x: 8 * x)


def test_a_number_juxtaposed_with_a_parenthesized_tensor_expression_scales_it():
    assert_computes("Y[n f] = 2 (X[n f] + 1)\noutput Y", lambda x: 2 * (x + 1))


def test_a_chain_of_scalar_factors_is_one_coefficient():
    assert_computes(
        "Y[n f] = 2 sqrt(D) log(N) 0.5 exp(X[n f])\noutput Y",
        lambda x: 3 * math.log(N) * torch.exp(x),
    )


def test_a_juxtaposed_scalar_inside_a_call_argument_is_a_product():
    assert_computes("Y[n f] = exp(2 log(N)) X[n f]\noutput Y", lambda x: N**2 * x)


def test_a_juxtaposed_scalar_in_a_bias_is_the_product_before_the_sum():
    assert_computes(
        "Y[n f] = X[n f] - 10000 sqrt(D) relu(X[n f] - 1) + 2 sqrt(D)\noutput Y",
        lambda x: x - 30000 * torch.relu(x - 1) + 6,
    )


def test_juxtaposition_binds_like_star_below_a_power():
    assert_computes("Y[n f] = 2 sqrt(D) X[n f] ^ 2\noutput Y", lambda x: 6 * x**2)


def test_juxtaposition_after_a_quotient_multiplies_the_quotient_as_star_does():
    """`X / 2 sqrt(D)` is (X / 2)·sqrt(D), as `X / 2 * sqrt(D)`: left to right, one precedence."""
    _, star, _ = run("Y[n f] = X[n f] / 2 * sqrt(D)\noutput Y")
    x, juxtaposed, _ = run("Y[n f] = X[n f] / 2 sqrt(D)\noutput Y")
    torch.testing.assert_close(juxtaposed, star, rtol=0, atol=0)
    torch.testing.assert_close(juxtaposed, x * 1.5, rtol=0, atol=1e-12)


def test_a_negated_juxtaposed_scalar_is_negative():
    assert_computes("Y[n f] = -2 sqrt(D) X[n f]\noutput Y", lambda x: -6 * x)


def test_a_juxtaposed_scalar_is_an_initializer_value():
    design = tdiag.loads(PREFIX + "param W[f: F] = fill(2 sqrt(D))\nY[n f] = X[n f] W[f]\noutput Y", "t.td")
    torch.testing.assert_close(design.module(dtype=F64).W, torch.full((3,), 6.0, dtype=F64))


@pytest.mark.parametrize(("size", "value"), [("2 F", "2*F"), ("2 * F", "2*F"), ("2 (F + 1) F", "2*F**2 + 2*F")])
def test_a_juxtaposed_size_product_sizes_a_position_leg(size: str, value: str):
    design = tdiag.loads(PREFIX + f"Y[n p] = X[n f] index(p, {size})\noutput Y", "t.td")
    assert str(sympy.expand(design.graph.legs["p"].size)) == value
