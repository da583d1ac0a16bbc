"""FlexAttention (flex.py): the matched box as one flex_attention call whose score_mod computes
the terms of the scores in the kernel. Only when the user asks for it (`attention="flex"`), and
then taken wherever it applies, whatever it costs (`asked`). Several query legs are grouped
over the key heads: the kernel's query index is the position. A map of the scores (Gemma 2's
logit softcap, score_maps.py) is applied in the score_mod."""

from __future__ import annotations

import dataclasses

from ..context import Leaf, Lowering
from ..flex import flex_refusal, fuse_flex
from ..score_maps import MAPPED
from ..sdpa_match import MatchedAttention
from .base import BoxSite, Form, Unfit


def _as_flex(match: MatchedAttention) -> MatchedAttention:
    return dataclasses.replace(match, grouped=len(match.queries) > 1)


class Flex(Form):
    name = "flex"
    fused = True

    def label(self, site: BoxSite) -> str:
        return "FlexAttention"

    def asked(self, ctx: Lowering) -> bool:
        return ctx.attention == "flex"

    def refusal(self, ctx: Lowering, site: BoxSite) -> str | None:
        if site.kind != "softmax":
            return Unfit("a normalize box (FlexAttention fuses a softmax)")
        if not self.asked(ctx):
            return Unfit(f"not asked for (attention={ctx.attention!r})")
        match = site.attention or site.found.get(MAPPED)
        if match is None:
            return site.mismatch
        return flex_refusal(ctx, _as_flex(match))

    def emit(self, ctx: Lowering, site: BoxSite) -> list[Leaf]:
        match = site.attention or site.found[MAPPED]
        return fuse_flex(ctx, site.box, site.ren, site.others, _as_flex(match))
