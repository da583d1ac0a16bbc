"""Grammar-aware fuzzing: hypothesis writes valid-ish designs (random sizes, legs, boxes, maps,
reductions, sums, masks, parameters) and tdiag must either refuse one with positioned errors or
compile it into a module whose forward and backward run and equal the reference evaluation in
float64. A few dozen examples run with the suite; `make fuzz` runs many more (TDIAG_FUZZ_EXAMPLES)."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import random
import re
import signal
import sys
import time
from pathlib import Path
from typing import NamedTuple

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tdiag
import tdiag.decode
from tdiag import TdiagError, cli

DESIGNS = Path(__file__).resolve().parent.parent / "designs"
EXAMPLES = int(os.environ.get("TDIAG_FUZZ_EXAMPLES", "25"))
# both fuzzes draw new examples each run (the classes scripts/fuzz.py found are tests in test_fuzz_found.py)
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=False)
CLI_FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=False)

SIZES = {"n": "N", "m": "N", "f": "F", "g": "G", "h": "H"}
LEGS = list(SIZES)


@st.composite
def legs(draw, min_size=1, max_size=3):
    return draw(st.lists(st.sampled_from(LEGS), min_size=min_size, max_size=max_size, unique=True))


@st.composite
def tensor(draw, tensors):
    name = draw(st.sampled_from(sorted(tensors)))
    axes = tensors[name]
    if draw(st.integers(0, 39)) == 17:  # now and then the wrong legs, or a leg repeated (hypothesis favours 0)
        return f"{name}[{' '.join(draw(st.lists(st.sampled_from(LEGS), max_size=4)))}]"
    renamed = draw(st.permutations(LEGS)) if draw(st.booleans()) and draw(st.integers(0, 3)) == 0 else LEGS
    mapping = dict(zip(LEGS, renamed, strict=True))
    return f"{name}[{' '.join(mapping[leg] for leg in axes)}]"


def number():
    return st.sampled_from(["2", "0.5", "3", "1 / 2", "sqrt(2)", "1 / sqrt(F)", "F", "0.25", "2 ^ 2", "log(N)"])


def box_scale():
    """A softmax box's scale: a number of either sign, zero, a size formula or a temperature."""
    return st.sampled_from(["1 / sqrt(F)", "2", "-1", "-1 / sqrt(F)", "0", "- 0.5", "t[h]", "exp(clamp(t[h], -2, 2))"])


MAPS = ["exp", "relu", "elu1", "clamp", "log", "sigmoid", "tanh", "softplus", "silu", "gelu", "sin", "cos"]
MAPS += ["sqrt", "abs"]


def legs_of(text: str) -> list[str]:
    """The legs of the tensors read in `text`, in order (an approximation of its free legs)."""
    return list(
        dict.fromkeys(leg for group in re.findall(r"\b[A-Za-z]\w*\[([a-z ]+)\]", text) for leg in group.split())
    )


def _masks(present: list[str], masks) -> list[str]:
    """Mask options that fit legs `present`: causal(n, m) when both are there, and the padding masks."""
    return (["mask = causal(n, m)"] if {"n", "m"} <= set(present) else []) + list(masks) or ["mask = causal(n, m)"]


@st.composite
def expression(draw, tensors, masks=(), depth=0):
    """A random expression over `tensors` (name -> legs): products, sums (with numbers and size
    formulas as terms), boxes with scales that are numbers or tensors and masks, maps (masked now
    and then), reductions, powers, quotients, and `causal(n, m)` or a mask input as a factor."""
    atom = tensor(tensors)
    if depth >= 3:
        return draw(atom)
    kinds = ["tensor", "tensor", "product", "sum", "constant", "scaled", "softmax", "normalize", "map", "reduce"]
    kinds += ["power", "quotient", "causal"]
    kind = draw(st.sampled_from(kinds))
    inner = lambda: draw(expression(tensors, masks, depth + 1))  # noqa: E731
    if kind == "tensor":
        return draw(atom)
    if kind == "product":
        return f"{inner()} {inner()}"
    if kind == "sum":
        return f"({inner()} {draw(st.sampled_from(['+', '-']))} {inner()})"
    if kind == "constant":  # a number or a size formula as a term of a sum
        return f"({inner()} {draw(st.sampled_from(['+', '-']))} {draw(number())})"
    if kind == "scaled":
        return f"{draw(number())} * {inner()}"
    if kind == "causal":  # over legs the statement has, else a leg would come from nowhere
        argument = inner()
        return f"causal(n, m) {argument}" if {"n", "m"} <= set(legs_of(argument)) else argument
    if kind in ("softmax", "normalize"):
        content = inner() if kind == "softmax" else f"exp({inner()})"
        present = legs_of(content)
        over = " ".join(draw(st.lists(st.sampled_from(present or LEGS), min_size=1, max_size=2, unique=True)))
        options = ""
        if kind == "softmax" and draw(st.booleans()):
            scale = draw(st.sampled_from([draw(number()), draw(box_scale()), draw(atom)]))
            options += f", scale = {scale}"
        if draw(st.integers(0, 3)) == 0:
            options += ", " + draw(st.sampled_from(_masks(present, masks)))
        return f"{kind}[{over}{options}]({content})"
    if kind == "map":
        name, argument = draw(st.sampled_from(MAPS)), inner()
        options = ""
        if draw(st.integers(0, 4)) == 0 and "m" in legs_of(argument):  # a masked map names its key legs
            options = f"[m, {draw(st.sampled_from(_masks(legs_of(argument), masks)))}]"
        if name == "log":
            return f"log{options}(1 + exp(clamp({argument}, -3, 3)))"
        if name == "sqrt":
            return f"sqrt{options}(1 + {argument} ^ 2)"
        if name == "clamp":
            return f"clamp{options}({argument}, -1, 1)"
        if name == "exp":
            return f"exp{options}(clamp({argument}, -3, 3))"
        return f"{name}{options}({argument})"
    if kind == "reduce":
        name, argument = draw(st.sampled_from(["max", "logsumexp", "mean"])), inner()
        present = legs_of(argument)
        over = draw(st.lists(st.sampled_from(present or LEGS), min_size=1, max_size=2, unique=True))
        mask = ""
        if draw(st.integers(0, 2)) == 0:
            mask = ", " + draw(st.sampled_from(_masks(present, masks)))
        return f"{name}[{' '.join(over)}{mask}]({argument})"
    if kind == "power":
        return f"relu({inner()}) ^ {draw(st.sampled_from(['2', '3', '1']))}"
    return f"{inner()} / (1 + exp(clamp({inner()}, -3, 3)))"


@st.composite
def design_text(draw):
    """A design over sizes N (sometimes given only at run time), F, G (sometimes derived from F)
    and H: an input, parameters and constants with random initializers, a padding mask (used in
    boxes and maps or as a factor) and noise now and then, a per-head temperature t[h], a buffer
    with its update, and one to three statements of random expressions."""
    sizes = {s: str(draw(st.integers(1, 3))) for s in ("N", "F", "G", "H")}
    if draw(st.booleans()):
        sizes["G"] = draw(st.sampled_from(["2 * F", "F + 1", "F"]))
    runtime = {"N": draw(st.integers(1, 4))} if draw(st.integers(0, 3)) == 0 else {}
    lines = ["design fuzzed", "size " + ", ".join(k if k in runtime else f"{k} = {v}" for k, v in sizes.items())]
    tensors = {"X": draw(st.sampled_from([["n", "f"], ["m", "f"], ["n", "g"], ["f"], ["n", "f", "g"]]))}
    lines.append(f"input X[{', '.join(f'{leg}: {SIZES[leg]}' for leg in tensors['X'])}]")
    stored = [leg for leg in LEGS if not runtime or SIZES[leg] != "N"]  # a param over N is refused
    masks = []
    if draw(st.integers(0, 3)) == 0:
        axes = draw(st.sampled_from([["m"], ["n", "m"]]))
        lines.append(f"mask P[{', '.join(f'{leg}: N' for leg in axes)}]")
        masks.append(f"mask = P[{' '.join(axes)}]")
        tensors["P"] = axes
    if draw(st.integers(0, 4)) == 0:
        axes = draw(legs(max_size=2))
        lines.append(f"random E[{', '.join(f'{leg}: {SIZES[leg]}' for leg in axes)}] = normal(mode = never)")
        tensors["E"] = axes
    lines.append("param t[h: H] = normal(std = 0.5)")
    for k in range(draw(st.integers(0, 2))):
        kind = draw(st.sampled_from(["param", "param", "const"]))
        axes = (
            draw(legs(max_size=3))
            if kind == "const"
            else draw(st.lists(st.sampled_from(stored), max_size=3, unique=True))
        )
        init = draw(st.sampled_from(["", " = normal(std = 0.5)", " = uniform(low = -1, high = 1)", " = ones"]))
        if kind == "const":
            init = draw(st.sampled_from([" = fill(0.5)", " = ones", " = zeros", " = identity"]))
            axes = ["n", "m"] if init == " = identity" else axes  # δ over axes of one size
        lines.append(f"{kind} W{k}[{', '.join(f'{leg}: {SIZES[leg]}' for leg in axes)}]{init}")
        tensors[f"W{k}"] = axes
    if draw(st.integers(0, 5)) == 0:
        lines.append("buffer S[f: F] = ones")
        lines.append("update S[f] = mean[n](X[n f] X[n f])" if "n" in tensors["X"] else "update S[f] = X[f]")
        tensors["S"] = ["f"]
    count, reads_input = draw(st.integers(1, 3)), {"X"}
    attention = tensors["X"] == ["n", "f"] and draw(st.booleans())
    if attention:  # a fusable attention (SDPA, flex): signed and zero scales, masks, empty rows
        lines += ["param Wq[f: F, d: G]", "param Wk[f: F, d: G]", "param Wv[f: F, h: H]"]
        options = f", scale = {draw(box_scale())}" if draw(st.integers(0, 3)) else ""
        options += "".join(f", {m}" for m in draw(st.lists(st.sampled_from(_masks(["n", "m"], masks)), max_size=2)))
        query = draw(st.sampled_from(["", "- "]))
        content = f"{query}X[n f] Wq[f d] X[m k] Wk[k d]"
        if draw(st.integers(0, 3)) == 0:
            bias = [" + t[h]", " - 0.5 * X[m j] X[m j]", " + index(n) - index(m)"]
            content += draw(st.sampled_from(bias + ([" + W0[n m]"] if tensors.get("W0") == ["n", "m"] else [])))
        lines.append(f"A[n h] = softmax[m{options}]({content}) X[m j] Wv[j h]")
        tensors["A"] = ["n", "h"]
        reads_input.add("A")
        count = draw(st.integers(0, 1))  # the attention alone, or one statement over it
    output = "A"
    for k in range(count):
        expr = draw(expression(tensors, masks))
        if k == count - 1 and attention and "A[" not in expr:
            expr = f"{expr} + A[n h]"
        if k == count - 1 and not reads_input & set(re.findall(r"\b[A-Z]\w*", expr)) and draw(st.integers(0, 9)):
            expr = f"{expr} + X[{' '.join(tensors['X'])}]"  # mostly an output that depends on the input
        if reads_input & set(re.findall(r"\b[A-Z]\w*", expr)):
            reads_input.add(f"T{k}")
        present = legs_of(expr) if draw(st.integers(0, 9)) else LEGS  # now and then any legs
        result = draw(st.lists(st.sampled_from(present or LEGS), min_size=1, max_size=3, unique=True))
        lines.append(f"T{k}[{' '.join(result)}] = {expr}")
        tensors[f"T{k}"] = result
        output = f"T{k}"
    lines.append(f"output {output}")
    return "\n".join(lines) + "\n", runtime


def run_design(text: str, sizes: dict[str, int] | None = None, decode: bool = False, causal: bool = False) -> str:
    """'refused' or 'ran'; raises (failing the test) on anything else. With `decode`, a design
    with a causal form is also decoded (check_decoding), and one without says why; one `causal`
    as written is decoded as it is, and a cache that refuses it is a missing causal form."""
    try:
        design = tdiag.loads(text)
        compiled = design.module(sizes or {}, dtype=torch.float64)
    except TdiagError as error:
        assert error.diagnostics and all(d.spans for d in error.diagnostics), str(error)
        return "refused"
    values = {**design.size_values, **(sizes or {})}
    shape = lambda t: [int(design.graph.evaluate(a.size, **values)) for a in t.axes]  # noqa: E731
    generator = torch.Generator().manual_seed(len(text))
    x = torch.randn(2, *shape(design.graph.inputs[0]), dtype=torch.float64, requires_grad=True, generator=generator)
    masks = {}  # each mask given with batch dims, without, or left out (attend everywhere)
    for t in design.graph.tensors_of_kind("mask"):
        batch = [(2,), (), None][int(torch.randint(3, (), generator=generator))]
        if batch is not None:
            mask = torch.rand(*batch, *shape(t), generator=generator) < 0.7
            hide = int(torch.randint(3, (), generator=generator))  # an empty row now and then, or all
            masks[t.name] = (
                mask
                if hide == 0
                else torch.zeros_like(mask)
                if hide == 1
                else mask.index_fill(0, torch.tensor([0]), False)
            )
    _compare(design, compiled, sizes or {}, x, masks)
    try:  # a design without attention over m beside n has no causal form, and says where
        masked = design.with_causal_mask()
        compiled = masked.module(sizes or {}, dtype=torch.float64)
    except TdiagError as error:
        assert error.diagnostics and all(d.spans for d in error.diagnostics), str(error)
        return f"no causal form: {str(error).splitlines()[0]}" if decode else "ran"
    _compare(masked, compiled, sizes or {}, x, masks)
    if not decode:
        return "ran"
    decoded = check_decoding(design if causal else masked, sizes or {})
    if causal and decoded.startswith("not decodable"):
        return f"no causal form: the cache refuses the design as written: {decoded}"
    return decoded


def _compare(design, compiled, sizes: dict[str, int], x: torch.Tensor, masks: dict) -> None:
    """The compiled module equals the reference in value and input gradient wherever the
    reference is finite; with FlexAttention asked for, in value."""
    reference = design.module(sizes, impl="reference", dtype=torch.float64)
    y = compiled(x, **masks)
    expected = reference(x, **masks)
    gradient, expected_gradient = _input_gradient(y, x), _input_gradient(expected, x)
    if torch.isfinite(expected).all():
        torch.testing.assert_close(y, expected, rtol=1e-7, atol=1e-9)
        if torch.isfinite(expected_gradient).all():
            torch.testing.assert_close(gradient, expected_gradient, rtol=1e-6, atol=1e-8)
    _check_flex(design, sizes, x.detach(), masks, expected.detach())


def _check_flex(design, sizes: dict[str, int], x: torch.Tensor, masks: dict, expected: torch.Tensor) -> None:
    """With FlexAttention asked for, the same function forward (torch 2.13 has no flex backward
    on CPU): boxes the lowering takes or refuses alike."""
    flexed = design.module(sizes, dtype=torch.float64, attention="flex")
    if not any(step.kind == "flex" for step in flexed.tdiag_plan.steps):
        return
    with torch.no_grad():
        y = flexed(x, **masks)
    if torch.isfinite(expected).all():
        torch.testing.assert_close(y, expected, rtol=1e-7, atol=1e-9)


def _input_gradient(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """d Σ y / d x, backward run through y's graph; zero where the plan proved y constant (an
    output with no graph, e.g. a softmax over a leg its content only shifts along)."""
    if not y.requires_grad:
        return torch.zeros_like(x)
    (gradient,) = torch.autograd.grad(y.sum(), x, allow_unused=True)
    return torch.zeros_like(x) if gradient is None else gradient


@FUZZ
@given(case=design_text())
def test_a_generated_design_is_refused_with_positions_or_runs_like_the_reference(case):
    run_design(*case)


# ---- designs at the seams: causal forms written the ways users write them ---------------------

SEAM_CORES = ("softmax", "linear", "decay", "decay_statement", "strict", "split")
SEAM_FEATURES = ("query_over_key", "key_reads_length", "typo")
SEAM_KINDS = SEAM_CORES + SEAM_FEATURES
STRICT_FACTORS = ["causal(n, m) - I[n m]", "clamp(index(n) - index(m), 0, 1)", "(1 - I[n m]) causal(n, m)"]
LENGTH_WEIGHTS = ["(1 + index(m) / N)", "cos(index(m) / N)", "exp(-index(m) / N)", "CS[m]"]


class SeamCase(NamedTuple):
    """A generated causal design: its text, the run-time sizes it is planned at, the seams it
    holds (one core form of SEAM_CORES and any of SEAM_FEATURES), and whether it is causal as
    written (else with_causal_mask makes it so)."""

    text: str
    sizes: dict[str, int]
    kinds: tuple[str, ...]
    causal: bool


def seam_design(rng: random.Random, kind: str | None = None) -> SeamCase:
    """A causal attention design over a run-time length N (now and then a fixed one), with `kind`
    among its seams when given: a softmax box, a linear attention, a decay inline or as a
    statement of its own, a strictly causal factor, or a run-time split of the position leg
    into blocks; and, at random, a query-side term reading a tensor declared over the key leg,
    a key side that reads N, and a leg typo."""
    core = kind if kind in SEAM_CORES else rng.choice([c for c in SEAM_CORES if c != "split" or rng.random() < 0.6])
    features = [f for f in SEAM_FEATURES if f == kind or rng.random() < (0.15 if f == "typo" else 0.35)]
    sizes = {"F": rng.randint(2, 4), "H": rng.randint(1, 2), "D": rng.randint(1, 3), "E": rng.randint(1, 2)}
    block = rng.randint(2, 3)
    runtime = core == "split" or rng.random() < 0.9
    length = block * rng.randint(1, 2) if core == "split" else rng.randint(2, 5)
    size = ", ".join(f"{k} = {v}" for k, v in sizes.items())
    lines = ["design seam", f"size {size}" + (f", C = {block}" if core == "split" else "")]
    lines += ["size N" if runtime else f"size N = {length}", "input X[n: N, f: F]"]
    lines += [f"param W{s}[f: F, h: H, {leg}: {n}] = normal(std = 0.5)" for s, leg, n in _PROJECTIONS]
    lines.append("param WO[h: H, e: E, g: F] = normal(std = 0.5)")
    if core == "split":
        lines, causal = lines + _split_core(rng, features), True
    else:
        core_lines, causal = _positional_core(rng, core, features, runtime)
        lines += core_lines
    lines.append("output Y")
    if "typo" in features:
        lines = _leg_typo(rng, lines)
    causal = causal and "typo" not in features  # a typo may read a key at the query or the reverse
    return SeamCase("\n".join(lines) + "\n", {"N": length} if runtime else {}, (core, *features), causal)


_PROJECTIONS = [("Q", "d", "D"), ("K", "d", "D"), ("V", "e", "E")]


def _positional_core(rng: random.Random, core: str, features: list[str], runtime: bool) -> tuple[list[str], bool]:
    """Projections, the attention core over query leg n and key leg m, and the output Y[n g]; and
    whether they are causal as written."""
    lines, key = [], "K[m h d]"
    feature_map = rng.choice(["elu1", "exp", "sigmoid", "softplus"]) if core == "linear" else ""
    project = lambda name, leg, side: f"X[{side} f] W{name}[f h {leg}]"  # noqa: E731
    lines.append(f"Q[n h d] = {_mapped(feature_map, project('Q', 'd', 'n'))}")
    lines.append(f"K[m h d] = {_mapped(feature_map, project('K', 'd', 'm'))}")
    lines.append(f"V[m h e] = {project('V', 'e', 'm')}")
    if "key_reads_length" in features:  # a key side whose rows change as the sequence grows
        weight = rng.choice(LENGTH_WEIGHTS)
        if weight == "CS[m]":
            lines.append("CS[m] = cos(3.141592653589793 (index(m) + 1) / (2 N))")
        lines.append(f"Kw[m h d] = {weight} K[m h d]")
        key = "Kw[m h d]"
    masked = rng.random() < 0.6  # else the design is made causal by with_causal_mask
    mask = ", mask = causal(n, m)" if masked else ""
    causal = "causal(n, m) " if masked else ""
    scores = f"Q[n h d] {key}"
    if core == "softmax":
        scale = rng.choice(["", ", scale = 1 / sqrt(D)", ", scale = -0.5", ", scale = 2"])
        bias = rng.choice(["", "", " + index(n) - index(m)", " - 0.5 * X[m f] X[m f]"])
        attention = f"softmax[m{scale}{mask}]({scores}{bias}) V[m h e]"
    elif core == "linear":
        eps = rng.choice(["", ", eps = 1e-6"])
        attention = (
            f"normalize[m{mask}{eps}]({scores}) V[m h e]" if rng.random() < 0.7 else f"{causal}{scores} V[m h e]"
        )
    elif core in ("decay", "decay_statement"):
        decay, lines = _decay(rng, lines, runtime)
        if core == "decay_statement":  # the decay matrix as the papers write it, a statement of its own
            lines.append(f"Dec[h n m] = {decay}")
            decay = "Dec[h n m]"
        attention = rng.choice([f"{decay} {scores} V[m h e]", f"({scores} {decay}) V[m h e]"])
    else:
        factor = rng.choice(STRICT_FACTORS)
        if "I[n m]" in factor:
            lines.insert(0, "const I[n: N, m: N] = identity")
        if rng.random() < 0.5:
            lines.append(f"B[n m] = {factor}")
            factor = "B[n m]"
        else:
            factor = f"({factor})" if " - " in factor else factor
        attention = rng.choice(
            [
                f"{factor} {scores} V[m h e]",
                f"sigmoid({scores}) {factor} V[m h e]",
                f"{factor} exp(-softplus(-{scores})) V[m h e]",
            ]
        )
    if "query_over_key" in features:  # V declared over m, read at the query leg n
        attention += rng.choice([" + V[n h e]", " + 0.5 * V[n h e]", " - 0.5 * K[n h d] Q[n h d] V[n h e]"])
    lines.append(f"O[n h e] = {attention}")
    lines += _output(rng, "n")
    return lines, masked or core in ("decay", "decay_statement", "strict")


def _mapped(name: str, text: str) -> str:
    if name == "exp":
        return f"exp(clamp({text}, -3, 3))"
    return f"{name}({text})" if name else text


def _decay(rng: random.Random, lines: list[str], runtime: bool) -> tuple[str, list[str]]:
    """A decay of the scores, with what defines its rates: a per-head rate exp(lg[h] (n - m)) beside
    causal(n, m), or data-dependent gates through segment sums (causal by themselves, along a
    run-time length only)."""
    if rng.random() < 0.5 or not runtime:
        lines = ["param t[h: H] = normal(std = 0.5)", *lines, "lg[h] = -softplus(t[h])"]
        return "causal(n, m) exp(lg[h] (index(n) - index(m)))", lines
    lines = ["param WG[f: F, h: H] = normal(std = 0.5)", *lines, "G[n h] = -softplus(X[n f] WG[f h])"]
    return "exp(segsum[n, m](G[n h]))", lines


def _output(rng: random.Random, query: str) -> list[str]:
    """Y from the heads' outputs O: projected, now and then gated or normalized per head first."""
    read = f"O[{query} h e]"
    lines = []
    if rng.random() < 0.25:
        lines.append(f"Oc[{query} h e] = O[{query} h e] - mean[e](O[{query} h e])")
        lines.append(f"On[{query} h e] = Oc[{query} h e] (mean[e](Oc[{query} h e] ^ 2) + 1e-5) ^ -0.5")
        read = f"On[{query} h e]"
    gate = f"silu(X[{query} f] WV[f h e]) " if rng.random() < 0.25 else ""
    return [*lines, f"Y[{query} g] = {gate}{read} WO[h e g]"]


def _split_core(rng: random.Random, features: list[str]) -> list[str]:
    """Block-local attention written with a run-time split of the position leg, X[(b i) f]: blocks
    b of C positions i (sized by a constant of ones), causal within each block."""
    lines = ["const one[i: C] = ones"]
    lines.append("Q[b i h d] = X[(b i) f] WQ[f h d] one[i]")
    lines.append("K[b j h d] = X[(b j) f] WK[f h d] one[j]")
    lines.append("V[b j h e] = X[(b j) f] WV[f h e]")
    scale = rng.choice(["", ", scale = 1 / sqrt(D)"])
    attention = f"softmax[j{scale}, mask = causal(i, j)](Q[b i h d] K[b j h d]) V[b j h e]"
    if rng.random() < 0.3:
        attention = "causal(i, j) Q[b i h d] K[b j h d] V[b j h e]"
    if "query_over_key" in features:
        attention += " + V[b i h e]"
    lines.append(f"O[b i h e] = {attention}")
    lines.append("Y[(b i) g] = O[b i h e] WO[h e g]")
    return lines


def _leg_typo(rng: random.Random, lines: list[str]) -> list[str]:
    """One leg of one tensor read in a statement mistyped: doubled ('e' -> 'ee') or another leg
    of the statement."""
    statements = [k for k, line in enumerate(lines) if re.match(r"\w+\[[^\]]*\] = ", line)]
    k = rng.choice(statements)
    target, expression = lines[k].split(" = ", 1)
    reads = list(re.finditer(r"\b[A-Za-z]\w*\[([a-z ]+)\]", expression))
    if not reads:
        return lines
    read = rng.choice(reads)
    legs = read.group(1).split()
    j = rng.randrange(len(legs))
    others = sorted(set(legs_of(lines[k])) - {legs[j]})
    legs[j] = legs[j] * 2 if rng.random() < 0.6 or not others else rng.choice(others)
    start, end = read.span(1)
    lines = list(lines)
    lines[k] = f"{target} = {expression[:start]}{' '.join(legs)}{expression[end:]}"
    return lines


class DecodeMismatchError(AssertionError):
    """A cache decoded a causal design's positions other than its causal forward over the same prefix."""

    fuzz_outcome = "decode_mismatch"  # scripts/fuzz.py counts it apart from the crashes


DECODE_TOLERANCE = 1e-10


def decode_error(module: torch.nn.Module, x: torch.Tensor, chunks: list[int], compiled: bool | None = None) -> float:
    """The largest relative error of decoding `x` in `chunks` through a new cache of `module`
    against the module's causal forward over each prefix (tdiag.decode.check_decodes)."""
    from tdiag.decode import check_decodes

    return check_decodes(module, x, chunks, compiled=compiled)


def check_decoding(design: tdiag.Design, sizes: dict[str, int]) -> str:
    """'decoded as KIND' where the design's float64 module decodes token by token and a prompt then
    chunks as its causal forward over each prefix, stepped by generated code and by the
    reference evaluator; 'not decodable: WHY' where the cache refuses with a reason; 'fixed length'
    where the input has no axis of a run-time length N. Raises DecodeMismatchError past 1e-10."""
    from tdiag.decode import NotDecodableError

    sizes_of = design.graph.sizes
    if "N" not in sizes_of or not sizes_of["N"].is_free:
        return "fixed length"
    if sizes_of["N"].symbol not in [axis.size for axis in design.graph.inputs[0].axes]:
        return "fixed length"
    module = design.module(sizes, dtype=torch.float64).eval()
    try:
        tdiag.DecodeCache(module)
    except NotDecodableError as refusal:
        assert str(refusal).strip(), "a cache refused without saying why"
        return f"not decodable: {str(refusal).splitlines()[0]}"
    x, block = _decoding_input(design, sizes, module)
    plans = [[1] * 5, [2, 1, 2]] if block == 1 else [[block] * 3, [2 * block, block]]
    for compiled in (None, False):
        for chunks in plans:
            try:
                error = decode_error(module, x, chunks, compiled=compiled)
            except NotDecodableError as refusal:
                assert str(refusal).strip(), "a cache refused without saying why"
                return f"not decodable: {str(refusal).splitlines()[0]}"
            if not error <= DECODE_TOLERANCE:
                step = "generated code" if compiled is None else "the reference evaluator"
                raise DecodeMismatchError(f"decoding in chunks {chunks} stepped by {step}: relative error {error:.3g}")
    return f"decoded as {tdiag.DecodeCache(module).kind}"


def _decoding_input(design: tdiag.Design, sizes: dict[str, int], module: torch.nn.Module) -> tuple[torch.Tensor, int]:
    """A random input of 5 positions, or of three blocks where the forward takes only whole
    blocks (a run-time split of the positions): the block is the smallest length of 1..4 it takes."""
    values = {**design.size_values, **sizes}
    axes, symbol = design.graph.inputs[0].axes, design.graph.sizes["N"].symbol
    generator = torch.Generator().manual_seed(len(design.graph.tensors))

    def input_of(length: int) -> torch.Tensor:
        shape = [length if a.size == symbol else int(design.graph.evaluate(a.size, **values)) for a in axes]
        return torch.randn(2, *shape, dtype=torch.float64, generator=generator)

    for block in range(1, 5):
        try:
            with torch.no_grad():
                module(input_of(block))
        except (TdiagError, ValueError):
            continue
        return input_of(5 if block == 1 else 3 * block), block
    return input_of(5), 1


SEAM_MARKERS = {
    "softmax": r"= softmax\[m",
    "linear": r"Q\[n h d\] = (elu1|exp\(clamp|sigmoid|softplus)\(",
    "decay": r"exp\(lg\[h\] \(index\(n\) - index\(m\)\)\)|exp\(segsum\[n, m\]",
    "decay_statement": r"(?m)^Dec\[h n m\] = .*exp\(.*\n(.*\n)*O\[n h e\] = .*Dec\[h n m\]",
    "strict": r"causal\(n, m\) - I\[n m\]|clamp\(index\(n\) - index\(m\), 0, 1\)|\(1 - I\[n m\]\) causal\(n, m\)",
    "split": r"const one\[i: C\] = ones\n.*X\[\(b i\) f\](.*\n)*Y\[\(b i\) g\] = ",
    "query_over_key": r"(?m)^V\[m h e\] = (.*\n)*O\[n h e\] = .*[VK]\[n h [de]\]"
    r"|^V\[b j h e\] = (.*\n)*O.* V\[b i h e\]",
    "key_reads_length": r"index\(m\) / N|\(index\(m\) \+ 1\) / \(2 N\)",
}


@pytest.mark.parametrize("kind", SEAM_KINDS)
def test_the_seam_generator_writes_each_kind_of_design_the_same_for_a_seed(kind):
    for seed in range(5):
        case = seam_design(random.Random(seed), kind)
        assert kind in case.kinds and case.kinds[0] in SEAM_CORES
        if case.kinds[0] in ("decay", "decay_statement", "strict", "split"):
            assert case.causal == ("typo" not in case.kinds)
        assert case == seam_design(random.Random(seed), kind)
        if kind in SEAM_MARKERS and "typo" not in case.kinds:  # a typo may fall on the marker
            assert re.search(SEAM_MARKERS[kind], case.text), case.text
    assert len({seam_design(random.Random(seed), kind).text for seed in range(5)}) > 1


@pytest.mark.parametrize("core", SEAM_CORES)
def test_a_seam_design_without_a_typo_checks(core):
    for seed in range(8):
        case = seam_design(random.Random(seed), core)
        if "typo" not in case.kinds:
            assert tdiag.loads(case.text).graph.sizes["N"].is_free == bool(case.sizes)


def test_a_leg_typo_changes_one_leg_of_one_tensor_read():
    for seed in range(20):
        lines = seam_design(random.Random(seed), "softmax").text.splitlines()
        typed = _leg_typo(random.Random(seed), lines)
        changed = [(a, b) for a, b in zip(lines, typed, strict=True) if a != b]
        assert len(changed) == 1
        before, after = (re.findall(r"\w+|\S", line) for line in changed[0])
        assert len(before) == len(after) and sum(x != y for x, y in zip(before, after, strict=True)) == 1


CAUSAL_SOFTMAX = (
    "design causal_softmax\nsize F = 3, H = 2, D = 2, E = 2\nsize N\ninput X[n: N, f: F]\n"
    "param WQ[f: F, h: H, d: D]\nparam WK[f: F, h: H, d: D]\nparam WV[f: F, h: H, e: E]\n"
    "param WO[h: H, e: E, g: F]\n"
    "Y[n g] = softmax[m, mask = causal(n, m)](X[n f] WQ[f h d] X[m k] WK[k h d]) X[m j] WV[j h e] WO[h e g]\n"
    "output Y\n"
)


@pytest.fixture
def fuzz_script():
    """scripts/fuzz.py as a module, its time limit's handler installed as its main() does."""
    spec = importlib.util.spec_from_file_location("fuzz_script", DESIGNS.parent / "scripts" / "fuzz.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)  # type: ignore[union-attr]
    previous = signal.signal(signal.SIGPROF, script._alarm)
    yield script
    signal.signal(signal.SIGPROF, previous)


def test_the_fuzzer_counts_a_decode_that_differs_from_the_forward_as_a_decode_mismatch(fuzz_script, monkeypatch):
    script, generator = fuzz_script, sys.modules[__name__]
    run = lambda: script.run_generated(generator, CAUSAL_SOFTMAX, {"N": 4}, "seam")  # noqa: E731
    assert script.classify(run, CAUSAL_SOFTMAX, 120) == ("decoded", "kv")
    extend = tdiag.decode.DecodeCache.extend
    wrong = lambda cache, x, **kwargs: extend(cache, x, **kwargs) * (1 + 1e-6)  # noqa: E731
    monkeypatch.setattr(tdiag.decode.DecodeCache, "extend", wrong)
    outcome, detail = script.classify(run, CAUSAL_SOFTMAX, 120)
    assert outcome == "decode_mismatch" and outcome in script.FAILURES
    assert "relative error 1e-06" in detail
    assert script.signature(outcome, detail).startswith("decode_mismatch: decoding in chunks [#")


def test_an_input_past_its_limit_of_cpu_time_is_a_hang_and_one_that_waits_is_not(fuzz_script):
    def spin() -> str:
        while True:
            pass

    def wait() -> str:  # as an input does while other jobs hold the cores
        time.sleep(0.5)
        return "ok"

    assert fuzz_script.classify(spin, "", 0.2) == ("hang", "")
    assert fuzz_script.classify(wait, "", 0.2) == ("ok", "")


def test_a_design_causal_as_written_that_the_cache_refuses_has_no_causal_form(fuzz_script, monkeypatch):
    def refuse(cache, module, **options):
        raise tdiag.decode.NotDecodableError("design 'causal_softmax' is not causal")

    monkeypatch.setattr(tdiag.decode.DecodeCache, "__init__", refuse)
    result = run_design(CAUSAL_SOFTMAX, {"N": 3}, decode=True, causal=True)
    assert result.startswith("no causal form: the cache refuses the design as written: not decodable")
    assert result.endswith("design 'causal_softmax' is not causal")
    outcome, detail = fuzz_script.run_generated(sys.modules[__name__], CAUSAL_SOFTMAX, {"N": 3}, "seam", True)
    assert (outcome, detail) == ("causal_refused", result)


def test_a_leg_typo_that_runs_is_told_apart_by_whether_check_warned(fuzz_script):
    unused = CAUSAL_SOFTMAX.replace("output Y", "param Wx[f: F]\noutput Y")  # check warns of Wx
    assert fuzz_script.typo_outcome(unused, "decoded") == "warned"
    assert fuzz_script.typo_outcome(CAUSAL_SOFTMAX, "ok") == "silent"
    assert fuzz_script.typo_outcome(CAUSAL_SOFTMAX, "refused") == "refused"
    assert fuzz_script.typo_outcome(CAUSAL_SOFTMAX, "decode_mismatch") == "failed"


def test_a_cache_that_refuses_a_causal_design_with_a_reason_is_not_a_mismatch():
    text = CAUSAL_SOFTMAX.replace("input X[n: N, f: F]", "input X[n: N, f: F]\ninput Z[n: N, f: F]")
    text = text.replace("X[m j] WV", "Z[m j] WV")
    assert check_decoding(tdiag.loads(text).with_causal_mask(), {"N": 3}).startswith("not decodable: ")


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


def test_a_const_over_the_run_time_size_is_made_at_the_size_of_each_call():
    text = (
        "design runtime_const\nsize N, F = 2\ninput X[n: N, f: F]\nconst I[n: N, m: N] = identity\n"
        "T[n f] = exp(I[n m]) X[m f]\noutput T\n"
    )
    design = tdiag.loads(text)
    module = design.module(dtype=torch.float64)
    reference = design.module(impl="reference", dtype=torch.float64)
    for n in (3, 5):  # one module, two sequence lengths; never stored at the planning default
        x = torch.randn(2, n, 2, dtype=torch.float64)
        expected = torch.exp(torch.eye(n, dtype=torch.float64)) @ x
        torch.testing.assert_close(module(x), expected, rtol=0, atol=1e-12)
        torch.testing.assert_close(reference(x), expected, rtol=0, atol=1e-12)
    assert not list(module.buffers())


@pytest.mark.parametrize(
    "declaration", ["mask P[m: N]", "random E[m: N] = normal(mode = never)", "const C[m: N] = ones"]
)
def test_a_run_time_size_that_no_input_has_is_refused_where_it_is_first_used(declaration):
    text = f"design unbound\nsize N, F = 2\ninput X[f: F]\n{declaration}\nT[f] = X[f]\noutput T\n"
    with pytest.raises(TdiagError) as error:
        tdiag.loads(text)
    assert "run-time size N" in str(error.value)
    assert error.value.diagnostics[0].spans[0].line == 4


@pytest.mark.parametrize("impl", ["compiled", "reference"])
def test_a_sum_term_whose_legs_are_all_summed_is_a_scalar_added_to_every_entry(impl):
    text = (
        "design scalar_term\nsize N = 3, F = 2, H = 4\ninput X[n: N, f: F]\nparam W[m: N, h: H]\n"
        "T[f] = X[n f] - W[m h]\noutput T\n"
    )
    module = tdiag.loads(text).module(impl=impl, dtype=torch.float64)
    x = torch.randn(2, 3, 2, dtype=torch.float64)
    torch.testing.assert_close(module(x), x.sum(-2) - module.W.sum(), rtol=0, atol=1e-12)


@pytest.mark.parametrize("impl", ["compiled", "reference"])
def test_a_leg_less_tensor_in_a_box_scale_a_box_argument_and_a_sum_is_evaluated(impl):
    text = (
        "design leg_less\nsize N = 3, F = 2\ninput X[n: N, f: F]\nparam w[f: F] = normal(std = 0.5)\n"
        "lam[] = exp(w[f] w[f]) - 0.5\n"
        "Y[n f] = softmax[n](lam[] X[n f]) + softmax[f, scale = lam[]](X[n f]) - lam[]\noutput Y\n"
    )
    module = tdiag.loads(text).module(impl=impl, dtype=torch.float64)
    x = torch.randn(2, 3, 2, dtype=torch.float64)
    lam = torch.exp(module.w @ module.w) - 0.5
    expected = torch.softmax(lam * x, dim=-2) + torch.softmax(lam * x, dim=-1) - lam
    torch.testing.assert_close(module(x), expected, rtol=0, atol=1e-12)


def test_a_normalized_leg_that_only_a_bias_carries_is_materialized_and_equals_the_reference(tmp_path):
    # MGK with the key side summed over its component leg: r of softmax[m r] comes from log pi only,
    # so the key side of a fused SDPA would lack a key leg (the fuzzer's mutation of designs/mgk.td)
    text = (DESIGNS / "mgk.td").read_text().replace("K[m h r d]) /", "K[m h rr d]) /")
    assert "K[m h rr d]" in text
    design = tdiag.loads(text, "<mgk mutated>", F=8, H=2, D=4)
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    reference = design.module(impl="reference", dtype=torch.float64)(x)
    for objective in ("flops", "memory"):
        module = design.module(dtype=torch.float64, objective=objective)
        torch.testing.assert_close(module(x), reference, rtol=1e-10, atol=1e-12)
        assert any("only a bias carries" in why for why in module.tdiag_plan.refused)


def test_a_scalar_param_without_initializer_gets_the_default_normal_with_fan_in_1():
    text = "design scalar\nsize N = 3, F = 2\ninput X[n: N, f: F]\nparam w[]\nT[n f] = w[] X[n f]\noutput T\n"
    assert run_design(text) == "ran"
    module = tdiag.loads(text).module(dtype=torch.float64)
    x = torch.randn(2, 3, 2, dtype=torch.float64)
    assert module.w.shape == ()
    torch.testing.assert_close(module(x), module.w * x, rtol=0, atol=1e-12)


def test_a_buffer_read_by_a_nonlinear_map_and_updated_in_the_same_call_still_backpropagates():
    text = (
        "design updated\nsize N = 3, F = 2\ninput X[n: N, f: F]\nparam w[f: F]\nbuffer S[f: F] = ones\n"
        "update S[f] = mean[n](X[n f] X[n f])\nT[n f] = exp(S[f] w[f]) X[n f]\noutput T\n"
    )
    design = tdiag.loads(text)
    module = design.module(dtype=torch.float64).train()
    reference = design.module(impl="reference", dtype=torch.float64).train()
    x = torch.randn(2, 3, 2, dtype=torch.float64)
    module(x).sum().backward()  # the update rewrites S after exp(S w) saved it for backward
    reference(x).sum().backward()
    torch.testing.assert_close(module.w.grad, reference.w.grad, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(module.w.grad, x.sum((0, 1)) * torch.exp(module.w.detach()), rtol=1e-10, atol=0)
    torch.testing.assert_close(module.S, (x * x).mean(1).mean(0), rtol=1e-12, atol=0)


# ---- the command line, fuzzed the same way ------------------------------------------------------

DESIGN = DESIGNS / "mhsa.td"
VALUES = ["0", "-1", "1", "3", "nan", "inf", "1e400", "abc", "", "N=4", "N=-1", "F=0", "x=1", "N=1e30", "N=4,F=x"]
VALUES += ["cpu", "bogus", "cuda:99", "json", "table", "svg", "dot", "flops", "time", "flops,bogus", "-", "--"]
FLAGS = {
    "check": ["--time"],
    "show": ["--set"],
    "render": ["-o", "--output", "--statements", "--set"],
    "cost": ["--at", "--format", "--objective", "--set"],
    "compile": ["-o", "--output", "--objective", "--checkpoint-boxes", "--causal", "--set"],
    "plan": ["--at", "--causal", "--checkpoint-boxes", "--objective", "--set"],
    "train": ["--steps", "--batch", "--context", "--lr", "--device", "--nproc", "--layers", "--eval-every"],
    "bench": ["--n", "--batch", "--width", "--heads", "--repeat", "--device", "--out", "--objective"],
}
for _flags in FLAGS.values():
    _flags += ["-h", "--help", "--version", "--bogus"]


@st.composite
def command_line(draw, folder: Path):
    """tdiag COMMAND with random files (a design, a broken one, a missing one, a folder, an output
    path that cannot be written) and random flags with random values."""
    files = {
        "design": str(DESIGN),
        "broken": str(folder / "broken.td"),
        "missing": str(folder / "missing.td"),
        "folder": str(folder),
        "output": str(folder / "out.py"),
        "unwritable": str(folder / "no" / "such" / "out.svg"),
        "dot": str(folder / "out.dot"),
    }
    command = draw(st.sampled_from(sorted(FLAGS)))
    argv = [command] if draw(st.integers(0, 9)) else []
    argv += [files[draw(st.sampled_from(sorted(files)))] for _ in range(draw(st.integers(0, 2)))]
    for _ in range(draw(st.integers(0, 4))):
        argv.append(draw(st.sampled_from(FLAGS[command])))
        if draw(st.booleans()):
            argv.append(draw(st.sampled_from([*VALUES, *files.values()])))
    if command in ("train", "bench") and all(v not in argv for v in ("0", "-1", "nan", "bogus", "abc", "--bogus")):
        argv.append(files["broken"])  # never a real training or benchmark run in the suite
    return argv


def run_cli(argv: list[str]) -> int:
    """tdiag's exit status for argv, in process; fails on an exception or a traceback printed."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(argv)
        except SystemExit as exit:
            code = exit.code if isinstance(exit.code, int) else 1
    assert "Traceback" not in err.getvalue(), (argv, err.getvalue())
    return code


@CLI_FUZZ
@given(data=st.data())
def test_a_random_command_line_ends_with_an_exit_status_never_a_traceback(data, tmp_path_factory):
    folder = tmp_path_factory.mktemp("cli")
    (folder / "broken.td").write_text("design broken\nsize N = 3\ninput X[n: N]\nY[n] = softmax[m](X[n])\n")
    argv = data.draw(command_line(folder))
    assert run_cli(argv) in (0, 1, 2), argv


def test_a_number_alone_as_a_term_of_a_sum_is_added_to_every_entry():
    text = "design plus_one\nsize N = 3\ninput X[n: N]\nT[n] = X[n] + 1\noutput T\n"
    x = torch.randn(2, 3, dtype=torch.float64)
    module = tdiag.loads(text).module(dtype=torch.float64)
    assert torch.allclose(module(x), x + 1, rtol=0, atol=1e-12)


@pytest.mark.parametrize("text", ["", "size N = 3\n", "design b extends a\nsize N\n"])
def test_text_that_does_not_start_a_design_is_refused_with_a_position(text):
    with pytest.raises(TdiagError) as error:
        tdiag.loads(text)
    assert error.value.diagnostics[0].spans[0].line == 1
