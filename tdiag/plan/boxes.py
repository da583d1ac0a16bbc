"""Softmax and normalize boxes computed as such: content, masks, then the normalization over the
last axes of a layout whose leading legs are the consumer's batch legs.
Guarantees: the box's entries are materialized once, masked entries filled before normalizing."""

from __future__ import annotations

import sympy

from ..ir import (
    POSITION_MASKS,
    CausalMask,
    Reduction,
    SoftmaxBox,
    WindowMask,
)
from . import forms
from .context import Leaf
from .program import (
    BATCH,
    Expand,
    MaskFill,
    Materialize,
    Normalize,
    Operand,
    Reshape,
    Softmax,
    Step,
    Value,
    align,
    show_legs,
)


class BoxLowering:
    """Computes softmax and normalize boxes as materialized tensors."""

    def resolve_boxes(self, leaves: list[Leaf], out: tuple[str, ...]) -> list[Leaf]:
        """Each box leaf of a region replaced by the candidate form the chooser takes (forms/)."""
        return forms.resolve_boxes(self, leaves, out)  # type: ignore[arg-type]

    def lower_box(
        self, e: SoftmaxBox, ren: dict[str, tuple[str, ...]], var: str | None, prefer: set[str] = frozenset()
    ) -> Value:  # type: ignore[assignment]
        """`prefer`: legs the consumer shares with other factors (its batch legs), laid out first so
        that the consumer's matmul reads the box without a copy."""
        start = len(self.target)
        wide = 0 if e.is_exp else 1
        with self.wide(wide):
            value = self._lower_box(e, ren, var, prefer)
        if not self.trialing:
            self.box_segments.append((start, len(self.steps) - 1, value.var))
        return value

    def _lower_box(self, e: SoftmaxBox, ren: dict[str, tuple[str, ...]], var: str | None, prefer: set[str]) -> Value:
        scale = e.scale if e.is_exp else sympy.Integer(1)
        normalized = tuple(p for leg in e.normalized for p in ren[leg])
        # a sink breaks the softmax's shift invariance: a term constant along the keys stays
        invariant = frozenset(normalized) if e.is_exp and e.sink is None else None
        shifted = self.stabilizations
        with self.scope(shift_invariant=invariant, stabilized=self.kept_by(e, ren)), self.box():
            content = self.lower(e.content, ren, None, scale)  # type: ignore[arg-type]
        guard = self.stabilizations > shifted
        sink = None
        if e.sink is not None:
            sink = self.lower(e.sink, ren, None)
            if BATCH in sink.legs and BATCH not in content.legs:
                batched = self.materialize(content, (BATCH, *content.legs))
                content = Value(batched.var, batched.legs, content.broadcast)
        sink_legs = set(sink.legs) if sink is not None else set()
        content = self.maskable(content, e, ren, set(normalized) | sink_legs)
        name = self.names.fresh(var or ("attention" if e.is_exp else "normalized"))
        masked = content
        for mask in sorted(e.masks, key=lambda m: isinstance(m, POSITION_MASKS)):  # padding first
            masked = self.apply_mask(masked, mask, ren, e.is_exp)
        kept = [leg for leg in content.legs if leg not in normalized]
        kept.sort(key=lambda leg: (leg != BATCH, leg not in prefer))
        moved = kept + list(normalized)
        permutation = None
        if list(content.legs) != moved:
            permutation = tuple(content.legs.index(leg) for leg in moved)
        read = Operand(masked, permutation)
        count = len(normalized)
        entries = self.numel(content.legs)
        if e.is_exp:
            rows = self.numel(kept) if sink is not None else sympy.Integer(0)
            step = Step(
                "softmax",
                Softmax(read, count, self.shape(normalized), align(sink, (*kept, normalized[0])) if sink else None),
                Value(name, tuple(moved), content.broadcast),
                f"softmax over {' '.join(show_legs(normalized))}"
                + (", a sink in each row's denominator" if sink else ""),
                exps=entries + rows,
                divisions=entries,
                entries=entries,
                flops=sympy.Integer(0),
                inputs=(content,) if sink is None else (content, sink),
            )
        else:
            step = Step(
                "normalize",
                Normalize(read, count, self.runtime(e.eps), guard),
                Value(name, tuple(moved), content.broadcast),
                f"normalize over {' '.join(show_legs(normalized))}",
                divisions=entries,
                entries=entries,
                elementwise=entries,
                inputs=(content,),
            )
        return self.emit(step)  # type: ignore[return-value]

    def kept_by(self, e: SoftmaxBox, ren: dict[str, tuple[str, ...]]) -> frozenset[str] | None:
        """The region legs a normalize box without eps or masks keeps (and the batch): its content's
        exp factors may be shifted along any other leg (stabilize.py); None for other boxes. Under
        a mask the max along a key leg may come from a hidden key (a future one, under a causal
        mask), and every visible term would underflow: wrong rows, not a stable box."""
        if e.is_exp or e.eps != 0 or e.masks:
            return None
        normalized = {p for leg in e.normalized for p in ren[leg]}
        return frozenset(p for leg in e.legs for p in ren[leg] if p not in normalized) | {BATCH}

    def causal_mask(self, query: str, key: str) -> str:
        """The forward's boolean [query, key] triangle (True above the diagonal: the future), one per
        pair of sizes, built at entry."""
        sizes = (self.size(query), self.size(key))
        if sizes not in self.causal_masks:
            self.causal_masks[sizes] = self.names.fresh("causal")
        return self.causal_masks[sizes]

    def window_mask(self, query: str, key: str, before: sympy.Expr, after: sympy.Expr) -> str:
        """The forward's boolean [query, key] band of a window (True outside it: key ≤ query −
        before or key ≥ query + after), one per sizes and widths, built at entry beside the causal
        triangles (`Plan.causal`, keyed (N, M, before, after))."""
        sizes = (self.size(query), self.size(key), self.runtime(before), self.runtime(after))
        if sizes not in self.causal_masks:
            self.causal_masks[sizes] = self.names.fresh("window")
        return self.causal_masks[sizes]

    def position_mask(self, mask: CausalMask | WindowMask, query: str, key: str) -> str:
        """The boolean [query, key] matrix, True where `mask` hides, between region legs."""
        if isinstance(mask, WindowMask):
            return self.window_mask(query, key, mask.before, mask.after)
        return self.causal_mask(query, key)

    def mask_legs(self, e: SoftmaxBox | Reduction, ren: dict[str, tuple[str, ...]]) -> set[str]:
        """The region legs the masks of a box or reduction index: its content needs them as real
        axes to be filled."""
        legs: set[str] = set()
        for mask in e.masks:
            if isinstance(mask, POSITION_MASKS):
                legs |= {*ren[mask.query], *ren[mask.key]}
            else:
                legs |= {p for leg in mask.tensor.legs for p in ren[leg]}
        return legs

    def apply_mask(self, content: Value, mask, ren, is_exp: bool, future: str = "-inf") -> Value:
        """The box content with the entries a mask hides filled before normalizing; a causal or
        window mask's with `future` (−inf: a box or a scan always sees its diagonal; a reduction
        passes "lowest", since one over another leg may see no entry at all, docs/language.md)."""
        hidden = self.hidden_operand(mask, ren, content.legs)
        masked = Value(self.names.fresh("masked"), content.legs, content.broadcast)
        fill = (future if isinstance(mask, POSITION_MASKS) else "lowest") if is_exp else "zero"
        self.emit(Step("mask", MaskFill(content, hidden, fill), masked, inputs=(content,)))
        return masked

    def maskable(self, content: Value, e: SoftmaxBox | Reduction, ren, legs: set[str]) -> Value:
        """`content` with real axes along `legs` and every leg the masks of `e` index; repeated over
        the batch when a mask input (which differs per sequence) meets content that does not."""
        content = self.expand_broadcast(content, legs | self.mask_legs(e, ren))
        if BATCH not in content.legs and any(not isinstance(mask, POSITION_MASKS) for mask in e.masks):
            batched = self.materialize(content, (BATCH, *content.legs))
            content = Value(batched.var, batched.legs, content.broadcast)
        return content

    def hidden_operand(self, mask, ren, legs: tuple[str, ...]) -> Operand:
        """A mask read over `legs` as True where it hides an entry."""
        if isinstance(mask, POSITION_MASKS):
            (query,), (key,) = ren[mask.query], ren[mask.key]
            return align(Value(self.position_mask(mask, query, key), (query, key)), legs)
        ref = mask.tensor
        mask_legs = tuple(p for leg in ref.legs for p in ren[leg])
        value = Value(self.input_vars[ref.name], (BATCH, *mask_legs))
        if len(mask_legs) != len(ref.legs):  # a head leg the region splits (h as h.0 k): a view of it
            whole = Value(value.var, (BATCH, *ref.legs))
            value = Value(self.names.fresh(f"{ref.name}_view"), value.legs)
            shape = self.shape((BATCH, *mask_legs))
            self.emit(
                Step(
                    "view", Reshape(whole, shape), value, f"view {ref.name} with legs {' '.join(show_legs(mask_legs))}"
                )
            )
        return align(value, legs, invert=True)

    def expand_broadcast(self, value: Value, legs: set[str]) -> Value:
        """Materialize broadcast legs that an operation needs as real axes."""
        needed = [leg for leg in value.broadcast if leg in legs]
        if not needed:
            return value
        name = self.names.fresh("expanded")
        target = (*value.legs, *needed)
        return self.emit(
            Step(
                "expand",
                Expand(value, self.shape(needed)),
                Value(name, target, value.broadcast - set(needed)),
                "broadcast " + " ".join(show_legs(needed)),
                inputs=(value,),
            )
        )  # type: ignore[return-value]

    def materialize(self, value: Value, legs: tuple[str, ...]) -> Value:
        """`value` expanded to exactly `legs` (a copy), for an operand that must be dense."""
        name = self.names.fresh(f"{value.var}_full")
        return self.emit(
            Step(
                "expand",
                Materialize(align(value, legs), self.shape(legs)),
                Value(name, legs),
                "broadcast " + " ".join(show_legs(leg for leg in legs if leg not in value.legs)),
                inputs=(value,),
            )
        )  # type: ignore[return-value]
