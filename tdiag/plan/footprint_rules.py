"""The footprint's rule table: for each op type of the program IR, the function that runs it on
the abstract machine (abstract.py) and says what it allocates, copies and saves. footprint_tensors.py
and footprint_boxes.py register one rule per op; footprint.py runs a plan's steps through them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .abstract import AbstractMachine, Meta
from .program import Step

FootprintRule = Callable[[AbstractMachine, Any, Step], Meta | None]
RULES: dict[type, FootprintRule] = {}


def rule(op_type: type) -> Callable[[FootprintRule], FootprintRule]:
    """Registers the decorated function as the footprint rule of `op_type`, one rule per type."""

    def register(function: FootprintRule) -> FootprintRule:
        if op_type in RULES:
            raise ValueError(f"two footprint rules for {op_type.__name__}")
        RULES[op_type] = function
        return function

    return register
