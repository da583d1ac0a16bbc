"""What a file `tdiag compile` writes carries to decode (issue 42): its design as data, the class
attribute `tdiag_design` codegen writes (the texts of the design's file and of each base it
`extends`, the sizes it was loaded and planned at, the causal masks added, the planning options;
each a literal of strings, numbers and tuples, never code). A cache of a module of such a class
rebuilds the design through the front end as for any `.td` file (parse, graph, checks: an error
is positioned in the embedded text), plans it as `tdiag compile` did, and checks that the module
holds the design's stored tensors, so that a file whose record is another design's is refused
naming what differs (tdiag/decode.py, docs/decoding.md)."""

from __future__ import annotations

import sys
import weakref
from typing import Any

from torch import nn

from .errors import TdiagError
from .graph import DesignGraph

__all__ = ["NotDecodableError", "check_tensors", "embedded_plan"]


class NotDecodableError(ValueError):
    """A module that no cache can serve: not causal, several inputs, no run-time length, or a
    compiled file whose carried design is not its weights'."""


_EMBEDDED: weakref.WeakKeyDictionary[type, Any] = weakref.WeakKeyDictionary()


def embedded_plan(cls: type) -> Any:
    """The plan of the design a compiled file carries as data (codegen's `tdiag_design`: the texts
    of its files, its sizes, its causal masks, its planning options), made through the front end as
    for any `.td` file (parse, graph, checks; errors positioned in the embedded text) and planned
    as `tdiag compile` planned it; once per class and record. None for a class without one."""
    record = getattr(cls, "tdiag_design", None)
    if record is None:
        return None
    if _EMBEDDED.get(cls, (None,))[0] is not record:
        from .check import check
        from .graph import build_graph, load_texts, with_causal_mask
        from .graph.model import checked_sizes
        from .planning import plan_for

        files, sizes, causal, plan_sizes, options = _record(cls, record)
        where = getattr(sys.modules.get(cls.__module__), "__file__", None) or cls.__module__
        head, items = load_texts(tuple((f"{where} (embedded {name})", text) for name, text in files))
        graph = build_graph(head, items, checked_sizes(None, sizes))
        errors = [d for d in graph.warnings + check(graph) if d.is_error]
        if errors:
            raise TdiagError(errors)
        for query, key in causal:
            graph = with_causal_mask(graph, query, key)
        _EMBEDDED[cls] = (record, plan_for(graph, checked_sizes(graph, plan_sizes), **options))
    return _EMBEDDED[cls][1]


_OPTIONS = {"checkpoint_boxes": bool, "objective": str, "attention": str}


def _record(cls: type, record: object) -> tuple:
    """The parts of a `tdiag_design` record, each checked to be the data codegen writes."""

    def pairs(value: object) -> bool:
        return isinstance(value, tuple) and all(
            isinstance(p, tuple) and len(p) == 2 and all(isinstance(s, str) for s in p) for p in value
        )

    def numbers(value: object) -> bool:
        return isinstance(value, dict) and all(isinstance(k, str) and type(v) is int for k, v in value.items())

    record = record if isinstance(record, dict) else {}
    options = record.get("options")
    parts = (record.get("files"), record.get("sizes"), record.get("causal", ()), record.get("plan_sizes"), options)
    valid = (
        pairs(parts[0])
        and bool(parts[0])
        and numbers(parts[1])
        and pairs(parts[2])
        and numbers(parts[3])
        and isinstance(options, dict)
        and options.keys() == _OPTIONS.keys()
        and all(type(options[k]) is t for k, t in _OPTIONS.items())
    )
    if not valid:
        raise NotDecodableError(
            f"{cls.__name__}.tdiag_design is not the design record `tdiag compile` writes (files: (name, text)"
            f" pairs; sizes and plan_sizes: name -> int; causal: (query, key) pairs; options: {', '.join(_OPTIONS)})"
        )
    return parts


def check_tensors(module: nn.Module, graph: DesignGraph) -> None:
    """A module decodes by the design it carries only if its stored tensors are the design's: the
    same names, each parameter a param and each buffer a buffer, the same shapes. Else the
    mismatch is named: a missing or extra tensor first, then a shape."""
    held = {
        **{n: ("param", tuple(t.shape)) for n, t in module.named_parameters(recurse=False)},
        **{n: ("buffer", tuple(t.shape)) for n, t in module.named_buffers(recurse=False)},
    }
    wanted = {
        t.name: (t.kind, tuple(int(graph.evaluate(a.size)) for a in t.axes))
        for t in graph.tensors.values()
        if t.kind in ("param", "buffer")
    }
    design = f"the design carried by {type(module).__name__} ('{graph.name}')"
    missing = [f"{kind} {name}" for name, (kind, _) in wanted.items() if held.get(name, ("",))[0] != kind]
    extra = [f"param {name}" for name, (kind, _) in held.items() if kind == "param" and name not in wanted]
    problems = [f"has {', '.join(missing)}, which the module does not hold"] if missing else []
    problems += [f"lacks {', '.join(extra)}, which the module holds"] if extra else []
    problems += [
        f"has {kind} {name}{list(shape)}, the module holds {name}{list(held[name][1])}"
        for name, (kind, shape) in wanted.items()
        if not problems and held[name][1] != shape
    ][:1]
    if problems:
        raise NotDecodableError(
            f"{design} {'; it '.join(problems)}: the file's design is not the one its weights were compiled from"
        )
