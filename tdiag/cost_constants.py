"""The numbers a plan chooses that are not the design's sizes, named, so that a cost formula
reads in the design's sizes with a legend line for each (`C = 64`, what it is, what chose it)
rather than as `128*D*H*N`. The chunk C of a chunked causal order (plan/chunked.py) and the query
block C of a banded window (forms/banded.py) enter a step's count through the sizes of its legs:
a position within a chunk (C), the chunk count (N / C), a block's keys (C + W − 1). A count that
is a number times the product of the sizes of the legs its step runs over is written again with
those sizes named; a count of another shape keeps its numbers. Either way it equals the executed
count at the plan's constants. A fused causal kernel's block K (SDPA's 512, FlexAttention's 128)
enters kernel_flops as min(K, N)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import sympy

from .ir import WindowMask, walk
from .plan import Plan, Step
from .plan.program import FLEX_BLOCK, SDPA_KEY_BLOCK, BandBlocks, BandMask, ChunkCount, executed_flops, reads

CHUNK_NOTE = re.compile(r"causal prefix sums over (?P<leg>\S+) in chunks of C = (?P<size>\d+), (?P<why>.*)$")
BAND_NOTE = re.compile(r"softmax box over (?P<leg>.+) in blocks of C = (?P<size>\d+) queries")
BAND_RULE = "planner: the largest power of two at most half the window, 16 to 256"
# the block at whose grain a fused causal kernel skips the keys above the diagonal, by step kind
KERNEL_BLOCKS = {
    "sdpa": (SDPA_KEY_BLOCK, "the key block of the CPU flash kernel, at which is_causal skips keys", "torch's kernel"),
    "flex": (FLEX_BLOCK, "the block of FlexAttention's block mask, at which it skips keys", "create_block_mask"),
}


@dataclass(frozen=True)
class PlannerConstant:
    """A number the planner chose, its symbol in the formulas, what it is and what chose it."""

    symbol: sympy.Symbol
    value: int
    meaning: str
    chosen_by: str

    def legend(self) -> str:
        """`C = 64: the chunk of the chunked causal order over n (planner: ...)`."""
        return f"{self.symbol} = {self.value}: {self.meaning} ({self.chosen_by})"

    def as_dict(self) -> dict[str, object]:
        return {"symbol": str(self.symbol), "value": self.value, "meaning": self.meaning, "chosen_by": self.chosen_by}


@dataclass(frozen=True)
class Naming:
    """The plan's constants and, for each leg whose size holds one, that size with it named."""

    constants: tuple[PlannerConstant, ...] = ()
    sizes: Mapping[str, sympy.Expr] = field(default_factory=dict)  # leg -> its size, constants named
    planned: Mapping[str, sympy.Expr] = field(default_factory=dict)  # leg -> its size in the plan
    blocks: Mapping[str, PlannerConstant] = field(default_factory=dict)  # step kind -> its kernel's block

    def named(self, count: sympy.Expr, spaces: Iterable[Sequence[str]]) -> sympy.Expr:
        """`count` with the constants named, where it is a number times the product of the
        sizes of one of `spaces` (the legs a step runs over); else `count`. Where several fit
        (a leg of C entries is a number too), the one with the simplest number per entry is
        taken: 2 per multiply-add over every leg of a contraction, not 2·C over its result's
        legs, which would hide the C of the legs it sums."""
        count = sympy.sympify(count)
        if count == 0 or not self.sizes:
            return count
        fits = []
        for legs in spaces:
            if not any(leg in self.sizes for leg in legs):
                continue
            ratio = sympy.cancel(count / sympy.Mul(*(self.planned[leg] for leg in legs)))
            if ratio.is_Rational:
                fits.append((abs(ratio.p) + ratio.q, ratio, legs))
        if not fits:
            return count
        _, ratio, legs = min(fits, key=lambda fit: fit[0])
        return ratio * sympy.Mul(*(self.leg_size(leg) for leg in legs))

    def kernel_share(self, step: Step) -> sympy.Expr:
        """The share of a fused step's FLOPs its kernel does, (L + min(b, L)) / 2L under a
        causal mask, with the kernel's block b named."""
        share = executed_flops(step) / step.flops
        block = self.blocks.get(step.kind)
        if block is None:
            return share
        value = sympy.Integer(block.value)
        return share.replace(
            lambda e: isinstance(e, sympy.Min) and value in e.args,
            lambda e: sympy.Min(block.symbol, *(a for a in e.args if a != value)),
        )

    def leg_size(self, leg: str) -> sympy.Expr:
        """A leg's size with the constants named (the plan's size where none enters it)."""
        return self.sizes.get(leg, self.planned[leg])


def step_spaces(step: Step) -> list[tuple[str, ...]]:
    """The legs a step may run over: every leg it reads or writes, its result's, each operand's."""
    values = [*([step.out] if step.out is not None else []), *reads(step.op)]
    every = tuple(dict.fromkeys((*[leg for v in values for leg in v.legs], *step.summed)))
    return list(dict.fromkeys([every, *(tuple(v.legs) for v in values)]))


def naming(plan: Plan) -> Naming:
    """The chunk of each chunked causal order or banded window of the plan as a symbol no design
    size uses (`C`, else `C_1`, `C_2`, ...), with the legs whose sizes it enters, and each fused
    causal kernel's block (`K`)."""
    used = set(plan.graph.sizes)
    constants: list[PlannerConstant] = []
    sizes: dict[str, sympy.Expr] = {}
    for chunk in plan.chunks:
        symbol = _fresh_symbol(used)
        used.add(str(symbol))
        positions, counts = _chunk_legs(plan, chunk)
        if not positions and not counts:
            continue
        bands = _band_legs(plan, chunk, counts)
        if bands:
            reach = _window_reach(plan, chunk)
            constants.append(_band_constant(plan, chunk, symbol, reach))
            sizes |= {leg: symbol + (width - chunk.size if reach is None else reach) for leg, width in bands.items()}
        else:
            constants.append(_chunk_constant(plan, chunk, symbol, positions))
        sizes |= {leg: symbol for leg in positions}
        sizes |= {leg: plan.leg_sizes[leg] * chunk.size / symbol for leg in counts}
    blocks = {}
    for kind, (value, meaning, chosen_by) in KERNEL_BLOCKS.items():
        if any(_skips_at(step, value) for step in plan.steps if step.kind == kind):
            symbol = _fresh_symbol(used, "K")
            used.add(str(symbol))
            blocks[kind] = PlannerConstant(symbol, value, meaning, chosen_by)
    constants += blocks.values()
    return Naming(tuple(constants), sizes, dict(plan.leg_sizes), blocks)


def _skips_at(step: Step, block: int) -> bool:
    """Whether a fused step's kernel skips masked keys at the grain of `block` (a min(block, L))."""
    if step.kernel_flops is None:
        return False
    share = sympy.sympify(step.kernel_flops / step.flops)
    return any(sympy.Integer(block) in e.args for e in share.atoms(sympy.Min))


def _fresh_symbol(used: set[str], base: str = "C") -> sympy.Symbol:
    """`base`, else `base_1`, `base_2`, ...: the first no design size (nor constant) uses."""
    name = (
        base if base not in used else next(f"{base}_{k}" for k in range(1, len(used) + 2) if f"{base}_{k}" not in used)
    )
    return sympy.Symbol(name, positive=True, integer=True)


def _chunk_legs(plan: Plan, chunk: ChunkCount) -> tuple[list[str], list[str]]:
    """The legs of positions within a chunk (size C, split off a leg of the chunked extent) and
    the legs that count chunks (size extent / C, or the run-time count's symbol)."""
    count = sympy.Symbol(chunk.name, positive=True, integer=True)
    positions, counts = [], []
    for leg, size in plan.leg_sizes.items():
        size = sympy.sympify(size)
        if size == count or (size.free_symbols and sympy.expand(size * chunk.size - chunk.extent) == 0):
            counts.append(leg)
        elif size == chunk.size and _split_off(plan, leg, chunk.extent):
            positions.append(leg)
    return positions, counts


def _band_legs(plan: Plan, chunk: ChunkCount, counts: list[str]) -> dict[str, int]:
    """The legs of the keys a block of C queries sees in a banded window form (forms/banded.py):
    C + before + after − 2 of them, by the leg -> its planned width."""
    bands = {}
    for step in plan.steps:
        op = step.op
        if isinstance(op, BandBlocks) and op.size == chunk.size and step.out is not None:
            new = [leg for leg in step.out.legs if leg not in op.x.legs]
            if any(leg in counts for leg in new):
                bands |= {leg: op.width for leg in new if leg not in counts}
    return bands


def _window_reach(plan: Plan, chunk: ChunkCount) -> sympy.Expr | None:
    """before + after − 2 of the window a banded form of blocks of `chunk.size` runs (W − 1 for
    window(n, m, W)) in the design's sizes, where the design has one window of those widths."""
    ops = [s.op for s in plan.steps]
    widths = {(op.before, op.after) for op in ops if isinstance(op, BandMask) and op.size == chunk.size}
    found = set()
    for statement in plan.graph.statements:
        for node in walk(statement.expr):
            for mask in getattr(node, "masks", ()):
                if isinstance(mask, WindowMask):
                    at = tuple(int(plan.graph.evaluate_at(w, plan.sizes)) for w in (mask.before, mask.after))
                    if at in widths:
                        found.add(mask.before + mask.after - 2)
    return found.pop() if len(found) == 1 else None


def _band_constant(plan: Plan, chunk: ChunkCount, symbol: sympy.Symbol, reach: sympy.Expr | None) -> PlannerConstant:
    """The query block of a banded window form: what it is and what chose it."""
    over = next((found["leg"] for note in plan.lowered if (found := BAND_NOTE.match(note))), str(chunk.extent))
    keys = f"{symbol} + {sympy.sstr(reach)}" if reach is not None else f"{symbol} + before + after − 2"
    meaning = f"the block of queries of the banded window over {over}, each block seeing {keys} keys"
    return PlannerConstant(symbol, chunk.size, meaning, BAND_RULE)


def _split_off(plan: Plan, leg: str, extent: sympy.Expr) -> bool:
    """Whether `leg` is a copy of a leg (its name before the first prime) of size `extent`."""
    root = leg.split("'")[0]
    return root != leg and root in plan.leg_sizes and sympy.expand(plan.leg_sizes[root] - extent) == 0


def _chunk_constant(plan: Plan, chunk: ChunkCount, symbol: sympy.Symbol, positions: list[str]) -> PlannerConstant:
    """The constant of one chunked causal order, what it is and what chose it, from the
    planner's note on it (plan.lowered) where there is one."""
    roots = list(dict.fromkeys(leg.split("'")[0] for leg in positions))
    over = roots[0] if roots else str(chunk.extent)
    why = "planner"
    for note in plan.lowered:
        found = CHUNK_NOTE.match(note)
        if found and int(found["size"]) == chunk.size:
            over, why = found["leg"], f"planner: {found['why'].split(' of the first')[0]}"
            break
    return PlannerConstant(symbol, chunk.size, f"the chunk of the chunked causal order over {over}", why)
