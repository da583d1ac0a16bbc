"""What a candidate form of a box is, where it is asked to apply, and what its choice records.

A `BoxSite` is one softmax or normalize box met while a multilinear region is lowered: the box,
its renaming into region legs, its place among the region's leaves, the other leaves (its
consumer's factors) and the legs the region keeps, with the attention match of a softmax box.
A `Form` says why it does not apply to a site (`refusal`), or emits its program fragment
(`emit`) and returns the region's leaves with the box replaced. The lowering is passed to both
as `ctx`: a form reads and emits through it and keeps no state of its own."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ...ir import SoftmaxBox
from ..chooser import Cost
from ..context import Leaf, Lowering
from ..program import show_legs
from ..sdpa_match import MatchedAttention


class Unfit(str):
    """A refusal that only says the form is made for other boxes or other options (a normalize
    box for an attention form, a kernel not asked for, no query heads to group). The candidate
    table shows it; the plan's notes of refused rewrites leave it out, as they always did."""


class FormRefusedError(Exception):
    """Raised by `Form.emit` for a reason found only while emitting (a causal box whose content
    has no prefix-sum form): the chooser records the form as refused with this reason."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass
class BoxSite:
    """One box of a region where the forms are weighed."""

    box: SoftmaxBox
    ren: dict[str, tuple[str, ...]]  # the box's legs renamed into region legs
    index: int  # the box's position among the region's leaves
    others: list[Leaf]  # the region's other leaves, in order
    out: tuple[str, ...]  # the legs the region keeps
    attention: MatchedAttention | None = None  # a softmax box read as an attention, if it is one
    mismatch: str | None = None  # ... else why not (None for a normalize box)
    found: dict[str, Any] = field(default_factory=dict)  # what a form searched for, by form name

    @property
    def kind(self) -> str:
        return "softmax" if self.box.is_exp else "normalize"

    @property
    def keys(self) -> tuple[str, ...]:
        """The normalized region legs."""
        return tuple(p for leg in self.box.normalized for p in self.ren[leg])

    def matched(self) -> MatchedAttention:
        """The attention match, for a form whose refusal found that there is one."""
        if self.attention is None:
            raise AssertionError(f"no attention match at the {self.describe()}: {self.mismatch}")
        return self.attention

    def describe(self) -> str:
        """`softmax box over m`: how notes and the candidate table name the site."""
        return f"{self.kind} box over {' '.join(show_legs(self.keys))}"


class Form(ABC):
    """A way to compute a box together with its consumer. Subclasses set `name` (unique, short:
    the candidate table's row) and may set `fused` (a fused attention kernel, which never stores
    the box's entries: objective `memory` takes one wherever one applies) and `rewrite` (False
    for the box computed as such, which the plan's notes of rewrites leave out)."""

    name: ClassVar[str]
    fused: ClassVar[bool] = False
    rewrite: ClassVar[bool] = True

    def label(self, site: BoxSite) -> str:
        """How the plan's notes name this form at `site` (`SDPA`, `the materialized box`)."""
        return self.name

    def asked(self, ctx: Lowering) -> bool:
        """Whether the user asked for this form by an option: then it is taken wherever it
        applies, whatever it costs (FlexAttention under `attention="flex"`)."""
        return False

    @abstractmethod
    def refusal(self, ctx: Lowering, site: BoxSite) -> str | None:
        """Why the form does not apply to `site` (an `Unfit` where it is made for other boxes),
        or None. Cheap: nothing is emitted."""

    @abstractmethod
    def emit(self, ctx: Lowering, site: BoxSite) -> list[Leaf]:
        """Emit the form's steps through `ctx` and return the region's leaves with the box (and
        whatever of its consumer the form absorbs) replaced by what it computed. Called on trial
        (`with ctx.trial()`) to cost it and once more for real if it is taken; a search whose result
        should not be repeated goes into `site.found[self.name]`. May raise FormRefusedError."""


@dataclass(frozen=True)
class Candidate:
    """One form at one site: its cost where it applies, else why not."""

    form: str
    label: str
    cost: Cost | None = None
    refusal: str | None = None


@dataclass(frozen=True)
class BoxChoice:
    """The record of one box's decision: every form's cost or refusal, the one taken, and the
    rule that restricted the choice before the costs were compared (None: the costs alone)."""

    site: str
    objective: str
    candidates: tuple[Candidate, ...]
    taken: str
    rule: str | None = None
