"""The standalone file `tdiag compile` writes, read as text: one body per distinct plan, comments
true of the steps they describe, and constant tables made once with the module (codegen.py,
codegen_calls.py)."""

import functools
import re

import pytest
import torch
from conftest import DESIGN_FILES, DESIGNS, standalone_module

import tdiag

F64 = torch.float64


@functools.cache
def bundled_source(name: str) -> str:
    return tdiag.load(DESIGNS / f"{name}.td").source()


def bodies(source: str) -> dict[str, str]:
    """Each method of the generated class by name, its text up to the next method."""
    design_class = source.split("(nn.Module):\n")[-1]
    starts = list(re.finditer(r"^    (?:@torch\.no_grad\(\)\n    )?def (\w+)", design_class, re.M))
    ends = [found.start() for found in starts[1:]] + [len(design_class)]
    return {found.group(1): design_class[found.start() : end] for found, end in zip(starts, ends, strict=True)}


def comparable(body: str) -> str:
    """A body without its name, its cache argument and entry, and its fresh names' numbers."""
    body = re.sub(r"def \w+\(", "def (", body, count=1).replace(", *, cache=None)", ")").replace(", cache=None)", ")")
    body = re.sub(r"\n        if cache is not None:\n            return _extend\([^\n]*", "", body)
    return re.sub(r"_[0-9]+", "_#", body)


@pytest.mark.parametrize("path", DESIGN_FILES, ids=lambda p: p.stem)
def test_no_two_bodies_of_a_bundled_design_print_the_same_steps(path):
    methods = {name: comparable(text) for name, text in bodies(bundled_source(path.stem)).items()}
    variants = {
        name: text for name, text in methods.items() if name.startswith("_tdiag_") and name != "_tdiag_make_tables"
    }
    seen: dict[str, str] = {}
    for name, text in variants.items():
        assert text not in seen, f"{name} prints the same steps as {seen.get(text)}"
        seen[text] = name


def test_is_causal_on_a_design_causal_as_written_runs_the_plain_body():
    source = bundled_source("gla")
    assert "    def _tdiag_causal(" not in source  # an alias of the plain body, or no causal plan at all
    assert "return self._tdiag_plain(X)\n" in source
    module = tdiag.load(DESIGNS / "gla.td", F=32, H=2, R=4).module(dtype=F64, plan_calls=True)
    x = torch.randn(2, 19, 32, dtype=F64, generator=torch.Generator().manual_seed(0))
    assert torch.equal(module(x, is_causal=True), module(x))


def test_the_fresh_names_of_each_body_are_numbered_from_one():
    """The planner's counter (t_2871) never reaches the page: t_1, t_2, ... in every body."""
    source = bundled_source("gla")
    assert not re.search(r"\b[A-Za-z]\w*_[0-9]{3,}\b", source)
    assert re.search(r"\bt_1 = ", bodies(source)["_tdiag_plain"])


def test_a_shared_body_serves_a_variant_planned_on_first_use():
    """A module built without its variants plans them on the first masked call; a variant whose
    body is another's runs that one (module.py's _planned_on_first_use)."""
    design = tdiag.load(DESIGNS / "gla.td", F=32, H=2, R=4)
    lazy, planned = design.module(dtype=F64), design.module(dtype=F64, plan_calls=True)
    x = torch.randn(2, 9, 32, dtype=F64, generator=torch.Generator().manual_seed(1))
    mask = torch.rand(2, 9, 9, generator=torch.Generator().manual_seed(2)) > 0.3
    assert torch.equal(lazy(x, attn_mask=mask, is_causal=True), planned(x, attn_mask=mask, is_causal=True))
    assert torch.equal(lazy(x, is_causal=True), planned(x))


@pytest.mark.parametrize("path", DESIGN_FILES, ids=lambda p: p.stem)
def test_a_comment_names_a_normalize_or_softmax_box_only_where_the_design_has_one(path):
    graph = tdiag.load(path).graph
    kinds = {"softmax" if box.is_exp else "normalize" for _, box in graph.boxes()}
    methods = "".join(bodies(bundled_source(path.stem)).values())
    comments = [line.split("  # ", 1)[1] for line in methods.splitlines() if "  # " in line]
    for kind in ("normalize", "softmax"):
        named = [c for c in comments if f"{kind} box" in c]
        assert kind in kinds or not named, f"{path.stem} has no {kind} box: {named[0]}"


def test_a_causal_sum_in_chunks_is_not_called_a_normalize_box():
    source = bundled_source("gla")
    assert "# a causal sum in chunks, in float32 under autocast" in source
    assert "normalize box" not in source


def rope(**sizes):
    return tdiag.load(DESIGNS / "rope.td", F=64, H=2, **sizes)


def test_rope_frequencies_are_made_once_with_the_module_not_on_every_call():
    source = rope().source()
    forward = "".join(text for name, text in bodies(source).items() if name != "_tdiag_make_tables")
    assert "torch.arange(16," not in forward  # P = D / 2 = 16 positions over half a head
    assert "torch.arange(N," in forward  # the positions of the call stay in forward
    assert "torch.arange(16," in bodies(source)["_tdiag_make_tables"]
    module = rope().module(dtype=F64)
    p = torch.arange(16, dtype=F64)
    assert torch.allclose(module._tdiag_table_theta, 10000.0 ** (-2 * p / 32), rtol=1e-14, atol=0)


def test_a_table_is_outside_the_state_dict_so_old_checkpoints_load():
    module = rope().module(dtype=F64)
    assert "_tdiag_table_theta" in dict(module.named_buffers())
    assert set(module.state_dict()) == {"WQ", "WK", "WV", "WO"}
    fresh = rope().module(dtype=F64, seed=3)
    fresh.load_state_dict(module.state_dict(), strict=True)
    x = torch.randn(2, 7, 64, dtype=F64, generator=torch.Generator().manual_seed(0))
    assert torch.equal(fresh(x), module(x))


def test_a_table_is_made_again_in_the_dtype_the_module_is_converted_to():
    """A float32 module made float64 computes its table in float64, as forward computed it before."""
    converted = rope().module(dtype=torch.float32).to(F64)
    native = rope().module(dtype=F64)
    assert converted._tdiag_table_theta.dtype == F64
    assert torch.equal(converted._tdiag_table_theta, native._tdiag_table_theta)
    native.load_state_dict(converted.state_dict())
    x = torch.randn(2, 7, 64, dtype=F64, generator=torch.Generator().manual_seed(0))
    assert torch.equal(converted(x), native(x))


def test_a_module_with_tables_equals_its_reference_and_its_standalone_file(tmp_path):
    design = rope()
    module = design.module(dtype=F64, seed=5)
    reference = design.module(dtype=F64, seed=5, impl="reference")
    generated = standalone_module(design.source(), "rope_tables", tmp_path)
    standalone = generated.Rope(seed=5, dtype=F64)
    x = torch.randn(2, 11, 64, dtype=F64, generator=torch.Generator().manual_seed(4))
    assert torch.allclose(module(x), reference(x), atol=1e-10, rtol=0)
    assert torch.equal(standalone(x), module(x))
    assert "_tdiag_table_theta" not in repr(module)


def test_torch_compile_traces_a_module_reading_a_table():
    module = rope().module(dtype=F64)
    compiled = torch.compile(module, fullgraph=True, backend="eager")
    x = torch.randn(2, 7, 64, dtype=F64, generator=torch.Generator().manual_seed(0))
    assert torch.equal(compiled(x), module(x))


@pytest.mark.parametrize("path", DESIGN_FILES, ids=lambda p: p.stem)
def test_a_table_never_depends_on_the_call(path):
    """Tables are made from sizes fixed at build time: never the call's N or B, an input's values,
    a parameter or noise (the module's own tensors are read as self.<name>)."""
    graph = tdiag.load(path).graph
    tables = bodies(bundled_source(path.stem)).get("_tdiag_make_tables", "")
    run_time = {name for name, size in graph.sizes.items() if size.is_free} | {"B", "batch_shape"}
    statements = [line.split("  #", 1)[0] for line in tables.splitlines()[4:]]
    code = re.sub(r"\b\w+\.(dtype|device)\b", "", "\n".join(statements))
    assert not set(re.findall(r"[A-Za-z_]\w*", code)) & run_time
    assert "self." not in code.replace("self.register_buffer(", "")


def test_a_causal_variant_differing_in_its_mask_alone_is_one_body_reading_is_causal():
    """MHSA's causal body differs from its plain one in SDPA's is_causal only: one body takes it."""
    methods = bodies(bundled_source("mhsa"))
    assert "is_causal: bool = False) -> torch.Tensor:" in methods["_tdiag_plain"]
    assert "        if is_causal:\n" in methods["_tdiag_plain"]
    assert methods["_tdiag_causal"].strip().count("\n") == 1  # hands over to the plain body
    design = tdiag.load(DESIGNS / "mhsa.td", F=16, H=2)
    x = torch.randn(2, 9, 16, dtype=F64, generator=torch.Generator().manual_seed(0))
    mask = torch.rand(2, 9, 9, generator=torch.Generator().manual_seed(1)) > 0.3
    mask[..., 0] = True
    reference = design.with_causal_mask().module(dtype=F64, seed=2, impl="reference")
    for module in (design.module(dtype=F64, seed=2), design.module(dtype=F64, seed=2, plan_calls=True)):
        assert torch.allclose(module(x, is_causal=True), reference(x), atol=1e-10, rtol=0)
        both = module(x, attn_mask=mask, is_causal=True)
        hidden = torch.ones(9, 9, dtype=torch.bool).tril() & mask
        assert torch.allclose(both, module(x, attn_mask=hidden), atol=1e-10, rtol=0)
