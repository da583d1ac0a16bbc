"""SDPA with one head width: where the value head size differs from the query and key head size
(differential attention's E = 2D, an MLA value narrower than its keys), torch's CPU flash kernel
refuses the call and its math kernel stores the whole box. Zero features change no score and no
output, so q and k are padded to the value width (or v to the query width, the output sliced
back) and the flash kernel takes the call, at the padded width's FLOPs. The chooser weighs that
against the unpadded call (forms/sdpa.py, forms/sdpa_grouped.py) by the one cost model."""

from __future__ import annotations

import dataclasses

from ..context import Leaf, Lowering
from ..sdpa import fuse
from .base import BoxSite, Form, Unfit


class SdpaPadded(Form):
    name = "sdpa_padded"
    fused = True

    def label(self, site: BoxSite) -> str:
        return "SDPA with q, k and v padded to one head width"

    def refusal(self, ctx: Lowering, site: BoxSite) -> str | None:
        if site.kind != "softmax":
            return Unfit("a normalize box (SDPA fuses a softmax)")
        match = site.attention
        if match is None:
            return site.mismatch
        if match.widened:
            return Unfit("the SDPA forms pad to one head width already (a key bias or several query·key products)")
        if ctx.numel_number(match.latent) == ctx.numel_number(match.features):
            return Unfit("q, k and v have one head width already")
        return None

    def emit(self, ctx: Lowering, site: BoxSite) -> list[Leaf]:
        match = site.matched()
        grouped = len(match.queries) > 1
        return fuse(ctx, site.box, site.ren, site.others, dataclasses.replace(match, grouped=grouped, padded=True))
