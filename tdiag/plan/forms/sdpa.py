"""SDPA with the query legs folded into its query rows (sdpa.py): one scaled_dot_product_attention
call over the matched box and its value side. With one query leg this is plain SDPA; with
several (query heads sharing key heads: MQA, GQA) they become the rows of a 3-D or 4-D call,
which runs SDPA's math kernel and keeps the scores (the grouped form, sdpa_grouped.py, does not)."""

from __future__ import annotations

import dataclasses

from ..context import Leaf, Lowering
from ..program import show_legs
from ..sdpa import fuse
from .base import BoxSite, Form, Unfit


class Sdpa(Form):
    name = "sdpa"
    fused = True

    def label(self, site: BoxSite) -> str:
        match = site.attention
        if match is None or len(match.queries) == 1:
            return "SDPA"
        heads = " ".join(show_legs(leg for leg in match.queries if leg != match.sequence))
        return f"SDPA with query heads {heads} folded into the query rows"

    def refusal(self, ctx: Lowering, site: BoxSite) -> str | None:
        if site.kind != "softmax":
            return Unfit("a normalize box (SDPA fuses a softmax)")
        if site.attention is None:
            return site.mismatch
        if len(site.attention.queries) > 1 and site.attention.masks:
            return "a causal mask is no triangle over query rows folded from several legs (the grouped form takes it)"
        return None

    def emit(self, ctx: Lowering, site: BoxSite) -> list[Leaf]:
        match = dataclasses.replace(site.matched(), grouped=False)
        return fuse(ctx, site.box, site.ren, site.others, match)
