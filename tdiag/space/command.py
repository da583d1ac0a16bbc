"""`tdiag space FILE.tds`: enumerate, check and cost every point of a design space; print the
table (text, JSON or CSV) with the Pareto front marked; optionally plot it, write each point as a
`.td`, compare with a baseline, and train the front. Only `--train` imports torch."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from ..design import OBJECTIVES
from ..errors import Diagnostic, TdiagError
from ..files import OutputRefusedError, check_output, output_folder, write_output
from ..resources import design_file
from .points import base_path, load_space

SPACE_AXES = ("params", "flops", "time", "peak_memory", "softmax_entries")  # report.METRICS, not imported:
# building the parser (tdiag --help) must not import the planner


def _axes(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if len(names) < 2 or any(n not in SPACE_AXES for n in names):
        raise argparse.ArgumentTypeError(f"expected two or more of {', '.join(SPACE_AXES)}, got '{text}'")
    return names


def _flags(text: str) -> str:
    """`--train-args` text, split as a shell would; unbalanced quotes are a usage error."""
    try:
        shlex.split(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"{error} in '{text}'") from None
    return text


def add_parser(commands, size_list, positive, usage_error) -> None:
    """The `space` subcommand's flags (every one with help that states its default); the CLI's
    own value checkers and usage error are passed in, as this module may not import the CLI."""
    p = commands.add_parser("space", help="enumerate, check, cost and compare every point of a design space (.tds)")
    p.add_argument(
        "file", metavar="FILE.tds", help="a design space file, or a bundled space by name: tuformer, fish, mgk"
    )
    p.add_argument(
        "--at",
        type=size_list,
        default={},
        metavar="N=1024,F=512",
        help="sizes to cost at (run-time sizes such as N default to 1024)",
    )
    p.add_argument("--format", choices=("table", "json", "csv"), default="table", help="a text table, JSON or CSV")
    p.add_argument("--sort", choices=SPACE_AXES, default="flops", help="the column the table is sorted by")
    p.add_argument(
        "--formulas",
        action="store_true",
        help="with the table: each distinct point's formulas below it, the time roofline in full "
        "(default: numbers only; JSON and CSV always hold them)",
    )
    p.add_argument(
        "--pareto",
        type=_axes,
        default=("params", "flops"),
        metavar="A,B",
        help=f"the axes of the Pareto front, all minimized ({', '.join(SPACE_AXES)})",
    )
    p.add_argument("--objective", choices=OBJECTIVES, default="flops", help="how the planner chooses each point's plan")
    p.add_argument(
        "--vs",
        metavar="POINT",
        help="a baseline: a point's name or choices, or a design file or bundled name; adds cost "
        "ratios and the N where the order changes (default: no baseline)",
    )
    p.add_argument(
        "--known",
        nargs="*",
        metavar="FILE.td",
        help="designs to recognise points as (default: the .td files beside the base design)",
    )
    p.add_argument(
        "--plot",
        metavar="OUT.png",
        help="write a plot of the first two Pareto axes, front highlighted (needs matplotlib; default: no plot)",
    )
    p.add_argument(
        "--write",
        metavar="DIR",
        help="write each point as DIR/NAME.td with a header naming its choices (default: write nothing)",
    )
    p.add_argument(
        "--train",
        action="store_true",
        help="train the Pareto points (or --points) on the default corpus and compare them",
    )
    p.add_argument(
        "--points",
        metavar="A,B",
        help="with --train: the points to train, by name or choices (default: the Pareto front)",
    )
    p.add_argument("--steps", type=positive, default=300, help="with --train: optimizer steps per point")
    p.add_argument(
        "--out", default="runs/space", help="with --train: the folder of the runs, the compare table and plots"
    )
    p.add_argument(
        "--train-args",
        type=_flags,
        default="",
        metavar="'--width 64 ...'",
        help="with --train: more `tdiag train` flags for every point (default: none)",
    )
    p.set_defaults(usage_error=usage_error)


def run(args: argparse.Namespace) -> int:
    from . import report

    space = load_space(args.file)
    base = base_path(space.space)
    at = dict(args.at)
    from ..design import load

    base_design = load(str(base))
    unknown = [k for k in at if k not in base_design.graph.sizes]
    if unknown:
        raise args.usage_error(
            f"tdiag space: error: the base design has no size {', '.join(unknown)}; its sizes are: "
            f"{', '.join(base_design.graph.sizes)}"
        )
    _check_outputs(args)
    unreadable = [f for f in args.known or () if not os.path.isfile(design_file(f))]
    if unreadable:  # those beside the base are tried quietly; one named here must be a design file
        raise args.usage_error(f"tdiag space: error: argument --known: '{unreadable[0]}' is not a design file")
    for name, size in base_design.graph.sizes.items():
        if size.is_free and name not in at:
            at[name] = 1024
    files = [Path(f) for f in args.known] if args.known is not None else sorted(base.parent.glob("*.td"))
    known = report.known_programs(files, at)
    rows = report.evaluate(space, at, axes=args.pareto, known=known, objective=args.objective)
    if args.vs:
        baseline = _baseline(args.vs, rows, at, args.objective)
        report.compare_to(rows, baseline, at)
    rows = report.sort_rows(rows, args.sort)
    if args.format == "json":
        print(report.to_json(rows, at, args.objective))
    elif args.format == "csv":
        print(report.to_csv(rows), end="")
    else:
        title = f"space {space.space.name} ({space.count()} points)"
        print(report.text_table(rows, at, args.pareto, title, formulas=args.formulas, objective=args.objective))
    if args.write:
        folder = output_folder(args.write, flag="--write")
        for row in rows:
            write_output(folder / f"{row.point.name}.td", row.point.text(), flag="--write")
        print(f"wrote {len(rows)} points to {folder}/", file=sys.stderr)
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print("tdiag space: matplotlib is not installed; no plot written (pip install matplotlib)", file=sys.stderr)
        else:
            x, y = args.pareto[:2]
            path = report.plot(rows, Path(args.plot), x, y, axes=args.pareto)
            print(f"wrote {path}", file=sys.stderr)
    if args.train:
        from .training import train_points

        return train_points(args, space, rows, at)
    return 0


def _check_outputs(args: argparse.Namespace) -> None:
    """Refuse --write and --plot places that cannot be written, or are files read, before the
    space is costed (files.check_output)."""
    if args.write:
        check_output(args.write, flag="--write", folder=True)
    if args.plot:
        check_output(args.plot, flag="--plot")
        _check_plot_format(args.plot)


def _check_plot_format(path: str) -> None:
    suffix = Path(path).suffix.lstrip(".").lower()
    try:
        from matplotlib.backend_bases import FigureCanvasBase
    except ImportError:
        return  # no plot is drawn; run() says so
    formats = FigureCanvasBase.get_supported_filetypes()
    if suffix and suffix not in formats:
        raise OutputRefusedError(
            Diagnostic(f"--plot {path}: matplotlib cannot write .{suffix}; use one of: .{', .'.join(sorted(formats))}")
        )


@dataclass
class _Design:
    """A design outside the space, costed like a point (for --vs)."""

    design: object
    name: str
    ok: bool = True
    chosen_sizes: frozenset = frozenset()
    problems: tuple = ()

    @property
    def label(self) -> str:
        return self.name


def _baseline(text: str, rows, at, objective):
    """A point (by name or choices, or the design file it equals) of this space, else another
    design costed at the same sizes."""
    from ..design import load
    from .report import cost_rows

    for row in rows:
        if row.point.ok and (text in (row.point.name, row.point.label) or Path(text).stem in row.known):
            return row
    try:
        design = load(text)
    except TdiagError:
        if os.path.lexists(text):  # a file that exists but cannot be read or checked: its own error says why
            raise
        raise TdiagError(Diagnostic(f"--vs {text}: no point of this space and no design by that name")) from None
    own = {k: v for k, v in at.items() if k in design.graph.sizes and not design.graph.sizes[k].is_free}
    design = load(text, **own) if own else design
    return cost_rows([_Design(design, design.name)], at, objective)[0]
