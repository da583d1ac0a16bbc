"""Plans shared between designs made the same way. A Design caches its own plans; two designs
loaded from the same texts with the same sizes (and the variants derived from them the same way:
the causal mask, a call mask) have equal graphs and plan alike, yet each plans again. While
sharing is on, `Design.plan` keeps each plan under the design's `made_from` key and its planning
key (sizes, objective, options, pricing device, forms), so such a design plans once per process.

Off by default, so that a user's plans stay their own design's. The test suite turns it on
(tests/conftest.py), except for a test that patches the planner (a module-level constant such as
chunked.CHUNK_SIZES decides a plan without being part of any key), and so does the goldens script."""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from typing import TypeVar

KEPT = 256  # plans kept, the least recently asked for dropped first

T = TypeVar("T")
_plans: OrderedDict[Hashable, object] = OrderedDict()
_sharing = [False]


def shared_plan(key: Hashable | None, plan: Callable[[], T]) -> T:
    """The plan kept under `key` while sharing is on, else `plan()` (kept if sharing is on and
    `key` is not None: a design made some other way has no key)."""
    if key is None or not _sharing[0]:
        return plan()
    if key in _plans:
        _plans.move_to_end(key)
        return _plans[key]  # type: ignore[return-value]
    made = _plans[key] = plan()
    while len(_plans) > KEPT:
        _plans.popitem(last=False)
    return made


@contextlib.contextmanager
def sharing(on: bool = True) -> Iterator[None]:
    """Share plans between designs (`on`), or not, for the duration of the block; the plans kept
    in a sharing block are forgotten on its exit."""
    saved, _sharing[0] = _sharing[0], on
    try:
        yield
    finally:
        _sharing[0] = saved
        if on:
            _plans.clear()


def kept() -> int:
    """How many plans are kept now."""
    return len(_plans)


__all__ = ["KEPT", "kept", "shared_plan", "sharing"]
