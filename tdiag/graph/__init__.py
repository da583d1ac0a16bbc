"""Syntax -> DesignGraph, the front end. Resolves every name, binds every leg to one size symbol,
applies the diagram rule for legs (a leg that does not cross a box, map or sum boundary is summed
inside it; Tuformer App. A) and records the result as a networkx graph of tensors and operations.
Every mistake becomes a Diagnostic; all of them are collected before anything is raised.

One module per concern, in pipeline order: merge.py (files, `extends` and `replace`) -> builder.py
(sizes, declarations, statements, outputs) -> expressions.py (one statement's right-hand side, with
products.py, positions.py and calls.py) -> dataflow.py (the networkx view) -> model.py (DesignGraph,
Limits); sizes.py, syntax.py and vocabulary.py are shared by all of them, and causal.py derives a
causally masked design from a built one.

The language layer: it may import the core (errors, names, files, resources) and the rest of the
language (parse, ir, printer), never the planner or anything above it. Its public names are
imported on first use (PEP 562), so reading DesignGraph loads model.py, not the parser."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import lazy_exports

if TYPE_CHECKING:
    from .builder import build_graph
    from .causal import with_causal_mask
    from .merge import design_file_items, item_name, item_name_span, load_items, load_texts, merged_items
    from .model import LIMITS, DesignGraph, Limits
    from .sizes import SizeTable, expand_sizes, size_symbol, size_values
    from .vocabulary import (
        BOX_OPTIONS,
        BOXES,
        FUNCTIONS,
        INIT_PARAMS,
        INITIALIZERS,
        MAPS,
        MASK_FACTORS,
        PAIRINGS,
        POISON_NAME,
        POISON_SIZE,
        POSITION_FUNCTIONS,
        RANDOM_MODES,
        REDUCTIONS,
        SCALAR_FUNCTIONS,
    )

__all__ = [
    "BOXES",
    "BOX_OPTIONS",
    "FUNCTIONS",
    "INITIALIZERS",
    "INIT_PARAMS",
    "LIMITS",
    "MAPS",
    "MASK_FACTORS",
    "PAIRINGS",
    "POISON_NAME",
    "POISON_SIZE",
    "POSITION_FUNCTIONS",
    "RANDOM_MODES",
    "REDUCTIONS",
    "SCALAR_FUNCTIONS",
    "DesignGraph",
    "Limits",
    "SizeTable",
    "build_graph",
    "design_file_items",
    "expand_sizes",
    "item_name",
    "item_name_span",
    "load_items",
    "load_texts",
    "merged_items",
    "size_symbol",
    "size_values",
    "with_causal_mask",
]

_HOMES = {
    **dict.fromkeys(("build_graph",), "builder"),
    **dict.fromkeys(("with_causal_mask",), "causal"),
    **dict.fromkeys(
        ("design_file_items", "item_name", "item_name_span", "merged_items", "load_items", "load_texts"), "merge"
    ),
    **dict.fromkeys(("LIMITS", "DesignGraph", "Limits"), "model"),
    **dict.fromkeys(("SizeTable", "expand_sizes", "size_symbol", "size_values"), "sizes"),
    **dict.fromkeys(
        (
            "BOX_OPTIONS",
            "BOXES",
            "FUNCTIONS",
            "INIT_PARAMS",
            "INITIALIZERS",
            "MAPS",
            "MASK_FACTORS",
            "PAIRINGS",
            "POISON_NAME",
            "POISON_SIZE",
            "POSITION_FUNCTIONS",
            "RANDOM_MODES",
            "REDUCTIONS",
            "SCALAR_FUNCTIONS",
        ),
        "vocabulary",
    ),
}

__getattr__, __dir__ = lazy_exports(__name__, _HOMES, __all__)
