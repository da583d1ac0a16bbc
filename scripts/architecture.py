"""The compiler's layers, measured and enforced (issue 37). tdiag's modules form layers that import
downward only: core -> language -> planner -> backends -> runtime -> constructs -> facade -> tools.
The import graph is read from the source with `ast` (tdiag is never imported to build it), counting
every import: top-level, inside a function and under `if TYPE_CHECKING:`, since each one ties the
importer to the imported module's layer.

    python scripts/architecture.py            # the issue's targets as a table
    python scripts/architecture.py --json     # the same as JSON
    python scripts/architecture.py check      # exit 1 naming every upward import not allowed

`check` reads scripts/architecture_allow.txt: one `importer -> imported  # why` per line, the known
upward edges that the refactor in progress removes. An upward edge not listed fails, and so does a
listed edge that no longer goes up (or no longer exists), so the list only shrinks.
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ALLOWLIST = Path(__file__).resolve().parent / "architecture_allow.txt"
PACKAGE = "tdiag"

# Each layer by module-name patterns, lowest first; a module may import its own layer and those
# before it. The planner is itself layered (program IR -> prices -> lowering -> forms -> chooser ->
# passes). A module takes the layer of its most specific matching pattern: an exact name before a
# glob, a longer glob before a shorter one.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "core",
        (
            "tdiag.errors",
            "tdiag.names",
            "tdiag.objectives",
            "tdiag.device",
            "tdiag.files",
            "tdiag.resources",
            "tdiag.rules",
            "tdiag.lazy",
            "tdiag.notebook",  # formulas and tables as text, HTML and Markdown: sympy only
        ),
    ),
    ("language", ("tdiag.parse", "tdiag.ir", "tdiag.graph", "tdiag.graph.*", "tdiag.check", "tdiag.printing")),
    ("planner: program IR", ("tdiag.plan.program", "tdiag.plan.ops", "tdiag.plan.box_ops")),
    (
        "planner: prices",
        (
            "tdiag.plan.chooser",
            "tdiag.plan.strides",
            "tdiag.plan.abstract",
            "tdiag.plan.footprint",
            "tdiag.plan.footprint_*",
            "tdiag.plan.timing",
            "tdiag.plan.prices",
            "tdiag.plan.objective",
        ),
    ),
    ("planner: lowering", ("tdiag.plan.*",)),
    ("planner: forms", ("tdiag.plan.forms.*",)),
    ("planner: chooser", ("tdiag.plan.forms", "tdiag.plan.forms.choice")),
    (
        "planner: passes",
        (
            "tdiag.plan",
            "tdiag.plan.build",
            "tdiag.plan.absorb_choice",
            "tdiag.plan.layout",
            "tdiag.plan.report",
            "tdiag.plan.call_variants",
        ),
    ),
    ("backends", ("tdiag.codegen", "tdiag.codegen.*", "tdiag.cost", "tdiag.cost_*", "tdiag.render", "tdiag.render_*")),
    (
        "runtime",
        (
            "tdiag.planning",
            "tdiag.generated",
            "tdiag.module",
            "tdiag.reference",
            "tdiag.reference_module",
            "tdiag.evaluation",
            "tdiag.decode",
            "tdiag.decode_*",
            "tdiag.init",
            "tdiag.weights",
            "tdiag.thsa",
        ),
    ),
    ("constructs", ("tdiag.constructs", "tdiag.constructs.*")),
    ("facade", ("tdiag", "tdiag.design", "tdiag.call_plans", "tdiag.shared_plans")),
    (
        "tools",
        (
            "tdiag.__main__",
            "tdiag.cli",
            "tdiag.train",
            "tdiag.train_*",
            "tdiag.bench",
            "tdiag.measure",
            "tdiag.space",
            "tdiag.space.*",
            "tdiag.hf",
            "tdiag.gpu_report",
            "tdiag.gpu_baselines",
            "tdiag.catalog",
            "tdiag.runs",
        ),
    ),
)
LAYER_NAMES = tuple(name for name, _ in LAYERS)
# The layers whose targets the issue measures: the compiler proper, between the language and the
# facade.
MEASURED = ("planner", "backends", "runtime")
MAX_LINES = 600


class ArchitectureError(Exception):
    """A module no layer claims, or a malformed allowlist line: the contract cannot be checked."""


@dataclass(frozen=True)
class Import:
    """One import statement's tie from `importer` to `imported`, with the names it takes."""

    importer: str
    imported: str
    line: int
    kind: str  # "top", "local" (inside a function) or "TYPE_CHECKING"
    names: tuple[str, ...]


@dataclass(frozen=True)
class Source:
    """One module of the package: its name, file, parsed tree and length in lines."""

    name: str
    path: Path
    tree: ast.Module
    lines: int


def _specificity(pattern: str) -> tuple[bool, int]:
    return ("*" not in pattern, len(pattern))


def layer_of(module: str) -> str:
    """The layer a module belongs to: that of the most specific pattern of LAYERS it matches."""
    matches = [
        (_specificity(pattern), name)
        for name, patterns in LAYERS
        for pattern in patterns
        if fnmatch.fnmatchcase(module, pattern)
    ]
    if not matches:
        raise ArchitectureError(f"module {module} is in no layer; add it to LAYERS in {Path(__file__).name}")
    return max(matches)[1]


def is_measured(module: str) -> bool:
    """Whether a module is in the planner, the backends or the runtime."""
    return layer_of(module).split(":")[0] in MEASURED


def module_name(path: Path, root: Path) -> str:
    """`tdiag/plan/build.py` -> `tdiag.plan.build`; a package's `__init__.py` is the package."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def sources(root: Path = ROOT) -> dict[str, Source]:
    """Every module of the package under `root`, parsed."""
    found = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        name = module_name(path, root)
        found[name] = Source(name, path, ast.parse(text, filename=str(path)), len(text.splitlines()))
    return found


def _package_of(source: Source) -> str:
    return source.name if source.path.name == "__init__.py" else source.name.rpartition(".")[0]


def _resolve_from(node: ast.ImportFrom, source: Source) -> str:
    """The absolute module a `from ... import` statement names."""
    if not node.level:
        return node.module or ""
    base = _package_of(source).split(".")
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _known(module: str, modules: set[str]) -> str | None:
    """The longest prefix of `module` that is a module of the package (`tdiag.plan.build.x` ->
    `tdiag.plan.build`), or None when it is outside the package."""
    parts = module.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _statements(node: ast.AST, kind: str = "top") -> Iterator[tuple[ast.AST, str]]:
    """Every import statement under `node` with where it sits: at the top, inside a function or
    under `if TYPE_CHECKING:` (the innermost of these wins)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child, kind
        elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            yield from _statements(child, "local")
        elif isinstance(child, ast.If) and _is_type_checking(child.test):
            for statement in child.body:
                yield from _statements(ast.Module(body=[statement], type_ignores=[]), "TYPE_CHECKING")
            for statement in child.orelse:
                yield from _statements(ast.Module(body=[statement], type_ignores=[]), kind)
        else:
            yield from _statements(child, kind)


def imports_of(source: Source, modules: set[str]) -> Iterator[Import]:
    """The package modules `source` imports, one Import per statement and imported module. `from
    .plan import forms` ties to `tdiag.plan.forms` when forms is a module, to `tdiag.plan` when it
    is a name."""
    for node, kind in _statements(source.tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _known(alias.name, modules)
                if target and target != source.name:
                    yield Import(source.name, target, node.lineno, kind, ())
            continue
        base = _resolve_from(node, source)
        by_target: dict[str, list[str]] = {}
        for alias in node.names:
            target = _known(f"{base}.{alias.name}", modules)
            if target is None or target != f"{base}.{alias.name}":
                target = _known(base, modules)
            if target and target != source.name:
                by_target.setdefault(target, []).append(alias.name)
        for target, names in by_target.items():
            yield Import(source.name, target, node.lineno, kind, tuple(names))


def import_graph(root: Path = ROOT) -> tuple[dict[str, Source], list[Import]]:
    """The package's modules and every import among them."""
    found = sources(root)
    modules = set(found)
    return found, [i for source in found.values() for i in imports_of(source, modules)]


def upward(imports: list[Import]) -> list[Import]:
    """The imports that go up a layer: the imported module's layer comes after the importer's."""
    rank = {name: index for index, name in enumerate(LAYER_NAMES)}
    return [i for i in imports if rank[layer_of(i.imported)] > rank[layer_of(i.importer)]]


def strongly_connected(nodes: set[str], edges: set[tuple[str, str]]) -> list[set[str]]:
    """The strongly connected components of a directed graph (Tarjan's algorithm, iterative)."""
    successors: dict[str, list[str]] = {n: [] for n in nodes}
    for a, b in sorted(edges):
        successors[a].append(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []
    for start in sorted(nodes):
        if start in index:
            continue
        work = [(start, iter(successors[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    components.append(component)
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(successors[child])))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return components


def largest_circle(found: dict[str, Source], imports: list[Import], among=lambda module: True) -> set[str]:
    """The largest set of modules that import one another in a circle (a strongly connected
    component of the whole package's import graph), sized by its members that `among` accepts:
    a circle through the runtime counts for the measured layers even where a larger one elsewhere
    (in the language layer, say) is the package's largest."""
    edges = {(i.importer, i.imported) for i in imports}
    circles = [c for c in strongly_connected(set(found), edges) if len(c) > 1]
    return max(circles, key=lambda c: len({m for m in c if among(m)}), default=set())


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_imports(imports: list[Import]) -> list[tuple[Import, str]]:
    """Each private name (`_x`) a module imports from another module: (the import, the name)."""
    return [(i, name) for i in imports for name in i.names if _is_private(name)]


def wide_classes(found: dict[str, Source]) -> list[tuple[str, int, str, int]]:
    """Classes with more than two bases: (module, line, class, bases)."""
    return [
        (source.name, node.lineno, node.name, len(node.bases))
        for source in found.values()
        for node in ast.walk(source.tree)
        if isinstance(node, ast.ClassDef) and len(node.bases) > 2
    ]


def long_files(found: dict[str, Source]) -> list[tuple[str, int]]:
    """Modules longer than MAX_LINES, longest first: (module, lines)."""
    return sorted(((s.name, s.lines) for s in found.values() if s.lines > MAX_LINES), key=lambda item: -item[1])


_LOADED = """
import json, sys
before = set(sys.modules)
import tdiag.plan.program
loaded = sorted(m for m in sys.modules if m not in before)
print(json.dumps({
    "tdiag": [m for m in loaded if m == "tdiag" or m.startswith("tdiag.")],
    "lark": "lark" in sys.modules,
    "torch": "torch" in sys.modules,
}))
"""


def loaded_by_program(root: Path = ROOT) -> dict:
    """What `import tdiag.plan.program` loads, in a fresh interpreter on this checkout."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    out = subprocess.run([sys.executable, "-c", _LOADED], capture_output=True, text=True, env=env, cwd=root, check=True)
    return json.loads(out.stdout)


def _target(items: list, module_of) -> dict:
    """A count over the whole package, and over the planner, backends and runtime."""
    measured = [item for item in items if is_measured(module_of(item))]
    return {"count": len(items), "measured": len(measured)}


def targets(root: Path = ROOT) -> dict:
    """The issue's targets for the checkout at `root`, each with what it is made of: `count` over
    the whole package and `measured` over the planner, backends and runtime."""
    found, imports = import_graph(root)
    circle = sorted(largest_circle(found, imports))
    measured_circle = sorted(m for m in largest_circle(found, imports, is_measured) if is_measured(m))
    private = private_imports(imports)
    wide = wide_classes(found)
    long = long_files(found)
    up = sorted({(i.importer, i.imported) for i in upward(imports)})
    return {
        "largest_import_circle": {
            "count": len(circle),
            "measured": len(measured_circle),
            "modules": circle,
            "measured_modules": measured_circle,
        },
        "loaded_by_plan_program": loaded_by_program(root),
        "private_names_imported": {
            **_target(private, lambda item: item[0].importer),
            "imports": [f"{i.importer}:{i.line} {name} from {i.imported}" for i, name in private],
        },
        "classes_over_2_bases": {
            **_target(wide, lambda item: item[0]),
            "classes": [f"{m}:{line} {name} ({n} bases)" for m, line, name, n in wide],
        },
        "files_over_600_lines": {
            **_target(long, lambda item: item[0]),
            "files": [f"{name} ({lines})" for name, lines in long],
        },
        "upward_imports": {
            **_target(up, lambda item: item[0]),
            "edges": [f"{a} -> {b}" for a, b in up],
        },
    }


def _widest(report: dict) -> str:
    classes = report["classes_over_2_bases"]["classes"]
    if not classes:
        return "none"
    widest = max(classes, key=lambda c: int(c.rpartition("(")[2].split()[0]))
    return f"{widest.split()[1]}, {widest.rpartition('(')[2].split()[0]}"


def table(report: dict) -> str:
    """The targets as a table: the count over the package, over the planner, backends and
    runtime, and the goal."""
    loaded = report["loaded_by_plan_program"]
    modules = len(loaded["tdiag"])
    below = sum(is_measured(m) for m in loaded["tdiag"])
    libraries = ", ".join(f"{name} {'yes' if loaded[name] else 'no'}" for name in ("lark", "torch"))

    def row(name: str, key: str, goal: str, unit: str = "") -> tuple[str, str, str, str]:
        return (name, f"{report[key]['count']}{unit}", str(report[key]["measured"]), goal)

    rows = [
        row("largest import circle (modules)", "largest_import_circle", "1"),
        (
            "`import tdiag.plan.program` loads (tdiag modules)",
            f"{modules} ({libraries})",
            str(below),
            "<= 6, no lark/torch",
        ),
        row("private names imported across modules", "private_names_imported", "0"),
        (
            "classes with more than 2 bases",
            f"{report['classes_over_2_bases']['count']} (most bases: {_widest(report)})",
            str(report["classes_over_2_bases"]["measured"]),
            "0",
        ),
        row(f"files over {MAX_LINES} lines", "files_over_600_lines", "0"),
        row("upward imports (module pairs)", "upward_imports", "0"),
    ]
    header = ("target", "package", "planner+backends+runtime", "goal")
    widths = [max(len(r[k]) for r in [header, *rows]) for k in range(4)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


@dataclass(frozen=True)
class Allowed:
    """One allowlist entry: an upward edge the refactor still has, and why."""

    importer: str
    imported: str
    why: str
    line: int


def read_allowlist(path: Path) -> list[Allowed]:
    """The allowlist's entries; a line that is not `importer -> imported  # why` is an error."""
    entries = []
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        text = raw.strip()
        if not text or text.startswith("#"):
            continue
        edge, _, why = text.partition("#")
        importer, arrow, imported = edge.partition("->")
        if not arrow or not importer.strip() or not imported.strip() or not why.strip():
            raise ArchitectureError(f"{path}:{number}: expected 'importer -> imported  # why', found {text!r}")
        entries.append(Allowed(importer.strip(), imported.strip(), why.strip(), number))
    return entries


def contract_violations(root: Path = ROOT, allowlist: Path = ALLOWLIST) -> list[str]:
    """Every upward import not in the allowlist, and every allowlist entry that is no longer an
    upward import; empty when the contract holds."""
    _, imports = import_graph(root)
    up = upward(imports)
    allowed = read_allowlist(allowlist)
    listed = {(a.importer, a.imported) for a in allowed}
    problems = [
        f"{i.importer} -> {i.imported}: line {i.line} ({i.kind} import) goes up from "
        f"{layer_of(i.importer)} to {layer_of(i.imported)}"
        for i in up
        if (i.importer, i.imported) not in listed
    ]
    present = {(i.importer, i.imported) for i in up}
    problems += [
        f"{allowlist.name}:{a.line}: {a.importer} -> {a.imported} is allowed but no longer an upward "
        "import; remove the line"
        for a in allowed
        if (a.importer, a.imported) not in present
    ]
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", nargs="?", choices=("table", "check"), default="table")
    parser.add_argument("--json", action="store_true", help="print the targets as JSON")
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout to read (default: this one)")
    parser.add_argument("--allow", type=Path, default=ALLOWLIST, help="the allowlist of upward imports")
    args = parser.parse_args(argv)
    try:
        if args.command == "check":
            problems = contract_violations(args.root, args.allow)
            for problem in problems:
                print(f"error: {problem}", file=sys.stderr)
            if problems:
                print(f"{len(problems)} import(s) break the layers (see {Path(__file__).name})", file=sys.stderr)
                return 1
            print("layers: every import goes down (or is in the allowlist)")
            return 0
        report = targets(args.root)
    except ArchitectureError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=2) if args.json else table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
