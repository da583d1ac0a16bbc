"""Expressions: the right-hand side of one statement -> an ir.Expr tree, applying the diagram rule
for legs at every boundary (a leg that does not cross a box, map or sum boundary is summed inside
it; Tuformer App. A). The constructs are built by the base classes, one module each: products.py
(tensors, reshapes, products, sums), positions.py (slices, gathers, index) and calls.py (boxes,
maps, masks, reductions)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import sympy

from .. import parse as syn
from ..errors import Span, did_you_mean
from ..ir import CausalFactor, Contraction, Expr, Gather, PositionIndex, Scalar, TensorRef, WindowFactor, walk
from .calls import BoxesAndMaps
from .lone_sums import lone_leg_warnings
from .positions import Positions
from .products import Products
from .syntax import available_legs, call_as_product, is_scalar_syntax, product_op, statement_targets
from .vocabulary import FUNCTIONS, POISON_NAME

if TYPE_CHECKING:
    from .protocols import GraphBuilder


class ExprBuilder(Products, BoxesAndMaps):
    """Builds the expression of one statement, applying the leg rule at every boundary; its slices,
    gathers and index(...) are built by its `positions` part."""

    def __init__(self, builder: GraphBuilder):
        self.b = builder
        self.gathered: list[tuple[str, Span]] = []  # legs naming an axis read at a position
        self.positions = Positions(self)

    def _has_errors_since(self, start: int) -> bool:
        """Whether a diagnostic from `start` on is an error (a warning inside an expression explains
        nothing about its legs); only the statement's own are read, so a file of many warnings is
        checked in linear time."""
        return any(d.is_error for d in self.b.diagnostics[start:])

    def statement(self, e: syn.Expr, groups: tuple[tuple[str, ...], ...], target: syn.Target) -> Expr:
        result = [leg for g in groups for leg in g]
        start = len(self.b.diagnostics)
        self.bind_factor_legs(e)
        expr = self.inside(e, set(result))
        if self._has_errors_since(start):
            return expr  # a mistake inside already explains any missing result leg
        self._check_gathered_legs(expr, set(result))
        spans = {
            leg.name: leg.span
            for item in target.legs
            for leg in (item.legs if isinstance(item, syn.LegGroup) else (item,))
        }
        for leg in result:
            if leg not in expr.legs:
                self.b.error(
                    f"result leg '{leg}' of {target.name} appears in no factor",
                    spans[leg],
                    hint=did_you_mean(leg, expr.legs)
                    or f"the right-hand side has legs: {', '.join(expr.legs) or 'none'}",
                )
        if any(len(g) > 1 for g in groups):
            for g in groups:
                if len(g) > 1 and any(leg not in self.b.legs for leg in g):
                    self.b.error(f"cannot size the merged legs ({' '.join(g)})", target.span)
        self.b.diagnostics += lone_leg_warnings(expr, e, result, self.b.meant_sums, self.b.lone_sum_spans)
        return expr

    def _check_gathered_legs(self, expr: Expr, result: set[str]) -> None:
        """The leg naming an axis read at a position (`r` in Rel[h, r = m - n]) belongs to that
        read alone: used anywhere else in the statement it would mean two things."""
        sources = {id(n.source) for n in walk(expr) if isinstance(n, Gather)}
        elsewhere = {
            leg
            for n in walk(expr)
            if isinstance(n, TensorRef | PositionIndex | CausalFactor | WindowFactor) and id(n) not in sources
            for leg in n.legs
        }
        for leg, span in self.gathered:
            if leg in elsewhere or leg in result:
                self.b.error(
                    f"leg '{leg}' names the axis read at a position, and is used elsewhere in this statement",
                    span,
                    hint="give the gathered axis a leg name of its own",
                )

    def poison(self, e: syn.Expr) -> Expr:
        """A stand-in for a sub-expression that had an error: it has the legs the text gives it,
        so one mistake is reported once, not again by every check downstream of it."""
        return TensorRef(tuple(sorted(available_legs(e, self.b.tensors))), e.span, POISON_NAME, ())

    # -- the leg rule --
    def inside(self, e: syn.Expr, keep: set[str]) -> Expr:
        """A sub-expression seen from outside: legs not in `keep` are summed inside it."""
        return self.restrict(self.build(e, keep), keep, e.span)

    @staticmethod
    def restrict(node: Expr, keep: set[str], span: Span) -> Expr:
        extra = tuple(leg for leg in node.legs if leg not in keep)
        if not extra:
            return node
        kept = tuple(leg for leg in node.legs if leg in keep)
        if isinstance(node, Contraction):
            return Contraction(
                kept,
                node.span,
                node.factors,
                node.coefficient,
                (*node.summed, *extra),
                tuple(b for b in node.batch if b in keep),
            )
        return Contraction(kept, span, (node,), sympy.Integer(1), extra, ())

    def build(self, e: syn.Expr, keep: set[str]) -> Expr:
        e = call_as_product(e, self.b.tensors)
        if is_scalar_syntax(e, self.b.tensors):
            return Scalar((), e.span, self.b.scalar_of(e))
        if isinstance(e, syn.Name):
            return self._bare_name(e)
        if isinstance(e, syn.Indexed):
            return self.tensor_ref(e)
        if isinstance(e, syn.Neg | syn.BinOp) and product_op(e, self.b.tensors):
            return self.product(e, keep)
        if isinstance(e, syn.BinOp) and e.op in "+-":
            return self.sum(e, keep)
        if isinstance(e, syn.BinOp) and e.op == "/":
            return self.quotient(e, keep)
        if isinstance(e, syn.BinOp) and e.op == "^":
            return self.power(e, keep)
        if isinstance(e, syn.Call):
            return self.call(e, keep)
        self.b.error("expected a tensor expression", e.span)
        return self.poison(e)

    def _bare_name(self, e: syn.Name) -> Expr:
        if e.name in self.b.tensors:
            t = self.b.tensors[e.name]
            self.b.error(
                f"tensor '{e.name}' is used without legs",
                e.span,
                hint=f"name its legs: {e.name}[{' '.join(t.legs)}]",
            )
        elif e.name in FUNCTIONS:
            self.b.error(f"'{e.name}' needs an argument", e.span, hint=f"e.g. {e.name}(...)")
        else:
            candidates = [*self.b.tensors, *self.b.sizes, *statement_targets(self.b.items)]
            self.b.error(f"unknown name '{e.name}'", e.span, hint=did_you_mean(e.name, candidates))
        return self.poison(e)
