"""Which points compute the same function: the canonical form of a lowered program.

Two designs compute the same function (for some values of their parameters each) when their
lowered programs (plan/program.py) are equal up to the names of variables, legs and parameters
and up to how a stored tensor is viewed: the planner has already folded constant factors
(identity and all-ones cores into legs, scales into the box scale), so THSA with
C = sqrt(H) (I_H kron J_D) lowers to the ops MHSA lowers to. The canonical form renames every
variable, leg and stored tensor in order of first use, evaluates every size formula at the planned
sizes, and describes a stored tensor by its kind and shape (a parameter's initializer is not part
of the function; a constant's and a buffer's values are). Runs of legs always used together
are one leg, legs of size 1 are dropped, a value's legs are a set (legs meet by name) and a
product's two operands are put in an order that does not depend on names. Leg names are still
given in order of first use, so two programs whose independent ops the planner emits in another
order are not recognised as equal (no bundled design needs that).

A reparameterization is a product, in the program, of trainable tensors alone whose result has no
more entries than one of them: that one parameter could hold the product (skip-left's C3 multiplying
WK's columns, Tuformer P8/P11). Such points are flagged, not merged: their function class is the
same, their training dynamics need not be."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import sympy

from ..device import DeviceModel
from ..plan import BATCH, Plan, Value
from ..plan.program import Matmul, Multiply, Normalize, Operand, Reshape, Softmax

if TYPE_CHECKING:
    from ..design import Design

# The canonical plan is made for the `flops` objective, and where two candidates cost the same
# FLOPs the objective breaks the tie by estimated time: priced here on a fixed roofline (no
# per-op overhead, no measured per-kind factors) rather than on the planning device, whose
# figures are this machine's measurement (and TDIAG_DEVICE's), so that the canonical form is a
# function of the design and the sizes alone.
CANONICAL_OBJECTIVE = "flops"
CANONICAL_DEVICE = DeviceModel("canonical roofline (fixed, no machine's figures)", peak_flops=1e12, bandwidth=1e11)


def _read_legs(operand: Operand) -> tuple[str, ...]:
    """The legs an operand reads, in the order it reads them (its permutation applied)."""
    legs = operand.value.legs
    if operand.permutation is not None:
        legs = tuple(legs[k] for k in operand.permutation)
    return legs


def _sequences(plan: Plan, views: dict[str, tuple[str, tuple]]) -> Iterator[tuple[str, ...]]:
    """Every ordered run of legs the program holds or reads."""
    for step in [*plan.steps, *plan.update_steps]:
        if step.out is not None:
            yield step.out.legs
        if step.summed:
            yield step.summed
        for item in _walk(step.op):
            if isinstance(item, Operand):
                yield _read_legs(item)
            elif isinstance(item, Value):
                yield item.legs
    for _, value in plan.outputs:
        yield value.legs


def _walk(item: object) -> Iterator[object]:
    if isinstance(item, Value | Operand):
        yield item
    elif dataclasses.is_dataclass(item) and not isinstance(item, type):
        for f in dataclasses.fields(item):
            yield from _walk(getattr(item, f.name))
    elif isinstance(item, tuple):
        for i in item:
            yield from _walk(i)


def _fusion(sequences: list[tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
    """Legs that always appear together, one right after the other, are one leg: a stored tensor
    viewed as (h d) only to be read back as one axis is the same program as one read whole.
    Returns each leg's run (a leg alone is a run of one)."""
    after: dict[str, set[str | None]] = {}
    before: dict[str, set[str | None]] = {}
    for seq in sequences:
        for k, leg in enumerate(seq):
            after.setdefault(leg, set()).add(seq[k + 1] if k + 1 < len(seq) else None)
            before.setdefault(leg, set()).add(seq[k - 1] if k else None)

    def joined(a: str) -> str | None:
        (b,) = after[a] if len(after[a]) == 1 else (None,)
        if b is None or b == BATCH or a == BATCH or before.get(b) != {a}:
            return None
        return b

    runs: dict[str, tuple[str, ...]] = {}
    for leg in after:
        if leg in runs or (len(before[leg]) == 1 and (p := next(iter(before[leg]))) is not None and joined(p) == leg):
            continue
        run = [leg]
        while (b := joined(run[-1])) is not None and b not in run:
            run.append(b)
        for member in run:
            runs[member] = tuple(run)
    for leg in after:
        runs.setdefault(leg, (leg,))
    return runs


@dataclass
class _Namer:
    plan: Plan
    runs: dict[str, tuple[str, ...]]
    names: dict[str, object] = dataclasses.field(default_factory=dict)
    legs: dict[tuple[str, ...], str] = dataclasses.field(default_factory=dict)
    views: dict[str, tuple[str, tuple]] = dataclasses.field(default_factory=dict)
    stored: int = 0
    derived: int = 0

    cache: dict = dataclasses.field(default_factory=dict)

    def number(self, expr: object) -> object:
        if expr not in self.cache:
            value = self.plan.graph.evaluate_at(sympy.sympify(expr), self.plan.sizes)
            self.cache[expr] = sympy.sstr(sympy.nsimplify(value))
        return self.cache[expr]

    def fused(self, legs: tuple[str, ...]) -> tuple[str, ...]:
        """Legs with each run of fused legs named once, canonically, in order of first use."""
        out: list[str] = []
        k = 0
        while k < len(legs):
            run = self.runs.get(legs[k], (legs[k],))
            if run[0] != legs[k] or tuple(legs[k : k + len(run)]) != run:
                run = (legs[k],)  # a partial run (cannot happen when fusion was computed on this program)
            size = self.number(sympy.Mul(*(self.plan.leg_sizes[leg] for leg in run)))
            if legs[k] == BATCH:
                out.append(BATCH)
            elif size != "1":  # a leg of size 1 is a unit axis: layout, not function
                if run not in self.legs:
                    self.legs[run] = f"l{len(self.legs)}:{size}"
                out.append(self.legs[run])
            k += len(run)
        return tuple(out)

    def fused_set(self, legs: frozenset[str]) -> tuple[str, ...]:
        """A set of legs (the legs a value is broadcast along) named as `fused` names a sequence:
        a run whose legs are all in the set is one leg. A set has no order of its own (a
        frozenset's follows the process's string hashes), so runs already named come first, then
        the others by size, then by their own names (a tie only legs of one size, unnamed, meet)."""
        groups: list[tuple[str, ...]] = []
        for leg in sorted(legs):
            if any(leg in group for group in groups):
                continue
            run = self.runs.get(leg, (leg,))
            groups.append(run if legs.issuperset(run) else (leg,))

        def order(group: tuple[str, ...]) -> tuple:
            named = self.legs.get(group)
            size = self.number(sympy.Mul(*(self.plan.leg_sizes[leg] for leg in group)))
            return (named is None, named or "", size, group)

        return tuple(sorted(leg for group in sorted(groups, key=order) for leg in self.fused(group)))

    def stored_tensor(self, var: str) -> object:
        """A declared tensor by its kind, its number of entries and (unless trainable) its values."""
        tensor = self.plan.graph.tensors.get(var)
        if tensor is None or tensor.kind == "derived":
            return None
        values: tuple = ()
        if tensor.kind != "param" and tensor.init is not None:
            params = tuple((k, v if isinstance(v, str) else self.number(v)) for k, v in tensor.init.params)
            values = (tensor.init.name, params)
        self.stored += 1
        identity = f"{tensor.kind}{self.stored}" if tensor.kind in ("param", "random", "buffer") else tensor.kind
        return (identity, self.number(tensor.numel), values)

    def _order(self, operand: Operand) -> str:
        """Operands of a product in an order that does not depend on names not yet given."""
        sizes = sorted(self.number(self.plan.leg_sizes[g]) for g in operand.value.legs if g != BATCH)
        return repr((self.var(operand.value.var), sizes, BATCH in operand.value.legs))

    def var(self, var: str) -> object:
        if var not in self.names:
            found = self.stored_tensor(self.views.get(var, (var,))[0])
            if found is None:
                found = f"v{self.derived}"
                self.derived += 1
            self.names[var] = found
        return self.names[var]

    def form(self, item: object, field: str = "") -> object:
        # legs are compared as sets: in a contraction, legs meet by name, so the order of a value's
        # axes and of an op's operands is layout, not function
        if isinstance(item, Value):
            legs = tuple(sorted(self.fused(item.legs)))
            return ("value", self.var(item.var), legs, self.fused_set(item.broadcast))
        if isinstance(item, Operand):
            return ("read", self.var(item.value.var), tuple(sorted(self.fused(_read_legs(item)))), item.invert)
        if isinstance(item, Matmul | Multiply):
            a, b = sorted((item.a, item.b), key=self._order)
            summed = (len(item.summed),) if isinstance(item, Multiply) else ()
            bias = (self.form(item.bias),) if isinstance(item, Matmul) and item.bias is not None else ()
            return (type(item).__name__, self.form(a), self.form(b), *summed, *bias)
        if isinstance(item, Softmax | Normalize):  # over the last `count` axes: say which legs
            over = self.fused(_read_legs(item.x)[len(_read_legs(item.x)) - item.count :])
            rest = tuple(self.form(getattr(item, f.name), f.name) for f in dataclasses.fields(item) if f.name == "eps")
            return (type(item).__name__, self.form(item.x), over, rest)
        if dataclasses.is_dataclass(item) and not isinstance(item, type):
            fields = [f.name for f in dataclasses.fields(item) if f.name not in _LAYOUT]
            return (type(item).__name__, *(self.form(getattr(item, name), name) for name in fields))
        if isinstance(item, tuple | list):
            return tuple(self.form(i) for i in item)
        if isinstance(item, sympy.Basic):
            return self.number(item)
        return item


# fields that say how values are laid out and regrouped, which the legs already say
_LAYOUT = {"shape", "sizes", "index", "permutation", "normalized"}


def canonical_plan(design: Design, sizes: Mapping[str, int]) -> Plan:
    """The plan a design's canonical form is read from: planned for CANONICAL_OBJECTIVE with
    its ties priced on CANONICAL_DEVICE, whatever objective and device the design is costed
    for, so that which points are the same function never depends on the machine."""
    return design.plan(sizes, objective=CANONICAL_OBJECTIVE, device=CANONICAL_DEVICE)


def canonical_form(design: Design, sizes: Mapping[str, int]) -> tuple:
    """The design's canonical form at `sizes`: two designs compute the same function when
    theirs are equal (the module docstring says what is compared)."""
    return canonical_program(canonical_plan(design, sizes))


def canonical_program(plan: Plan) -> tuple:
    """The plan's ops with canonical names (see the module docstring)."""
    views = {}
    for step in plan.steps:
        if isinstance(step.op, Reshape) and step.out is not None and step.op.x.var in plan.graph.tensors:
            views[step.out.var] = (step.op.x.var, step.op.shape)
    namer = _Namer(plan, _fusion(list(_sequences(plan, views))), views=views)
    ops = []
    for step in [*plan.steps, *plan.update_steps]:
        if step.out is not None and step.out.var in views:
            continue  # a stored tensor viewed with its axes split: the same tensor
        out = namer.form(step.out) if step.out is not None else None
        ops.append((step.kind, namer.form(step.op), out, namer.fused(step.summed)))
    outputs = tuple(namer.form(value) for _, value in plan.outputs)
    return (tuple(ops), outputs)


def trainable_products(plan: Plan) -> Iterator[str]:
    """Products of trainable tensors alone whose result is no larger than one factor (a
    reparameterization: one parameter of that factor's shape holds the product)."""
    graph = plan.graph
    params: dict[str, str] = {}  # var -> the parameter it is (views included)
    for step in plan.steps:
        op = step.op
        if isinstance(op, Reshape) and step.out is not None:
            tensor = graph.tensors.get(op.x.var)
            if tensor is not None and tensor.kind == "param":
                params[step.out.var] = tensor.name
        for name, tensor in graph.tensors.items():
            if tensor.kind == "param":
                params.setdefault(name, name)
        if not isinstance(op, Multiply | Matmul) or step.out is None:
            continue
        factors = [op.a.value, op.b.value]
        if not all(f.var in params for f in factors):
            continue
        sizes = [_entries(plan, f.legs) for f in factors]
        result = _entries(plan, step.out.legs)
        if any(sympy.simplify(result - s) == 0 or (result - s).is_nonpositive for s in sizes):
            a, b = (params[f.var] for f in factors)
            yield f"{a} · {b}: one parameter of the larger one's shape would do"


def _entries(plan: Plan, legs: tuple[str, ...]) -> sympy.Expr:
    return sympy.Mul(*(plan.leg_sizes.get(leg.split("'")[0], sympy.Integer(1)) for leg in legs if leg != BATCH))
