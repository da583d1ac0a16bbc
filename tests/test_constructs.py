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


def test_every_word_of_the_language_is_built_by_a_rule_or_is_a_scalar_function():
    """A word added to graph/vocabulary.py without a construct's build rule would reach the
    "unknown map" error; a rule for a word the vocabulary lacks would be missing from its hints."""
    from tdiag.graph import FUNCTIONS, SCALAR_FUNCTIONS
    from tdiag.graph.calls import BUILD

    assert BUILD.names() | set(SCALAR_FUNCTIONS) == set(FUNCTIONS)


def test_a_word_is_built_by_one_rule_only():
    rules = Rules("build")
    rules.register(TriangularSolve, names=("trisolve",))(lambda builder, call, keep: None)
    assert rules.named("trisolve") is not None and rules.named("solve") is None

    @dataclass(frozen=True)
    class Other(ir.Expr):
        pass

    with pytest.raises(ValueError, match="already has a rule for the word 'trisolve'"):
        rules.register(Other, names=("trisolve",))(lambda builder, call, keep: None)
