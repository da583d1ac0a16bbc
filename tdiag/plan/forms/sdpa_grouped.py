"""SDPA with grouped key heads (sdpa.py, enable_gqa): with several query legs (query heads sharing
key heads: MQA, GQA), the query legs other than the sequence leg go to SDPA's head axis, query
head i reading key head i // G, so that the kernel sees (batch, heads, positions, features) and
a causal mask stays a triangle."""

from __future__ import annotations

import dataclasses

from ..context import Leaf, Lowering
from ..sdpa import fuse
from .base import BoxSite, Form, Unfit


class SdpaGrouped(Form):
    name = "sdpa_grouped"
    fused = True

    def label(self, site: BoxSite) -> str:
        return "SDPA" if site.attention is None else "grouped key heads (enable_gqa)"

    def refusal(self, ctx: Lowering, site: BoxSite) -> str | None:
        if site.kind != "softmax":
            return Unfit("a normalize box (SDPA fuses a softmax)")
        if site.attention is None:
            return site.mismatch
        if len(site.attention.queries) == 1:
            return Unfit("one query leg: no query heads to group over the key heads")
        return None

    def emit(self, ctx: Lowering, site: BoxSite) -> list[Leaf]:
        match = dataclasses.replace(site.matched(), grouped=True)
        return fuse(ctx, site.box, site.ren, site.others, match)
