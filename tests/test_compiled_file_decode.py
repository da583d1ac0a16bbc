"""A file `tdiag compile` writes decodes as the in-process module does (issue 42): it carries its
design as data (`tdiag_design`: the texts of its files, its sizes, causal masks and planning
options), which DecodeCache reads through the front end; a file whose design is not its weights'
is refused."""

import re
import subprocess
import sys

import pytest
import torch
from conftest import DESIGNS, standalone_module

import tdiag
from tdiag import TdiagError
from tdiag.decode import DecodeCache, NotDecodableError

TOL = 1e-10
LENGTH = 7
SIZES = {"F": 8, "H": 2}


def compiled_file(name: str, folder, stem: str | None = None, **sizes: int) -> torch.nn.Module:
    """The causal form of bundled design `name`, written as `tdiag compile --causal` writes it,
    imported and instantiated in float64, eval mode."""
    design = tdiag.load(DESIGNS / f"{name}.td", **(SIZES | sizes)).with_causal_mask()
    generated = standalone_module(design.source(N=8), stem or f"{name}_file", folder)
    return _only_class(generated)(seed=3, dtype=torch.float64).eval()


def _only_class(generated) -> type:
    (cls,) = [v for v in vars(generated).values() if isinstance(v, type) and v.__module__ == generated.__name__]
    return cls


def decoded(module: torch.nn.Module, x: torch.Tensor, chunks: list[int]) -> torch.Tensor:
    cache, start, outputs = DecodeCache(module), 0, []
    for count in chunks:
        outputs.append(module(x[:, start : start + count], cache=cache))
        start += count
    return torch.cat(outputs, 1)


def inputs(width: int = 8) -> torch.Tensor:
    return torch.randn(2, LENGTH, width, dtype=torch.float64, generator=torch.Generator().manual_seed(5))


@pytest.mark.parametrize(
    ("name", "kind"),
    [("mhsa", "kv"), ("gla", "state"), ("forgetting_attention", "prefix")],
    ids=["kv", "state", "prefix"],  # prefix: a scan along the positions and a softmax, no state holds it
)
def test_a_module_imported_from_a_compiled_file_decodes_as_its_causal_forward(tmp_path, name, kind):
    module = compiled_file(name, tmp_path)
    assert not hasattr(module, "tdiag_plan")
    x = inputs()
    expected = module(x)
    assert DecodeCache(module).kind == kind
    for chunks in ([1] * LENGTH, [3, 2, 2]):  # token by token; a prompt, then chunks
        assert torch.allclose(decoded(module, x, chunks), expected, atol=TOL, rtol=0)


def test_a_compiled_file_decodes_as_the_in_process_module_of_its_design(tmp_path):
    module = compiled_file("mhsa", tmp_path)
    design = tdiag.load(DESIGNS / "mhsa.td", **SIZES).with_causal_mask()
    in_process = design.module(seed=3, dtype=torch.float64, N=8).eval()
    x = inputs()
    assert torch.allclose(decoded(module, x, [2, 1, 4]), decoded(in_process, x, [2, 1, 4]), atol=TOL, rtol=0)


def test_a_design_text_with_quotes_backslashes_and_triple_quotes_is_carried_as_data(tmp_path):
    hostile = "# a comment with \"quotes\", 'single', a \\ backslash, \\n, \"\"\" and ''' and {braces}\n"
    text = hostile + (DESIGNS / "mhsa.td").read_text() + '# trailing """)); import os  #\n'
    path = tmp_path / "quoted.td"
    path.write_text(text)
    design = tdiag.load(path, **SIZES).with_causal_mask()
    generated = standalone_module(design.source(N=8), "quoted_file", tmp_path)
    cls = _only_class(generated)
    assert cls.tdiag_design["files"][0][1] == text
    assert not hasattr(generated, "os")
    module = cls(seed=3, dtype=torch.float64).eval()
    x = inputs()
    assert torch.allclose(decoded(module, x, [1] * LENGTH), module(x), atol=TOL, rtol=0)


def test_a_compiled_file_of_a_design_that_extends_another_carries_both_texts(tmp_path):
    module = compiled_file("gemma2_sliding", tmp_path, F=16, H=2)
    names = [name for name, _ in type(module).tdiag_design["files"]]
    assert names == ["designs/gemma2_sliding.td", "designs/gemma2.td"]
    x = inputs(16)
    assert torch.allclose(decoded(module, x, [3, 1, 3]), module(x), atol=TOL, rtol=0)


def _tampered(tmp_path, name: str, other: str, **other_sizes: int) -> torch.nn.Module:
    """The compiled file of `name` with the design record of `other`'s file in place of its own."""
    record = re.compile(r"    tdiag_design = \{\n.*?\n    \}\n", re.S)
    source = tdiag.load(DESIGNS / f"{name}.td", **SIZES).with_causal_mask().source(N=8)
    swapped = tdiag.load(DESIGNS / f"{other}.td", **(SIZES | other_sizes)).with_causal_mask().source(N=8)
    tampered = record.sub(lambda _: record.search(swapped).group(0), source, count=1)
    assert tampered != source
    return _only_class(standalone_module(tampered, f"{name}_tampered", tmp_path))(dtype=torch.float64).eval()


def test_a_file_carrying_another_design_than_its_weights_is_refused_naming_the_tensor(tmp_path):
    module = _tampered(tmp_path, "mhsa", "gla")
    with pytest.raises(
        NotDecodableError,
        match=r"\('gla'\) has param Wa1, param Wa2, param ba, param Wr, which the module does not hold",
    ):
        DecodeCache(module)


def test_a_file_carrying_its_design_at_other_sizes_is_refused_naming_the_shapes(tmp_path):
    module = _tampered(tmp_path, "mhsa", "mhsa", H=4)
    with pytest.raises(
        NotDecodableError,
        match=r"has param WQ\[8, 4, 2\], the module holds WQ\[8, 2, 4\]: the file's design is not the one",
    ):
        DecodeCache(module)


def test_a_tampered_design_text_is_a_positioned_error_in_the_embedded_text(tmp_path):
    design = tdiag.load(DESIGNS / "mhsa.td", **SIZES).with_causal_mask()
    source = design.source(N=8).replace("A[h n m] = softmax[", "A[h n m] = softmax(", 1)
    assert "softmax(" in source.split("def __init__")[0]
    module = _only_class(standalone_module(source, "mhsa_typo", tmp_path))(dtype=torch.float64)
    with pytest.raises(TdiagError, match=r"mhsa_typo\.py \(embedded designs/mhsa\.td\):\d+:\d+"):
        DecodeCache(module)


def test_a_design_record_that_is_not_data_is_refused(tmp_path):
    module = compiled_file("mhsa", tmp_path)
    type(module).tdiag_design = {**type(module).tdiag_design, "sizes": {"F": "8"}}
    with pytest.raises(NotDecodableError, match="not the design record"):
        DecodeCache(module)


def test_a_compiled_file_runs_its_forward_without_tdiag(tmp_path):
    source = tdiag.load(DESIGNS / "mhsa.td", **SIZES).with_causal_mask().source(N=8)
    (tmp_path / "alone.py").write_text(source)
    script = (
        "import sys; sys.modules['tdiag'] = sys.modules['lark'] = None; import torch, alone;"
        "m = alone.Mhsa(dtype=torch.float64); print(tuple(m(torch.ones(2, 5, 8, dtype=torch.float64)).shape))"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "(2, 5, 8)"


def test_a_record_missing_the_base_a_design_extends_is_an_error_at_its_extends(tmp_path):
    module = compiled_file("gemma2_sliding", tmp_path, F=16, H=2)
    record = type(module).tdiag_design
    type(module).tdiag_design = {**record, "files": record["files"][:1]}
    with pytest.raises(
        TdiagError,
        match=r"\(embedded designs/gemma2_sliding\.td\):\d+:31: error: design .gemma2_sliding. extends 'gemma2' but no",
    ):
        DecodeCache(module)


def test_the_design_record_is_written_as_a_literal_of_plain_data_only():
    import ast

    from tdiag.codegen import data_literal

    class Sneaky(str):
        def __repr__(self) -> str:
            return "__import__('os').getcwd()"

    value = {"files": (("a.td", 'x = """\\\'\n'),), "sizes": {"F": 8}, "flag": True, "none": None}
    assert ast.literal_eval(data_literal(value)) == value
    with pytest.raises(TypeError, match="data only, got Sneaky"):
        data_literal({"files": ((Sneaky("a.td"), "text"),)})
