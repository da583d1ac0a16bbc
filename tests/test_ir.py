"""The expression nodes' generic child walk (tdiag/ir.py): `children`, `walk` and `map_children`
reach every field holding an Expr or a tuple of Exprs, whatever the field is called, so a new
construct is walked and rewritten by every graph pass without naming its fields anywhere."""

from dataclasses import dataclass
from typing import ClassVar

from tdiag.errors import Span
from tdiag.ir import Contraction, Expr, Gather, SoftmaxBox, TensorRef, map_children, walk

SPAN = Span("<test>", 1, 1, 1, 2)


@dataclass(frozen=True)
class TriangularSolve(Expr):
    """A node kind no pass knows: x with L x = b, its sides in fields no rewrite names."""

    matrix: Expr | None = None
    rhs: Expr | None = None
    blocks: tuple[Expr, ...] = ()
    kind: ClassVar[str] = "trisolve"


def ref(name: str, *legs: str) -> TensorRef:
    return TensorRef(legs, SPAN, name=name, groups=tuple((leg,) for leg in legs))


def renamed(expr: Expr) -> Expr:
    """Every tensor reference `X` read as `X2`, at any depth (a rewrite in the graph passes' shape)."""
    expr = map_children(expr, renamed)
    return (
        TensorRef(expr.legs, expr.span, name=expr.name + "2", groups=expr.groups)
        if isinstance(expr, TensorRef)
        else expr
    )


def solve() -> TriangularSolve:
    product = Contraction(("n",), SPAN, factors=(ref("A", "n", "m"), ref("B", "m")), summed=("m",))
    return TriangularSolve(("n",), SPAN, matrix=ref("L", "n", "m"), rhs=product, blocks=(ref("C", "n"),))


def test_a_rewrite_reaches_the_matrix_and_rhs_fields_of_a_new_node_kind():
    rewritten = renamed(solve())
    assert isinstance(rewritten, TriangularSolve)
    assert [n.name for n in walk(rewritten) if isinstance(n, TensorRef)] == ["L2", "A2", "B2", "C2"]


def test_walk_reaches_every_child_field_of_a_new_node_kind_in_field_order():
    assert [n.name for n in walk(solve()) if isinstance(n, TensorRef)] == ["L", "A", "B", "C"]


def test_map_children_returns_the_node_itself_where_nothing_changes():
    node = solve()
    assert map_children(node, lambda child: child) is node


def test_a_rewrite_reaches_a_box_sink_and_a_gather_source():
    box = SoftmaxBox(("n", "m"), SPAN, content=ref("S", "n", "m"), normalized=("m",), sink=ref("s", "n"))
    gather = Gather(("n",), SPAN, source=ref("R", "r"), axis="r")
    assert [n.name for n in walk(renamed(box)) if isinstance(n, TensorRef)] == ["S2", "s2"]
    assert renamed(gather).source.name == "R2"
