"""Property: whatever happens to a bundled design's text (deleted or duplicated characters,
swapped tokens, truncation, stray unicode, renamed legs), tdiag answers with its own positioned
errors or a valid design, never with another exception."""

import keyword
import re
import shutil
import sys
from unittest import mock

import pytest
import torch
from conftest import DESIGN_FILES, DESIGNS
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tdiag
from tdiag import TdiagError, codegen
from tdiag import names as reserved
from tdiag.errors import format_diagnostics
from tdiag.plan import chunked
from tdiag.shared_plans import sharing

TEXTS = {p.name: p.read_text() for p in DESIGN_FILES}
TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|[0-9.]+|\S")
STRAY = st.sampled_from(["é", "∑", "α", "\u200b", "１", "\t", "\x00", "😀", "—", "\r", "⊗"])
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    """A copy of designs/ so mutated derived designs still find their base files."""
    folder = tmp_path_factory.mktemp("designs")
    for path in DESIGN_FILES:
        shutil.copy(path, folder / path.name)
    return folder


def load_mutated(folder, name: str, text: str) -> None:
    path = folder / f"mutant_{name}"
    path.write_text(text, encoding="utf-8")
    try:
        tdiag.load(path)
    except TdiagError as error:
        assert error.diagnostics
        rendered = format_diagnostics(error.diagnostics)
        assert ": error: " in rendered and "Traceback" not in rendered


def mutate_chars(text: str, data, kind: str) -> str:
    i = data.draw(st.integers(0, max(len(text) - 1, 0)))
    if kind == "delete":
        return text[:i] + text[i + 1 :]
    if kind == "duplicate":
        return text[:i] + text[i] + text[i:]
    if kind == "truncate":
        return text[:i]
    return text[:i] + data.draw(STRAY) + text[i:]


names = st.sampled_from(sorted(TEXTS))


@SETTINGS
@given(name=names, kind=st.sampled_from(["delete", "duplicate", "truncate", "unicode"]), data=st.data())
def test_character_mutations_give_only_tdiag_errors(library, name, kind, data):
    text = TEXTS[name]
    for _ in range(data.draw(st.integers(1, 3))):
        text = mutate_chars(text, data, kind)
    load_mutated(library, name, text)


@SETTINGS
@given(name=names, data=st.data())
def test_swapped_tokens_give_only_tdiag_errors(library, name, data):
    text = TEXTS[name]
    tokens = list(TOKEN.finditer(text))
    a, b = sorted(data.draw(st.lists(st.integers(0, len(tokens) - 1), min_size=2, max_size=2, unique=True)))
    ta, tb = tokens[a], tokens[b]
    swapped = text[: ta.start()] + tb.group() + text[ta.end() : tb.start()] + ta.group() + text[tb.end() :]
    load_mutated(library, name, swapped)


@SETTINGS
@given(name=names, data=st.data())
def test_renamed_legs_give_only_tdiag_errors(library, name, data):
    text = TEXTS[name]
    legs = sorted(set(re.findall(r"\b([a-z][a-z0-9]*)\b(?=[^\[\]]*\])", text)))
    if not legs:
        return
    old = data.draw(st.sampled_from(legs))
    new = data.draw(st.sampled_from([*legs, "zz", "N", "WQ", "softmax", "size"]))
    occurrences = [m.start() for m in re.finditer(rf"\b{old}\b", text)]
    where = data.draw(st.sampled_from(occurrences))
    load_mutated(library, name, text[:where] + new + text[where + len(old) :])


@SETTINGS
@given(name=names, data=st.data())
def test_random_token_replacement_gives_only_tdiag_errors(library, name, data):
    text = TEXTS[name]
    tokens = list(TOKEN.finditer(text))
    t = data.draw(st.sampled_from(tokens))
    new = data.draw(
        st.sampled_from(
            [
                "(",
                ")",
                "[",
                "]",
                "=",
                ",",
                ":",
                "^",
                "*",
                "/",
                "+",
                "-",
                "0",
                "1e999",
                "replace",
                "output",
                "design",
                "size",
                "param",
                "softmax",
                "sqdist",
                "max",
                "causal",
                "mask",
                "extends",
                "0.0",
                "-1",
                "sqrt",
                "",
                "\n",
                "#",
            ]
        )
    )
    load_mutated(library, name, text[: t.start()] + new + text[t.end() :])


def test_the_unmutated_library_loads(library):
    for name in TEXTS:
        assert tdiag.load(library / name).name == name.removesuffix(".td")


# ---- generated code: nothing from a design or its path runs as code ---------------------------

TINY = "design tiny\nsize N = 3, F = 2\ninput X[n: N, f: F]\nparam W[f: F, g: F]\nY[n g] = X[n f] W[f g]\noutput Y\n"


@pytest.mark.parametrize(
    "file_name",
    [
        'x"""; open("PWNED", "w").write("1"); """.td',
        "x'''; open('PWNED', 'w').write('1'); '''.td",
        "C:\\Users\\me\\a.td",
        "line\nbreak.td",
        "ünïcödé \u2028 \x7f.td",
        "trailing\\.td",
    ],
)
def test_a_design_path_reaches_generated_code_only_as_text(tmp_path, monkeypatch, file_name):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / file_name
    path.write_text(TINY, encoding="utf-8")
    module = tdiag.load(path).module()
    assert not (tmp_path / "PWNED").exists()
    assert file_name in sys.modules[type(module).__module__].__doc__  # the path, relative to the current folder


def test_a_scale_in_a_run_time_size_compiles_to_plain_python():
    text = (
        "design scaled\nsize N, F = 2\ninput X[n: N, f: F]\n"
        "A[n m] = softmax[m, scale = 1 / sqrt(N)](X[n f] X[m f])\nY[n f] = A[n m] X[m f]\noutput Y\n"
    )
    design = tdiag.loads(text)
    x = torch.randn(2, 5, 2, dtype=torch.float64)
    compiled = design.module(dtype=torch.float64)(x)
    reference = design.module(impl="reference", dtype=torch.float64, N=5)(x)
    assert "math." not in design.source()
    torch.testing.assert_close(compiled, reference)


# ---- the front end: no input size reaches a Python limit; checking is near-linear -------------

HEAD = "design big\nsize N = 4, F = 3\ninput X[n: N, f: F]\n"


def positioned_error(text: str) -> str:
    with pytest.raises(TdiagError) as error:
        tdiag.loads(text)
    message = format_diagnostics(error.value.diagnostics)
    assert re.match(r"<string>:\d+:\d+: error: ", message), message
    return message


@pytest.mark.parametrize("digits", [400, 5000])
def test_a_huge_integer_literal_is_out_of_range(digits):
    message = positioned_error(HEAD.replace("F = 3", "F = " + "9" * digits) + "Y[n f] = X[n f]\noutput Y\n")
    assert "number out of range" in message


@pytest.mark.parametrize(
    "expression",
    [
        " + ".join(["X[n f]"] * 600),
        "-" * 1000 + "X[n f]",
        "X[n f]" + " ^ 1" * 1000,
        "exp(" * 500 + "X[n f]" + ")" * 500,
        "(X[n f] + " * 500 + "X[n f]" + ")" * 500,
    ],
    ids=["sum", "negations", "powers", "maps", "parentheses"],
)
def test_an_expression_nested_too_deeply_is_a_positioned_error(expression):
    message = positioned_error(HEAD + f"Y[n f] = {expression}\noutput Y\n")
    assert "nested too deeply" in message and "split it" in message


def test_a_long_extends_chain_loads(tmp_path):
    (tmp_path / "d0.td").write_text(HEAD + "Y[n f] = X[n f]\noutput Y\n")
    for k in range(1, 1500):
        (tmp_path / f"d{k}.td").write_text(f"design d{k} extends d{k - 1}\nsize S{k} = 2\n")
    assert tdiag.load(tmp_path / "d1499.td").size_values["S1499"] == 2


def test_a_long_chain_of_statements_sizing_a_leg_ends_in_a_positioned_error_not_a_recursion():
    # index(a0) reads a leg only the chain T0[a0] = T1[a0], T1[a1] = T2[a1], ... sizes, in statements
    # built after it: following the chain is bounded, and beyond the bound the leg is unbound
    chain = "".join(f"T{k}[a{k}] = T{k + 1}[a{k}]\n" for k in range(1000))
    text = HEAD + f"Y[n f] = index(a0) X[n f]\n{chain}T1000[a1000] = X[a1000 f]\noutput Y\n"
    assert "leg 'a0' of index(...) is not bound to a size" in positioned_error(text)


def test_an_extends_cycle_is_a_positioned_error(tmp_path):
    (tmp_path / "a.td").write_text("design a extends b\n")
    (tmp_path / "b.td").write_text("design b extends a\n")
    with pytest.raises(TdiagError, match="extends itself"):
        tdiag.load(tmp_path / "a.td")


@pytest.mark.parametrize(
    "lines",
    [
        lambda k: f"size S{k} = {k + 1}\n",
        lambda k: f"size S{k} = S{k - 1} + 1\n" if k else "size S0 = 1\n",
        lambda k: f"T{k}[n f] = T{k - 1}[n f] + X[n f]\n" if k else "T0[n f] = X[n f]\n",
        lambda k: f"param W{k}[f: F, g: F]\nY{k}[n g] = X[n f] W{k}[f g]\n",
    ],
    ids=["sizes", "derived sizes", "statements", "parameters"],
)
@pytest.mark.slow
def test_checking_is_near_linear_in_the_number_of_lines(lines):
    """Work counted, not timed: the Python function calls made while checking a file of k items
    and of 4k items. Linear work gives a ratio near 4; the quadratic check of issue 11 (1,000 sizes
    in 1.6 s, 8,000 in 98 s) gives about 16."""

    def text(count: int) -> str:
        body = "".join(lines(k) for k in range(count))
        outputs = sorted(set(re.findall(r"^(Y\d+|T\d+)\[", body, re.M)), key=lambda n: int(n[1:]))
        if outputs and outputs[0].startswith("T"):
            return HEAD + body + f"output {outputs[-1]}\n"
        return HEAD + body + (f"output {', '.join(outputs)}\n" if outputs else "Y[n f] = X[n f]\noutput Y\n")

    def calls(count: int) -> int:
        made = 0

        def profile(frame, event, arg):
            nonlocal made
            made += event == "call"

        sys.setprofile(profile)
        try:
            tdiag.loads(text(count))
        finally:
            sys.setprofile(None)
        return made

    calls(20)  # the parser and caches are built once, outside the count
    small, large = calls(300), calls(1_200)
    assert large < 6 * small, (small, large)


# ---- check refuses, with a position, what compile or run would refuse ---------------------------


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("Y[n f] = softmax[f f](X[n f])", "leg 'f' is named twice in softmax"),
        ("Y[n] = max[f f](X[n f])", "leg 'f' is named twice in max"),
        ("Y[n f] = exp(X[n f] / 0)", "division by zero"),
        ("Y[n f] = exp(X[n f] / (F - 3))", "division by zero"),
        ("Y[n f] = normalize[f, eps = 1e30](X[n f])", "number out of range"),
        ("Y[n f] = normalize[f, eps = 1000](X[n f])", "eps 1000 must be between 0 and 1"),
        ("Y[n f] = normalize[f, eps = -1](X[n f])", "eps -1 must be between 0 and 1"),
        ("Y[n f] = softmax[f, scale = 1e10 * 1e10](X[n f])", "scale 100000000000000000000 is out of range"),
        ("Y[n f] = 1e10 * 1e10 * X[n f]", "coefficient 100000000000000000000 is out of range"),
        ("Y[n f] = X[n f] ^ 100", "exponent 100 is out of range"),
        ("Y[n f] = clamp(X[n f], 1, 0)", "lo is greater than hi"),
        ("param W[f: F, g: F] = normal(std = -1)\nY[n g] = X[n f] W[f g]", "normal's std = -1 must be >= 0"),
        ("param W[f: F, g: F] = uniform(low = 1, high = 0)\nY[n g] = X[n f] W[f g]", "low is greater than high"),
        ("param W[f: F, g: F] = fill(1e300)\nY[n g] = X[n f] W[f g]", "number out of range"),
        ("param W[f: F, g: F] = fill\nY[n g] = X[n f] W[f g]", "fill needs a value"),
        ("param W[f: F, g: F] = fill#(1)\nY[n g] = X[n f] W[f g]", "fill needs a value"),
        ("const W[f: F, g: F] = fill()\nY[n g] = X[n f] W[f g]", "fill needs a value"),
        ("Y[n f] = X[n f] / (1 / 0)", "division by zero"),
    ],
)
def test_check_refuses_what_compile_or_run_would_refuse(line, message):
    assert message in positioned_error(HEAD + line + "\noutput Y\n")


@pytest.mark.parametrize("value", ["1e30", "10000000000000", "9" * 400])
def test_a_size_over_the_limit_is_refused_by_check(value):
    message = positioned_error(HEAD.replace("F = 3", f"F = {value}") + "Y[n f] = X[n f]\noutput Y\n")
    assert "out of range" in message or "over the limit" in message


def test_a_module_too_big_for_memory_is_refused_before_allocation_naming_the_tensor(monkeypatch):
    monkeypatch.setattr(tdiag.LIMITS, "max_bytes", 10**6)
    design = tdiag.load(DESIGNS / "mhsa.td", F=64, H=4)  # 4 params of 64·64 floats: 64 kB
    with pytest.raises(TdiagError, match=r"param WQ would take 2.1 MB \(2,097,152 bytes\)") as error:
        design.module({"F": 512}, dtype=torch.float64)
    assert error.value.diagnostics[0].spans[0].line == 16


def test_load_refuses_sizes_whose_parameters_would_not_fit(monkeypatch):
    monkeypatch.setattr(tdiag.LIMITS, "max_bytes", 10**6)
    with pytest.raises(TdiagError, match="param WQ would take"):
        tdiag.load(DESIGNS / "mhsa.td", F=1024)


@pytest.mark.parametrize("call", ["module", "plan", "source", "cost"])
@pytest.mark.parametrize(
    ("sizes", "message"),
    [({"N": -1}, "positive whole number"), ({"Q": 3}, "no size 'Q'"), ({"sizes": {"N": 8}}, "is not a size")],
)
def test_sizes_given_to_a_design_are_checked_like_load(call, sizes, message):
    design = tdiag.load(DESIGNS / "mhsa.td", F=16, H=2)
    with pytest.raises(TdiagError, match=message):
        getattr(design, call)(**sizes)


# ---- names the generated module uses: refused by check with a position, or they compile and run -


ROLES = {
    "size": "size N = 3, {x} = 2\ninput X[n: N, f: {x}]\nY[n f] = exp(X[n f])",
    "run-time size": "size {x}, F = 2\ninput X[n: {x}, f: F]\n"
    "A[n m] = softmax[m, scale = 1 / sqrt({x})](X[n f] X[m f])\nY[n f] = A[n m] X[m f]",
    "input": "size N = 3, F = 2\ninput {x}[n: N, f: F]\nY[n f] = exp({x}[n f])",
    "param": "size N = 3, F = 2\ninput X[n: N, f: F]\nparam {x}[f: F, g: F]\nY[n g] = X[n f] {x}[f g]",
    "const": "size N = 3, F = 2\ninput X[n: N, f: F]\nconst {x}[f: F] = fill(2)\nY[n f] = X[n f] {x}[f]",
    "buffer": "size N = 3, F = 2\ninput X[n: N, f: F]\nbuffer {x}[f: F] = ones\nY[n f] = X[n f] + {x}[f]\n"
    "update {x}[f] = mean[n](X[n f])",
    "statement target": "size N = 3, F = 2\ninput X[n: N, f: F]\n{x}[n f] = exp(X[n f])\nY[n f] = {x}[n f] X[n f]",
    "leg": "size N = 3, F = 2\ninput X[n: N, {x}: F]\nY[n {x}] = softmax[{x}](X[n {x}])",
    "mask": "size N = 3, F = 2\ninput X[n: N, f: F]\nmask {x}[m: N]\n"
    "A[n m] = softmax[m, mask = {x}[m]](X[n f] X[m f])\nY[n f] = A[n m] X[m f]",
    "noise": "size N = 3, F = 2\ninput X[n: N, f: F]\nrandom {x}[n: N, f: F] = normal(mode = never)\n"
    "Y[n f] = X[n f] + {x}[n f]",
    "output": "size N = 3, F = 2\ninput X[n: N, f: F]\nY[n f] = exp(X[n f])\n{x}[n f] = Y[n f] X[n f]",
    "design name": "size N = 3, F = 2\ninput X[n: N, f: F]\nY[n f] = exp(X[n f])",
}
NAMES = sorted(
    {*keyword.kwlist, *reserved.GENERATED, *reserved.BUILTINS, *reserved.MODULE_ATTRIBUTES, *reserved.MODULE_METHODS}
    | {"x", "F", "seed", "dtype", "device", "impl", "objective", "expr", "path", "sizes", "self", "name"}
)


def test_the_reserved_module_names_cover_torch_nn_module():
    module = torch.nn.Module()
    for name in {*dir(torch.nn.Module), *vars(module)}:
        assert reserved.reserved_because(name, "param"), name


@pytest.mark.parametrize("role", ROLES)
def test_every_python_or_torch_name_is_refused_with_a_position_or_compiles_and_runs(role):
    refused = []
    for name in NAMES:
        design_name = name if role == "design name" else "named"
        output = name if role == "output" else "Y"
        text = f"design {design_name}\n" + ROLES[role].format(x=name) + f"\noutput {output}\n"
        try:
            design = tdiag.loads(text)
        except TdiagError as error:
            assert all(d.spans and d.spans[0].line > 1 for d in error.diagnostics), (name, str(error))
            refused.append(name)
            continue
        sizes = {name: 4} if role == "run-time size" else {}  # a mapping: any name, even `dtype` or `self`
        x = torch.randn(2, 4 if sizes else 3, 2, dtype=torch.float64, requires_grad=True)
        compiled = design.module(sizes, dtype=torch.float64)(x)
        compiled.sum().backward()
        torch.testing.assert_close(compiled, design.module(sizes, impl="reference", dtype=torch.float64)(x))
    assert set(keyword.kwlist) - {"True", "False", "None"} <= set(refused) or role in ("leg", "design name")


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("param class[f: F, g: F]", "'class' is a Python keyword"),
        ("param forward[f: F, g: F]", "'forward' is a method of torch.nn.Module"),
        ("param training[f: F, g: F]", "'training' is an attribute of torch.nn.Module"),
        ("size B", "'B' is reserved for the batch size in generated code"),
        ("size torch", "'torch' is reserved for the torch module in generated code"),
        ("buffer _tdiag_table_t[f: F] = zeros", "'_tdiag_table_t' begins with '_tdiag_'"),
        ("param tdiag_design[f: F] = zeros", "'tdiag_design' begins with 'tdiag_'"),
    ],
)
def test_a_reserved_name_is_refused_saying_why(line, message):
    assert message in positioned_error(f"design named\nsize N = 3, F = 2\n{line}\n")


@pytest.mark.parametrize("size", ["expr", "path", "sizes", "dtype", "seed"])
def test_a_size_named_like_a_python_parameter_can_be_set_through_the_api(size):
    text = f"design named\nsize N = 3, {size} = 2\ninput X[n: N, f: {size}]\nY[n f] = exp(X[n f])\noutput Y\n"
    design = tdiag.loads(text, "<string>", {size: 5})
    assert design.size_values[size] == 5
    assert design.graph.evaluate(design.graph.sizes[size].symbol * 2, **{size: 7}) == 14
    assert design.module({size: 5})(torch.randn(3, 5)).shape == (3, 5)


@pytest.mark.parametrize("name", ["B", "batch_shape", "torch", "self", "len", "_box_0"])
def test_an_input_named_like_a_generated_local_gets_a_fresh_variable_and_runs(name):
    text = f"design named\nsize N = 3, F = 2\ninput {name}[n: N, f: F]\nY[n f] = exp({name}[n f])\noutput Y\n"
    x = torch.randn(2, 3, 2)
    torch.testing.assert_close(tdiag.loads(text).module()(x), x.exp())


@pytest.mark.parametrize("design", ["none", "true", "_3", "class_", "nn"])
def test_any_design_name_gives_a_python_class(design):
    text = f"design {design}\nsize N = 3, F = 2\ninput X[n: N, f: F]\nY[n f] = exp(X[n f])\noutput Y\n"
    module = tdiag.loads(text).module()
    assert type(module).__name__.isidentifier()
    assert module(torch.zeros(3, 2)).shape == (3, 2)


@pytest.mark.parametrize(
    ("value", "context"),
    [("a b", "name"), ("class", "name"), ("x;import os", "name"), (float("nan"), "number"), (float("inf"), "number")],
)
def test_generated_source_refuses_what_is_not_a_name_or_a_finite_number(value, context):
    with pytest.raises(ValueError, match="reached generated code"):
        codegen.source(value, context)


@pytest.mark.parametrize("text", ['a"""b', "x\ny", "C:\\Users\\me", "{braces}", "caf\u00e9\u2028"])
def test_text_in_generated_source_reads_back_as_itself(text):
    assert eval('"' + codegen.source(text, "text") + '"') == text
    assert eval('f"' + codegen.source(text, "fstring") + '"') == text
    assert "\n" not in codegen.source(text, "comment")


# ---- numerics: every bundled design runs in float16 and under float16 and bfloat16 autocast ----


def narrow_design(path, causal: bool) -> tdiag.Design:
    """A bundled design at width 32 with 4 heads (head size 4 for the Gaussian-key designs), plain
    or causal."""
    sizes = {"F": 32, "H": 4, **({"D": 4} if "mgk" in path.stem or "mlk" in path.stem else {})}
    sizes |= {"N": 16} if path.stem == "mgk_softe" else {}
    design = tdiag.load(path, **sizes)
    return design.with_causal_mask() if causal else design


def narrow_outputs(design: tdiag.Design, n: int = 16) -> dict[str, torch.Tensor]:
    """The outputs of the module built in float16 (float16 input), and of the float32 module under
    float16 and bfloat16 autocast, for a standard normal input."""
    x = [torch.randn(2, n, 32, generator=torch.Generator().manual_seed(1))] * len(design.graph.inputs)
    module = design.module(N=n, seed=0).eval()
    with torch.no_grad():
        outputs = {"float16 module": design.module(N=n, seed=0, dtype=torch.float16).eval()(*(v.half() for v in x))}
        for dtype in (torch.float16, torch.bfloat16):
            with torch.autocast("cpu", dtype=dtype):
                outputs[f"{dtype} autocast"] = module(*x)
    return outputs


def test_a_clamp_bound_beyond_float16s_range_runs_in_a_float16_module():
    """max{|x|, 1} written clamp(abs(x), 1, 1e15), as mLSTM once was: the bound 1e15 does not fit a
    half tensor (was: 'value cannot be converted to type c10::Half without overflow'); it is the same
    clamp there, and under float16 and bfloat16 autocast."""
    text = HEAD + "param W[f: F, g: F]\nY[n g] = X[n f] W[f g] / clamp(abs(X[n f] W[f g]), 1, 1e15)\noutput Y\n"
    design = tdiag.loads(text)
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(1))
    exact = design.module(seed=0)(x)
    for module, dtype in (
        (design.module(seed=0, dtype=torch.float16), None),
        *((design.module(seed=0), d) for d in (torch.float16, torch.bfloat16)),
    ):
        with torch.autocast("cpu", dtype=dtype or torch.float16, enabled=dtype is not None):
            y = module(x.half() if dtype is None else x)
        torch.testing.assert_close(y.float(), exact, rtol=2e-2, atol=2e-2)


def test_a_clamp_bound_float16_can_hold_is_printed_as_it_is():
    text = HEAD + "Y[n f] = clamp(X[n f], -2, 3) + clamp(X[n f], -1e5, 1e5)\noutput Y\n"
    source = tdiag.loads(text).source()
    assert ".clamp(-2, 3)" in source and source.count("torch.finfo(") == 2
    x = 1e4 * torch.randn(4, 3, dtype=torch.float16)
    torch.testing.assert_close(tdiag.loads(text).module(dtype=torch.float16)(x), x.clamp(-2, 3) + x)


@pytest.mark.slow
@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
@pytest.mark.parametrize("path", DESIGN_FILES, ids=lambda p: p.stem)
def test_every_bundled_design_runs_finite_in_float16_and_under_autocast(path, causal):
    for precision, y in narrow_outputs(narrow_design(path, causal)).items():
        assert torch.isfinite(y).all(), precision


def test_index_positions_in_a_float32_step_are_exact_for_a_bfloat16_input_under_autocast():
    """Lightning's decay λ^(n−m) reads index(n) in its float32 decayed sum: with a bfloat16 input
    under autocast the positions took the input's dtype, which holds no whole number above 256
    exactly (was 63% off float64 at N = 1024; the bfloat16 projections alone give 3%)."""
    n = 1024
    design = tdiag.load(DESIGNS / "lightning.td", F=32, H=8)
    x = torch.randn(2, n, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        exact = design.module(N=n, seed=0, dtype=torch.float64)(x.double())
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = design.module(N=n, seed=0)(x.bfloat16())
    assert float((low.double() - exact).norm() / exact.norm()) <= 0.05


def _mlstm(form: str, dtype: torch.dtype) -> tuple[torch.nn.Module, torch.nn.Module]:
    """mLSTM (F = 16, H = 2) compiled in `form` (the masked (n, m) product at N = 64, or prefix
    sums in chunks of 4 planned for N = 4096), and the design as written by the reference
    evaluator with the same parameters."""
    design = tdiag.load(DESIGNS / "mlstm.td", F=16, H=2)
    sizes = {"N": 64} if form == "masked" else {"N": 4096}
    chunk_sizes = chunked.CHUNK_SIZES if form == "masked" else (4,)
    with sharing(False), mock.patch.object(chunked, "CHUNK_SIZES", chunk_sizes):
        module = design.module(sizes, dtype=dtype)
    assert ("_decayed_earlier" in module.tdiag_source) == (form == "chunked")
    reference = design.module(impl="reference", dtype=dtype)
    reference.load_state_dict(module.state_dict())
    return module, reference


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("form", ["masked", "chunked"])
def test_mlstm_at_inputs_times_1e4_is_finite_its_shared_decay_shifted_by_the_row_max(form, dtype):
    """exp(ĩ) of input gates near 1e4 overflows every float (the design as written gives inf / inf);
    the planner shifts the decay its numerator and denominator share by the row max m_t (xLSTM
    App. A.2), so every exponent is ≤ 0: outputs and gradients finite (was: NaN)."""
    module, reference = _mlstm(form, dtype)
    x = 1e4 * torch.randn(2, 37, 16, dtype=dtype, generator=torch.Generator().manual_seed(4))
    x.requires_grad_(True)
    y = module(x)
    (gradient,) = torch.autograd.grad(y.square().sum(), x)
    assert torch.isfinite(y).all() and torch.isfinite(gradient).all()
    assert not torch.isfinite(reference(x.detach())).all()  # the overflow is real


@pytest.mark.parametrize("scale", [1, 10])
@pytest.mark.parametrize("form", ["masked", "chunked"])
def test_the_shifted_mlstm_equals_the_design_as_written_in_float64(form, scale):
    module, reference = _mlstm(form, torch.float64)
    x = scale * torch.randn(2, 37, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(module(x), reference(x), rtol=1e-10, atol=1e-10)
