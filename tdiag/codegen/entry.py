"""The entry of forward: reading the inputs (dtype, device, rank, batch dims), binding run-time
sizes from their shapes and checking the others, checking masks and split legs, then making
the masks' defaults, the run-time constants, causal triangles, chunk counts and noise."""

from __future__ import annotations

import sympy

from ..graph import DesignGraph
from ..ir import Tensor, TensorRef, walk
from ..plan import Plan
from .state import TABLE_PREFIX, TABLED
from .stored import init_line, reference_tensor
from .tables import table_reads
from .text import batch_dims, expr_code, known_sizes, operand_code, quoted, shape_args, size_code, source


def entry_lines(plan: Plan) -> list[str]:
    """Read the inputs: bind run-time sizes from their shapes, check them, flatten the batch. With
    several inputs their leading batch dims broadcast (an input over (n, m) without batch dims
    serves every sequence), as do a mask's."""
    graph = plan.graph
    lines: list[str] = []
    first = True
    bound: set[str] = set()
    several = len(graph.inputs) > 1
    like, like_name = reference_tensor(plan)
    for t in graph.inputs:
        var = source(plan.names[t.name], "name")
        rank = len(t.axes)
        what = quoted(f"input {t.name}")
        lines.append(f"_input({var}, {what}, {like}, {like_name})")
        if like == "None":  # a design without stored tensors: the first input sets dtype and device
            like, like_name = var, what
        lines.append(f"if {var}.dim() < {rank}:")
        needs = source(f"input {t.name} needs {rank} trailing axes ({' '.join(t.legs)}), got shape ", "fstring")
        lines.append(f'    raise ValueError(f"{needs}{{tuple({var}.shape)}}")')
        if first:
            lines.append(f"batch_shape = {batch_dims(var, rank)}")
            first = False
        elif several:
            lines.append(f"batch_shape = _batch(batch_shape, {var}, {rank}, {what})")
        for k, axis in enumerate(t.axes):
            position = k - rank
            size = axis.size
            if size.is_Symbol and graph.sizes[str(size)].is_free and str(size) not in bound:
                name = source(str(size), "name")
                lines.append(f"{name} = {var}.shape[{position}]")
                lines.append(f"if {name} == 0:")
                empty = source(f"input {t.name}: leg {axis.leg} (size {size}) has no entries", "text")
                lines.append(f'    raise ValueError("{empty}")')
                bound.add(str(size))
                continue
            expected = size_code(graph, size)
            lines.append(f"if {var}.shape[{position}] != {expected}:")
            leg = source(f"input {t.name}: leg {axis.leg} has size {axis.size} = ", "fstring")
            lines.append(f'    raise ValueError(f"{leg}{{{expected}}}, got {{{var}.shape[{position}]}}")')
    lines += _split_checks(graph)
    masks = graph.tensors_of_kind("mask") if graph.inputs else []
    for t in masks:
        lines += _mask_checks(plan, t, bound)
    for t in graph.inputs:
        var = source(plan.names[t.name], "name")
        shape = ", ".join(size_code(graph, a.size) for a in t.axes)
        if several or masks:
            lines.append(
                f"{var} = {var}.expand({shape_args('*batch_shape', shape)}).reshape({shape_args('-1', shape)})"
            )
        else:
            lines.append(f"{var} = {var}.reshape({shape_args('-1', shape)})")
    first_input = source(plan.names[graph.inputs[0].name], "name") if graph.inputs else None
    lines.append(f"B = {first_input}.shape[0]" if first_input else "B = 1")
    for t in graph.tensors_of_kind("mask"):
        var = source(plan.names[t.name], "name")
        shape = ", ".join(size_code(graph, a.size) for a in t.axes)
        lines.append(
            f"{var} = torch.ones({shape_args('B', shape)}, dtype=torch.bool, device={first_input}.device) if {var} is None"
            f" else {var}.expand({shape_args('*batch_shape', shape)}).reshape({shape_args('B', shape)})"
        )
    device = first_input or "None"
    for t in graph.tensors_of_kind("buffer"):  # read as it was: the update below must not touch saved tensors
        if t.name in plan.names:
            lines.append(f"{source(plan.names[t.name], 'name')} = self.{source(t.name, 'name')}.clone()")
    for t in graph.tensors_of_kind("const"):  # over a run-time size: made at the size of this call
        if t.name in plan.stored and t.name not in plan.attributes:
            like = f"dtype={device}.dtype, device={device}.device"
            lines.append(f"{source(plan.names[t.name], 'name')} = {init_line(t, graph, None)}.to({like})")
    lines += [
        f"{source(c.name, 'name')} = -(-{expr_code(c.extent)} // {source(c.size, 'number')})" for c in plan.chunks
    ]
    for key, var in plan.causal.items():
        ones = f"torch.ones({size_code(graph, key[0])}, {size_code(graph, key[1])}, dtype=torch.bool, device={device}.device)"
        if len(key) == 4:  # a window's band: hidden where key - query >= after or <= -before
            before, after = (size_code(graph, w) for w in key[2:])
            lines.append(f"{source(var, 'name')} = {ones}.triu({after}) | {ones}.tril(-{before})")
        else:
            lines.append(f"{source(var, 'name')} = {ones}.triu(1)")
    for var in table_reads(plan) if TABLED.get() else []:
        dtype = f".to({first_input}.dtype)" if first_input else ""
        lines.append(f"{source(var, 'name')} = self.{TABLE_PREFIX}{source(var, 'name')}{dtype}  # made with the module")
    for t in graph.tensors_of_kind("random"):
        var = source(plan.names[t.name], "name")
        shape = ", ".join(size_code(graph, a.size) for a in t.axes)
        mode = t.init.param("mode", "train") if t.init else "train"
        like = f"dtype={device}.dtype, device={device}.device"
        noise = f"torch.randn({shape_args('B', shape)}, {like})"
        zeros = "None" if var in plan.training_noise else f"torch.zeros({shape_args('B', shape)}, {like})"
        lines.append(
            f"{var} = "
            + {"always": noise, "never": zeros}.get(str(mode), f"{noise} if self.training else {zeros}")
            + f"  # noise, mode {source(mode, 'comment')}"
        )
    return lines


def _split_checks(graph: DesignGraph) -> list[str]:
    """A leg sized by a division of a run-time length (the N/C blocks of `X[(b i) f]` with i of
    size C) is whole only where the call's length is a multiple of the block: checked at entry,
    a ValueError naming the reshape, the leg, its size, the length and the block, where a
    failed reshape would say none of them."""
    lines, seen = [], set()
    for leg in graph.legs.values():
        size = graph.expand(leg.size)
        numerator, denominator = sympy.fraction(sympy.together(size.xreplace(known_sizes(graph))))
        if denominator == 1 or (numerator, denominator) in seen:
            continue
        seen.add((numerator, denominator))
        length, block = operand_code(numerator), operand_code(denominator)
        written, divisor = sympy.fraction(sympy.together(size))
        shown = f"{divisor} = {denominator}" if divisor != denominator else f"{denominator}"
        text = f"{_split_site(graph, leg.name)}leg {leg.name} has size {leg.size}, whole only where {written} is a"
        text += f" multiple of {shown}; got {numerator} = "
        lines.append(f"if {length} % {block} != 0:")
        lines.append(f'    raise ValueError(f"{source(text, "fstring")}{{{length}}}")')
    return lines


def _split_site(graph: DesignGraph, leg: str) -> str:
    """Where `leg` is a piece of a split axis: its first reshaped use, as `X[(b i) f] on line 10: `."""
    for statement in graph.statements:
        for node in walk(statement.expr):
            if isinstance(node, TensorRef) and any(leg in g and len(g) > 1 for g in node.groups):
                legs = " ".join(f"({' '.join(g)})" if len(g) > 1 else g[0] for g in node.groups)
                return f"{node.name}[{legs}] on line {node.span.line}: "
    return ""


def _mask_checks(plan: Plan, t: Tensor, bound: set[str]) -> list[str]:
    """Check a mask given at run time as the reference evaluator does (bool, its trailing axes
    at their sizes) and broadcast its batch dims with the inputs': an int mask's `~` would flip
    bits, not hide entries, and a mask with batch dims of its own serves the inputs' sequences."""
    graph = plan.graph
    var = source(plan.names[t.name], "name")
    rank = len(t.axes)
    what = quoted(f"mask {t.name}")
    lines = [f"if {var} is not None:"]
    lines.append(f"    if not isinstance({var}, torch.Tensor):")
    tensor = source(f"mask {t.name} must be a torch.Tensor of booleans (True = attend), got ", "fstring")
    lines.append(f'        raise TypeError(f"{tensor}{{type({var}).__name__}}")')
    lines.append(f"    if {var}.dtype != torch.bool:")
    boolean = source(f"mask {t.name} must be a bool tensor (True = attend), got ", "fstring")
    lines.append(f'        raise ValueError(f"{boolean}{{{var}.dtype}}")')
    lines.append(f"    if {var}.dim() < {rank}:")
    needs = source(f"mask {t.name} needs {rank} trailing axes ({' '.join(t.legs)}), got shape ", "fstring")
    lines.append(f'        raise ValueError(f"{needs}{{tuple({var}.shape)}}")')
    for k, axis in enumerate(t.axes):
        position = k - rank
        if axis.size.is_Symbol and graph.sizes[str(axis.size)].is_free and str(axis.size) not in bound:
            lines.append(f"    {source(str(axis.size), 'name')} = {var}.shape[{position}]")
            bound.add(str(axis.size))
            continue
        expected = size_code(graph, axis.size)
        lines.append(f"    if {var}.shape[{position}] != {expected}:")
        leg = source(f"mask {t.name}: leg {axis.leg} has size {axis.size} = ", "fstring")
        lines.append(f'        raise ValueError(f"{leg}{{{expected}}}, got {{{var}.shape[{position}]}}")')
    first = source(plan.names[plan.graph.inputs[0].name], "name")
    lines.append(f"    if {var}.device != {first}.device:")
    device = source(f"mask {t.name} is on ", "fstring")
    lines.append(f'        raise ValueError(f"{device}{{{var}.device}} but the inputs are on {{{first}.device}}")')
    lines.append(f"    batch_shape = _batch(batch_shape, {var}, {rank}, {what})")
    return lines
