"""Causal Σ_{m ≤ n} of a product in chunks: a masked C×C product within a chunk and an
exclusive prefix sum of per-chunk states across them (MGK P12, spec mgk §6.6)."""

from __future__ import annotations

import itertools

import sympy

from .base import _Leaf, _renamed
from .program import (
    BATCH,
    JoinChunks,
    Operand,
    PrefixSum,
    SplitChunks,
    Step,
    Triangle,
    Value,
    show_legs,
)

CHUNK_SIZES = (4, 8, 16, 32, 64, 128, 256)  # the chunk sizes tried, each a power of two
# the largest chunk size whose cost is within this factor of the least is taken: the roofline
# estimate misses much of what many small chunks cost (an add per chunk in the exclusive prefix
# sum, small matmuls below the device's peak; lfish at N = 4096 runs 1.2x slower at C = 32 than
# at C = 64, estimated 1.5% faster), and FLOPs fall as C shrinks down to a few positions
# (C = 4 at N = 4096 is 1,024 chunks)
TIME_SLACK = 1.05
FLOPS_SLACK = 1.1
# where a factor carrying neither the query nor the key leg may go: in both the within-chunk
# product and the query side of the across-chunk one, in the key side's per-chunk state, or
# applied once to the sum of the two parts (a factor common to both, contracted once: a core
# C[r s] in THSA's denominator)
PLACEMENTS = ("both", "state", "after")


def _cost(cost: float, objective: str) -> str:
    """A trial's cost for the plan note: seconds under `time` (3 significant digits), else FLOPs."""
    return f"{cost:.3g}" if objective == "time" else f"{int(cost):,}"


class NotPrefixSumError(Exception):
    """A causal box whose query and key legs meet on one factor: Σ_{m ≤ n} of it is no prefix
    sum (the factor is not split into a query side and a key side); its caller refuses the rewrite."""


class ChunkedCausal:
    """Evaluates causal prefix sums of products in chunks (MGK P12, spec mgk §6.6)."""

    def causal_contract(
        self, query: str, key: str, leaves: list[_Leaf], out: tuple[str, ...], coefficient: sympy.Expr, var: str | None
    ) -> Value:
        """Σ_{m ≤ n} of a product, chunked (causal linear attention in O(N·C + N·D·E/C)): both
        legs split into chunks of C; within a chunk the product is masked by a C×C triangle,
        across chunks the key side is summed per chunk into a state whose exclusive prefix sum
        over chunks the query side reads (MGK P12, spec mgk §6.6; Katharopoulos et al. §3.3).
        C is chosen by the objective on trial (`choose_chunk_size`) at the pair's first
        contraction and shared by the later ones (the numerator's and the denominator's)."""
        leaves = self.resolve_boxes(leaves, out)
        if any(query in leaf.legs and key in leaf.legs for leaf in leaves):
            raise NotPrefixSumError(f"{' and '.join(show_legs([query, key]))} are legs of one factor")
        if (query, key) not in self.chunk_pairs:
            self.choose_chunk_size(query, key, leaves, out, coefficient, var)
        return self.cheapest_chunked(query, key, leaves, out, coefficient, var)

    def choose_chunk_size(
        self, query: str, key: str, leaves: list[_Leaf], out: tuple[str, ...], coefficient: sympy.Expr, var: str | None
    ) -> None:
        """The chunk size C for the pair (query, key): of the powers of two from 4 to 256 (none
        above the planned length's), the one whose chunked contraction costs least under the
        objective: the largest within TIME_SLACK of the least estimated time (FLOPS_SLACK of
        the fewest FLOPs). Larger chunks
        mean fewer, larger matmuls and fewer states to sum over chunks, at C·N entries within
        the chunks: the balance depends on the design's widths. The chunk counts of the sizes
        not taken are forgotten (no run-time binding of them)."""
        planned = self.number(query)
        candidates = [size for size in CHUNK_SIZES if size < 2 * planned] or [CHUNK_SIZES[0]]
        before = set(self.chunk_counts)
        legs, costs = {}, {}
        for size in candidates:
            self.chunk_pairs[(query, key)] = legs[size] = self.chunk_legs(query, key, size)
            costs[size] = self.trial(lambda: self.cheapest_chunked(query, key, leaves, out, coefficient, var))
        slack = TIME_SLACK if self.objective == "time" else FLOPS_SLACK
        least = min(costs.values())
        size = max(c for c in candidates if costs[c] <= slack * least)
        self.chunk_pairs[(query, key)] = legs[size]
        extent = self.runtime(self.size(query))
        for count_key in set(self.chunk_counts) - before - {(extent, size)}:
            symbol = self.chunk_counts.pop(count_key)
            del self.chunk_values[symbol], self.chunk_sizes[symbol]
        measure = "least estimated time (s)" if self.objective == "time" else "fewest FLOPs"
        tried = ", ".join(f"{c}: {_cost(costs[c], self.objective)}" for c in candidates)
        self.chunk_notes[(query, key)] = (
            f"causal prefix sums over {show_legs([query])[0]} in chunks of C = {size},"
            f" the largest within {slack}× the {measure} of the first contraction over them at C = {tried}"
        )

    def cheapest_chunked(self, query, key, leaves, out, coefficient, var) -> Value:
        """chunked_contract with each factor carrying neither leg placed where the objective's
        cost is least, over every combination of PLACEMENTS for up to two such factors, of the
        first two for up to four (as many trials as the planning time allows, each size of
        chunk tried over them); more stay in both parts."""
        free = [leaf for leaf in leaves if key not in leaf.legs and query not in leaf.legs]
        places = PLACEMENTS if len(free) <= 2 else PLACEMENTS[:2] if len(free) <= 4 else PLACEMENTS[:1]
        choices = itertools.product(places, repeat=len(free))
        best, best_cost = {}, None
        for choice in choices:
            placed = dict(zip(map(id, free), choice, strict=True))
            cost = self.trial(lambda p=placed: self.placed_contract(query, key, leaves, p, out, coefficient, var))
            if best_cost is None or cost < best_cost:
                best, best_cost = placed, cost
        if self.target is self.steps and (query, key) in self.chunk_notes:
            note = self.chunk_notes[(query, key)]
            if note not in self.lowered:
                self.lowered.append(note)
        return self.placed_contract(query, key, leaves, best, out, coefficient, var)

    def placed_contract(self, query, key, leaves, placed, out, coefficient, var) -> Value:
        """chunked_contract of `leaves` with the free factors placed as `placed` (by id) says."""
        joined = [leaf for leaf in leaves if placed.get(id(leaf)) == "state"]
        after = [leaf for leaf in leaves if placed.get(id(leaf)) == "after"]
        return self.chunked_contract(query, key, leaves, joined, out, coefficient, var, after)

    def chunked_contract(self, query, key, leaves, joined, out, coefficient, var, after=()) -> Value:
        """causal_contract with the factors `joined` (carrying neither leg) in the key side's
        state and the factors `after` applied once to the sum of the within- and across-chunk
        parts."""
        chunks, within_query, within_key, size = self.chunk_pairs[(query, key)]
        rename = {query: (chunks, within_query), key: (chunks, within_key)}
        chunked = [self.chunk_leaf(leaf, rename) for leaf in leaves if all(leaf is not a for a in after)]
        leaves = [leaf for leaf in leaves if all(leaf is not a for a in after)]
        out_chunked = tuple(p for leg in out for p in rename.get(leg, (leg,)))
        final = out_chunked
        if after:
            inner = {g for leaf in chunked for g in leaf.legs}
            out_chunked = (
                *out_chunked,
                *dict.fromkeys(g for a in after for g in a.legs if g in inner and g not in final),
            )
        some = self.leaf_value(chunked[0])
        triangle = self.names.fresh("triangle")
        self.emit(
            Step(
                "const",
                Triangle(size, some),
                Value(triangle, (within_query, within_key)),
                "causal triangle within a chunk",
            )
        )
        mask = _Leaf((within_query, within_key), value=Value(triangle, (within_query, within_key)))
        within = self.contract([*chunked, mask], out_chunked, coefficient, None)
        key_side = [c for c, leaf in zip(chunked, leaves, strict=True) if key in leaf.legs or leaf in joined]
        rest = [c for c in chunked if c not in key_side]
        needed = set(out_chunked) | {leg for leaf in rest for leg in leaf.legs}
        state_legs = tuple(
            dict.fromkeys(leg for leaf in key_side for leg in leaf.legs if leg in needed or leg in (chunks, BATCH))
        )
        state = self.contract(key_side, state_legs, sympy.Integer(1), None)
        name = self.names.fresh("earlier")
        axis = state.legs.index(chunks)
        earlier = self.emit(
            Step(
                "prefix",
                PrefixSum(state, axis),
                Value(name, state.legs, state.broadcast),
                f"state of the earlier chunks: exclusive prefix sum over {show_legs([chunks])[0]} (causal)",
                (chunks,),
                flops=self.numel(state.legs),
                inputs=(state,),
            )
        )
        across = self.contract([*rest, _Leaf(earlier.legs, value=earlier)], out_chunked, coefficient, None)  # type: ignore[union-attr]
        total = self.combine("sum", [(1, within), (1, across)], out_chunked, None)
        if after:
            total = self.contract([_Leaf(total.legs, value=total), *after], final, sympy.Integer(1), None)
        order = [leg for leg in total.legs if leg != within_query]
        position = order.index(chunks)
        order.insert(position + 1, within_query)
        permutation = None
        if list(total.legs) != order:
            permutation = tuple(total.legs.index(leg) for leg in order)
        legs = tuple(query if leg == chunks else leg for leg in order if leg != within_query)
        name = self.names.fresh(var or "causal_sum")
        return self.emit(
            Step(
                "view",
                JoinChunks(Operand(total, permutation), position, self.runtime(self.size(query))),
                Value(name, legs, total.broadcast),
                "chunks joined",
                inputs=(total,),
            )
        )  # type: ignore[return-value]

    def chunk_legs(self, query: str, key: str, size: int) -> tuple[str, str, str, int]:
        """Legs for chunks of `size` positions: the chunk count, a run-time ⌈N / C⌉ bound in
        forward, and the query's and key's position within a chunk."""
        planned = self.number(query)
        extent = self.runtime(self.size(query))
        count_key = (extent, size)
        if count_key not in self.chunk_counts:
            var = self.names.fresh(f"chunks_{size}")
            symbol = sympy.Symbol(var, positive=True, integer=True)
            self.chunk_counts[count_key] = symbol
            self.chunk_values[symbol] = sympy.Integer(-(-int(planned) // size))
            self.chunk_sizes[symbol] = self.size(query) / size
        legs = (
            self.new_leg("chunk", self.chunk_counts[count_key]),
            self.new_leg(query, sympy.Integer(size)),
            self.new_leg(key, sympy.Integer(size)),
        )
        return (*legs, size)

    def chunk_leaf(self, leaf: _Leaf, rename: dict[str, tuple[str, str]]) -> _Leaf:
        """A factor with its query or key leg split into (chunk, position within the chunk),
        zero-padded to whole chunks (zeros add nothing to a sum)."""
        legs = tuple(p for leg in leaf.legs for p in rename.get(leg, (leg,)))
        split = [leg for leg in leaf.legs if leg in rename]
        if not split:
            return leaf
        (leg,) = split
        value = self.leaf_value(leaf)
        chunks, within = rename[leg]
        key = ("chunk", value.var, value.legs.index(leg), len(value.legs), chunks, within)
        if key not in self.memo:
            self.memo[key] = (self.chunk_value(value, leg, chunks, within), value.legs)
        chunked, earlier = self.memo[key]
        return _Leaf(legs, value=_renamed(chunked, dict(zip(earlier, value.legs, strict=True))))

    def chunk_value(self, value: Value, leg: str, chunks: str, within: str) -> Value:
        """`value` with `leg` split into (chunks, within), zero-padded to whole chunks."""
        legs = tuple(p for old in value.legs for p in ((chunks, within) if old == leg else (old,)))
        if leg in value.broadcast:
            return Value(value.var, legs, (value.broadcast - {leg}) | {chunks, within})
        physical = [old for old in value.legs if old not in value.broadcast]
        axis = physical.index(leg)
        size = self.number(within)
        split = SplitChunks(
            value, axis, len(physical) - 1 - axis, self.leg_sizes[chunks], size, self.runtime(self.size(leg))
        )
        name = self.names.fresh(f"{value.var}_chunks")
        return self.emit(
            Step(
                "view",
                split,
                Value(name, legs, value.broadcast),
                f"{show_legs([leg])[0]} in chunks of {size}",
                inputs=(value,),
            )
        )  # type: ignore[return-value]
