"""Tensors, products and sums in an expression: a tensor used with its legs (a reshape `(h d)` binds
or checks the legs' sizes), an Einstein product of factors with a scalar coefficient, a sum of
terms, a quotient and a power. A leg not kept by the surroundings is summed inside the node that has
it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import TYPE_CHECKING

import sympy

from .. import parse as syn
from ..errors import Span, did_you_mean
from ..ir import Axis, Contraction, ElementwiseMap, Expr, Leg, Quotient, Scalar, SumNode, Tensor, TensorRef
from .sizes import expand_sizes, same_size
from .syntax import (
    available_legs,
    call_as_product,
    flatten_sum,
    is_scalar_syntax,
    leg_names,
    ordered_union,
    statement_targets,
    syntax_nodes,
)
from .vocabulary import FUNCTIONS, POISON_SIZE

if TYPE_CHECKING:
    from .positions import Positions
    from .protocols import GraphBuilder


class Products:
    """Tensor uses, products, sums, quotients and powers; a base class of ExprBuilder
    (expressions.py), whose inside/restrict/poison/build it uses."""

    b: GraphBuilder
    positions: Positions

    # -- tensors --
    def tensor_ref(self, e: syn.Indexed) -> Expr:
        if e.name in FUNCTIONS:
            if e.name not in statement_targets(self.b.items) and e.name not in self.b.tensors:
                self.b.error(f"'{e.name}[...]' needs its argument", e.span, hint=f"write {e.name}[...](expression)")
            return self.poison(e)
        tensor = self.b.tensors.get(e.name)
        if tensor is None:
            return self._unknown_tensor(e)
        if e.options:
            return self.positions.gather(e, tensor)
        groups = tuple(leg_names(item) for item in e.legs)
        if len(groups) != len(tensor.axes):
            return self.wrong_axis_count(e, tensor, f"{len(groups)} legs")
        self._check_repeated_legs(e)
        slices: list[sympy.Expr | None] = []
        starts: list[sympy.Expr] = []
        for item, axis in zip(e.legs, tensor.axes, strict=True):
            where = e.name
            cut = self.positions.slice_of(item, axis, tensor) if isinstance(item, syn.SlicedLeg) else None
            slices.append(None if cut is None else cut[1])
            starts.append(sympy.Integer(0) if cut is None else cut[0])
            if cut is not None:
                self.b.bind_leg(item.name, cut[1], item.span, where)
            elif isinstance(item, syn.SlicedLeg):
                if item.name not in self.b.legs:  # refused: its error explains the leg, once
                    self.b.bind_leg(item.name, POISON_SIZE, item.span, where)
            elif isinstance(item, syn.Leg):
                self.b.bind_leg(item.name, axis.size, item.span, where)
            else:
                self._bind_group(item, axis, e.name, where)
        legs = tuple(leg for g in groups for leg in g)
        sliced = tuple(slices) if any(k is not None for k in slices) else ()
        offsets = tuple(starts) if sliced and any(k != 0 for k in starts) else ()
        return TensorRef(legs, e.span, e.name, groups, sliced, offsets)

    def bind_factor_legs(self, e: syn.Expr) -> None:
        """Bind every leg that a tensor use anywhere in statement `e` gives a size (plain legs,
        slices, a gathered axis, `index(p, P)`; then reshape pieces the other legs determine)
        before the statement is built, so that `causal(n, l) LF[l h]`, `index(l)` or `X[n (p q)]`
        read a leg's size whatever the order of the factors (pieces of a reshape that no factor sizes
        come from their uses elsewhere, as index does). Only unbound legs are bound here, and
        nothing is reported: a mistake is reported where the statement is built."""
        groups: list[tuple[syn.LegGroup, Axis, str]] = []
        for node in sorted(syntax_nodes(e), key=lambda n: (n.span.line, n.span.column)):
            if isinstance(node, syn.Call) and node.name == "index" and len(node.args) == 2:
                leg, size = node.args
                if isinstance(leg, syn.Name):
                    self._bind_quietly(leg.name, partial(self.b.scalar_of, size, sizes_only=True), leg.span, "index")
                continue
            tensor = self.b.tensors.get(node.name) if isinstance(node, syn.Indexed | syn.Call) else None
            if tensor is None or node.name in FUNCTIONS or node.legs is None:  # type: ignore[union-attr]
                continue
            if isinstance(node, syn.Call) and node.options:
                continue  # not a tensor use; reported where the statement is built
            items = getattr(node, "items", ()) or (*node.legs, *node.options)  # type: ignore[union-attr]
            if len(items) != len(tensor.axes):
                continue
            for item, axis in zip(items, tensor.axes, strict=True):
                if isinstance(item, syn.LegGroup):
                    groups.append((item, axis, tensor.name))
                elif isinstance(item, syn.SlicedLeg):
                    self._bind_quietly(item.name, partial(self._extent, item, axis, tensor), item.span, tensor.name)
                elif item.name not in self.b.legs:
                    self.b.bind_leg(item.name, axis.size, item.span, tensor.name)
        groups = [g for g in groups if self._unsized(g[0])]
        while groups:
            ready = [g for g in groups if len(self._unsized(g[0])) == 1]
            if not ready:  # two pieces unknown here: size them from their uses elsewhere in the file
                if not any([self.b.find_leg(piece) for g in groups for piece in self._unsized(g[0])]):
                    return
            for group, axis, name in ready:
                self._bind_group(group, axis, name, name)
            groups = [g for g in groups if self._unsized(g[0])]

    def _extent(self, item: syn.SlicedLeg, axis: Axis, tensor: Tensor) -> sympy.Expr | None:
        """The number of entries slice `item` reads, None when it is refused."""
        cut = self.positions.slice_of(item, axis, tensor)
        return None if cut is None else cut[1]

    def _unsized(self, group: syn.LegGroup) -> list[str]:
        return [leg.name for leg in group.legs if leg.name not in self.b.legs]

    def _bind_quietly(self, leg: str, size: Callable[[], sympy.Expr | None], span: Span, where: str) -> None:
        """Bind an unbound leg to the size `size()` reads; a size with a mistake (None or
        poisoned) binds nothing, and its error is reported where the statement is built."""
        if leg in self.b.legs:
            return
        before = len(self.b.diagnostics)
        value = size()
        del self.b.diagnostics[before:]
        if value is not None and POISON_SIZE not in value.free_symbols:
            self.b.bind_leg(leg, value, span, where)

    def wrong_axis_count(self, e: syn.Indexed, tensor: Tensor, used: str) -> Expr:
        """A use names more or fewer axes than the declaration has (`used` says how many)."""
        axes = " ".join(tensor.legs)
        self.b.error(
            f"{e.name} has {len(tensor.axes)} axes ({axes}) but is used with {used}",
            e.span,
            hint=f"e.g. {e.name}[{axes}]",
        )
        return self.poison(e)

    def _unknown_tensor(self, e: syn.Indexed) -> Expr:
        if e.name in self.b.sizes:
            self.b.error(f"'{e.name}' is a size, not a tensor", e.name_span)
        else:
            defined = [*self.b.tensors, *statement_targets(self.b.items)]
            if e.name in defined:
                return self.poison(e)  # its own statement failed; already reported
            self.b.error(f"unknown tensor '{e.name}'", e.name_span, hint=did_you_mean(e.name, defined))
        return self.poison(e)

    def _check_repeated_legs(self, e: syn.Indexed) -> None:
        seen: dict[str, Span] = {}
        for item in e.legs:
            for leg in item.legs if isinstance(item, syn.LegGroup) else (item,):
                if leg.name in seen:
                    self.b.error(
                        f"leg '{leg.name}' names two axes of {e.name}",
                        leg.span,
                        seen[leg.name],
                        hint="each axis of a tensor needs its own leg; a diagonal is not supported",
                    )
                seen[leg.name] = leg.span

    def _bind_group(self, group: syn.LegGroup, axis: Axis, name: str, where: str) -> None:
        """A reshape `(h d)`: the axis size must equal the product of the legs' sizes."""
        unknown = [leg for leg in group.legs if leg.name not in self.b.legs]
        known = sympy.Mul(*(self.b.legs[leg.name].size for leg in group.legs if leg.name in self.b.legs))
        pieces = " ".join(leg.name for leg in group.legs)
        if len(unknown) > 1:
            self.b.error(
                f"cannot split axis {axis.leg} of {name} ({axis.size}) into ({pieces}): "
                f"legs {', '.join(leg.name for leg in unknown)} have no size yet",
                group.span,
                hint="declare a tensor that uses these legs, so their sizes are known",
            )
            return
        if unknown:
            inferred = sympy.simplify(
                self.b.sizes and expand_sizes(axis.size, self.b.sizes) / expand_sizes(known, self.b.sizes)
            )
            self.b.bind_leg(unknown[0].name, inferred, unknown[0].span, where)
            return
        if not same_size(known, axis.size, self.b.sizes):
            self.b.error(
                f"reshape mismatch: axis {axis.leg} of {name} has size {axis.size} "
                f"but ({' '.join(leg.name for leg in group.legs)}) has size {_product_text(group, self.b.legs)}",
                group.span,
                hint="the legs of a reshape must multiply to the axis size",
            )

    # -- products, sums, quotients --
    def product(self, e: syn.Expr, keep: set[str]) -> Expr:
        coefficient, factors = self._flatten_product(e)
        if not factors:
            return Scalar((), e.span, coefficient)
        available = [available_legs(f, self.b.tensors) for f in factors]
        nodes = []
        for i, f in enumerate(factors):
            outside = set().union(*(a for j, a in enumerate(available) if j != i))
            nodes.append(self.build(f, keep | outside))
        every = ordered_union(n.legs for n in nodes)
        kept = tuple(leg for leg in every if leg in keep)
        summed = tuple(leg for leg in every if leg not in keep)
        batch = tuple(leg for leg in kept if sum(leg in n.legs for n in nodes) > 1)
        if len(nodes) == 1 and coefficient == 1 and not summed:
            return nodes[0]
        return Contraction(kept, e.span, tuple(nodes), coefficient, summed, batch)

    def _flatten_product(self, e: syn.Expr) -> tuple[sympy.Expr, list[syn.Expr]]:
        e = call_as_product(e, self.b.tensors)
        if is_scalar_syntax(e, self.b.tensors):
            return self.b.scalar_of(e), []
        if isinstance(e, syn.Neg):
            c, fs = self._flatten_product(e.operand)
            return -c, fs
        if isinstance(e, syn.BinOp) and e.op in ("juxt", "*"):
            c1, f1 = self._flatten_product(e.left)
            c2, f2 = self._flatten_product(e.right)
            return c1 * c2, f1 + f2
        if isinstance(e, syn.BinOp) and e.op == "/" and is_scalar_syntax(e.right, self.b.tensors):
            c, fs = self._flatten_product(e.left)
            divisor = self.b.scalar_of(e.right)
            if divisor == 0:
                self.b.error("division by zero", e.right.span)
                return c, fs
            return c / divisor, fs
        return sympy.Integer(1), [e]

    def elementwise(self, operands: list[syn.Expr], keep: set[str]) -> list[Expr]:
        """Operands of an elementwise node: legs shared between operands survive into the node."""
        available = [available_legs(o, self.b.tensors) for o in operands]
        shared = {
            leg
            for i, a in enumerate(available)
            for leg in a
            if any(leg in b for j, b in enumerate(available) if j != i)
        }
        return [self.inside(o, keep | shared) for o in operands]

    def sum(self, e: syn.BinOp, keep: set[str]) -> Expr:
        """A leg that leaves no term is summed within each term: Σ_k (A + B) = Σ_k A + Σ_k B."""
        terms, signs = flatten_sum(e)
        nodes = [self.inside(t, keep) for t in terms]
        node = SumNode(ordered_union(n.legs for n in nodes), e.span, tuple(nodes), tuple(signs))
        return self.restrict(node, keep, e.span)

    def quotient(self, e: syn.BinOp, keep: set[str]) -> Expr:
        numerator, denominator = self.elementwise([e.left, e.right], keep)
        node = Quotient(ordered_union([numerator.legs, denominator.legs]), e.span, numerator, denominator)
        return self.restrict(node, keep, e.span)

    def power(self, e: syn.BinOp, keep: set[str]) -> Expr:
        if not is_scalar_syntax(e.right, self.b.tensors):
            if is_scalar_syntax(e.left, self.b.tensors):
                return self.scalar_power(e, keep)
            self.b.error(
                "an exponent is a number or size, not a tensor",
                e.right.span,
                hint="a tensor exponent needs a number or size as its base: Theta ^ x[p] is exp(x[p] log(Theta))",
            )
            return self.poison(e)
        base = self.inside(e.left, keep)
        self.warn_lone_sums(e, e.left, base)
        return ElementwiseMap(base.legs, e.span, "pow", base, (self.b.scalar_of(e.right),))

    def scalar_power(self, e: syn.BinOp, keep: set[str]) -> Expr:
        """`Theta ^ x[p]`, a positive number or size raised to a tensor, is exp(x[p] · log(Theta))
        (RoPE's inverse frequencies as HF writes them, 1 / base ^ (2p / D))."""
        base = self.b.scalar_of(e.left)
        if base.is_positive is False or base.is_zero:
            self.b.error(
                f"the base of a power with a tensor exponent must be positive, got {base}",
                e.left.span,
                hint="it is read as exp(exponent · log(base))",
            )
            return self.poison(e)
        log = syn.Call(e.left.span, "log", e.left.span, None, (), (e.left,), ())
        return self.inside(syn.Call(e.span, "exp", e.span, None, (), (syn.BinOp(e.span, "*", e.right, log),), ()), keep)


def _product_text(group: syn.LegGroup, legs: Mapping[str, Leg]) -> str:
    return "·".join(str(legs[leg.name].size) for leg in group.legs)
