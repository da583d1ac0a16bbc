"""DesignGraph -> DOT text in the papers' notation (Tuformer Sec. 2.1, App. A; design notes §5):
tensors are circles (inputs shaded blue, parameters blank, constants double-ringed, noise
dashed, buffers yellow), legs are edges labelled with their name and size (`n: N`), a leg shared
by three or more nodes meets at a junction dot carrying that label, only an output leg dangles
(Sec. 2.1: "the output shape by the dangling edges"), a leg summed where it has a single end is
closed by an all-ones vector node `1` (Fig. 4a/5's 1_D: summing a branch away), and a softmax box
is a dotted cluster with a filled ball on its normalized leg, labelled with the scale α (Fig. 2).
A sum or quotient node marks the edges of a subtracted term with − and of a denominator with ÷.
By default a computed tensor used once is inlined, so the drawing is the tensor network of the
leaf tensors, as in the papers' figures; one used more than once is drawn once, as a derived node
(green) with legs to each use and a dashed arrow from its own labelled statement, so no
sub-diagram is drawn twice. A drawing too large for one screen (render_layout.MAX_NODES) is
drawn as with `inline=False`: each statement its own labelled cluster, the tensors that earlier
statements define one node per use, and a dashed arrow from a statement to each use of its result.
Each expression kind is drawn by its render rule (RENDER, filled in by tdiag/constructs), on the
drawing's public helpers below. DOT text needs nothing installed; SVG, PNG and PDF need
Graphviz's `dot` program."""

from __future__ import annotations

import dataclasses
import itertools
import re
import shutil
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import sympy

from .files import check_output, write_output
from .graph import DesignGraph
from .ir import (
    CausalMask,
    Contraction,
    Expr,
    Statement,
    TensorRef,
    WindowMask,
)
from .printing import format_expr
from .render_layout import MAX_NODES, shared_tensors, too_large
from .render_notation import GREEK, NODE_STYLE, ONES_STYLE, OPEN_END_STYLE, SCALED
from .rules import Rules

RENDER: Rules = Rules("render")  # how each kind is drawn: rule(drawing, node, env, cluster)


class RenderError(Exception):
    """The diagram could not be written (no `dot` program, or it failed)."""


class DiagramTooLarge(UserWarning):
    """The default drawing would not fit one screen, so one panel per statement was drawn."""


@dataclass
class _Cluster:
    id: str
    label: str
    style: str
    parent: str | None


@dataclass
class Drawing:
    """Nodes, clusters and leg instances; a leg instance is one hyperedge of the network."""

    design: DesignGraph
    inline: bool
    nodes: dict[str, tuple[str, str | None]] = field(default_factory=dict)  # id -> (attrs, cluster)
    clusters: dict[str, _Cluster] = field(default_factory=dict)
    ends: dict[str, list[str]] = field(default_factory=dict)  # leg instance -> node ids
    leg_of: dict[str, str] = field(default_factory=dict)  # leg instance -> leg name
    home: dict[str, str | None] = field(default_factory=dict)  # leg instance -> cluster it is summed in
    balls: dict[str, tuple[str, str]] = field(default_factory=dict)  # instance -> (cluster, label)
    dangling: set[str] = field(default_factory=set)
    uses: list[tuple[str, str]] = field(default_factory=list)  # (derived tensor, node drawing one use)
    defined_in: dict[str, str] = field(default_factory=dict)  # derived tensor -> its statement's cluster
    shared: dict[str, str | None] = field(default_factory=dict)  # tensor drawn once -> its node, once drawn
    placed: dict[tuple[str, int], str | None] = field(default_factory=dict)  # (leg, end) -> use's cluster
    counter: itertools.count = field(default_factory=itertools.count)

    def new_id(self, prefix: str) -> str:
        return f"{prefix}{next(self.counter)}"

    def node(self, prefix: str, attrs: str, cluster: str | None) -> str:
        node_id = self.new_id(prefix)
        self.nodes[node_id] = (attrs, cluster)
        return node_id

    def cluster(self, label: str, style: str, parent: str | None) -> str:
        cluster_id = self.new_id("cluster_")
        self.clusters[cluster_id] = _Cluster(cluster_id, label, style, parent)
        return cluster_id

    def leg(self, name: str, cluster: str | None) -> str:
        """A new leg instance, summed (or kept, for an output) in `cluster`."""
        instance = self.new_id("leg")
        self.ends[instance] = []
        self.leg_of[instance] = name
        self.home[instance] = cluster
        return instance

    def attach(self, node_id: str, instance: str) -> None:
        self.ends[instance].append(node_id)

    def size_label(self, instance: str) -> str:
        """The leg's size symbol; a fused leg `(h d)` has the product of its pieces' sizes."""
        names = self.leg_of[instance].strip("()").split()
        sizes = [self.design.legs[n].size for n in names if n in self.design.legs]
        return math_text(sympy.Mul(*sizes)) if len(sizes) == len(names) else self.leg_of[instance]

    def edge_label(self, instance: str) -> str:
        """`n: N`: the leg's name next to its size, so legs of equal size are told apart."""
        return f"{self.leg_of[instance]}: {self.size_label(instance)}"


# ---- walking the design --------------------------------------------------------------------


def draw(d: Drawing, e: Expr, env: dict[str, str], cluster: str | None) -> None:
    """Add `e` to the drawing by its kind's render rule; `env` gives the leg instance of each of
    e's legs."""
    RENDER.lookup(e)(d, e, env, cluster)


def draw_tensor(d: Drawing, e: TensorRef, env: dict[str, str], cluster: str | None) -> None:
    tensor = d.design.tensors[e.name]
    statement = tensor.statement
    if e.name in d.shared:
        _draw_shared_use(d, e, env, cluster)
        return
    if statement is not None and d.inline:
        # inline the definition: its result legs become this use's legs (reshaped if grouped)
        inner: dict[str, str] = {}
        for use, definition in zip(e.groups, statement.groups, strict=True):
            if use == definition or (len(use) == 1 and len(definition) == 1):
                for a, b in zip(definition, use, strict=True):
                    inner[a] = env[b]
            else:
                _reshape(d, [env[leg] for leg in use], definition, inner, cluster)
        draw(d, statement.expr, {leg: inner[leg] for leg in statement.expr.legs}, cluster)
        return
    kind = tensor.kind if statement is None else "derived"
    label = GREEK.get(e.name, "ε" if kind == "random" and e.name.lower().startswith("eps") else e.name)
    if e.is_sliced:  # a table read at its first entries: P[n: N]
        cuts = [
            f"{g[0]}: {math_text(k)}"
            if e.offset(axis) == 0
            else f"{g[0]}: {math_text(e.offset(axis))}..{math_text(e.offset(axis) + k)}"
            for axis, (g, k) in enumerate(zip(e.groups, e.slices, strict=True))
            if k is not None
        ]
        label += escape("[" + ", ".join(cuts) + "]")
    node = d.node("t", f'{NODE_STYLE[kind]} label="{label}" tooltip="{kind} {e.name}"', cluster)
    if statement is not None:
        d.uses.append((e.name, node))
    _attach_use(d, node, e, env, cluster)


def _attach_use(d: Drawing, node: str, e: TensorRef, env: dict[str, str], cluster: str | None) -> None:
    """Join a tensor's node to the legs of one use; a fused group `(h d)` meets its pieces at a dot."""
    for group in e.groups:
        if len(group) == 1:
            d.placed[(env[group[0]], len(d.ends[env[group[0]]]))] = cluster
            d.attach(node, env[group[0]])
        else:
            fused = d.leg("(" + " ".join(group) + ")", cluster)
            d.attach(node, fused)
            join = d.node("j", 'shape=point width=0.06 label=""', cluster)
            d.attach(join, fused)
            for leg in group:
                d.attach(join, env[leg])


def _draw_shared_use(d: Drawing, e: TensorRef, env: dict[str, str], cluster: str | None) -> None:
    """One use of a computed tensor used more than once: an edge bundle to its single node, drawn
    outside every box, and the first use draws the node with an arrow from its statement."""
    node = d.shared[e.name]
    if node is None:
        label = GREEK.get(e.name, e.name)
        node = d.node("t", f'{NODE_STYLE["derived"]} label="{label}" tooltip="derived {e.name}"', None)
        d.shared[e.name] = node
        d.uses.append((e.name, node))
    _attach_use(d, node, e, env, cluster)


def _reshape(
    d: Drawing, outer: list[str], definition: tuple[str, ...], inner: dict[str, str], cluster: str | None
) -> None:
    """A use `C[r s]` of a tensor defined as `C[(h d) (g e)]`: join the pieces at a small node."""
    join = d.node("j", 'shape=point width=0.06 label=""', cluster)
    for instance in outer:
        d.attach(join, instance)
    for leg in definition:
        inner[leg] = d.leg(leg, cluster)
        d.attach(join, inner[leg])


def position_masks(masks) -> list[str]:
    """The causal masks and windows of a box, map or reduction, as written."""
    return [
        f"causal({m.query}, {m.key})" if isinstance(m, CausalMask) else str(m)
        for m in masks
        if isinstance(m, CausalMask | WindowMask)
    ]


def draw_joined(
    d: Drawing, e: Expr, env: dict[str, str], cluster: str | None, label: str, parts: list[Expr], marks: list[str]
) -> None:
    """A sum node or quotient: each part is its own sub-network whose open legs meet at the node.
    A subtracted term or a denominator is drawn in a dashed cluster labelled − or ÷ (with its
    coefficient, when it has one), so the sign sits on the term it belongs to."""
    join = d.node("s", f'shape=circle width=0.3 fixedsize=true fontsize=12 label="{label}"', cluster)
    for leg in e.legs:
        d.attach(join, env[leg])
    for part, mark in zip(parts, marks, strict=True):
        part_env = {leg: d.leg(leg, cluster) for leg in part.legs}
        for instance in part_env.values():
            d.attach(join, instance)
        where = cluster
        if mark and isinstance(part, Contraction) and part.coefficient != 1:
            where = d.cluster(f"{mark} {math_text(part.coefficient)} ×", SCALED, cluster)
            part = dataclasses.replace(part, coefficient=sympy.Integer(1))
        elif mark:
            where = d.cluster(mark, SCALED, cluster)
        draw(d, part, part_env, where)


# ---- writing DOT ---------------------------------------------------------------------------


def math_text(value: sympy.Expr) -> str:
    text = re.sub(r"sqrt\((\w+)\)", r"√\1", str(value)).replace("sqrt", "√")
    return text.replace("**", "^").replace("*", "·")


def _cluster_chain(d: Drawing, cluster: str | None) -> list[str]:
    chain = []
    while cluster is not None:
        chain.append(cluster)
        cluster = d.clusters[cluster].parent
    return chain


def _common_cluster(d: Drawing, nodes: list[str]) -> str | None:
    """The innermost cluster holding all `nodes`, where a junction between them belongs."""
    chains = [_cluster_chain(d, d.nodes[n][1])[::-1] for n in nodes]
    common = None
    for level in zip(*chains, strict=False):
        if len(set(level)) != 1:
            break
        common = level[0]
    return common


def _is_inside(d: Drawing, node: str, cluster: str, use: str | None = None) -> bool:
    """Whether `node` is drawn in `cluster`; a shared tensor's node counts where its `use` is."""
    return cluster in _cluster_chain(d, use if node in d.shared.values() else d.nodes[node][1])


def _edges(d: Drawing) -> list[str]:
    lines = []
    for instance, ends in d.ends.items():
        if instance in d.balls:
            box, alpha = d.balls[instance]
            ball = d.node(
                "b",
                f'shape=circle style=filled fillcolor=black width=0.14 fixedsize=true label="" xlabel="{alpha}"',
                box,
            )
            within = [_is_inside(d, n, box, d.placed.get((instance, k))) for k, n in enumerate(ends)]
            inside = [n for n, flag in zip(ends, within, strict=True) if flag]
            outside = [n for n, flag in zip(ends, within, strict=True) if not flag]
            lines += _hyperedge(d, instance, [*inside, ball], d.nodes[ball][1], closed=True)
            lines += _hyperedge(d, instance, [ball, *outside], None)
        else:
            lines += _hyperedge(d, instance, ends, None)
    lines += _use_arrows(d)
    return lines


def _hyperedge(d: Drawing, instance: str, ends: list[str], cluster: str | None, *, closed: bool = False) -> list[str]:
    """Two ends: one edge. Three or more: a junction dot (hyperedge), labelled on one spoke. An output
    leg gets an open end; a summed leg with a single end is closed by an all-ones vector `1`,
    so that it never dangles like an output leg. `closed`: the part of a leg inside a box."""
    ends = list(ends)
    label = d.edge_label(instance)
    tip = f"leg {d.leg_of[instance]}: {d.size_label(instance)}"
    if not closed and instance in d.dangling:
        ends.append(d.node("o", f'{OPEN_END_STYLE} tooltip="output leg {d.leg_of[instance]}"', d.home[instance]))
    elif not closed and len(ends) == 1:
        ends.append(d.node("u", f'{ONES_STYLE} tooltip="sum over {d.leg_of[instance]}"', d.home[instance]))
    if len(ends) < 2:
        return []
    if len(ends) == 2:
        return [f'  {_edge(d, ends[0], ends[1])} [label="{label}" tooltip="{tip}"];']
    where = _common_cluster(d, ends) if cluster is None else cluster
    hub = d.node("h", 'shape=point width=0.08 label=""', where)
    return [
        f'  {_edge(d, hub, end)} [label="{label if k == 0 else ""}" tooltip="{tip}"];' for k, end in enumerate(ends)
    ]


def _edge(d: Drawing, a: str, b: str) -> str:
    """`a -- b`, a shared tensor's node first: dot ranks an edge's tail before its head, so each
    computed tensor sits after its statement and before its uses, and a long design reads left
    to right, statement by statement."""
    return f"{b} -- {a}" if b in d.shared.values() and a not in d.shared.values() else f"{a} -- {b}"


def _use_arrows(d: Drawing) -> list[str]:
    """With statements drawn apart: a dashed arrow from each statement to every use of its result."""
    lines = []
    for name, node in d.uses:
        cluster = d.defined_in.get(name)
        if cluster is None:
            continue
        # from an open end of the defining statement, so that the arrows order the statements; a
        # scalar result (no open leg) from any node of its statement
        in_cluster = [(n, attrs) for n, (attrs, c) in d.nodes.items() if c == cluster]
        if not in_cluster:
            continue
        anchor = next((n for n, attrs in in_cluster if attrs.startswith(OPEN_END_STYLE)), in_cluster[0][0])
        lines.append(
            f"  {anchor} -- {node} [style=dashed color=gray50 dir=forward arrowsize=0.6 ltail={cluster} "
            f'tooltip="{name} is used here"];'
        )
    return lines


@dataclass(frozen=True)
class Hyperedge:
    """One leg of the drawn network: the tensors it joins, and whether it is an open output leg."""

    leg: str
    size: str
    tensors: tuple[str, ...]
    is_open: bool
    has_ball: bool


def network(design: DesignGraph, *, inline: bool = True) -> list[Hyperedge]:
    """The leaf-tensor network that the drawing shows, leg by leg (for tests and tools)."""
    d = _trace(design, inline)
    names = {node: _node_name(attrs) for node, (attrs, _) in d.nodes.items()}
    return [
        Hyperedge(
            d.leg_of[i],
            d.size_label(i),
            tuple(sorted(names[n] for n in ends if names[n])),
            i in d.dangling,
            i in d.balls,
        )
        for i, ends in d.ends.items()
    ]


def _node_name(attrs: str) -> str:
    match = re.search(r'tooltip="\w+ (\w+)"', attrs)
    return match.group(1) if match else ""


def _trace(design: DesignGraph, inline: bool) -> Drawing:
    d = Drawing(design, inline)
    if not inline:
        for statement in [*design.statements, *design.updates]:
            _draw_statement(d, statement)
        return d
    shared = shared_tensors(design)
    d.shared = dict.fromkeys(shared)
    for name in shared:  # each drawn once, as its own labelled statement
        _draw_statement(d, design.tensors[name].statement)  # type: ignore[arg-type]
    for name in design.outputs:
        tensor = design.tensors[name]
        ref = TensorRef(
            tensor.legs,
            tensor.span,
            name,
            tensor.statement.groups if tensor.statement else tuple((leg,) for leg in tensor.legs),
        )
        env = {leg: d.leg(leg, None) for group in ref.groups for leg in group}
        d.dangling |= set(env.values())
        draw_tensor(d, ref, env, None)
    return d


def _draw_statement(d: Drawing, statement: Statement) -> None:
    """One statement as its own cluster, labelled with its text: its right-hand side's network,
    whose dangling legs are the target's legs; tensors of earlier statements are single nodes."""
    target = f"{statement.target}[{' '.join(_group_text(g) for g in statement.groups)}]"
    text = f"{'update ' if statement.is_update else ''}{target} = {format_expr(statement.expr)}"
    box = d.cluster(escape(text), "rounded", None)
    if not statement.is_update:
        d.defined_in[statement.target] = box
    env = {leg: d.leg(leg, box) for leg in statement.expr.legs}
    d.dangling |= set(env.values())
    draw(d, statement.expr, env, box)


def _group_text(group: tuple[str, ...]) -> str:
    return group[0] if len(group) == 1 else "(" + " ".join(group) + ")"


def escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def to_dot(design: DesignGraph, *, inline: bool = True) -> str:
    """The diagram as DOT text (undirected; boxes are clusters)."""
    return _dot(_trace(design, inline))


def fitted_dot(design: DesignGraph, *, inline: bool = True) -> tuple[str, str | None]:
    """The DOT text that render writes, and a note where the default drawing was too large for one
    screen and one panel per statement was drawn instead."""
    d = _trace(design, inline)
    text = _dot(d)
    count = visible_nodes(d)
    if not inline or not too_large(count):
        return text, None
    note = (
        f"the diagram of '{design.name}' has {count} nodes, more than {MAX_NODES} fit on one screen; "
        "drew one panel per statement instead (as --statements does)"
    )
    return to_dot(design, inline=False), note


def visible_nodes(d: Drawing) -> int:
    """The nodes a reader sees (tensors, junctions, boxes' marks), once the edges are drawn."""
    return sum(1 for attrs, _ in d.nodes.values() if not attrs.startswith(OPEN_END_STYLE))


def _dot(d: Drawing) -> str:
    """The drawing as DOT. One panel per statement ranks top to bottom inside each panel, so the
    panels, ordered by the arrows between them, stand side by side: left to right by statement."""
    design = d.design
    edges = _edges(d)
    values = design.size_values()
    sizes = ", ".join(f"{k}={v}" for k, v in values.items())
    rankdir = "LR" if d.inline else "TB"
    lines = [
        f'graph "{design.name}" {{',
        f'  graph [rankdir={rankdir} fontname="Helvetica" fontsize=12 label="{design.name}   ({sizes})" labelloc=t'
        " compound=true nodesep=0.35];",
        '  node [fontname="Helvetica" fontsize=11 width=0.45 fixedsize=false];',
        '  edge [fontname="Helvetica" fontsize=10];',
    ]
    lines += _clusters(d, None, "  ")
    lines += edges
    lines.append("}")
    return "\n".join(lines) + "\n"


def _clusters(d: Drawing, parent: str | None, indent: str) -> list[str]:
    lines = [f"{indent}{node} [{attrs}];" for node, (attrs, cluster) in d.nodes.items() if cluster == parent]
    for c in d.clusters.values():
        if c.parent != parent:
            continue
        lines.append(f"{indent}subgraph {c.id} {{")
        lines.append(f'{indent}  graph [label="{c.label}" style={c.style} fontsize=10 labeljust=l];')
        lines += _clusters(d, c.id, indent + "  ")
        lines.append(f"{indent}}}")
    return lines


def has_dot() -> bool:
    return shutil.which("dot") is not None


def render(design: DesignGraph, path: str | Path, *, inline: bool = True) -> Path:
    """Write the diagram to `path`; the suffix picks the format (dot, svg, png, pdf). Written as
    every output is (files.write_output): whole or not at all, never over the design's own files."""
    check_output(path, design.sources)
    fmt = Path(path).suffix.lstrip(".").lower()
    text, note = fitted_dot(design, inline=inline)
    if note:
        warnings.warn(note, DiagramTooLarge, stacklevel=3)
    return write_output(path, text if fmt == "dot" else _pipe(text, fmt), design.sources)


def _pipe(text: str, fmt: str) -> bytes:
    import graphviz

    if not has_dot():
        raise RenderError(
            f"writing .{fmt} needs Graphviz's 'dot' program, which is not installed "
            "(apt-get install graphviz); .dot output works without it"
        )
    try:
        return graphviz.Source(text).pipe(format=fmt)
    except graphviz.backend.ExecutableNotFound as error:
        raise RenderError(str(error)) from None
    except graphviz.backend.CalledProcessError as error:
        raise RenderError(f"dot failed: {error.stderr.decode(errors='replace').strip()}") from None


def to_svg(design: DesignGraph) -> str | None:
    """SVG text for Jupyter's `_repr_svg_`, or None when `dot` is missing."""
    if not has_dot():
        return None
    return _pipe(fitted_dot(design)[0], "svg").decode("utf-8")
