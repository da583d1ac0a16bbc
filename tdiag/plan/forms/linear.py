"""The linear-time order of a normalize box (linear.py): Σ_m (x / Σ_m x) v = (Σ_m x v) / (Σ_m x)
when the content is multilinear, both sides contractions that opt_einsum orders so that N·M
never appears (Tuformer §3.3, MGK P12); under a causal mask over the normalized leg, both sides
are prefix sums computed in chunks (chunked.py). Which of the consumer's factors join the value
side is searched here, inside the form: each placement is costed by the one model and the
objective's order picks one (`site.found` keeps it between the trial and the real emission)."""

from __future__ import annotations

import itertools

import sympy

from ..chooser import choose
from ..chunked import NotPrefixSumError
from ..context import Leaf, Lowering
from ..linear import hoist, not_linear_content, prefix_legs
from ..regions import contract
from .base import BoxSite, Form, FormRefusedError, Unfit
from .cost import cost

MAX_OPTIONAL = 6  # factors whose place (value side or not) is searched: 2^6 trial plans at most


class LinearOrder(Form):
    name = "linear"

    def label(self, site: BoxSite) -> str:
        return "linear-time order"

    def refusal(self, ctx: Lowering, site: BoxSite) -> str | None:
        box = site.box
        if box.is_exp:
            return Unfit("a softmax box (the linear-time order is for normalize boxes)")
        if any(leg in site.out for leg in site.keys):
            return "the normalized legs are kept in the result"
        why = not_linear_content(box.content)
        if why is not None:
            return why
        if box.masks and prefix_legs(ctx, box, site.ren) is None:
            return "a mask other than one causal mask over the normalized leg"
        fixed, optional = _sides(site)
        if not fixed:
            return "no value side is contracted over the normalized legs"
        if len(optional) > MAX_OPTIONAL:
            return "more than six factors to place on the value side"
        return None

    def emit(self, ctx: Lowering, site: BoxSite) -> list[Leaf]:
        if self.name not in site.found:
            site.found[self.name] = _value_side(ctx, site)
        values, rest = site.found[self.name]
        with ctx.wide():  # as the materialized box: in float32 under autocast
            try:
                leaves = hoist(ctx, site.box, site.ren, values, rest, site.out)
            except NotPrefixSumError as why:
                raise FormRefusedError(f"no causal prefix sum: {why} of the content or value side") from None
        if not ctx.trialing:
            how = " with causal prefix sums over chunks" if site.box.masks else ""
            ctx.lowered.append(f"{site.describe()} evaluated in the linear-time order{how}")
        return leaves


def _sides(site: BoxSite) -> tuple[list[Leaf], list[Leaf]]:
    """The consumer's factors that carry a normalized leg (on the value side by force) and the
    others (placed by the search)."""
    fixed = [o for o in site.others if set(site.keys) & set(o.legs)]
    return fixed, [o for o in site.others if o not in fixed]


def _value_side(ctx: Lowering, site: BoxSite) -> tuple[list[Leaf], list[Leaf]]:
    """The placement of the optional factors (value side or rest) of least cost under the
    objective, the first of equal ones; a single placement is taken without costing it."""
    fixed, optional = _sides(site)
    placements = []
    for choice in itertools.product((0, 1), repeat=len(optional)):
        values = fixed + [o for o, c in zip(optional, choice, strict=True) if c]
        placements.append((values, [o for o in site.others if o not in values]))
    if len(placements) == 1:
        return placements[0]
    costed, not_prefix = [], None
    for values, rest in placements:

        def build(v: list[Leaf] = values, r: list[Leaf] = rest) -> None:
            contract(ctx, hoist(ctx, site.box, site.ren, v, r, site.out), site.out, sympy.Integer(1), None)

        try:
            costed.append(((values, rest), cost(ctx, build)))
        except NotPrefixSumError as why:
            not_prefix = str(why)
    if not costed:
        raise FormRefusedError(f"no causal prefix sum: {not_prefix} of the content or value side")
    return choose(ctx.objective, costed)
