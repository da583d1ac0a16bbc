"""The module's stored tensors as the generated file makes them: which tensors forward reads,
their shapes at the built sizes and their seeded initializer calls, and the tensor whose dtype
and device the inputs must share."""

from __future__ import annotations

import sympy

from ..graph import DesignGraph
from ..graph.model import numeric_shape
from ..ir import Tensor
from ..plan import Plan
from .text import known_sizes, number_code, quoted, scalar_code, size_code, source


def stored_tensors(plan: Plan) -> list[Tensor]:
    graph = plan.graph
    return [
        t
        for t in graph.tensors.values()
        if t.kind in ("param", "buffer") or (t.kind == "const" and t.name in plan.stored and t.name in plan.attributes)
    ]


def tensor_shape(tensor: Tensor, graph: DesignGraph, sizes: dict[str, int]) -> tuple[int, ...]:
    return numeric_shape(tensor, sizes, graph)


def init_line(tensor: Tensor, graph: DesignGraph, sizes: dict[str, int] | None) -> str:
    """The initializer call; with `sizes` None, a const made in forward at run-time sizes."""
    init = tensor.init
    if sizes is None:
        dims = [size_code(graph, a.size) for a in tensor.axes]
        shape: object = f"({', '.join(dims)}{',' if len(dims) == 1 else ''})"
        p = {k: scalar_code(graph.expand(sympy.sympify(v)).xreplace(known_sizes(graph))) for k, v in init.params}  # type: ignore[union-attr]
    else:
        shape = tensor_shape(tensor, graph, sizes)
        p = {k: number_code(graph, v, sizes) for k, v in init.params} if init else {}
    if init is None:
        return f"_normal({shape}, 0.0, {source(1 / (shape[0] if shape else 1) ** 0.5, 'number')}, seed, {quoted(tensor.name)})"  # type: ignore[index]
    if init.name == "normal":
        return f"_normal({shape}, {p.get('mean', '0.0')}, {p.get('std', '1.0')}, seed, {quoted(tensor.name)})"
    if init.name == "uniform":
        return f"_uniform({shape}, {p['low']}, {p['high']}, seed, {quoted(tensor.name)})"
    if init.name == "identity":
        return f"_identity({shape}, {p.get('scale', '1.0')})"
    if init.name == "values":
        entries = ", ".join(number_code(graph, v, sizes) for v in init.values)
        return f"torch.tensor([{entries}], dtype=torch.float64).reshape({shape})"
    value = {"zeros": "0.0", "ones": "1.0"}.get(init.name) or p["value"]
    return f"_fill({shape}, {value})"


def reference_tensor(plan: Plan) -> tuple[str, str]:
    """The stored tensor whose dtype and device the inputs must have (its code and its name as a
    string literal), or ("None", "None") for a design that stores none."""
    stored = stored_tensors(plan)
    if not stored:
        return "None", "None"
    name = source(stored[0].name, "name")
    return f"self.{name}", quoted(f"{stored[0].kind} {stored[0].name}")


def dtype_reference(plan: Plan) -> str:
    """The tensor whose dtype is the module's: its first stored tensor, else its first input."""
    like, _ = reference_tensor(plan)
    return like if like != "None" else source(plan.names[plan.graph.inputs[0].name], "name")
