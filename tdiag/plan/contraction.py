"""Contraction order: a region's leaves contracted pairwise in opt_einsum's order, each pair as
one matmul (einsum only for a leg repeated in one operand), coefficients on the smallest operand.
Guarantees: fewest FLOPs among the orders opt_einsum considers, ties to the smaller intermediate."""

from __future__ import annotations

import functools
from collections.abc import Iterable

import opt_einsum
import sympy

from .base import OPTIMAL_UP_TO
from .legs import renamed_value
from .program import (
    BATCH,
    Einsum,
    Matmul,
    Multiply,
    Operand,
    Scale,
    Step,
    SumAxes,
    Value,
    align,
    read_groups,
    show_legs,
)


class ContractionOrder:
    """Orders a region's contraction and emits it as matmuls."""

    def plan_contraction(
        self, values: list[Value], out: tuple[str, ...], coefficient: sympy.Expr, var: str | None
    ) -> Value:
        if coefficient != 1:
            values, coefficient = self.place_coefficient(values, out, coefficient)
        if len(values) == 1:
            result = self.reduce_single(values[0], out, var)
        else:
            result = self.pairwise_steps(values, out, var)
        if coefficient != 1:
            result = self.scale(result, coefficient, var)
        return result

    def place_coefficient(self, values: list[Value], out: tuple[str, ...], coefficient: sympy.Expr):
        """Multiply the smallest operand by the coefficient (a softmax scale lands on Q, not on QKᵀ)."""
        sizes = [self.numel_number(v.legs) for v in values]
        smallest = min(range(len(values)), key=lambda i: sizes[i])
        if sizes[smallest] <= self.numel_number(out):
            values = list(values)
            values[smallest] = self.scale(values[smallest], coefficient)
            return values, sympy.Integer(1)
        return values, coefficient

    def scale(self, value: Value, coefficient: sympy.Expr, var: str | None = None) -> Value:
        """`value` × `coefficient`, made once per value and coefficient (the two parts of a
        chunked causal sum each carry a region's coefficient to the same smallest operand)."""
        key = ("scale", value.var, value.legs, value.broadcast, coefficient)
        if var is None and key in self.memo:
            return self.memo[key][0]
        scaled = self._scale(value, coefficient, var)
        if var is None:
            self.memo[key] = (scaled, scaled.legs)
        return scaled

    def _scale(self, value: Value, coefficient: sympy.Expr, var: str | None) -> Value:
        name = self.names.fresh(var or "scaled")
        return self.emit(
            Step(
                "scale",
                Scale(value, self.runtime(coefficient)),
                Value(name, value.legs, value.broadcast),
                f"× {coefficient}",
                elementwise=self.numel(value.legs),
                inputs=(value,),
            )
        )  # type: ignore[return-value]

    def reduce_single(self, value: Value, out: tuple[str, ...], var: str | None) -> Value:
        summed = tuple(leg for leg in value.legs if leg not in out)
        if not summed:
            return value
        name = self.names.fresh(var or "summed")
        dims = tuple(value.legs.index(leg) for leg in summed)
        legs = tuple(leg for leg in value.legs if leg in out)
        return self.emit(
            Step(
                "sum",
                SumAxes(value, dims),
                Value(name, legs),
                f"Σ over {' '.join(show_legs(summed))}",
                summed,
                flops=self.numel(value.legs),
                inputs=(value,),
            )
        )  # type: ignore[return-value]

    def pairwise_steps(self, values: list[Value], out: tuple[str, ...], var: str | None) -> Value:
        path = self.contraction_path(values, out)
        operands = list(values)
        for k, step in enumerate(path):
            chosen = [operands[i] for i in step]
            rest = [v for n, v in enumerate(operands) if n not in step]
            needed = set(out) | {leg for v in rest for leg in v.legs}
            last = k == len(path) - 1
            result = chosen[0]
            if len(chosen) == 1:  # a leg only this operand has: summed on its own
                result = self.reduce_single(result, tuple(leg for leg in result.legs if leg in needed), None)
            for n, other in enumerate(chosen[1:], start=2):
                later = {leg for v in chosen[n:] for leg in v.legs}
                result = self.pairwise(result, other, needed | later, var if last and n == len(chosen) else None)
            operands = [*rest, result]
        (result,) = operands
        if len(values) > 1 and set(result.legs) != set(out):
            result = self.reduce_single(result, out, var)
        return result

    def contraction_path(self, values: list[Value], out: tuple[str, ...]) -> list[tuple[int, ...]]:
        legs = sorted({leg for v in values for leg in v.legs} | set(out))
        symbol = {leg: opt_einsum.get_symbol(i) for i, leg in enumerate(legs)}
        equation = (
            ",".join("".join(symbol[leg] for leg in v.legs) for v in values)
            + "->"
            + "".join(symbol[leg] for leg in out)
        )
        shapes = tuple(tuple(self.number(leg) for leg in v.legs) for v in values)
        return list(_cheapest_path(equation, shapes))

    def pairwise(self, a: Value, b: Value, needed: set[str], var: str | None) -> Value:
        """One pairwise contraction, computed once per emit target (the chunks of a causal
        contraction and its numerator and denominator share their key-side products)."""
        if a.broadcast or b.broadcast:
            return self.matmul(a, b, needed, var)
        order = tuple(dict.fromkeys(a.legs + b.legs))
        index = {leg: k for k, leg in enumerate(order)}
        key = (
            "pairwise",
            *((v.var, tuple(index[leg] for leg in v.legs)) for v in (a, b)),
            frozenset(index[leg] for leg in order if leg in needed),
        )
        if key not in self.memo:
            self.memo[key] = (self.matmul(a, b, needed, var), order)
        value, earlier = self.memo[key]
        return renamed_value(value, dict(zip(earlier, order, strict=True)))

    def matmul(self, a: Value, b: Value, needed: set[str], var: str | None) -> Value:
        """One pairwise contraction as a matmul: (batch, a's kept legs, summed) @ (batch, summed,
        b's kept legs). Legs that one side alone has and nobody needs are summed first."""
        a = self.reduce_single(a, tuple(leg for leg in a.legs if leg in needed or leg in b.legs), None)
        b = self.reduce_single(b, tuple(leg for leg in b.legs if leg in needed or leg in a.legs), None)
        if BATCH in b.legs and BATCH not in a.legs:
            a, b = b, a
        if len(set(a.legs)) != len(a.legs) or len(set(b.legs)) != len(b.legs):
            out = tuple(leg for leg in dict.fromkeys(a.legs + b.legs) if leg in needed)
            return self.einsum_step([a, b], out, var)
        batch = [leg for leg in a.legs if leg in b.legs and leg in needed]
        summed = [leg for leg in a.legs if leg in b.legs and leg not in needed]
        left = [leg for leg in a.legs if leg not in b.legs]
        right = [leg for leg in b.legs if leg not in a.legs]
        if not summed or not (left or right):
            return self.product(a, b, summed, var)
        legs = tuple(batch + left + right)
        if batch:
            a_operand = self.arrange(a, [batch, left, summed])
            b_operand = self.arrange(b, [batch, summed, right])
            natural = [batch, left, right]
        else:
            a_operand = self.arrange(a, [*[[leg] for leg in left], summed])
            b_operand = self.arrange(b, [summed, right])
            natural = [*[[leg] for leg in left], right]
        shape = None  # an empty group after the first is a unit axis of the product: reshaped away
        if [g for g in natural if g] != [[leg] for leg in legs] or any(not g for g in natural[1:]):
            shape = self.shape(legs)
        name = self.names.fresh(var or "t")
        flops = 2 * self.numel(batch + left + summed + right)
        description = f"{self.show_value(a)} · {self.show_value(b)} -> [{' '.join(show_legs(legs))}]"
        step = Step(
            "contraction",
            Matmul(a_operand, b_operand, shape),
            Value(name, legs),
            description,
            tuple(summed),
            flops,
            inputs=(a, b),
        )
        return self.emit(step)  # type: ignore[return-value]

    def product(self, a: Value, b: Value, summed: list[str], var: str | None) -> Value:
        """A pairwise contraction that sums nothing (an outer or batch product), or that leaves no
        free leg on either side (a batched dot product), as a broadcast multiply: one multiply
        per element of the product (FLOPs as opt_einsum counts them), then the sum if any (2 per
        multiply-add, as a matmul's). The result's legs follow a's, then b's own; the layout
        pass may reorder them for its consumer."""
        order = a.legs + tuple(leg for leg in b.legs if leg not in a.legs)
        legs = tuple(leg for leg in order if leg not in summed)
        dims = tuple(order.index(leg) for leg in summed)
        flops = 2 * self.numel(order) if summed else self.numel(order)
        name = self.names.fresh(var or "t")
        description = f"{self.show_value(a)} · {self.show_value(b)} -> [{' '.join(show_legs(legs))}]"
        step = Step(
            "contraction",
            Multiply(align(a, order), align(b, order), dims),
            Value(name, legs),
            description,
            tuple(summed),
            flops,
            inputs=(a, b),
        )
        return self.emit(step)  # type: ignore[return-value]

    def arrange(self, value: Value, groups: list[list[str]]) -> Operand:
        """`value` permuted to the legs of `groups` in order, one axis per group; an empty group
        is a unit axis inserted by indexing (a view whose last axis keeps stride 1, which the fused
        attention kernels need, where a reshape of a permuted tensor may not)."""
        return read_groups(value, groups, self.group_size)

    def group_size(self, group: Iterable[str]) -> sympy.Expr:
        return self.runtime(sympy.Mul(*(self.size(leg) for leg in group)))

    def einsum_step(self, values: list[Value], out: tuple[str, ...], var: str | None) -> Value:
        """The fallback for what a matmul cannot say (a leg repeated within one operand)."""
        legs = sorted({leg for v in values for leg in v.legs} | set(out))
        symbol = {leg: opt_einsum.get_symbol(i) for i, leg in enumerate(legs)}
        spec = (
            ",".join("".join(symbol[leg] for leg in v.legs) for v in values)
            + "->"
            + "".join(symbol[leg] for leg in out)
        )
        name = self.names.fresh(var or "t")
        flops = 2 * self.numel(legs)
        return self.emit(
            Step(
                "contraction",
                Einsum(spec, tuple(values)),
                Value(name, out),
                " · ".join(self.show_value(v) for v in values),
                flops=flops,
                inputs=tuple(values),
            )
        )  # type: ignore[return-value]


@functools.lru_cache(maxsize=65536)
def _cheapest_path(equation: str, shapes: tuple[tuple[int, ...], ...]) -> tuple[tuple[int, ...], ...]:
    """opt_einsum's order of pairwise contractions for `equation` at `shapes`: 'optimal' up to
    OPTIMAL_UP_TO operands ('dp' beyond) or the dynamic program minimizing the largest
    intermediate, whichever costs fewer FLOPs (then the smaller intermediate). Remembered: the
    planner orders the same contraction for every candidate form it prices."""
    strategies = [
        "optimal" if len(shapes) <= OPTIMAL_UP_TO else "dp",
        opt_einsum.paths.DynamicProgramming(minimize="size"),
    ]
    candidates = []
    for strategy in strategies:
        path, info = opt_einsum.contract_path(equation, *shapes, shapes=True, optimize=strategy)
        candidates.append((int(info.opt_cost), int(info.largest_intermediate), path))
    _, _, path = min(candidates, key=lambda c: (c[0], c[1]))
    return tuple(tuple(sorted(p)) for p in path)
