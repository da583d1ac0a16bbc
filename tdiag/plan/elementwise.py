"""Maps, reductions, sum nodes and quotients: elementwise ops over aligned operands; a sum's
terms meet smallest pair first, and terms constant along a surrounding softmax's legs drop out."""

from __future__ import annotations

import itertools

import sympy

from ..ir import (
    POSITION_MASKS,
    Contraction,
    ElementwiseMap,
    Expr,
    Quotient,
    Reduction,
    Scalar,
    Scan,
    SegmentSum,
    SquaredDistance,
    SumNode,
    TensorRef,
    walk,
)
from .distance import distance_parts
from .program import (
    BATCH,
    Binary,
    CumulativeScan,
    Elementwise,
    Map,
    Operand,
    Reduce,
    SegmentSums,
    Step,
    Value,
    align,
    show_legs,
)
from .quotient_shift import ROW_SHIFT_NOTE, shifted_quotient


class ElementwiseLowering:
    """Lowers maps, reductions, sum nodes and quotients."""

    def owns_parameter(self, e: Expr) -> bool:
        """Does `e` hold a parameter nothing else uses? Such a term is kept even where it cannot
        matter (GFiSH's b2, T11), so every parameter gets a gradient and DDP needs no
        find_unused_parameters."""
        for node in walk(e):
            if isinstance(node, TensorRef) and self.g.tensors[node.name].kind == "param" and self.uses[node.name] == 1:
                return True
        return False

    def lower_map(self, e: ElementwiseMap, ren, var: str | None) -> Value:
        operand = self.lower(e.operand, ren)  # type: ignore[arg-type]
        name = self.names.fresh(var or e.name)
        return self.emit(
            Step(
                "map",
                Map(operand, e.name, tuple(self.runtime(p) for p in e.params)),
                Value(name, operand.legs, operand.broadcast),
                e.name,
                elementwise=self.numel(operand.legs),
                inputs=(operand,),
            )
        )  # type: ignore[return-value]

    def lower_reduction(self, e: Reduction, ren, var: str | None) -> Value:
        operand = self.lower(e.operand, ren)  # type: ignore[arg-type]
        over = tuple(p for leg in e.over for p in ren[leg])
        operand = self.maskable(operand, e, ren, set(over))
        hidden = []
        for mask in e.masks:
            operand = self.apply_mask(operand, mask, ren, is_exp=e.name != "mean", future="lowest")
            hidden.append(self.hidden_operand(mask, ren, operand.legs))
        dims = tuple(operand.legs.index(leg) for leg in over)
        name = self.names.fresh(var or e.name)
        method = {"max": "amax", "logsumexp": "logsumexp", "mean": "mean"}[e.name]
        legs = tuple(leg for leg in operand.legs if leg not in over)
        return self.emit(
            Step(
                "reduction",
                Reduce(operand, method, dims, tuple(hidden) if e.name == "mean" else ()),
                Value(name, legs, operand.broadcast),
                f"{e.name} over {' '.join(show_legs(over))}",
                over,
                elementwise=self.numel(operand.legs),
                inputs=(operand,),
            )
        )  # type: ignore[return-value]

    def lower_scan(self, e: Scan, ren, var: str | None) -> Value:
        """A prefix scan along its leg: hidden entries filled with what adds nothing (0, or −inf
        in log space), then one scan step, computed in float32 under autocast (a running sum of
        log-gates loses its small terms in bfloat16). Costs one elementwise operation per entry."""
        operand = self.lower(e.operand, ren)  # type: ignore[arg-type]
        (along,) = ren[e.along]
        operand = self.maskable(operand, e, ren, {along})
        for mask in sorted(e.masks, key=lambda m: isinstance(m, POSITION_MASKS)):  # the future is −inf, padded or not
            operand = self.apply_mask(operand, mask, ren, is_exp=e.name == "logcumsumexp")
        name = self.names.fresh(var or e.name)
        options = [word for word, flag in (("exclusive", e.exclusive), ("reverse", e.reverse)) if flag]
        return self.emit(
            Step(
                "scan",
                CumulativeScan(operand, e.name, operand.legs.index(along), e.exclusive, e.reverse),
                Value(name, operand.legs, operand.broadcast),
                " ".join([e.name, *options, "along", *show_legs([along])]),
                elementwise=self.numel(operand.legs),
                inputs=(operand,),
                wide=True,
            )
        )  # type: ignore[return-value]

    def lower_segment_sum(self, e: SegmentSum, ren, var: str | None) -> Value:
        """Σ_{k=m+1..n} a_k over (n, m): one step whose result has the operand's other legs, then
        n and m; one addition per result entry (the masked cumulative sum), in float32 under
        autocast as a scan is."""
        operand = self.lower(e.operand, ren)  # type: ignore[arg-type]
        (along,), (key,) = ren[e.along], ren[e.key]
        operand = self.expand_broadcast(operand, {along})
        legs = (*(leg for leg in operand.legs if leg != along), along, key)
        name = self.names.fresh(var or "segsum")
        return self.emit(
            Step(
                "segsum",
                SegmentSums(operand, operand.legs.index(along)),
                Value(name, legs, operand.broadcast),
                f"segment sums along {' '.join(show_legs([along]))} over {' '.join(show_legs([along, key]))}",
                elementwise=self.numel(legs),
                inputs=(operand,),
                wide=True,
            )
        )  # type: ignore[return-value]

    def combine(
        self, kind: str, parts: list[tuple[int, Value]], out: tuple[str, ...], var: str | None, operator: str = "+"
    ) -> Value:
        """Elementwise sum (or quotient) of values aligned to `out` with broadcasting."""
        present = [leg for leg in out if any(leg in v.legs for _, v in parts)]
        if any(v.is_batched for _, v in parts) and BATCH not in present:
            present = [BATCH, *present]
        largest = max((v for _, v in parts), key=lambda v: self.numel_number(v.legs))
        if set(largest.legs) == set(present):
            present = list(largest.legs)  # the largest operand is read in its own layout, not permuted
        broadcast = frozenset(leg for leg in out if leg not in present)
        name = self.names.fresh(var or kind)
        aligned = [(sign, align(v, tuple(present)), v.legs) for sign, v in parts]
        if operator == "+":
            op, elementwise = self.sum_tree(aligned)
        else:
            tree = aligned[0][1]
            for _, operand, _ in aligned[1:]:
                tree = Binary("/", tree, operand)
            op, elementwise = Elementwise(tree), self.numel(present) * (len(parts) - 1)
        return self.emit(
            Step(
                kind,
                op,
                Value(name, tuple(present), broadcast),
                kind,
                elementwise=elementwise,
                inputs=tuple(v for _, v in parts),
            )
        )  # type: ignore[return-value]

    def sum_tree(self, terms: list[tuple[int, Operand, tuple[str, ...]]]) -> tuple[Elementwise, sympy.Expr]:
        """Σ ± terms, broadcasting, added smallest pair first: terms along few legs meet before
        they are broadcast to the full result (sMGK's five-term distance, P11), so each full-size
        pass is paid once. Returns the op and its elementwise operation count."""
        nodes: list[tuple[int, Binary | Operand, frozenset[str]]] = [
            (sign, operand, frozenset(legs)) for sign, operand, legs in terms
        ]
        elementwise = sympy.Integer(0)
        while len(nodes) > 1:
            pairs = itertools.combinations(range(len(nodes)), 2)
            i, j = min(pairs, key=lambda p: self.numel_number(nodes[p[0]][2] | nodes[p[1]][2]))
            (sa, a, la), (sb, b, lb) = nodes[i], nodes[j]
            elementwise += self.numel(la | lb)
            if sa == sb:
                merged = (sa, Binary("+", a, b))
            else:
                merged = (1, Binary("-", a, b) if sa > 0 else Binary("-", b, a))
            nodes = [n for k, n in enumerate(nodes) if k not in (i, j)] + [(*merged, la | lb)]
        sign, tree, _ = nodes[0]
        return Elementwise(tree, negate=sign < 0), elementwise

    def lower_sum(self, e: SumNode, ren, var: str | None) -> Value:
        """Σ ± terms in one elementwise step. A term that is itself a sum node or a squared
        distance, scaled or not, is flattened in with the scaling folded into its own terms (onto
        the smallest operand of each contraction), so that MGK's log π − ‖q − k‖²/(2√D) is one
        pass over the logits, log π and the key norm meeting first, not three."""
        terms = self.varying(e.terms, e.signs, ren)
        out = tuple(p for leg in e.legs for p in ren[leg])
        if len(terms) == 1 and terms[0][1] > 0:
            value = self.lower(terms[0][0], ren, var)
            dropped = frozenset(out) - set(value.legs) - value.broadcast  # legs only a dropped term had
            return Value(value.var, value.legs, value.broadcast | dropped) if dropped else value
        parts: list[tuple[int, Value]] = []
        flattened: list[Expr] = []
        for term, sign in terms:
            inner, factor = _scaled(term)
            if isinstance(inner, SumNode | SquaredDistance):
                parts += self.sum_parts(inner, ren, sign * factor)
                flattened.append(inner)
            else:
                parts.append((sign, self.as_missing_legs(self.lower(term, ren))))
        kind = "sqdist" if any(isinstance(f, SquaredDistance) for f in flattened) else "sum"
        value = self.combine(kind, parts, out, var)
        if flattened:  # the papers count a sum node's additions at its result's size (App. B)
            self.target[-1].paper = self.numel(value.legs) * (len(terms) - 1)
        return value

    def varying(self, terms, signs, ren) -> list[tuple[Expr, int]]:
        """A sum's terms less those constant along a surrounding softmax's legs (they drop out)."""
        pairs = list(zip(terms, signs, strict=True))
        if self.shift_invariant is None:
            return pairs
        kept = [
            (t, s)
            for t, s in pairs
            if {p for leg in t.legs for p in ren[leg]} & self.shift_invariant or self.owns_parameter(t)
        ]
        return kept or pairs[:1]

    def sum_parts(self, e: SumNode | SquaredDistance, ren, coefficient: sympy.Expr) -> list[tuple[int, Value]]:
        """The signed terms of coefficient · e for a flattened sum."""
        if isinstance(e, SquaredDistance):
            return distance_parts(self, e, ren, coefficient)
        parts = []
        for term, sign in self.varying(e.terms, e.signs, ren):
            inner, factor = _scaled(term)
            if isinstance(inner, SumNode | SquaredDistance):
                parts += self.sum_parts(inner, ren, coefficient * sign * factor)
            elif abs(coefficient) == 1:
                parts.append((int(sign * coefficient), self.as_missing_legs(self.lower(term, ren))))
            else:
                parts.append((1, self.as_missing_legs(self.lower(term, ren, scale=sign * coefficient))))
        return parts

    def lower_quotient(self, e: Quotient, ren, var: str | None) -> Value:
        """numerator / denominator, elementwise; a quotient of causal products sharing a decay
        with that decay shifted by its row max first (quotient_shift.py), which cancels."""
        shifted = shifted_quotient(e, self.g, self.uses)
        if shifted is not None:
            note = ROW_SHIFT_NOTE.format(target=var or "a quotient")
            if self.target is self.steps and note not in self.lowered:
                self.lowered.append(note)
            e = shifted
        numerator = self.as_missing_legs(self.lower(e.numerator, ren))  # type: ignore[arg-type]
        denominator = self.as_missing_legs(self.lower(e.denominator, ren))  # type: ignore[arg-type]
        out = tuple(p for leg in e.legs for p in ren[leg])
        return self.combine("quotient", [(1, numerator), (1, denominator)], out, var, operator="/")

    def as_missing_legs(self, value: Value) -> Value:
        """A value's broadcast legs, for combine, which broadcasts any leg an operand lacks."""
        return Value(value.var, value.legs, frozenset())


def _scaled(e: Expr) -> tuple[Expr, sympy.Expr]:
    """(x, c) for a term c · x that only scales one factor by numbers; (e, 1) otherwise."""
    if not isinstance(e, Contraction) or e.summed:
        return e, sympy.Integer(1)
    factors = [f for f in e.factors if not isinstance(f, Scalar)]
    if len(factors) != 1 or set(factors[0].legs) != set(e.legs):
        return e, sympy.Integer(1)
    coefficient = e.coefficient * sympy.Mul(*(f.value for f in e.factors if isinstance(f, Scalar)))
    return factors[0], coefficient
