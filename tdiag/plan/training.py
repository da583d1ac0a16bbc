"""Training-only terms. Noise drawn only in training (a random tensor with mode = train, FiSH's
ε in σ·ε, eq. 9) is zero in eval mode, and so is every value that has it as a factor; a sum that
adds such a value is, in eval mode, the sum of its other terms.

Guarantees (the program and its costs in training mode are unchanged):
- `Step.training_only` marks each step whose result is zero in eval mode and that no eval-mode
  step reads as a whole tensor: codegen runs it in training only (`... if self.training else
  None`), so eval mode neither multiplies by zeros nor allocates them.
- `Step.eval_op` is a sum's op without its eval-zero terms (None when it has none).
- `Plan.training_noise` lists the noise variables eval mode never reads: they are not drawn
  (no zeros allocated) in eval mode. Noise an eval-mode op does read (say exp(ε)) stays zeros.
- `eval_steps(plan)` is the program eval mode runs, for reading and testing."""

from __future__ import annotations

import dataclasses

from .program import (
    Binary,
    Einsum,
    Elementwise,
    Expand,
    Map,
    Materialize,
    Matmul,
    Multiply,
    Operand,
    Permute,
    Plan,
    Reshape,
    Scale,
    Step,
    SumAxes,
    reads,
)

PRODUCTS = (Multiply, Matmul, Einsum, Scale, SumAxes, Permute, Reshape, Expand, Materialize)  # zero in, zero out
ZERO_MAPS = frozenset({"relu", "tanh", "sin", "abs", "silu", "gelu", "sqrt"})  # f(0) = 0


def mark_training_only(plan: Plan) -> None:
    """Mark the steps that vanish in eval mode and the sums that drop terms (module docstring)."""
    noise = {plan.names[t.name] for t in plan.graph.tensors_of_kind("random") if _mode(t) == "train"}
    if not noise:
        return
    kept: set[str] = set()  # eval-zero values that some eval-mode op must read as a tensor
    while True:
        zero = _propagate(plan.steps, noise, kept)
        needed = _needed_in_eval(plan, zero) & zero
        if needed <= kept:
            break
        kept |= needed
    for step in plan.steps:
        step.training_only = step.out is not None and step.out.var in zero
        step.eval_op = None
        if isinstance(step.op, Elementwise) and not step.training_only:
            simpler = _without_zeros(step.op, zero)
            step.eval_op = simpler if simpler != step.op else None
    plan.training_noise = frozenset(noise - kept)


def eval_steps(plan: Plan) -> list[Step]:
    """The program eval mode runs: training-only steps left out, sums without their zero terms."""
    return [
        dataclasses.replace(step, op=step.eval_op) if step.eval_op is not None else step
        for step in plan.steps
        if not step.training_only
    ]


def _mode(tensor) -> str:
    return str(tensor.init.param("mode", "train")) if tensor.init else "train"


def _propagate(steps: list[Step], noise: set[str], kept: set[str]) -> set[str]:
    """The values that are zero in eval mode and need not exist there (those in `kept` and
    what reads them are computed as written)."""
    zero = noise - kept
    for step in steps:
        if step.out is None or step.out.var in kept:
            continue
        read = {v.var for v in reads(step.op)}
        if isinstance(step.op, PRODUCTS) and getattr(step.op, "bias", None) is None and read & zero:
            zero.add(step.out.var)
        elif isinstance(step.op, Map) and step.op.name in ZERO_MAPS and step.op.x.var in zero:
            zero.add(step.out.var)
        elif isinstance(step.op, Elementwise) and _without_zeros(step.op, zero) is None:
            zero.add(step.out.var)
    return zero


def _needed_in_eval(plan: Plan, zero: set[str]) -> set[str]:
    """Values that eval mode reads as tensors: inputs of the steps it runs (sums without their
    zero terms), the outputs and the state updates."""
    needed = {v.var for _, v in plan.outputs} | {v.var for s in plan.update_steps for v in reads(s.op)}
    for step in plan.steps:
        if step.out is not None and step.out.var in zero:
            continue
        op = step.op
        if isinstance(op, Elementwise):
            op = _without_zeros(op, zero) or op
        needed |= {v.var for v in reads(op)}
    return needed


def _without_zeros(op: Elementwise, zero: set[str]) -> Elementwise | None:
    """The sum without its eval-zero terms; None when all of it is zero. A term that cannot be
    dropped exactly (0 - x inside a tree, x / 0) keeps the tree as written."""
    tree, negate = _drop(op.tree, zero), op.negate
    if tree is _ZERO:
        return None
    if isinstance(tree, _Negated):
        tree, negate = tree.tree, not negate
    if tree is _KEEP:
        return op
    return Elementwise(tree, negate)


class _Marker:
    pass


_ZERO, _KEEP = _Marker(), _Marker()  # the whole subtree is zero / cannot be simplified


@dataclasses.dataclass
class _Negated:
    tree: Binary | Operand


def _drop(tree: Binary | Operand, zero: set[str]):
    if isinstance(tree, Operand):
        return _ZERO if tree.value.var in zero else tree
    left, right = _drop(tree.left, zero), _drop(tree.right, zero)
    if _KEEP in (left, right) or isinstance(left, _Negated) or isinstance(right, _Negated):
        return _KEEP
    if tree.op == "/":
        return _ZERO if left is _ZERO else (_KEEP if right is _ZERO else Binary("/", left, right))
    if left is _ZERO and right is _ZERO:
        return _ZERO
    if right is _ZERO:
        return left
    if left is _ZERO:
        return right if tree.op == "+" else _Negated(right)
    return Binary(tree.op, left, right)
