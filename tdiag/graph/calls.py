"""Calls in an expression: softmax and normalize boxes with their options (mask, scale, eps),
elementwise maps (with masks), reductions (max, logsumexp, mean), the squared distance sqdist, and
causal(n, m) as a factor. Each names the legs it works along; the leg rule decides what is summed
inside it."""

from __future__ import annotations

import dataclasses
from itertools import pairwise
from typing import TYPE_CHECKING

import sympy

from .. import parse as syn
from ..errors import Span, a_or_an, did_you_mean, one_of
from ..errors import hint as join_hint
from ..ir import (
    CausalFactor,
    CausalMask,
    Contraction,
    ElementwiseMap,
    Expr,
    Mask,
    PaddingMask,
    Reduction,
    SoftmaxBox,
    TensorRef,
    WindowFactor,
    WindowMask,
)
from .lone_sums import lone_sums, map_sum_warning
from .sizes import expand_sizes, number_text, size_symbol, size_values
from .syntax import available_legs, is_scalar_syntax
from .vocabulary import (
    BOUNDS,
    BOX_OPTIONS,
    BUILD,
    FUNCTIONS,
    MAPS,
    SCALAR_FUNCTIONS,
)

if TYPE_CHECKING:
    from .protocols import GraphBuilder


class BoxesAndMaps:
    """Boxes, maps, masks, reductions and sqdist; a base class of ExprBuilder (expressions.py),
    whose inside/restrict/poison/tensor_ref it uses."""

    b: GraphBuilder

    # -- calls: boxes, maps, reductions, squared distance --
    def call(self, e: syn.Call, keep: set[str]) -> Expr:
        """A call of a word of the language, built by the build rule registered for the word
        (tdiag/constructs); any other name is a mistake, said as precisely as it can be."""
        if self._juxtaposed_option(e):
            return self.poison(e)
        rule = BUILD.named(e.name)
        if rule is not None:
            return rule(self, e, keep)
        if e.name in self.b.tensors:
            legs = " ".join(self.b.tensors[e.name].legs)
            self.b.error(
                f"'{e.name}' is a tensor, not a map",
                e.name_span,
                hint=f"use it with legs, e.g. {e.name}[{legs}]; write '*' between factors if you meant a product",
            )
        elif e.name in SCALAR_FUNCTIONS:
            self.b.error(f"{e.name} takes a number or size, not a tensor", e.span)
        else:
            self.b.error(
                f"unknown map '{e.name}'",
                e.name_span,
                hint=join_hint(
                    did_you_mean(e.name, FUNCTIONS),
                    one_of(f for f in FUNCTIONS if f in MAPS or f not in SCALAR_FUNCTIONS),
                ),
            )
        return self.poison(e)

    def _juxtaposed_option(self, e: syn.Call) -> bool:
        """`softmax[m, scale = 2 sqrt(D)]`: inside [...] items are separated by spaces, so the option's
        value ends at `2` and `sqrt (D)` reads as a leg and a reshape; say so once."""
        items = e.legs or ()
        for item, after in pairwise(items):
            if isinstance(item, syn.Leg) and item.name in FUNCTIONS and isinstance(after, syn.LegGroup):
                start, end = item.span, after.span
                self.b.error(
                    f"'{item.name}' in {e.name}[...] reads as a leg: inside [...] a space separates items",
                    Span(start.file, start.line, start.column, end.end_line, end.end_column),
                    hint=f"an option's value multiplies with '*', e.g. scale = 2 * {item.name}(...)",
                )
                return True
        return False

    def one_argument(self, e: syn.Call) -> syn.Expr | None:
        if e.keywords:
            self.b.error(f"{e.name} takes no keyword arguments; options go in [...]", e.keywords[0].span)
        if len(e.args) != 1:
            self.b.error(f"{e.name} takes one argument, got {len(e.args)}", e.span)
            return None
        return e.args[0]

    def legs_of(self, e: syn.Call) -> tuple[str, ...]:
        legs: list[str] = []
        for item in e.legs or ():
            if isinstance(item, syn.LegGroup):
                self.b.error(f"{e.name} takes leg names, not a reshape", item.span)
                names = [leg.name for leg in item.legs]
            else:
                names = [item.name]
            for name in names:
                if name in legs:
                    self.b.error(f"leg '{name}' is named twice in {e.name}[...]", item.span, hint="name each leg once")
                else:
                    legs.append(name)
        return tuple(legs)

    def _content_legs(self, argument: syn.Expr) -> set[str]:
        """The legs an argument could expose, for naming them in a check or a hint: a size in a
        position (`Rel[h, r = clamp(m - n, -C, C) + C]`) stands for no leg."""
        return available_legs(argument, self.b.tensors) - set(self.b.sizes)

    def box(self, e: syn.Call, keep: set[str]) -> Expr:
        normalized = self.legs_of(e)
        argument = self.one_argument(e)
        if not normalized:
            self.b.error(
                f"a {e.name} box needs its normalized leg",
                e.name_span,
                hint=f"name the leg of the filled ball: {e.name}[m](...)",
            )
        if argument is None:
            return self.poison(e)
        available = self._content_legs(argument)
        for leg, item in zip(normalized, e.legs or (), strict=False):
            if leg not in available:
                self.b.error(
                    f"normalized leg '{leg}' is not a leg of the {e.name} box's content",
                    item.span,
                    hint=did_you_mean(leg, available) or f"its legs are: {', '.join(sorted(available)) or 'none'}",
                )
            elif leg not in keep:
                self.b.error(
                    f"normalized leg '{leg}' is contracted inside its {e.name} box",
                    item.span,
                    hint=f"the ball's leg must leave the box: use '{leg}' in the result or in a factor outside the box",
                )
        content = self.inside(argument, keep | (set(normalized) & available))
        options = self._box_options(e, content)
        if e.name == "normalize" and "eps" not in options:
            self._warn_empty_rows(e, options["masks"])
        factor = options.pop("scale_factor", None)
        if factor is not None:  # softmax[m, scale = t[h]](x) = softmax[m](t[h] x): a factor inside the box
            batch = tuple(leg for leg in factor.legs if leg in content.legs)
            content = Contraction(content.legs, factor.span, (factor, content), sympy.Integer(1), (), batch)
        return SoftmaxBox(
            content.legs,
            e.span,
            content,
            normalized,
            options.get("scale", sympy.Integer(1)),
            tuple(options.get("masks", ())),
            is_exp=e.name == "softmax",
            eps=options.get("eps", sympy.Integer(0)),
            sink=options.get("sink"),
        )

    def _warn_empty_rows(self, e: syn.Call, masks: list[Mask]) -> None:
        """A padding mask may hide every key of a query; a normalize box then divides 0 by 0 unless
        it has an eps (a softmax box averages the values instead, so it needs none)."""
        padding = next((m for m in masks if isinstance(m, PaddingMask)), None)
        if padding is not None:
            self.b.warn(
                "a query whose keys this mask hides all gives 0 / 0 (NaN) in a normalize box without eps",
                padding.span,
                hint="add an eps option, e.g. normalize[m, mask = ..., eps = 1e-6]",
            )

    def _box_options(self, e: syn.Call, content: Expr) -> dict:
        allowed = BOX_OPTIONS[e.name]
        options: dict = {"masks": []}
        for option in e.options:
            if option.name == "sink" and e.name == "normalize":
                self.b.error(
                    "a normalize box takes no sink: a sink is a logit in a softmax's denominator",
                    option.span,
                    hint="softmax[m, sink = s[h]](...)",
                )
            elif option.name not in allowed:
                self.b.error(
                    f"unknown {e.name} option '{option.name}'",
                    option.span,
                    hint=join_hint(did_you_mean(option.name, allowed), one_of(allowed)),
                )
            elif option.name == "mask":
                mask = self.mask_option(option.value, content, f"{e.name} box")
                if mask is not None:
                    options["masks"].append(mask)
            elif option.name in options or (option.name == "scale" and "scale_factor" in options):
                self.b.error(f"option '{option.name}' is given twice", option.span)
            elif option.name == "scale" and not is_scalar_syntax(option.value, self.b.tensors):
                factor = self._scale_factor(option.value, content, e.name)
                if factor is not None:
                    options["scale_factor"] = factor
            elif option.name == "sink":
                sink = self._sink(option.value, content, e)
                if sink is not None:
                    options["sink"] = sink
            else:
                options[option.name] = self.b.scalar_of(option.value)
        return options

    def _scale_factor(self, value: syn.Expr, content: Expr, box: str) -> Expr | None:
        """A scale that is a tensor expression (a learned per-head temperature `t[h]`): its legs
        must be legs of the box, along which it scales the logits entrywise."""
        legs = available_legs(value, self.b.tensors)
        wrong = sorted(legs - set(content.legs))
        for leg in wrong:
            self.b.error(
                f"scale leg '{leg}' is not a leg of the {box} box",
                value.span,
                hint=did_you_mean(leg, content.legs) or f"the box's legs are: {', '.join(content.legs)}",
            )
        if wrong:
            return None
        return self.inside(value, set(content.legs))

    def _sink(self, value: syn.Expr, content: Expr, e: syn.Call) -> Expr | None:
        """`softmax[m, sink = s[h]](x)`: a logit added to the box's denominator, a tensor
        expression (or a number) over legs the box keeps: never a normalized leg (the sink is one
        extra entry per row of the box, not one per key)."""
        normalized = set(self.legs_of(e))
        legs = available_legs(value, self.b.tensors)
        wrong = False
        for leg in sorted(legs):
            if leg in normalized:
                self.b.error(
                    f"sink leg '{leg}' is a normalized leg of the softmax box",
                    value.span,
                    hint="a sink is one logit per row of the box: index it by heads (and queries), e.g. sink = s[h]",
                )
                wrong = True
            elif leg not in content.legs:
                self.b.error(
                    f"sink leg '{leg}' is not a leg of the softmax box",
                    value.span,
                    hint=did_you_mean(leg, content.legs) or f"the box's legs are: {', '.join(content.legs)}",
                )
                wrong = True
        if wrong:
            return None
        return self.inside(value, set(legs))

    def mask_option(self, value: syn.Expr, content: Expr, box: str) -> Mask | None:
        if isinstance(value, syn.Call) and value.name == "causal":
            legs = [a.name if isinstance(a, syn.Name) else None for a in value.args]
            if len(legs) != 2 or None in legs or value.legs is not None:
                self.b.error("causal takes a query leg and a key leg", value.span, hint="mask = causal(n, m)")
                return None
            for leg, arg in zip(legs, value.args, strict=True):
                if leg not in content.legs:
                    self._mask_leg_outside("causal mask", leg, arg.span, box, content.legs)
            if legs[0] == legs[1]:
                self.b.error("a causal mask relates two different legs", value.span)
            return CausalMask(legs[0], legs[1], value.span)  # type: ignore[arg-type]
        if isinstance(value, syn.Call) and value.name == "window":
            window = self._window(value)
            if window is not None:
                for leg, arg in zip((window.query, window.key), value.args, strict=False):
                    if leg not in content.legs:
                        self._mask_leg_outside("window mask", leg, arg.span, box, content.legs)
            return window
        if isinstance(value, syn.Indexed):
            tensor = self.b.tensors.get(value.name)
            if tensor is None or tensor.kind != "mask":
                masks = [t.name for t in self.b.tensors.values() if t.kind == "mask"]
                what = a_or_an(tensor.kind) if tensor else "not declared"
                self.b.error(
                    f"a padding mask must be a 'mask' input; '{value.name}' is {what}",
                    value.name_span,
                    hint=did_you_mean(value.name, masks) or "declare it: mask pad[m: N]",
                )
                return None
            ref = self.tensor_ref(value)
            for leg in ref.legs:
                if leg not in content.legs:
                    self._mask_leg_outside("mask", leg, value.span, box, content.legs)
            return PaddingMask(ref, value.span) if isinstance(ref, TensorRef) else None
        self.b.error(
            "a mask is causal(query_leg, key_leg), window(query_leg, key_leg, W) or a mask input like pad[m]",
            value.span,
        )
        return None

    def _mask_leg_outside(self, mask: str, leg: str, span: Span, box: str, legs: tuple[str, ...]) -> None:
        """A mask (`mask` says which kind) names a leg the masked box or map does not have."""
        self.b.error(
            f"{mask} leg '{leg}' is not a leg of the {box}",
            span,
            hint=did_you_mean(leg, legs) or f"the {box.split()[-1]}'s legs are: {', '.join(legs)}",
        )

    def window_factor(self, e: syn.Call) -> Expr:
        """`window(n, m, W)` as a factor: 1 where the key is inside the query's window, else 0."""
        window = self._window(e)
        if window is None:
            return self.poison(e)
        return WindowFactor((window.query, window.key), e.span, window.query, window.key, window.before, window.after)

    def _window(self, e: syn.Call) -> WindowMask | None:
        """`window(n, m, W)` (keys n − W < m ≤ n: the query and the W − 1 keys before it) or
        `window(n, m, L, R)` (keys n − L < m < n + R), over a query and a key position leg of one
        run-time length, with widths that are fixed whole positive sizes (docs/language.md, Windows)."""
        usage = "window(n, m, W) or window(n, m, L, R)"
        if e.legs is not None or e.keywords or len(e.args) not in (3, 4):
            self.b.error(
                f"window takes a query leg, a key leg and one or two widths, got {len(e.args)} argument(s)",
                e.span,
                hint=usage,
            )
            return None
        legs = self._window_legs(e, usage)
        widths = [self._window_width(arg) for arg in e.args[2:]]
        if legs is None or any(w is None for w in widths):
            return None
        before, after = widths[0], widths[1] if len(widths) == 2 else sympy.Integer(1)
        return WindowMask(*legs, before, after, e.span)  # type: ignore[arg-type]

    def _window_legs(self, e: syn.Call, usage: str) -> tuple[str, str] | None:
        """The query and key legs of a window: two different position legs of one length."""
        legs = [a.name if isinstance(a, syn.Name) else None for a in e.args[:2]]
        for leg, arg in zip(legs, e.args, strict=False):
            if leg is None:
                self.b.error("window's first two arguments are a query leg and a key leg", arg.span, hint=usage)
                return None
        if legs[0] == legs[1]:
            self.b.error("a window relates two different legs", e.span, hint=usage)
            return None
        sizes = []
        for leg, arg in zip(legs, e.args, strict=False):
            bound = self.b.legs.get(leg) if self.b.find_leg(leg) else None  # type: ignore[arg-type]
            if bound is None:
                self.b.error(
                    f"window leg '{leg}' is not bound to a size",
                    arg.span,
                    hint=did_you_mean(leg, self.b.legs) or "use legs that a tensor of this file has",  # type: ignore[arg-type]
                )
                return None
            if not bound.size.free_symbols & self.b.runtime_sizes:
                self.b.error(
                    f"a window runs along positions, but '{leg}' has the fixed size {bound.size}",
                    arg.span,
                    hint="a window's legs are a query and a key position whose size is a run-time length (size N)",
                )
                return None
            sizes.append(bound.size)
        if sizes[0] != sizes[1]:
            self.b.error(
                f"a window relates a query and a key position of one length;"
                f" '{legs[0]}' is {sizes[0]}, '{legs[1]}' is {sizes[1]}",
                e.span,
            )
            return None
        return legs[0], legs[1]  # type: ignore[return-value]

    def _window_width(self, arg: syn.Expr) -> sympy.Expr | None:
        """A window's width: a whole positive number or size, fixed before any input."""
        width = self.b.scalar_of(arg, sizes_only=True)
        if width.free_symbols & self.b.runtime_sizes:
            self.b.error(
                f"a window's width is a fixed size, not the run-time length {width}",
                arg.span,
                hint="declare the width as a size with a value: size W = 256",
            )
            return None
        values = size_values(self.b.sizes)
        value = expand_sizes(width, self.b.sizes).xreplace({size_symbol(k): v for k, v in values.items()})
        if value.is_number and not (value.is_integer and value > 0):
            self.b.error(
                f"a window's width must be a whole positive number, got {number_text(value)}",
                arg.span,
                hint="window(n, m, W): the query and the W - 1 keys before it; W >= 1",
            )
            return None
        return width

    def _map_masks(self, e: syn.Call, operand: Expr) -> list[Expr]:
        """`relu[m, mask = causal(n, m)](x)`: the map's value is zeroed where a mask hides it;
        the legs in brackets are the key legs it runs along, legs of its argument."""
        factors: list[Expr] = []
        for mask in self._only_masks(e, operand, "map"):
            if isinstance(mask, CausalMask):
                factors.append(CausalFactor((mask.query, mask.key), mask.span, mask.query, mask.key))
            elif isinstance(mask, WindowMask):
                factors.append(
                    WindowFactor((mask.query, mask.key), mask.span, mask.query, mask.key, mask.before, mask.after)
                )
            elif isinstance(mask, PaddingMask):
                factors.append(mask.tensor)
        for leg, item in zip(self.legs_of(e), e.legs or (), strict=False):
            if leg not in operand.legs:
                self.b.error(
                    f"leg '{leg}' is not a leg of the {e.name} map's argument",
                    item.span,
                    hint=did_you_mean(leg, operand.legs) or f"its legs are: {', '.join(operand.legs) or 'none'}",
                )
        if e.legs and not e.options:
            self.b.error(
                f"{e.name} is elementwise and takes no legs",
                e.name_span,
                hint=f"write {e.name}(...), or name a mask: {e.name}[m, mask = causal(n, m)](...)",
            )
        return factors

    def elementwise_map(self, e: syn.Call, keep: set[str], written: syn.Call | None = None) -> Expr:
        """A map; `written` is the call as the file has it, when `e` is that call less its masks."""
        if e.legs is not None or e.options:
            along = {leg for option in e.options for leg in available_legs(option.value, self.b.tensors)}
            masked = self.elementwise_map(dataclasses.replace(e, legs=None, options=()), keep | along, e)
            factors = self._map_masks(e, masked)
            if not factors:
                return masked
            batch = tuple(leg for leg in masked.legs if any(leg in f.legs for f in factors))
            return Contraction(masked.legs, e.span, (masked, *factors), sympy.Integer(1), (), batch)
        extra = MAPS[e.name]
        args = list(e.args)
        keywords = {k.name: k.value for k in e.keywords}
        if e.name == "clamp":
            for key in ("lo", "hi"):
                if key in keywords:
                    args.append(keywords.pop(key))
        for key in keywords:
            self.b.error(f"unknown argument '{key}' of {e.name}", e.span)
        if len(args) != 1 + extra:
            usage = "clamp(x, lo, hi)" if extra else f"{e.name}(x)"
            self.b.error(f"{e.name} takes {1 + extra} argument(s), got {len(args)}", e.span, hint=usage)
            return self.poison(e)
        operand = self.inside(args[0], keep)
        self.warn_lone_sums(written or e, args[0], operand)
        params = tuple(self.b.scalar_of(a) for a in args[1:])
        return ElementwiseMap(operand.legs, e.span, e.name, operand, params)

    def rsqrt(self, e: syn.Call, keep: set[str]) -> Expr:
        """`rsqrt(x)` is x ^ -0.5 (torch.rsqrt): an RMS norm as HF writes it,
        `x rsqrt(mean[d](x ^ 2) + eps)`, planned as the power is (a layer norm's kernel included)."""
        if e.legs is not None or e.options or e.keywords or len(e.args) != 1:
            self.b.error("rsqrt takes one argument and no legs", e.span, hint="rsqrt(x) is x ^ -0.5")
            return self.poison(e)
        return self.inside(syn.BinOp(e.span, "^", e.args[0], syn.Number(e.name_span, -0.5)), keep)

    def bound(self, e: syn.Call, keep: set[str]) -> Expr:
        """`max(x, c)`, `min(x, c)` (either order): elementwise, a tensor against a number or size,
        the maps "maximum" and "minimum" (torch.clamp with one bound); the frequency pieces of
        Llama 3's rope scaling, for one. Of two numbers or sizes it is a number (builder.scalar_of)."""
        scalar = [is_scalar_syntax(a, self.b.tensors) for a in e.args]
        if not any(scalar):
            self.b.error(
                f"{e.name}(a, b) takes a tensor and a number or size, got two tensors",
                e.span,
                hint=f"{e.name}[r](x) reduces x over leg r; {e.name}(x, c) bounds x by c entry by entry",
            )
            return self.poison(e)
        tensor, bound = (e.args[1], e.args[0]) if scalar[0] else e.args
        operand = self.inside(tensor, keep)
        self.warn_lone_sums(e, tensor, operand)
        return ElementwiseMap(operand.legs, e.span, BOUNDS[e.name], operand, (self.b.scalar_of(bound),))

    def warn_lone_sums(self, call: syn.Call | syn.BinOp, argument: syn.Expr, operand: Expr) -> None:
        """Warn of a leg summed inside a map, reduction or power that one factor of its argument alone
        carries and no `sum[...]` names: `exp(S[h n k])` is exp(Σ_k S), not Σ_k exp(S) (lone_sums.py)."""
        legs = lone_sums(operand, self.b.tensors, self.b.meant_sums)
        if legs:
            warning = map_sum_warning(call, argument, legs)
            self.b.lone_sum_spans.update(warning.spans)
            self.b.diagnostics.append(warning)

    def reduction(self, e: syn.Call, keep: set[str]) -> Expr:
        over = self.legs_of(e)
        argument = self.one_argument(e)
        if not over:
            self.b.error(f"{e.name} needs the leg it reduces", e.name_span, hint=f"e.g. {e.name}[r](...)")
        if argument is None:
            return self.poison(e)
        along = {leg for option in e.options for leg in available_legs(option.value, self.b.tensors)}
        operand = self.inside(argument, keep | set(over) | along)
        self.warn_lone_sums(e, argument, operand)
        available = sorted(self._content_legs(argument))
        for leg, item in zip(over, e.legs or (), strict=False):
            if leg not in operand.legs:
                self.b.error(
                    f"{e.name} over leg '{leg}', which its argument does not have",
                    item.span,
                    hint=did_you_mean(leg, available) or f"its legs are: {', '.join(available) or 'none'}",
                )
        legs = tuple(leg for leg in operand.legs if leg not in over)
        masks = tuple(self._only_masks(e, operand, "reduction"))
        return self.restrict(Reduction(legs, e.span, e.name, over, operand, masks), keep, e.span)

    def scan_leg(self, e: syn.Call, operand: Expr, count: int, usage: str) -> str | None:
        """The position leg a scan or segment sum runs along: the first of its `count` legs in
        brackets, a leg of its argument whose size is a run-time length (N), never a feature leg."""
        legs = self.legs_of(e)
        if len(legs) != count:
            self.b.error(
                f"{e.name} takes {'one leg' if count == 1 else f'{count} legs'} in brackets, got {len(legs)}",
                e.name_span if not e.legs else e.legs[0].span,
                hint=f"e.g. {usage}",
            )
            return None
        along, item = legs[0], e.legs[0]  # type: ignore[index]
        if along not in operand.legs:
            self.b.error(
                f"{e.name} along leg '{along}', which its argument does not have",
                item.span,
                hint=did_you_mean(along, operand.legs) or f"its legs are: {', '.join(operand.legs) or 'none'}",
            )
            return None
        leg = self.b.legs.get(along)
        if leg is not None and not leg.size.free_symbols & self.b.runtime_sizes:
            self.b.error(
                f"{e.name} runs along a position leg, but '{along}' has the fixed size {leg.size}",
                item.span,
                hint="scan along a leg whose size is a run-time length such as N (size N)",
            )
            return None
        return along

    def _only_masks(self, e: syn.Call, operand: Expr, what: str) -> list[Mask]:
        """The masks of a map or reduction (`logsumexp[m, mask = causal(n, m)](S)`), over legs of
        its argument; any other option is an error, as `what` takes only masks."""
        masks = []
        for option in e.options:
            if option.name != "mask":
                self.b.error(
                    f"unknown {e.name} option '{option.name}'",
                    option.span,
                    hint=f"a {what} takes only masks: {e.name}[m, mask = causal(n, m)](...)",
                )
                continue
            mask = self.mask_option(option.value, operand, f"{e.name} {what}")
            if mask is not None:
                masks.append(mask)
        return masks
