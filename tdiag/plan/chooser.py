"""The one chooser: every comparison of prices the planner, the whole-plan choice and the decoder
make goes through these functions, so a choice is made one way, stably (of equal prices the first
listed is taken), and says why the others lost.

A price is a `Cost` (forms/cost.py's model: the estimated seconds of a training step, the bytes
kept for backward, the FLOPs) compared in an objective's order of figures (ORDER), or a single
figure (the seconds of a plan or a decoding step, a trial's seconds or FLOPs, elements copied).
This module imports nothing of tdiag: every layer of the planner and the runtime can use it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Cost:
    """What a candidate costs in one model (forms/cost.py): the estimated seconds of a training
    step on the planning device (timing.py), the bytes autograd keeps for backward (footprint.py),
    and the FLOPs as the rewrites count them, all at the planned sizes."""

    time: float
    kept: float
    flops: int


ORDER: dict[str, tuple[str, ...]] = {
    "time": ("time", "kept", "flops"),
    "flops": ("flops", "time"),
    "memory": ("kept", "time", "flops"),
}
WORSE = {"time": "is estimated slower than", "kept": "keeps more for backward than", "flops": "costs more FLOPs than"}


class NoCandidateError(ValueError):
    """A choice among no candidates: the caller found none that applies."""


def key(objective: str, price: Cost) -> tuple[float, ...]:
    """The objective's order of a cost's figures (ORDER)."""
    return tuple(getattr(price, name) for name in ORDER[objective])


def choose(objective: str, costed: Sequence[tuple[T, Cost]]) -> T:
    """The item of least cost in the objective's order; of equal ones the first."""
    return cheapest([(item, key(objective, price)) for item, price in costed])


def cheapest(priced: Sequence[tuple[T, object]]) -> T:
    """The item of least price (a number, or a tuple compared in order); of equal ones the first."""
    if not priced:
        raise NoCandidateError("no candidate to choose from")
    best, least = priced[0]
    for item, price in priced[1:]:
        if price < least:  # type: ignore[operator]
            best, least = item, price
    return best


def within(priced: Sequence[tuple[T, float]], slack: float) -> list[T]:
    """The items whose price is at most `slack` times the least, in their order: the ones a
    choice that prefers something else (a larger chunk) may take at a small loss."""
    if not priced:
        raise NoCandidateError("no candidate to choose from")
    least = min(price for _, price in priced)
    return [item for item, price in priced if price <= slack * least]


def worse(objective: str, loser: Cost, winner: Cost) -> str:
    """How a candidate not taken compares with the one taken: by the first figure of the
    objective's order in which it is worse."""
    for name in ORDER[objective]:
        if getattr(loser, name) > getattr(winner, name):
            return WORSE[name]
    return "costs the same as (and is listed after)"
