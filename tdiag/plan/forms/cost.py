"""One cost model and one chooser for the candidate forms of a box.

`cost` emits a candidate on trial (`ctx.trial()`, a fork of the lowering whose steps are dropped) and prices
the trial steps three ways at the planned sizes: the estimated seconds of a training step on the
planning device (timing.py's roofline, forward and backward), the bytes autograd keeps for
backward (footprint.py: storages first saved by the trial steps) and the FLOPs as the rewrites
count them (base.counted_flops). The chooser (plan/chooser.py) orders priced candidates by the objective:

- `time`:   (time, kept, flops)
- `flops`:  (flops, time)
- `memory`: (kept, time, flops)

and takes the least; of equal ones the first listed (FORMS order), so a choice is stable."""

from __future__ import annotations

from collections.abc import Callable

import sympy

from ..chooser import ORDER, WORSE, Cost, choose, key, worse
from ..context import Lowering
from ..footprint import footprint
from ..trials import counted_flops, estimated_time, program_with


def cost(ctx: Lowering, build: Callable[[], object]) -> Cost:
    """What `build` would cost, emitted after the program so far, without keeping its steps."""
    with ctx.trial() as steps:
        build()
        fp = footprint(program_with(ctx, steps))
        seconds = estimated_time(ctx, steps, fp)
        start = len(ctx.steps)
        first: dict[int, int] = {}
        for k, record in enumerate(fp.steps):
            for storage in record.saved:
                first.setdefault(storage, k)
        kept = sympy.Add(*(fp.storages[s].bytes for s in fp.saved if first.get(s, -1) >= start))
        return Cost(seconds, ctx.at_planned_sizes(kept), counted_flops(ctx, steps))


__all__ = ["ORDER", "WORSE", "choose", "cost", "key", "worse"]
