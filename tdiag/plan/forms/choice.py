"""The walk over a region's boxes: each box becomes a `BoxSite`, every form is asked whether it
applies, those that do are costed by the one model (cost.py), and one is taken:

1. a form the user asked for by an option (`Form.asked`: FlexAttention under `attention="flex"`)
   is taken wherever it applies;
2. else under objective `memory` a fused attention form (`Form.fused`: SDPA, FlexAttention) is
   taken wherever one applies, since it never stores the box (MGK P17 multiplies the value
   contraction by M but keeps no N²·M scores);
3. else, and among those, the objective's order of the costs decides (`choose`), ties going
   to the form listed first in FORMS.

A causal mask forcing the grouped SDPA form is the folded form's refusal (forms/sdpa.py). The
real plan records each decision (`BoxChoice`, in `Plan.choices`) and notes the rewrites taken
and refused; trial plans record nothing."""

from __future__ import annotations

from collections.abc import Sequence

import sympy

from ..chooser import Cost, choose, worse
from ..context import Leaf, Lowering
from ..regions import contract
from ..score_maps import MAPPED, match_map
from ..sdpa_match import fusable
from .base import BoxChoice, BoxSite, Candidate, Form, FormRefusedError, Unfit
from .cost import cost
from .sdpa_sink import SINK

ASKED = "asked for"
MEMORY = "objective memory takes a fused attention wherever one applies (it never stores the box)"


def resolve_boxes(ctx: Lowering, leaves: list[Leaf], out: tuple[str, ...], forms: Sequence[Form]) -> list[Leaf]:
    """The region's leaves with each box leaf replaced by the form taken for it."""
    while any(leaf.box is not None for leaf in leaves):
        k = next(i for i, leaf in enumerate(leaves) if leaf.box is not None)
        box, ren = leaves[k].box  # type: ignore[misc]
        others = leaves[:k] + leaves[k + 1 :]
        site = BoxSite(box, ren, k, others, out)
        if box.is_exp:
            match = fusable(ctx, box, ren, leaves[k], others, out)
            mapped = match_map(ctx, box, ren, leaves[k], others, out) if isinstance(match, str) else None
            if mapped is not None:  # FlexAttention and the banded form apply a map of the scores (score_maps.py)
                site.mismatch = MAPPED
                site.found[MAPPED] = mapped
            elif isinstance(match, str):
                site.mismatch = match
            elif box.sink is not None:  # only the sink form reads a sink (forms/sdpa_sink.py)
                site.mismatch = SINK
                site.found[SINK] = match
            else:
                site.attention = match
        leaves = decide(ctx, site, forms)
    return leaves


def decide(ctx: Lowering, site: BoxSite, forms: Sequence[Form]) -> list[Leaf]:
    """Weigh every form at `site`, emit the one taken and return the region's leaves."""
    real = not ctx.trialing
    reasons = {form.name: form.refusal(ctx, site) for form in forms}
    applicable = [form for form in forms if reasons[form.name] is None]
    prices: dict[str, Cost] = {}
    if real or len(applicable) > 1:  # a trial plan with one way to go needs no prices
        for form in applicable:
            try:
                prices[form.name] = cost(ctx, lambda f=form: _contracted(ctx, f, site))
            except FormRefusedError as refused:
                reasons[form.name] = refused.reason
        applicable = [form for form in applicable if form.name in prices]
    pool, rule = applicable, None
    asked = [form for form in applicable if form.asked(ctx)]
    fused = [form for form in applicable if form.fused]
    if asked:
        pool, rule = asked, f"{asked[0].label(site)} {ASKED}"
    elif ctx.objective == "memory" and fused:
        pool, rule = fused, MEMORY
    if len(pool) == 1:
        taken = pool[0]
    else:
        taken = choose(ctx.objective, [(form, prices[form.name]) for form in pool])
    if real:
        candidates = tuple(Candidate(f.name, f.label(site), prices.get(f.name), reasons[f.name]) for f in forms)
        ctx.choices.append(BoxChoice(site.describe(), ctx.objective, candidates, taken.name, rule))
        _note_refused(ctx, site, forms, taken, pool, prices, reasons, rule)
    try:
        return taken.emit(ctx, site)
    except FormRefusedError as refused:  # found on trial when it was costed: not taken then
        raise AssertionError(f"{taken.name} refused after it was taken: {refused.reason}") from None


def _contracted(ctx: Lowering, form: Form, site: BoxSite) -> None:
    contract(ctx, form.emit(ctx, site), site.out, sympy.Integer(1), None)


def _note_refused(ctx, site: BoxSite, forms, taken: Form, pool, prices, reasons, rule: str | None) -> None:
    """The plan's notes of rewrites refused, derived from the choice: a form that does not apply
    says why (unless it is made for other boxes), one that lost says how it compares with the
    form taken, or which rule passed it over."""
    where = site.describe()
    for form in forms:
        if form is taken or not form.rewrite:
            continue
        reason = reasons[form.name]
        if reason is not None:
            if not isinstance(reason, Unfit):
                ctx.refuse(f"{where}: {form.label(site)} refused: {reason}")
            continue
        if form in pool:
            how = worse(ctx.objective, prices[form.name], prices[taken.name])
            ctx.refuse(f"{where}: {form.label(site)} refused: {how} {taken.label(site)}")
        else:
            ctx.refuse(f"{where}: {form.label(site)} refused: {rule}")
