"""DesignGraph -> DOT text in the papers' notation (Tuformer Sec. 2.1, App. A; design notes §5):
tensors are circles (inputs shaded blue, parameters blank, constants double-ringed, noise
dashed, buffers yellow), legs are edges labelled with their size symbol, a leg shared by three or
more nodes meets at a junction dot, an output leg dangles, and a softmax box is a dotted cluster
with a filled ball on its normalized leg, labelled with the scale α. Intermediate statements are
inlined, so the drawing is the tensor network of the leaf tensors, as in the papers' figures.
DOT text needs nothing installed; SVG, PNG and PDF need Graphviz's `dot` program."""

from __future__ import annotations

import itertools
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import sympy

from .graph import DesignGraph
from .ir import (
    CausalFactor,
    CausalMask,
    Contraction,
    ElementwiseMap,
    Expr,
    PaddingMask,
    Quotient,
    Reduction,
    Scalar,
    SoftmaxBox,
    SquaredDistance,
    SumNode,
    TensorRef,
)

NODE_STYLE = {
    "input": 'shape=circle style=filled fillcolor="#cfe2f3"',
    "mask": 'shape=circle style=filled fillcolor="#f4cccc"',
    "param": "shape=circle style=solid",
    "const": 'shape=doublecircle style=filled fillcolor="#eeeeee"',
    "random": "shape=circle style=dashed",
    "buffer": 'shape=circle style=filled fillcolor="#fff2cc"',
    "derived": 'shape=circle style=filled fillcolor="#d9ead3"',
}
MAP_LABEL = {
    "exp": "exp",
    "log": "log",
    "relu": "ReLU",
    "elu1": "elu + 1",
    "clamp": "clamp",
    "sigmoid": "σ",
    "tanh": "tanh",
    "softplus": "softplus",
    "silu": "SiLU",
    "gelu": "GELU",
    "sin": "sin",
    "cos": "cos",
    "sqrt": "√",
    "abs": "|·|",
}


class RenderError(Exception):
    """The diagram could not be written (no `dot` program, or it failed)."""


@dataclass
class _Cluster:
    id: str
    label: str
    style: str
    parent: str | None


@dataclass
class _Drawing:
    """Nodes, clusters and leg instances; a leg instance is one hyperedge of the network."""

    design: DesignGraph
    inline: bool
    nodes: dict[str, tuple[str, str | None]] = field(default_factory=dict)  # id -> (attrs, cluster)
    clusters: dict[str, _Cluster] = field(default_factory=dict)
    ends: dict[str, list[str]] = field(default_factory=dict)  # leg instance -> node ids
    leg_of: dict[str, str] = field(default_factory=dict)  # leg instance -> leg name
    balls: dict[str, tuple[str, str]] = field(default_factory=dict)  # instance -> (cluster, label)
    dangling: set[str] = field(default_factory=set)
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

    def leg(self, name: str) -> str:
        instance = self.new_id("leg")
        self.ends[instance] = []
        self.leg_of[instance] = name
        return instance

    def attach(self, node_id: str, instance: str) -> None:
        self.ends[instance].append(node_id)

    def size_label(self, instance: str) -> str:
        leg = self.design.legs.get(self.leg_of[instance])
        return _text(leg.size) if leg else self.leg_of[instance]


# ---- walking the design --------------------------------------------------------------------


def _draw(d: _Drawing, e: Expr, env: dict[str, str], cluster: str | None) -> None:
    """Add `e` to the drawing; `env` gives the leg instance of each of e's legs."""
    if isinstance(e, TensorRef):
        _draw_tensor(d, e, env, cluster)
    elif isinstance(e, Contraction):
        inner = env | {leg: d.leg(leg) for leg in e.summed}
        if e.coefficient != 1:
            d.node("c", f'shape=plaintext label="×{_text(e.coefficient)}"', cluster)
        for factor in e.factors:
            _draw(d, factor, {leg: inner[leg] for leg in factor.legs}, cluster)
    elif isinstance(e, SoftmaxBox):
        _draw_box(d, e, env, cluster)
    elif isinstance(e, ElementwiseMap):
        label = f"(·)^{_text(e.params[0])}" if e.name == "pow" else MAP_LABEL[e.name]
        inner_cluster = d.cluster(label, "dotted", cluster)
        _draw(d, e.operand, env, inner_cluster)  # type: ignore[arg-type]
    elif isinstance(e, Reduction):
        box = d.cluster(f"{e.name} over {' '.join(e.over)}", "dotted", cluster)
        inner = env | {leg: d.leg(leg) for leg in e.over}
        end = d.node("r", f'shape=diamond width=0.25 height=0.25 label="" xlabel="{e.name}"', box)
        for leg in e.over:
            d.attach(end, inner[leg])
        _draw(d, e.operand, {leg: inner[leg] for leg in e.operand.legs}, box)  # type: ignore[union-attr]
    elif isinstance(e, SumNode):
        signs = " ".join("+" if s > 0 else "−" for s in e.signs)
        _draw_joined(d, e, env, cluster, f"⊕\\n{signs}", list(e.terms))
    elif isinstance(e, Quotient):
        _draw_joined(d, e, env, cluster, "÷", [e.numerator, e.denominator])  # type: ignore[list-item]
    elif isinstance(e, SquaredDistance):
        _draw_distance(d, e, env, cluster)
    elif isinstance(e, CausalFactor):
        node = d.node("mask", f'shape=box style=dashed label="causal({e.query}, {e.key})"', cluster)
        for leg in e.legs:
            d.attach(node, env[leg])
    elif isinstance(e, Scalar) and e.value != 1:
        d.node("c", f'shape=plaintext label="{_text(e.value)}"', cluster)


def _draw_tensor(d: _Drawing, e: TensorRef, env: dict[str, str], cluster: str | None) -> None:
    tensor = d.design.tensors[e.name]
    statement = tensor.statement
    if statement is not None and d.inline:
        # inline the definition: its result legs become this use's legs (reshaped if grouped)
        inner: dict[str, str] = {}
        for use, definition in zip(e.groups, statement.groups, strict=True):
            if use == definition or (len(use) == 1 and len(definition) == 1):
                for a, b in zip(definition, use, strict=True):
                    inner[a] = env[b]
            else:
                _reshape(d, [env[leg] for leg in use], definition, inner, cluster)
        _draw(d, statement.expr, {leg: inner[leg] for leg in statement.expr.legs}, cluster)
        return
    kind = tensor.kind if statement is None else "derived"
    label = "ε" if kind == "random" and e.name.lower().startswith("eps") else e.name
    node = d.node("t", f'{NODE_STYLE[kind]} label="{label}" tooltip="{kind} {e.name}"', cluster)
    for group in e.groups:
        if len(group) == 1:
            d.attach(node, env[group[0]])
        else:
            fused = d.leg("(" + " ".join(group) + ")")
            d.attach(node, fused)
            join = d.node("j", 'shape=point width=0.06 label=""', cluster)
            d.attach(join, fused)
            for leg in group:
                d.attach(join, env[leg])


def _reshape(
    d: _Drawing, outer: list[str], definition: tuple[str, ...], inner: dict[str, str], cluster: str | None
) -> None:
    """A use `C[r s]` of a tensor defined as `C[(h d) (g e)]`: join the pieces at a small node."""
    join = d.node("j", 'shape=point width=0.06 label=""', cluster)
    for instance in outer:
        d.attach(join, instance)
    for leg in definition:
        inner[leg] = d.leg(leg)
        d.attach(join, inner[leg])


def _draw_box(d: _Drawing, e: SoftmaxBox, env: dict[str, str], cluster: str | None) -> None:
    masks = [f"causal({m.query}, {m.key})" for m in e.masks if isinstance(m, CausalMask)]
    label = e.box_name + (" · mask " + ", ".join(masks) if masks else "")
    box = d.cluster(label, "dotted", cluster)
    scale = _text(e.scale) if e.is_exp else "Σ"
    for leg in e.normalized:
        d.balls[env[leg]] = (box, scale)
    for mask in e.masks:
        if isinstance(mask, PaddingMask):
            _draw_tensor(d, mask.tensor, env, box)
    _draw(d, e.content, env, box)  # type: ignore[arg-type]


def _draw_joined(d: _Drawing, e: Expr, env: dict[str, str], cluster: str | None, label: str, parts: list[Expr]) -> None:
    """A sum node or quotient: each part is its own sub-network whose open legs meet at the node."""
    join = d.node("s", f'shape=circle width=0.3 fixedsize=true fontsize=10 label="{label}"', cluster)
    for leg in e.legs:
        d.attach(join, env[leg])
    for part in parts:
        part_env = {leg: d.leg(leg) for leg in part.legs}
        for instance in part_env.values():
            d.attach(join, instance)
        _draw(d, part, part_env, cluster)


def _draw_distance(d: _Drawing, e: SquaredDistance, env: dict[str, str], cluster: str | None) -> None:
    box = d.cluster(f"squared distance over {' '.join(e.over)}", "dotted", cluster)
    pair = d.node("q", 'shape=circle width=0.35 fixedsize=true fontsize=9 label="‖−‖²"', box)
    for side in (e.left, e.right):
        side_env = {leg: env[leg] for leg in side.legs if leg in env}  # type: ignore[union-attr]
        for leg in e.over:
            side_env[leg] = d.leg(leg)
            d.attach(pair, side_env[leg])
        _draw(d, side, side_env, box)  # type: ignore[arg-type]


# ---- writing DOT ---------------------------------------------------------------------------


def _text(value: sympy.Expr) -> str:
    text = re.sub(r"sqrt\((\w+)\)", r"√\1", str(value)).replace("sqrt", "√")
    return text.replace("**", "^").replace("*", "·")


def _cluster_chain(d: _Drawing, cluster: str | None) -> list[str]:
    chain = []
    while cluster is not None:
        chain.append(cluster)
        cluster = d.clusters[cluster].parent
    return chain


def _common_cluster(d: _Drawing, nodes: list[str]) -> str | None:
    """The innermost cluster holding all `nodes`, where a junction between them belongs."""
    chains = [_cluster_chain(d, d.nodes[n][1])[::-1] for n in nodes]
    common = None
    for level in zip(*chains, strict=False):
        if len(set(level)) != 1:
            break
        common = level[0]
    return common


def _is_inside(d: _Drawing, node: str, cluster: str) -> bool:
    return cluster in _cluster_chain(d, d.nodes[node][1])


def _edges(d: _Drawing) -> list[str]:
    lines = []
    for instance, ends in d.ends.items():
        label = d.size_label(instance)
        tip = d.leg_of[instance]
        attrs = f'label="{label}" tooltip="leg {tip}"'
        if instance in d.balls:
            box, alpha = d.balls[instance]
            ball = d.node(
                "b",
                f'shape=circle style=filled fillcolor=black width=0.14 fixedsize=true label="" xlabel="{alpha}"',
                box,
            )
            inside = [n for n in ends if _is_inside(d, n, box)]
            outside = [n for n in ends if not _is_inside(d, n, box)]
            lines += _hyperedge(d, [*inside, ball], attrs, d.nodes[ball][1], dangle=False)
            lines += _hyperedge(d, [ball, *outside], attrs, None, dangle=instance in d.dangling or not outside)
        else:
            lines += _hyperedge(d, ends, attrs, None, dangle=instance in d.dangling)
    return lines


def _hyperedge(d: _Drawing, ends: list[str], attrs: str, cluster: str | None, *, dangle: bool) -> list[str]:
    """Two ends: one edge. One end: a dangling leg. Three or more: a junction dot (hyperedge)."""
    ends = list(ends)
    if dangle or len(ends) == 1:
        ends.append(d.node("o", 'shape=point style=invis width=0.01 label=""', None))
    if len(ends) == 2:
        return [f"  {ends[0]} -- {ends[1]} [{attrs}];"]
    if len(ends) < 2:
        return []
    hub = d.node("h", 'shape=point width=0.08 label=""', _common_cluster(d, ends) if cluster is None else cluster)
    return [f"  {hub} -- {end} [{attrs}];" for end in ends]


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


def _trace(design: DesignGraph, inline: bool) -> _Drawing:
    d = _Drawing(design, inline)
    for name in design.outputs:
        tensor = design.tensors[name]
        ref = TensorRef(
            tensor.legs,
            tensor.span,
            name,
            tensor.statement.groups if tensor.statement else tuple((leg,) for leg in tensor.legs),
        )
        env = {leg: d.leg(leg) for group in ref.groups for leg in group}
        d.dangling |= set(env.values())
        _draw_tensor(d, ref, env, None)
    return d


def to_dot(design: DesignGraph, *, inline: bool = True) -> str:
    """The diagram as DOT text (undirected; boxes are clusters)."""
    d = _trace(design, inline)
    edges = _edges(d)
    values = design.size_values()
    sizes = ", ".join(f"{k}={v}" for k, v in values.items())
    lines = [
        f'graph "{design.name}" {{',
        f'  graph [rankdir=LR fontname="Helvetica" fontsize=12 label="{design.name}   ({sizes})" labelloc=t'
        " compound=true nodesep=0.35];",
        '  node [fontname="Helvetica" fontsize=11 width=0.45 fixedsize=false];',
        '  edge [fontname="Helvetica" fontsize=10];',
    ]
    lines += _clusters(d, None, "  ")
    lines += edges
    lines.append("}")
    return "\n".join(lines) + "\n"


def _clusters(d: _Drawing, parent: str | None, indent: str) -> list[str]:
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
    """Write the diagram to `path`; the suffix picks the format (dot, svg, png, pdf)."""
    path = Path(path)
    fmt = path.suffix.lstrip(".").lower()
    text = to_dot(design, inline=inline)
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "dot":
        path.write_text(text, encoding="utf-8")
        return path
    path.write_bytes(_pipe(text, fmt))
    return path


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
    return _pipe(to_dot(design), "svg").decode("utf-8")
