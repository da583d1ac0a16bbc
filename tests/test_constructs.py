"""A construct is one registered rule set (tdiag/rules.py, tdiag/constructs): every expression
kind of the design graph has, for every stage converted to a rule table, a rule or an explicit
`unsupported(kind, reason)`, so a kind added without its rules fails here, not in a user's run."""

import subprocess
import sys
from dataclasses import dataclass
from typing import ClassVar

import pytest

from tdiag import ir
from tdiag.constructs import STAGES, missing_rules
from tdiag.errors import Span
from tdiag.plan.base import LOWER
from tdiag.rules import MissingRuleError, Rules, UnsupportedError

SPAN = Span("<test>", 1, 1, 1, 2)


def expression_kinds() -> list[type]:
    """Every expression class of tdiag, wherever it is defined: the design graph's (ir's Expr
    subclasses) and the planner's own (plan/norms.LayerNormNode, made in its copy of the graph)."""
    found, todo = [], list(ir.Expr.__subclasses__())
    while todo:
        kind = todo.pop()
        todo += kind.__subclasses__()
        if kind.__module__.startswith("tdiag.") and kind not in found:
            found.append(kind)
    return sorted(found, key=lambda kind: (kind.__module__, kind.__name__))


@dataclass(frozen=True)
class TriangularSolve(ir.Expr):
    """A kind added to the ir without rules."""

    matrix: ir.Expr | None = None
    rhs: ir.Expr | None = None
    kind: ClassVar[str] = "trisolve"


def test_every_expression_kind_has_a_rule_or_a_refusal_at_every_stage():
    assert len(expression_kinds()) >= 17
    assert missing_rules(expression_kinds()) == []


def test_the_planners_own_kind_is_covered():
    """A kind made outside ir (the planner's layer norm) is among the kinds the tables must cover."""
    from tdiag.plan.norms import LayerNormNode

    assert LayerNormNode in expression_kinds()
    assert LOWER.lookup(LayerNormNode((), SPAN)) is not None


def test_a_multilinear_factor_is_lowered_with_its_region_not_by_a_rule():
    with pytest.raises(UnsupportedError, match="lower does not take Contraction: a factor of a multilinear region"):
        LOWER.lookup(ir.Contraction((), SPAN))


def test_a_kind_added_without_rules_is_reported_at_every_stage():
    missing = missing_rules([*expression_kinds(), TriangularSolve])
    assert missing == [(rules.stage, "TriangularSolve") for rules in STAGES]


@pytest.mark.parametrize("rules", STAGES, ids=lambda rules: rules.stage)
def test_a_stage_without_a_rule_for_a_kind_names_the_kind_and_the_stage(rules):
    node = TriangularSolve((), SPAN)
    with pytest.raises(MissingRuleError, match=rf"no {rules.stage} rule for TriangularSolve"):
        rules.lookup(node)


def test_an_unsupported_kind_says_why_when_looked_up():
    rules = Rules("lower")
    rules.unsupported(TriangularSolve, "no program op solves a triangular system yet")
    with pytest.raises(UnsupportedError, match="lower does not take TriangularSolve: no program op solves"):
        rules.lookup(TriangularSolve((), SPAN))
    assert rules.kinds() == {TriangularSolve}


def test_a_subclass_takes_its_base_kinds_rule():
    rules = Rules("print")
    rules.register(TriangularSolve)(lambda node: "solve")

    @dataclass(frozen=True)
    class BandedSolve(TriangularSolve):
        pass

    assert rules.lookup(BandedSolve((), SPAN))(None) == "solve"


def test_a_second_rule_for_one_kind_is_refused():
    rules = Rules("render")
    rules.register(TriangularSolve)(lambda node: None)
    with pytest.raises(ValueError, match="render already has a rule for TriangularSolve"):
        rules.unsupported(TriangularSolve, "twice")


def test_registering_every_construct_does_not_load_torch():
    """check, show, render, cost and plan never import torch, so no construct module may at import."""
    code = "import sys, tdiag.constructs; assert 'torch' not in sys.modules, 'torch loaded'"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_a_word_registered_with_a_build_rule_is_a_word_of_the_language():
    """The words come from the build table: a construct's new word needs no vocabulary edit."""
    from tdiag.graph.vocabulary import Words

    rules = Rules("build")
    words = Words(rules, ("sqrt",))
    assert "trisolve" not in words
    rules.register(TriangularSolve, names=("trisolve",))(lambda builder, call, keep: None)
    assert "trisolve" in words and "sqrt" in words and "solve" not in words
    assert list(words) == ["sqrt", "trisolve"]


def test_every_registered_word_and_scalar_function_is_a_function_of_the_language():
    from tdiag.graph import FUNCTIONS, SCALAR_FUNCTIONS
    from tdiag.graph.calls import BUILD

    assert {"softmax", "causal", "conv", "rsqrt", "max", "floor"} <= set(FUNCTIONS)
    assert BUILD.names() | set(SCALAR_FUNCTIONS) == set(FUNCTIONS)


def test_plain_gives_a_kind_every_position_tables_neutral_rule_but_those_named():
    from tdiag.graph import position_rules as pos

    @dataclass(frozen=True)
    class Banded(ir.Expr):
        pass

    pos.plain(Banded, but=(pos.MASK_SITE,))
    assert missing_rules([Banded], pos.TABLES) == [("mask site", "Banded")]
    node = Banded(("n", "m"), SPAN)
    assert pos.zeros(node, {}) == set() and pos.HEADS.lookup(node)(node, "n", "m") == ((), ())


def test_plain_gives_a_kind_every_decode_tables_neutral_rule_but_those_named():
    from tdiag import decode_rules as decode

    @dataclass(frozen=True)
    class Banded(ir.Expr):
        pass

    decode.plain(Banded, but=(decode.KV_ROWS,))
    assert missing_rules([Banded], decode.STAGES) == [("decode rows", "Banded")]
    node = Banded(("n", "m"), SPAN)
    assert decode.INNER_LEGS.lookup(node)(node) == set() and decode.STATE_WHAT.lookup(node)(node) == "n, m"


def test_the_construct_modules_are_found_without_a_list():
    from tdiag import constructs

    assert {"softmax", "causal", "scan", "tensor"} <= set(constructs.MODULES)
    assert list(constructs.MODULES) == sorted(constructs.MODULES)


def test_a_word_is_built_by_one_rule_only():
    rules = Rules("build")
    rules.register(TriangularSolve, names=("trisolve",))(lambda builder, call, keep: None)
    assert rules.named("trisolve") is not None and rules.named("solve") is None

    @dataclass(frozen=True)
    class Other(ir.Expr):
        pass

    with pytest.raises(ValueError, match="already has a rule for the word 'trisolve'"):
        rules.register(Other, names=("trisolve",))(lambda builder, call, keep: None)


def test_decodings_tables_are_among_the_stages_the_completeness_test_covers():
    from tdiag import decode_rules

    assert set(decode_rules.STAGES) <= set(STAGES)
    assert len(decode_rules.STAGES) == 8


def test_decodings_tables_do_not_load_the_planner():
    """The decode tables' module and the rules' helpers hold no planner (the lower rules, which
    the construct modules register beside them, do)."""
    code = (
        "import sys, tdiag.decode_rules; loaded = [m for m in sys.modules if m.startswith('tdiag.plan')];"
        " assert not loaded, loaded"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_the_planners_fused_layer_norm_steps_as_it_is_and_is_written_out_for_a_state():
    """LayerNormNode is a kind of the planner's graph (plan/norms.py), not of the language: a "kv"
    step takes it, the state analysis writes it out first and its tables refuse it."""
    import tdiag.constructs  # noqa: F401  (registers the fused node's rules: constructs/norm.py)
    from tdiag.decode_rules import KV_ROWS, STATE_ROWS, no_row_problem
    from tdiag.plan.norms import LayerNormNode

    node = LayerNormNode((), SPAN)
    assert KV_ROWS.lookup(node) is no_row_problem
    with pytest.raises(UnsupportedError, match="writes a fused layer norm out first"):
        STATE_ROWS.lookup(node)
