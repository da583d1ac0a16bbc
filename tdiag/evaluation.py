"""The reference evaluator's rule table: how each expression kind is evaluated on materialized
tensors (tdiag/reference.py dispatches through it). It holds no torch, so that the construct
modules register into it without loading torch; their rules import it when they run."""

from __future__ import annotations

from .rules import Rules

EVALUATE: Rules = Rules("evaluate")
