"""Grammar-aware fuzzing: hypothesis writes valid-ish designs (random sizes, legs, boxes, maps,
reductions, sums, masks, parameters) and tdiag must either refuse one with positioned errors or
compile it into a module whose forward and backward run and equal the reference evaluation in
float64. A few dozen examples run with the suite; `make fuzz` runs many more (TDIAG_FUZZ_EXAMPLES)."""

from __future__ import annotations

import os

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tdiag
from tdiag import TdiagError

EXAMPLES = int(os.environ.get("TDIAG_FUZZ_EXAMPLES", "25"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=False)

SIZES = {"n": "N", "m": "N", "f": "F", "g": "G", "h": "H"}
LEGS = list(SIZES)


@st.composite
def legs(draw, min_size=1, max_size=3):
    return draw(st.lists(st.sampled_from(LEGS), min_size=min_size, max_size=max_size, unique=True))


@st.composite
def tensor(draw, tensors):
    name = draw(st.sampled_from(sorted(tensors)))
    axes = tensors[name]
    if draw(st.integers(0, 9)) == 0:  # now and then the wrong legs, or a leg repeated
        return f"{name}[{' '.join(draw(st.lists(st.sampled_from(LEGS), max_size=4)))}]"
    renamed = draw(st.permutations(LEGS)) if draw(st.booleans()) and draw(st.integers(0, 3)) == 0 else LEGS
    mapping = dict(zip(LEGS, renamed, strict=True))
    return f"{name}[{' '.join(mapping[leg] for leg in axes)}]"


def number():
    return st.sampled_from(["2", "0.5", "3", "1 / 2", "sqrt(2)", "1 / sqrt(F)", "F", "0.25", "2 ^ 2"])


@st.composite
def expression(draw, tensors, depth=0):
    atom = tensor(tensors)
    if depth >= 3:
        return draw(atom)
    kind = draw(
        st.sampled_from(
            [
                "tensor",
                "tensor",
                "product",
                "sum",
                "scaled",
                "softmax",
                "normalize",
                "map",
                "reduce",
                "power",
                "quotient",
            ]
        )
    )
    inner = lambda: draw(expression(tensors, depth + 1))  # noqa: E731
    if kind == "tensor":
        return draw(atom)
    if kind == "product":
        return f"{inner()} {inner()}"
    if kind == "sum":
        return f"({inner()} {draw(st.sampled_from(['+', '-']))} {inner()})"
    if kind == "scaled":
        return f"{draw(number())} * {inner()}"
    if kind in ("softmax", "normalize"):
        over = " ".join(draw(legs(max_size=2)))
        options = ""
        if kind == "softmax" and draw(st.booleans()):
            options += f", scale = {draw(number())}"
        if draw(st.integers(0, 3)) == 0:
            options += ", mask = causal(n, m)"
        content = inner() if kind == "softmax" else f"exp({inner()})"
        return f"{kind}[{over}{options}]({content})"
    if kind == "map":
        name = draw(st.sampled_from(["exp", "relu", "elu1", "clamp"]))
        if name == "clamp":
            return f"clamp({inner()}, -1, 1)"
        if name == "exp":
            return f"exp(clamp({inner()}, -3, 3))"
        return f"{name}({inner()})"
    if kind == "reduce":
        name = draw(st.sampled_from(["max", "logsumexp", "mean"]))
        return f"{name}[{' '.join(draw(legs(max_size=2)))}]({inner()})"
    if kind == "power":
        return f"relu({inner()}) ^ {draw(st.sampled_from(['2', '3', '1']))}"
    return f"{inner()} / (1 + exp(clamp({inner()}, -3, 3)))"


@st.composite
def design_text(draw):
    sizes = {s: draw(st.integers(1, 3)) for s in ("N", "F", "G", "H")}
    lines = ["design fuzzed", "size " + ", ".join(f"{k} = {v}" for k, v in sizes.items())]
    tensors = {"X": draw(st.sampled_from([["n", "f"], ["m", "f"], ["n", "g"], ["f"], ["n", "f", "g"]]))}
    lines.append(f"input X[{', '.join(f'{leg}: {SIZES[leg]}' for leg in tensors['X'])}]")
    for k in range(draw(st.integers(0, 2))):
        axes = draw(legs(max_size=3))
        init = draw(st.sampled_from(["", " = normal(std = 0.5)", " = uniform(low = -1, high = 1)", " = ones"]))
        kind = draw(st.sampled_from(["param", "param", "const"]))
        if kind == "const":
            init = " = fill(0.5)"
        lines.append(f"{kind} W{k}[{', '.join(f'{leg}: {SIZES[leg]}' for leg in axes)}]{init}")
        tensors[f"W{k}"] = axes
    for k in range(draw(st.integers(1, 3))):
        result = draw(legs(min_size=1, max_size=3))
        lines.append(f"T{k}[{' '.join(result)}] = {draw(expression(tensors))}")
        tensors[f"T{k}"] = result
    lines.append(f"output T{k}")
    return "\n".join(lines) + "\n"


def run_design(text: str) -> str:
    """'refused' or 'ran'; raises (failing the test) on anything else."""
    try:
        design = tdiag.loads(text)
    except TdiagError as error:
        assert error.diagnostics and all(d.spans for d in error.diagnostics), str(error)
        return "refused"
    x = torch.randn(2, *(design.size_values[str(a.size)] for a in design.graph.inputs[0].axes), dtype=torch.float64)
    x.requires_grad_(True)
    compiled = design.module(dtype=torch.float64)
    reference = design.module(impl="reference", dtype=torch.float64)
    y = compiled(x)
    y.sum().backward()
    expected = reference(x)
    if torch.isfinite(expected).all():
        torch.testing.assert_close(y, expected, rtol=1e-7, atol=1e-9)
    return "ran"


@FUZZ
@given(text=design_text())
def test_a_generated_design_is_refused_with_positions_or_runs_like_the_reference(text):
    run_design(text)


# ---- designs the fuzzer found, kept as specifications ---------------------------------------


def test_a_term_that_is_a_product_of_constants_only_is_computed_from_the_stored_constants():
    text = (
        "design constant_term\nsize N = 3, F = 2\ninput X[n: N, f: F]\nconst W[n: N] = fill(0.5)\n"
        "T[n] = 2 * W[n] (W[n] + X[n f])\noutput T\n"
    )
    assert run_design(text) == "ran"
    x = torch.randn(3, 2, dtype=torch.float64)
    y = tdiag.loads(text).module(dtype=torch.float64)(x)
    torch.testing.assert_close(y, 2 * 0.5 * (0.5 + x.sum(-1)))  # f is summed inside the sum, where it occurs
