"""A projection with a bias as one step: `Q[n h d] = X[n f] WQ[f h d] + bq[h d]` (BERT's, GPT-2's,
BLOOM's, Falcon's projections) is lowered as a matmul then a sum; nn.Linear runs it as one addmm.
This pass, run after the layout pass (whose result orders it keeps), finds a matmul whose right
operand is read as a 2-D matrix (no batch leg) with its columns last in the result, and a sum
that reads its result once, whole, beside a bias over exactly the matmul's column legs (the
result legs that come from the weight) with the same sign, and moves
the bias into the matmul (`Matmul.bias`: `torch.addmm(bias, x.flatten(0, -2), w)`). The sum keeps
its other terms; where the bias was its only other term, the sum step goes away and the fused
step defines the sum's value. The costs are kept: the fused step carries the additions it took
over as `elementwise` (and, for the papers' count, as `paper`), its FLOPs are the matmul's."""

from __future__ import annotations

import dataclasses

import sympy

from .combine import sum_tree
from .context import Lowering
from .contraction import group_size
from .program import BATCH, Binary, Elementwise, Matmul, Operand, Step, Value, read_groups, reads


@dataclasses.dataclass
class _Candidate:
    """A sum step (`total`) that reads the matmul step's result and `bias` over its `right` legs."""

    matmul: int
    total: int
    bias: Value
    right: tuple[str, ...]


def fuse_linear_biases(lowering: Lowering, steps: list[Step], kept: set[str]) -> list[int]:
    """Fuse every bias the pattern allows (module docstring) into `steps`, in place; `kept`:
    values read outside `steps` (outputs, state updates). Returns the indices (into the steps as
    they were) of the sum steps removed."""
    readers: dict[str, int] = {}
    for step in steps:
        for var in {v.var for v in reads(step.op)}:
            readers[var] = readers.get(var, 0) + 1
    producer = {s.out.var: k for k, s in enumerate(steps) if s.out is not None}
    for k, step in enumerate(steps):
        candidate = _candidate(steps, k, producer, readers, kept) if step is not None else None
        if candidate is not None and _fuse(lowering, steps, candidate) and steps[k] is None:
            producer[step.out.var] = candidate.matmul
    gone = [k for k, s in enumerate(steps) if s is None]
    steps[:] = [s for s in steps if s is not None]
    return gone


def _signed(tree: Binary | Operand, sign: int = 1):
    """(sign, leaf) for each leaf of a sum tree; None for a quotient."""
    if isinstance(tree, Operand):
        return [(sign, tree)]
    if tree.op not in "+-":
        return None
    left, right = _signed(tree.left, sign), _signed(tree.right, -sign if tree.op == "-" else sign)
    return None if left is None or right is None else left + right


def _candidate(steps, k, producer, readers, kept) -> _Candidate | None:
    """The matmul and bias a sum step can fuse, or None."""
    step = steps[k]
    if (
        step.kind != "sum"
        or step.description != "sum"
        or not isinstance(step.op, Elementwise)
        or step.op.negate
        or step.eval_op is not None
    ):
        return None
    leaves = _signed(step.op.tree)
    if leaves is None:
        return None
    for sign, leaf in leaves:
        var = leaf.value.var
        m = producer.get(var)
        once = sum(1 for _, other in leaves if other.value.var == var) == 1
        if sign < 0 or m is None or m >= k or readers.get(var) != 1 or var in kept or not once:
            continue
        if leaf.permutation is not None or leaf.index is not None or leaf.shape is not None:
            continue
        matmul = steps[m]
        op = matmul.op
        if not isinstance(op, Matmul) or op.bias is not None or len(matmul.inputs) != 2 or matmul.training_only:
            continue
        a, b = matmul.inputs
        right = tuple(leg for leg in matmul.out.legs if leg in b.legs and leg not in a.legs)
        if not _rows_times_matrix(op, a, b, matmul.out.legs, right):
            continue
        for other_sign, other in leaves:
            bias = other.value
            source = producer.get(bias.var)
            if other is leaf or other_sign < 0 or set(bias.legs) != set(right) or len(bias.legs) != len(right):
                continue
            if source is not None and source >= m:
                continue
            return _Candidate(m, k, bias, right)
    return None


def _rows_times_matrix(op: Matmul, a: Value, b: Value, out: tuple[str, ...], right: tuple[str, ...]) -> bool:
    """Is the matmul, as the layout pass left it, (rows of a) @ (a matrix over b's legs alone),
    its result's trailing axes b's columns (`right`, in the result's order), as addmm computes
    it? A weight read batched, or a result whose columns are not last, is left as it is."""
    matrix = len(op.b.shape or op.b.value.legs) == 2 and op.b.index is None and BATCH not in b.legs
    shared = [leg for leg in a.legs if leg in b.legs and leg in out]
    trailing = len(out) > len(right) > 0 and out[-len(right) :] == right
    return matrix and not shared and trailing and op.a.index is None and set(b.legs) - set(a.legs) == set(right)


def _fuse(lowering, steps: list[Step | None], c: _Candidate) -> bool:
    """Rewrite the matmul step with the bias, and the sum step without it (or without the sum)."""
    matmul, total = steps[c.matmul], steps[c.total]
    leaves = _signed(total.op.tree)
    product = next(leaf for _, leaf in leaves if leaf.value.var == matmul.out.var)
    bias_leaf = next(leaf for _, leaf in leaves if leaf.value == c.bias and leaf is not product)
    rest = [(sign, leaf) for sign, leaf in leaves if leaf is not product and leaf is not bias_leaf]
    if rest and total.paper != 0:
        return False
    if not rest and (total.out.legs != matmul.out.legs):
        return False
    bias = read_groups(c.bias, [list(c.right)], lambda group: group_size(lowering, group))
    shape = tuple(lowering.shape(matmul.out.legs))
    fused = dataclasses.replace(matmul.op, shape=shape, bias=bias)
    sum_cost = total.paper if total.paper != 0 else total.elementwise  # cost._paper_cost of a sum node
    if rest:
        terms = [(1, product, product.value.legs)] + [(s, leaf, leaf.value.legs) for s, leaf in rest]
        op, elementwise = sum_tree(lowering, terms)
        kept_cost = elementwise
        steps[c.total] = dataclasses.replace(
            total, op=op, elementwise=elementwise, inputs=tuple(v for v in total.inputs if v != c.bias)
        )
        out = matmul.out
    else:
        op, elementwise, kept_cost = None, sympy.Integer(0), sympy.Integer(0)
        steps[c.total] = None
        out = Value(total.out.var, matmul.out.legs, total.out.broadcast)
    steps[c.matmul] = dataclasses.replace(
        matmul,
        op=fused,
        out=out,
        description=f"{matmul.description.rsplit(' -> ', 1)[0]} + {lowering.show_value(c.bias)}"
        f" -> {matmul.description.rsplit(' -> ', 1)[1]}",
        elementwise=matmul.elementwise + total.elementwise - elementwise,
        paper=_paper(lowering, matmul) + sum_cost - kept_cost,
        inputs=(*matmul.inputs, c.bias),
        in_box=matmul.in_box or total.in_box,
        wide=matmul.wide or total.wide,
    )
    return True


def _paper(lowering, step: Step) -> sympy.Expr:
    """A matmul's cost the papers' way (cost._paper_cost): 2·summed − 1 per output entry."""
    return lowering.numel(step.out.legs) * (2 * lowering.numel(step.summed) - 1)


__all__ = ["fuse_linear_biases"]
