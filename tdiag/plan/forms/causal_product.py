"""The candidate forms of a causal product: a multilinear region with a causal(n, m) factor (or a
decay that is causal by itself, exp(segsum[n, m](a))) that keeps the query leg n and sums the
key leg m: the attention of un-normalized linear and decayed designs (RetNet, GLA, Mamba-2,
Lightning), after with_causal_mask as well.

- masked: the product as written, its N×N factors masked (a decay's exponent set to −inf above
  the diagonal before its exp);
- chunked: causal prefix sums in chunks of C (chunked.py), a decay carried across chunks
  (decay.py), O(N·C) instead of N².

As for a box (choice.py), every form says whether it applies (`refusal`), those that do are
emitted on trial and costed by the one model (cost.py), the objective's order takes one, and the
real plan records the decision in `Plan.choices`. A new form is one more `CausalProductForm` in
`CAUSAL_PRODUCT_FORMS`."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import sympy

from ..chooser import Cost, choose, worse
from ..chunked import NotPrefixSumError, causal_contract, decay_side, masked_decay_exp, union_legs
from ..combine import combine
from ..context import Leaf, Lowering
from ..decay import has_segment_sum, split_exponent
from ..program import Value, show_legs
from ..regions import contract
from .base import BoxChoice, Candidate, FormRefusedError
from .cost import cost


@dataclass
class CausalSite:
    """One causal product of a region: its leaves (the causal triangle among them, if written),
    the query leg kept and the key leg summed, the legs the region keeps, its coefficient."""

    query: str
    key: str
    leaves: list[Leaf]
    out: tuple[str, ...]
    coefficient: sympy.Expr

    @property
    def rest(self) -> list[Leaf]:
        """The leaves without the causal triangle (the chunks make their own)."""
        return [leaf for leaf in self.leaves if leaf.triangle != (self.query, self.key)]

    def describe(self) -> str:
        return f"causal product over {show_legs([self.key])[0]}"


class CausalProductForm(ABC):
    """A way to compute a causal product; `name` is its row in the candidate table."""

    name: ClassVar[str]

    @abstractmethod
    def refusal(self, ctx: Lowering, site: CausalSite) -> str | None:
        """Why the form does not apply (cheap: nothing emitted), or None."""

    @abstractmethod
    def emit(self, ctx: Lowering, site: CausalSite, var: str | None) -> Value:
        """Emit the form's steps through `ctx` and return the product. May raise FormRefusedError."""


class MaskedProduct(CausalProductForm):
    name = "masked"

    def refusal(self, ctx: Lowering, site: CausalSite) -> str | None:
        return None

    def emit(self, ctx: Lowering, site: CausalSite, var: str | None) -> Value:
        """Under autocast in float32 where a decay weighs the sum (as the chunks are)."""
        decayed = any(leaf.decay is not None for leaf in site.leaves)
        with ctx.wide(int(decayed)):
            leaves = [masked_decay(ctx, leaf, site.query, site.key) for leaf in site.leaves]
            return contract(ctx, leaves, site.out, site.coefficient, var)


class ChunkedPrefix(CausalProductForm):
    name = "chunked"

    def refusal(self, ctx: Lowering, site: CausalSite) -> str | None:
        for leaf in site.rest:
            if site.query in leaf.legs and site.key in leaf.legs:
                if leaf.decay is None or split_exponent(*leaf.decay, site.query, site.key) is None:
                    return f"{' and '.join(show_legs([site.query, site.key]))} are legs of one factor"
        return None

    def emit(self, ctx: Lowering, site: CausalSite, var: str | None) -> Value:
        """In float32 under autocast, as a normalize box's chunks are: the states are running
        sums over thousands of positions, which bfloat16's 8 significant bits do not carry."""
        with ctx.wide():
            try:
                return causal_contract(ctx, site.query, site.key, site.rest, site.out, site.coefficient, var)
            except NotPrefixSumError as why:
                raise FormRefusedError(str(why)) from None


CAUSAL_PRODUCT_FORMS: list[CausalProductForm] = [MaskedProduct(), ChunkedPrefix()]


def lower_causal_product(
    ctx: Lowering,
    query: str,
    key: str,
    leaves: list[Leaf],
    out: tuple[str, ...],
    coefficient: sympy.Expr,
    var: str | None,
) -> Value:
    """A product with a causal(query, key) factor that sums the key, in the form the objective
    takes (the lowering's `config.causal_product`, which regions.py calls)."""
    return decide_causal_product(ctx, CausalSite(query, key, leaves, out, coefficient), var)


def decide_causal_product(ctx: Lowering, site: CausalSite, var: str | None) -> Value:
    """Weigh every form of a causal product by the one model, emit the one the objective takes
    (the masked product on a tie) and, in the real plan, record the decision."""
    real = not ctx.trialing
    reasons = {form.name: form.refusal(ctx, site) for form in CAUSAL_PRODUCT_FORMS}
    prices: dict[str, Cost] = {}
    for form in CAUSAL_PRODUCT_FORMS:
        if reasons[form.name] is None:
            try:
                prices[form.name] = cost(ctx, lambda f=form: f.emit(ctx, site, None))  # None: the name stays free
            except FormRefusedError as refused:
                reasons[form.name] = refused.reason
    pool = [form for form in CAUSAL_PRODUCT_FORMS if form.name in prices]
    taken = choose(ctx.objective, [(form, prices[form.name]) for form in pool])
    if real:
        candidates = tuple(Candidate(f.name, f.name, prices.get(f.name), reasons[f.name]) for f in CAUSAL_PRODUCT_FORMS)
        ctx.choices.append(BoxChoice(site.describe(), ctx.objective, candidates, taken.name))
        for form in CAUSAL_PRODUCT_FORMS:
            if form is taken:
                continue
            if form.name in prices:
                how = worse(ctx.objective, prices[form.name], prices[taken.name])
                ctx.refuse(f"{site.describe()}: {form.name} refused: {how} {taken.name}")
            else:
                ctx.refuse(f"{site.describe()}: {form.name} refused: {reasons[form.name]}")
        if taken.name != MaskedProduct.name:
            ctx.lowered.append(f"{site.describe()} as prefix sums in chunks")
    return taken.emit(ctx, site, var)


def masked_decay(ctx: Lowering, leaf: Leaf, query: str, key: str) -> Leaf:
    """A decay factor of a causal product as the masked product reads it: its exponent u + w set
    to −inf above the diagonal before the exp, so the future's exp(growth) is never taken (an
    unmasked exp(C[n] − C[m]) overflows where m > n, and inf · 0 is NaN); a segment sum's decay
    (−inf above the diagonal by itself) and any other factor as it is."""
    if leaf.decay is None or has_segment_sum(leaf.decay[0]):
        return leaf
    split = split_exponent(*leaf.decay, query, key)
    if split is None:
        return leaf
    u, w = decay_side(ctx, list(split.u)), decay_side(ctx, list(split.w))
    exponent = combine(ctx, "sum", [(1, u), (1, w)], union_legs(u, w), None)
    value = masked_decay_exp(ctx, exponent, query, key, "the decay")
    return Leaf(value.legs, value=value)  # type: ignore[union-attr]
