"""The program IR (tdiag/plan/program.py, ops.py with the values, box_ops.py) and its readers: every op
has its footprint rule, its time rule and its printer, and the IR imports nothing above it."""

import dataclasses
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from tdiag.codegen import op_code
from tdiag.plan import box_ops, ops
from tdiag.plan.footprint import RULES
from tdiag.plan.program import Op, ScoreTerm
from tdiag.plan.timing import TIME_RULES

OPS = typing.get_args(Op)
ROOT = Path(__file__).resolve().parents[1]


def _dataclasses_of(module: object) -> set[type]:
    return {
        value
        for value in vars(module).values()
        if isinstance(value, type) and dataclasses.is_dataclass(value) and value.__module__ == module.__name__
    }


def test_the_op_union_lists_every_op_class_of_the_ir():
    declared = _dataclasses_of(ops) | _dataclasses_of(box_ops)
    terms = set(typing.get_args(ScoreTerm))  # score_mod terms are parts of a FlexAttention op, not ops
    values = {ops.Value, ops.Operand, ops.Binary}  # what ops read and define, not ops
    assert declared - terms - values == set(OPS)


@pytest.mark.parametrize("op", OPS, ids=lambda op: op.__name__)
def test_every_program_op_has_a_footprint_rule(op):
    assert op in RULES, f"footprint has no rule for {op.__name__} (plan/footprint_tensors.py or footprint_boxes.py)"


@pytest.mark.parametrize("op", OPS, ids=lambda op: op.__name__)
def test_every_program_op_has_a_time_rule(op):
    assert op in TIME_RULES, f"the time model has no rule for {op.__name__} (plan/timing.py TIME_RULES)"


@pytest.mark.parametrize("op", OPS, ids=lambda op: op.__name__)
def test_every_program_op_has_a_printer(op):
    assert op_code.dispatch(op) is not op_code.registry[object], f"codegen prints no {op.__name__} (codegen/ops.py)"


def test_the_readers_have_rules_for_program_ops_only():
    for table in (RULES, TIME_RULES, {k: v for k, v in op_code.registry.items() if k is not object}):
        assert set(table) <= set(OPS)


def test_an_op_without_a_time_rule_is_a_type_error_naming_it():
    from tdiag.plan.abstract import StepFootprint
    from tdiag.plan.program import Step
    from tdiag.plan.timing import op_time

    @dataclasses.dataclass(frozen=True)
    class Unknown:
        pass

    with pytest.raises(TypeError, match="no time rule for Unknown"):
        op_time(None, Step("unknown", Unknown(), None), StepFootprint(), float)  # type: ignore[arg-type]


IMPORTS = """
import sys, types
for name, path in (("tdiag", "tdiag"), ("tdiag.plan", "tdiag/plan")):  # the packages without their __init__
    package = types.ModuleType(name)
    package.__path__ = [path]
    sys.modules[name] = package
before = set(sys.modules)
import tdiag.plan.program
print(" ".join(sorted(m for m in sys.modules if m not in before)))
"""


def test_the_program_ir_imports_only_sympy_and_itself():
    loaded = subprocess.run(
        [sys.executable, "-c", IMPORTS], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    ours = {m for m in loaded if m.startswith("tdiag")}
    assert ours == {"tdiag.plan.program", "tdiag.plan.ops", "tdiag.plan.box_ops"}
    assert not {m.split(".")[0] for m in loaded} & {"lark", "torch", "networkx", "opt_einsum"}
