"""Plan -> the source of a standalone PyTorch module (`generate`): the file's header and
helpers, then one class whose parameters are named after the `.td` tensors with axes in
declared order (__init__, reset_parameters, extra_repr, the constant tables) and its forward
(forward.py, or calls.py where the call takes masks)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING

from ..graph import DesignGraph
from ..plan import Plan
from ..plan.program import FlexAttention
from .calls import CALL_HELPERS, call_forward, variant_plans
from .forward import forward_and_tables, forward_method
from .helpers import CALLED_HELPERS, HELPERS
from .state import TABLE_PREFIX, UNTABLED
from .stored import init_line, stored_tensors, tensor_shape
from .text import class_name, data_literal, python_text, quoted, source, tuple_code

if TYPE_CHECKING:
    from ..plan.call_variants import CallPlans


_FLEX_IMPORT = ["from torch.nn.attention.flex_attention import create_block_mask, flex_attention"]


def generate(
    plan: Plan, *, source_name: str = "", calls: CallPlans | None = None, design: Mapping[str, object] | None = None
) -> str:
    """The module source for `plan`; with `calls`, forward takes the call-time masks and runs the
    plan of the variant they ask for (calls.py). `design` (Design.origin and the planning
    options) becomes the class attribute `tdiag_design`, the data a standalone file decodes from."""
    graph = plan.graph
    name = class_name(graph.name)
    origin = f" from {source(source_name, 'text')}" if source_name else ""
    sizes = ", ".join(f"{source(k, 'text')}={source(v, 'text')}" for k, v in plan.sizes.items() if k != "B")
    printed = [plan] if calls is None else [p for p in variant_plans(plan, calls) if p is not None]
    tables, untabled = _tables(printed)
    token = UNTABLED.set(untabled)
    try:
        forward, plans = (forward_method(plan), [plan]) if calls is None else call_forward(plan, calls)
    finally:
        UNTABLED.reset(token)
    helpers = {**CALLED_HELPERS, **CALL_HELPERS}
    called = "".join(text for helper, text in helpers.items() if f"{helper}(" in "\n".join(forward))
    lines = [
        f'"""{name}: the `{source(graph.name, "text")}` design compiled by tdiag{origin}.',
        "",
        f"Sizes: {sizes}.",
        'Generated code: edit the .td file and recompile rather than editing this file."""',
        "",
        "import hashlib",
        "import math",
        "",
        "import torch",
        "from torch import nn",
        *(_FLEX_IMPORT if any(isinstance(step.op, FlexAttention) for p in plans for step in p.steps) else []),
        HELPERS + called,
        "",
        f"class {name}(nn.Module):",
        f'    """{_docstring(graph)}"""',
        "",
        *_legs(plan),
        *_design_record(design),
        "",
        *_init(plan, bool(tables)),
        "",
        *_reset(plan),
        "",
        *_extra_repr(plan, bool(tables)),
        "",
        *tables,
        *forward,
    ]
    return "\n".join(lines).rstrip() + "\n"


def _tables(plans: list[Plan]) -> tuple[list[str], frozenset[int]]:
    """The method that makes the constant tables of every body (each distinct set of statements
    once) and the `_apply` that makes them again where the module moves or changes dtype (so a
    float32 module made float64 has the float64 tables forward would have computed); and the
    plans whose tables stay in forward, because another body's table of the same name differs."""
    blocks: list[list[str]] = []
    names: dict[str, str] = {}
    untabled: set[int] = set()
    for plan in plans:
        block = forward_and_tables(plan)[1]
        if not block or block in blocks:
            continue
        text = "\n".join(block)
        made = re.findall(rf'register_buffer\("({TABLE_PREFIX}\w+)"', text)
        if any(names.get(name, text) != text for name in made):
            untabled.add(id(plan))
            continue
        names.update(dict.fromkeys(made, text))
        blocks.append(block)
    if not blocks:
        return [], frozenset(untabled)
    plan = plans[0]
    inputs = [source(plan.names[t.name], "name") for t in plan.graph.inputs]
    first = next(iter(names))
    lines = [
        "    @torch.no_grad()",
        "    def _tdiag_make_tables(self, dtype: torch.dtype, device=None) -> None:",
        '        """The constant tables forward reads, fixed by the sizes built for: made once, not on every',
        '        call, as buffers outside the state_dict (old checkpoints load, new ones hold no more)."""',
        *(
            f"        {x} = torch.empty(0, dtype=dtype, device=device)  # the tables take the module's dtype"
            for x in inputs
        ),
        *(line for block in blocks for line in block),
        "",
        "    def _apply(self, fn, recurse=True):",
        '        """Move or convert the module, then make the tables again in their new dtype and on their',
        '        new device (computed there, never rounded from another dtype)."""',
        "        super()._apply(fn, recurse)",
        f"        like = self.{first}",
        "        self._tdiag_make_tables(like.dtype, like.device)",
        "        return self",
        "",
    ]
    return lines, frozenset(untabled)


def _docstring(graph: DesignGraph) -> str:
    inputs = ", ".join(f"{t.name}[..., {', '.join(t.legs)}]" for t in graph.inputs)
    outputs = ", ".join(f"{o}[..., {', '.join(graph.tensors[o].legs)}]" for o in graph.outputs)
    return source(f"{inputs} -> {outputs}.", "text")


def _init(plan: Plan, tables: bool = False) -> list[str]:
    lines = [
        "    def __init__(self, seed: int = 0, dtype: torch.dtype = torch.float32, device=None):",
        "        super().__init__()",
    ]
    for t in stored_tensors(plan):
        shape = tensor_shape(t, plan.graph, plan.sizes)
        empty = f"torch.empty({shape}, dtype=dtype, device=device)"
        legs = source(" ".join(t.legs), "comment")
        if t.kind == "param":
            lines.append(f"        self.{source(t.name, 'name')} = nn.Parameter({empty})  # legs {legs}")
        else:
            persistent = "True" if t.kind == "buffer" else "False"
            lines.append(
                f"        self.register_buffer({quoted(source(t.name, 'name'))}, {empty}, persistent={persistent})  # legs {legs}"
            )
    lines.append("        self.reset_parameters(seed)")
    if tables:
        lines.append("        self._tdiag_make_tables(dtype, device)")
    return lines


def _reset(plan: Plan) -> list[str]:
    lines = [
        "    @torch.no_grad()",
        "    def reset_parameters(self, seed: int = 0) -> None:",
        '        """Initialize every stored tensor from its .td initializer; deterministic for a seed."""',
    ]
    for t in stored_tensors(plan):
        lines.append(f"        self.{source(t.name, 'name')}.copy_({init_line(t, plan.graph, plan.sizes)})")
    if len(lines) == 3:
        lines.append("        pass")
    return lines


def _legs(plan: Plan) -> list[str]:
    """Each stored tensor's legs in axis order, as data: `repr` shows them and tdiag.weights reads
    them to lay nn.Linear matrices onto leg-shaped tensors."""
    legs = ", ".join(f"{quoted(t.name)}: {tuple_code([quoted(leg) for leg in t.legs])}" for t in stored_tensors(plan))
    return [f"    tdiag_legs = {{{legs}}}"]


def _design_record(design: Mapping[str, object] | None) -> list[str]:
    """`tdiag_design`: the design's texts, sizes and planning options as a literal of strings,
    numbers and tuples (each text a repr, never code), one line per entry."""
    if design is None:
        return []
    entries = [f"        {data_literal(key)}: {data_literal(value)}," for key, value in design.items()]
    return ["    tdiag_design = {", *entries, "    }"]


def _extra_repr(plan: Plan, tables: bool = False) -> list[str]:
    """`repr(module)` shows the sizes built for, then each stored tensor with its legs and shape."""
    graph = plan.graph
    fixed = ", ".join(
        f"{python_text(k)}={v}" for k, v in plan.sizes.items() if k in graph.sizes and not graph.sizes[k].is_free
    )
    runtime = [
        f"{python_text(k)} (planned at {v})"
        for k, v in plan.sizes.items()
        if k in graph.sizes and graph.sizes[k].is_free
    ]
    sizes = f"sizes: {fixed or 'none'}" + (f"; bound at run time: {', '.join(runtime)}" if runtime else "")
    return [
        "    def extra_repr(self) -> str:",
        '        """The sizes built for, then each parameter and buffer with its legs and shape."""',
        f'        lines = ["{sizes}"]',
        "        for name, tensor in [*self.named_parameters(recurse=False), *self.named_buffers(recurse=False)]:",
        *(
            [
                "            if name not in self.tdiag_legs:  # a constant table (_tdiag_make_tables), not a .td tensor",
                "                continue",
            ]
            if tables
            else []
        ),
        '            kind = "param" if isinstance(tensor, nn.Parameter) else "buffer"',
        "            lines.append(f\"{kind} {name}[{' '.join(self.tdiag_legs[name])}]: {tuple(tensor.shape)}\")",
        '        return "\\n".join(lines)',
    ]
