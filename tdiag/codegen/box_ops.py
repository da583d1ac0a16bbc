"""The printers of a softmax box's lowered forms (plan/box_ops.py): chunks and their prefix
states, bands, the masks of scaled_dot_product_attention, the SDPA and FlexAttention calls with
FlexAttention's score_mod terms and block mask. They register on ops.op_code."""

from __future__ import annotations

import sympy

from ..plan.program import (
    Attention,
    BandBlocks,
    BandMask,
    BlockMask,
    ChunkEdge,
    DecayedPrefix,
    FlexAttention,
    JoinChunks,
    LiveRows,
    PrefixSum,
    ScoreArgument,
    ScoreArith,
    ScoreIndex,
    ScoreMap,
    ScoreMask,
    ScoreNumber,
    ScoreRead,
    SplitChunks,
    Triangle,
    VisibleMask,
)
from .ops import hidden_code, integer_position, map_code, op_code, read_code, var_code
from .text import expr_code, scalar_code, sizes_code, source


@op_code.register
def _(op: PrefixSum, attributes: frozenset[str]) -> str:
    return f"_earlier({var_code(op.x, attributes)}, {op.axis})"


@op_code.register
def _(op: Triangle, attributes: frozenset[str]) -> str:
    like = var_code(op.like, attributes)
    return f"torch.ones({op.size}, {op.size}, dtype={like}.dtype, device={like}.device).tril()"


@op_code.register
def _(op: SplitChunks, attributes: frozenset[str]) -> str:
    count = expr_code(op.count)
    if op.edge:
        x = var_code(op.x, attributes)
        positions = f"torch.arange({count} * {op.size}, device={x}.device).clamp(max={expr_code(op.length)} - 1)"
        return f"{x}.index_select({op.axis}, {positions}).unflatten({op.axis}, ({count}, {op.size}))"
    pads = "0, 0, " * op.trailing + f"0, {count} * {op.size} - {expr_code(op.length)}"
    return f"torch.nn.functional.pad({var_code(op.x, attributes)}, ({pads})).unflatten({op.axis}, ({count}, {op.size}))"


@op_code.register
def _(op: BandBlocks, attributes: frozenset[str]) -> str:
    count, length = expr_code(op.count), expr_code(op.length)
    tail = op.width - op.size - op.lead
    pads = "0, 0, " * op.trailing + f"{op.lead}, {count} * {op.size}{f' + {tail}' if tail else ''} - {length}"
    padded = f"torch.nn.functional.pad({var_code(op.x, attributes)}, ({pads}))"
    return f"{padded}.unfold({op.axis}, {op.width}, {op.size}).movedim(-1, {op.axis + 1}).contiguous()"


@op_code.register
def _(op: BandMask, attributes: frozenset[str]) -> str:
    device = f"device={source(op.like, 'name')}.device" if op.like else "device=None"
    count, length = expr_code(op.count), expr_code(op.length)
    query = f"torch.arange({count} * {op.size}, {device}).view({count}, {op.size}, 1)"
    key = (
        f"(torch.arange({count}, {device}).view({count}, 1, 1) * {op.size}"
        f" + torch.arange({op.width}, {device}) - {op.before - 1})"
    )
    return (
        f"(lambda i, j: ((j - i <= -{op.before}) | (j - i >= {op.after}) | (j < 0) | (j >= {length}))"
        f" & (i < {length}))({query}, {key})"
    )


@op_code.register
def _(op: ChunkEdge, attributes: frozenset[str]) -> str:
    return f"{var_code(op.x, attributes)}.select({op.axis}, {-1 if op.last else 0})"


@op_code.register
def _(op: DecayedPrefix, attributes: frozenset[str]) -> str:
    start, end = read_code(op.start, attributes), read_code(op.end, attributes)
    return f"_decayed_earlier({var_code(op.x, attributes)}, {start}, {end}, {op.axis})"


@op_code.register
def _(op: JoinChunks, attributes: frozenset[str]) -> str:
    p = op.position
    return f"{read_code(op.x, attributes)}.flatten({p}, {p + 1}).narrow({p}, 0, {expr_code(op.length)})"


@op_code.register
def _(op: VisibleMask, attributes: frozenset[str]) -> str:
    return f"{read_code(op.causal, attributes)}.expand({sizes_code(op.sizes)}).reshape({expr_code(op.rows)}, -1)"


@op_code.register
def _(op: ScoreMask, attributes: frozenset[str]) -> str:
    like = var_code(op.like, attributes)
    terms = [read_code(b, attributes) for b in op.bias]
    if not op.hidden:
        code = " + ".join(terms)
    elif terms:  # where, not a sum: a hidden score passes no gradient to the bias
        code = f"torch.where({hidden_code(op.hidden, attributes)}, torch.finfo({like}.dtype).min, {' + '.join(terms)})"
    else:
        code = f"{hidden_code(op.hidden, attributes)}.to({like}.dtype) * torch.finfo({like}.dtype).min"
    if op.future is not None:
        future = read_code(op.future, attributes)
        base = code or f"torch.zeros((), dtype={like}.dtype, device={like}.device)"
        code = f'torch.where({future}, float("-inf"), {base})'
    return code


@op_code.register
def _(op: LiveRows, attributes: frozenset[str]) -> str:
    return f"~{hidden_code(op.hidden, attributes)}.all(-1, keepdim=True)"


@op_code.register
def _(op: Attention, attributes: frozenset[str]) -> str:
    q, k, v = (read_code(x, attributes) for x in (op.q, op.k, op.v))
    if op.bias is not None:
        q = f"torch.nn.functional.pad({q}, (0, 1), value=1.0)"
        k = f"torch.cat([{k}, {read_code(op.bias, attributes)}.unsqueeze(-1)], -1)"
    if op.pad_value and op.sink is None:  # beside a sink, _sink_attention pads v once
        v = f"torch.nn.functional.pad({v}, (0, {op.pad_value}))"
    if op.pad_query_key:
        q = f"torch.nn.functional.pad({q}, (0, {op.pad_query_key}))"
        k = f"torch.nn.functional.pad({k}, (0, {op.pad_query_key}))"
    if op.repeat != 1:
        q = f"{q}.repeat_interleave({expr_code(op.repeat)}, dim=-2)"
    mask = ", is_causal=True" if op.causal else ""
    if op.mask is not None:
        mask = f", attn_mask={var_code(op.mask, attributes)}"
    if op.grouped:
        mask += ", enable_gqa=True"
    call = f"torch.nn.functional.scaled_dot_product_attention({q}, {k}, {v}, scale={scalar_code(op.scale)}{mask})"
    if op.sink is not None:
        call = f"_sink_attention({q}, {k}, {v}, {read_code(op.sink, attributes)}, scale={scalar_code(op.scale)}{mask})"
    if op.repeat != 1:
        call += f"[..., {expr_code(op.repeat - 1)}::{expr_code(op.repeat)}, :]"
    call = _live_rows(op, call, v, attributes)
    if op.width is not None:
        call += f"[..., :{op.width}]"
    if op.shape is not None:
        call = f"({call}).reshape({sizes_code(op.shape)})"
    return call


@op_code.register
def _(op: FlexAttention, attributes: frozenset[str]) -> str:
    # dense (batch, heads, positions, features): torch 2.13's CPU kernel under torch.compile has
    # no choice for the permuted views of a projection's output (NoValidChoicesError)
    arguments = [f"{read_code(x, attributes)}.contiguous()" for x in (op.q, op.k, op.v)]
    score, b, h, q, kv = (source(name, "name") for name in op.arguments)
    body = score if op.score is None else f"{score} + {_score_term(op.score, score, attributes)}"
    if op.mapped:  # a map of the scores: score_mod's value is the term, which reads the score
        body = _score_term(op.score, score, attributes)
    visible = [_score_read(r, attributes) for r in op.visible]
    if visible:  # padded scores at the lowest number, as the materialized box: never an empty row
        body = f"torch.where({' & '.join(visible)}, {body}, torch.finfo({score}.dtype).min)"
    if op.causal:  # the future (outside a window) at -inf, even in a row whose past is all padding
        body = f'torch.where({_band(q, kv, op.window)}, {body}, float("-inf"))'
    if body != score:
        arguments.append(f"score_mod=lambda {score}, {b}, {h}, {q}, {kv}: {body}")
    if op.block_mask is not None:
        arguments.append(f"block_mask={var_code(op.block_mask, attributes)}")
    arguments.append(f"scale={scalar_code(op.scale)}")
    if op.grouped:
        arguments.append("enable_gqa=True")
    call = _live_rows(op, f"flex_attention({', '.join(arguments)})", arguments[2], attributes)
    return call if op.shape is None else f"{call}.reshape({sizes_code(op.shape)})"


def _live_rows(op: Attention | FlexAttention, call: str, v: str, attributes: frozenset[str]) -> str:
    """The fused call where a row keeps a visible key, else the mean of the values (LiveRows)."""
    if op.live is None:
        return call
    mean = f"{v}.mean(-2, keepdim=True)"
    if op.future is not None:  # the values the row may see: its past and itself
        seen = f"(~{read_code(op.future, attributes)}).to({v}.dtype)"
        # (vᵀ seenᵀ)ᵀ with v's batch folded into one matrix: the product keeps only the
        # [queries, keys] matrix for backward, not a copy of it per head
        seen_sum = f"({v}.mT.flatten(0, -2) @ {seen}.mT).unflatten(0, {v}.mT.shape[:-1]).mT"
        if op.future.index is not None or len(op.future.value.legs) != 2:  # read over every group
            seen_sum = f"({seen} @ {v})"
        mean = f"({seen_sum} / {seen}.sum(-1, keepdim=True))"
    if op.group != 1:
        mean += f".repeat_interleave({expr_code(op.group)}, dim=-3)"
    return f"torch.where({var_code(op.live, attributes)}, {call}, {mean})"


@op_code.register
def _(op: BlockMask, attributes: frozenset[str]) -> str:
    b, h, q, kv = (source(name, "name") for name in op.arguments)
    device = f"{source(op.like, 'name')}.device" if op.like else "None"
    mask = f"lambda {b}, {h}, {q}, {kv}: {_band(q, kv, op.window)}"
    return f"create_block_mask({mask}, None, None, {expr_code(op.queries)}, {expr_code(op.keys)}, device={device})"


def _band(q: str, kv: str, window: tuple[sympy.Expr, sympy.Expr] | None) -> str:
    """Python for "key kv visible from query q": kv ≤ q, or inside a window q − before < kv < q + after."""
    if window is None:
        return f"{q} >= {kv}"
    before, after = (expr_code(w) for w in window)
    return f"({q} - {kv} < {before}) & ({kv} - {q} < {after})"


def _score_term(term, score: str, attributes: frozenset[str]) -> str:
    """A score_mod term as Python over the kernel's index arguments, in the dtype of `score`."""
    if isinstance(term, ScoreRead):
        return _score_read(term, attributes)
    if isinstance(term, ScoreIndex):
        return f"{_score_position(term.position)}.to({score}.dtype)"
    if isinstance(term, ScoreNumber):
        return scalar_code(term.value)
    if isinstance(term, ScoreArgument):
        return score
    if isinstance(term, ScoreMap):
        return f"({map_code(term.name, f'({_score_term(term.x, score, attributes)})', term.params)})"
    if isinstance(term, ScoreArith):
        left, right = _score_term(term.left, score, attributes), _score_term(term.right, score, attributes)
        return f"({left} {term.op} {right})"
    raise TypeError(f"no Python for {type(term).__name__}")


def _score_read(read: ScoreRead, attributes: frozenset[str]) -> str:
    index = ", ".join(_score_position(p) for p in read.index)
    return f"{var_code(read.value, attributes)}[{index}]" if index else var_code(read.value, attributes)


def _score_position(position) -> str:
    """An integer position of the kernel's index arguments (their names are the position's legs)."""
    return integer_position(position, lambda leg: source(leg, "name"))
