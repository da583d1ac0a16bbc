"""`tdiag check|show|render`: the only place that prints or exits. A mistake in a `.td` file
exits 1 with positioned messages; a usage mistake exits 2; neither shows a traceback."""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import os
import re
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

from . import __version__
from .design import COST_OBJECTIVE, DEFAULT_OBJECTIVE, OBJECTIVES, Design, load
from .errors import Diagnostic, TdiagError, format_diagnostic
from .files import OutputRefusedError, check_output, one_command, write_output
from .graph import LIMITS
from .resources import bundled_designs, bundled_spaces, design_file, designs_folder
from .train_config import (
    MAX_SEED,
    TrainConfig,
    add_arguments,
    config_from,
    device_name,
    given_settings,
    positive_int,
    resume_refusals,
    resumed,
    seed_int,
)

RENDER_FORMATS = ("dot", "pdf", "png", "svg")
DESIGN_HELP = "a .td file, or a bundled design's name (e.g. fish)"
OBJECTIVE_HELP = (
    "how the planner chooses: time: the least estimated training-step time on the planning device "
    "(TDIAG_DEVICE, else this CPU); flops: the fewest FLOPs (fused attention only where it costs no more); "
    "memory: fused attention wherever it applies"
)
ATTENTION_HELP = (
    "the fused kernel for softmax boxes: sdpa (scaled_dot_product_attention) or flex (FlexAttention, score_mod and "
    "block mask; with torch 2.13 on CPU inference only, float32/16/bf16 under torch.compile)"
)


class _UsageError(Exception):
    pass


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every flag's help states its default once: at its end, unless the help already says it
    in its own words (a flag whose absence means something other than a value, None or "", always
    does); positional arguments have no default to show."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if not action.option_strings or action.default in (None, "", argparse.SUPPRESS) or "default" in text.lower():
            return text  # the help says what happens when the flag is not given
        if action.default in ([], {}):
            return f"{action.help} (default: none)"
        return super()._get_help_string(action) or ""


class _Parser(argparse.ArgumentParser):
    """tdiag's parsers: a flag is spelt in full (`--step 5` is not taken as `--steps`), and a
    flag no command has is refused with the closest flag of the command it was given to."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    def error(self, message: str) -> None:  # type: ignore[override]
        raise _UsageError(f"{self.prog}: error: {message}")

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            command = _command_parser(self, parsed)
            raise _UsageError(f"{command.prog}: error: {_unrecognized(extras[0], command)}")
        return parsed


def _command_parser(parser: argparse.ArgumentParser, parsed: argparse.Namespace) -> argparse.ArgumentParser:
    """The (sub)command parser the arguments were given to: `tdiag cost`'s for `tdiag cost ...`."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen = action.choices.get(getattr(parsed, action.dest, None) or "")
            if chosen is not None:
                return _command_parser(chosen, parsed)
    return parser


def _unrecognized(argument: str, parser: argparse.ArgumentParser) -> str:
    """`unrecognized argument '--at-n'; did you mean '--at'?`, the guess among the command's own flags."""
    flag = argument.split("=", 1)[0]
    message = f"unrecognized argument '{flag if flag.startswith('-') else argument}'"
    if not flag.startswith("-"):
        return message
    flags = [f for action in parser._actions for f in action.option_strings if f.startswith("--")]
    guess = difflib.get_close_matches(flag, flags, n=1, cutoff=0.6)
    return f"{message}; did you mean '{guess[0]}'?" if guess else message


def _size_setting(text: str) -> tuple[str, int]:
    """`--set F=256` -> ("F", 256); `--set mgk:D=16` -> ("mgk:D", 16), a size of one design
    (by file name) among several given to `tdiag train --compare`."""
    name, sep, value = text.partition("=")
    design, colon, size = name.strip().rpartition(":")
    if not sep or not size.isidentifier() or (colon and not design):
        raise argparse.ArgumentTypeError(f"expected NAME=NUMBER or DESIGN:NAME=NUMBER, got '{text}'")
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"size {name} must be a whole number, got '{value}'") from None
    if number <= 0:
        raise argparse.ArgumentTypeError(f"size {name} must be positive, got {number}")
    if number > LIMITS.max_size:
        raise argparse.ArgumentTypeError(f"size {name} = {number:,} is over the limit of {LIMITS.max_size:,}")
    return name.strip(), number


def _design_size(text: str) -> tuple[str, int]:
    """`--set F=256` of check, show, render and compile: one design, so no DESIGN: prefix."""
    name, value = _size_setting(text)
    if ":" in name:
        raise argparse.ArgumentTypeError(
            f"expected NAME=NUMBER, e.g. F=256, got '{text}' (DESIGN:NAME=NUMBER is for tdiag train --compare)"
        )
    return name, value


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got '{text}'") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {value}")
    return value


def _objective_list(text: str) -> str:
    """`flops,time` -> the same text, each name checked."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in OBJECTIVES]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"expected objectives among {', '.join(OBJECTIVES)}, got '{text}'")
    return ",".join(names)


def _size_list(text: str) -> dict[str, int]:
    """`N=1024,F=512` -> {"N": 1024, "F": 512}; a size given twice is refused."""
    sizes: dict[str, int] = {}
    for name, value in (_design_size(part.strip()) for part in text.split(",") if part.strip()):
        if name in sizes:
            raise argparse.ArgumentTypeError(f"size {name} is given twice ({name}={sizes[name]}, {name}={value})")
        sizes[name] = value
    return sizes


def argument_parser() -> _Parser:
    parser = _Parser(
        prog="tdiag",
        description="A tensor-diagram compiler for attention designs. A design is a .td file, "
        "or the name of a bundled design (`tdiag list` names them).",
    )
    parser.add_argument("--version", action="version", version=f"tdiag {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def with_sizes(p: argparse.ArgumentParser, *, several: bool = False) -> None:
        if several:
            form, rule = "[DESIGN:]NAME=N", _size_setting
            text = (
                "override a size (repeatable): NAME=N for every design that has it, e.g. --set M=2; "
                "DESIGN:NAME=N for one design of --compare, e.g. --set mgk:D=16"
            )
        else:
            form, rule = "NAME=N", _design_size
            text = "override a size of the design (repeatable), e.g. --set F=256 --set H=4"
        p.add_argument("--set", dest="sizes", action="append", type=rule, default=[], metavar=form, help=text)

    def with_objective(p: argparse.ArgumentParser, default: str = DEFAULT_OBJECTIVE) -> None:
        p.add_argument("--objective", choices=OBJECTIVES, default=default, help=OBJECTIVE_HELP)

    def with_attention(p: argparse.ArgumentParser) -> None:
        p.add_argument("--attention", choices=("sdpa", "flex"), default="sdpa", help=ATTENTION_HELP)

    commands.add_parser("list", help="name the bundled designs and design spaces, each with its title")

    p = commands.add_parser("check", help="parse and check designs; print a summary or every mistake")
    p.add_argument("files", nargs="+", metavar="FILE.td", help=DESIGN_HELP)
    p.add_argument("--time", action="store_true", help="print how long checking took")
    with_sizes(p)

    p = commands.add_parser("show", help="print the design graph as a readable summary")
    p.add_argument("file", metavar="FILE.td", help=DESIGN_HELP)
    with_sizes(p)

    p = commands.add_parser("compile", help="write a standalone PyTorch module for a design")
    p.add_argument("file", metavar="FILE.td", help=DESIGN_HELP)
    p.add_argument("-o", "--output", required=True, metavar="OUT.py", help="the Python file to write")
    p.add_argument(
        "--plan-n",
        type=_positive,
        default=None,
        metavar="N",
        help="sequence length to plan for (default: 1024 where the design has a size N)",
    )
    p.add_argument("--checkpoint-boxes", action="store_true", help="recompute softmax boxes in the backward pass")
    p.add_argument("--causal", action="store_true", help="mask the future: causal(n, m) on every box over m")
    with_objective(p)
    with_attention(p)
    with_sizes(p)

    p = commands.add_parser("cost", help="parameters, FLOPs, softmax entries and peak memory, side by side")
    p.add_argument("files", nargs="+", metavar="FILE.td", help=DESIGN_HELP)
    p.add_argument(
        "--at", type=_size_list, default={}, metavar="N=1024,F=512", help="sizes to evaluate at (others stay symbols)"
    )
    p.add_argument("--format", choices=("table", "json"), default="table", help="a text table or JSON")
    p.add_argument(
        "--causal",
        action="store_true",
        help="mask the future: causal(n, m) on every box over m (also the FLOPs a block-skipping kernel does)",
    )
    p.add_argument(
        "--convention",
        choices=("flop", "mac", "paper"),
        default="flop",
        help="how contractions are counted: flop 2 per multiply-add, mac 1, paper FiSH App. D / MGK App. B",
    )
    with_objective(p, COST_OBJECTIVE)

    p = commands.add_parser(
        "plan", help="the lowered program: each op with its FLOPs, bytes moved and kept, the rewrites taken"
    )
    p.add_argument("file", metavar="FILE.td", help=DESIGN_HELP)
    p.add_argument("--at", type=_size_list, default={}, metavar="N=1024,F=512", help="sizes to plan for")
    p.add_argument("--causal", action="store_true", help="mask the future: causal(n, m) on every box over m")
    p.add_argument("--checkpoint-boxes", action="store_true", help="recompute softmax boxes in the backward pass")
    with_objective(p)
    with_attention(p)

    p = commands.add_parser("catalog", help="a Markdown page of designs by family: cost formulas and numbers")
    p.add_argument("paths", nargs="+", metavar="FOLDER|FILE.td", help="folders of .td files, or .td files")
    p.add_argument("--at", type=_size_list, default={}, metavar="N=1024,F=512", help="sizes to give numbers at")
    p.add_argument("-o", "--output", metavar="OUT.md", help="the page to write (default: print it)")
    with_objective(p, COST_OBJECTIVE)

    p = commands.add_parser("bench", help="time compiled designs against hand-written references")
    p.add_argument("files", nargs="+", metavar="FILE.td", help=DESIGN_HELP)
    p.add_argument("--n", type=_positive, default=256, help="sequence length N")
    p.add_argument("--batch", type=_positive, default=8, help="sequences per step")
    p.add_argument("--width", type=_positive, default=256, help="model width F")
    p.add_argument("--heads", type=_positive, default=4, help="heads H")
    p.add_argument("--repeat", type=_positive, default=10, help="timed forward + backward passes per design")
    p.add_argument("--causal", action="store_true", help="mask the future in every box")
    p.add_argument(
        "--objective",
        type=_objective_list,
        default=DEFAULT_OBJECTIVE,
        metavar="OBJECTIVE[,OBJECTIVE...]",
        help="planning objectives to compile each design with, side by side (e.g. flops,time); ratios are to the first",
    )
    p.add_argument(
        "--device", type=device_name, default="auto", help="cpu, cuda, cuda:N, mps; auto: cuda when available"
    )
    p.add_argument(
        "--baseline",
        metavar="DIR",
        help="also time DIR/NAME.py (NAME.causal.py with --causal): a standalone file from `tdiag compile`, "
        "e.g. at an older commit, given the compiled module's weights (default: none)",
    )
    p.add_argument("--out", default="out/bench", help="folder for bench.json, bench.csv and bench.png")

    p = commands.add_parser("train", help="train a character language model whose attention is the design")
    add_arguments(p)
    with_sizes(p, several=True)

    p = commands.add_parser("generate", help="print text drawn from a trained run's model after a prompt")
    p.add_argument("run", metavar="RUN", help="a run folder of `tdiag train` (its last checkpoint)")
    p.add_argument("--prompt", required=True, help="the text to continue (characters of the run's data)")
    p.add_argument("--length", type=positive_int, default=400, help="characters to draw")
    p.add_argument("--seed", type=seed_int, default=0, help="seed of the draw")
    p.add_argument("--device", type=device_name, default="cpu", help="cpu, cuda, cuda:N, mps")

    from .space.command import add_parser as add_space_parser

    add_space_parser(commands, _size_list, _positive, _UsageError)

    p = commands.add_parser("render", help="draw the diagram in the papers' notation")
    p.add_argument("file", metavar="FILE.td", help=DESIGN_HELP)
    p.add_argument("-o", "--output", required=True, metavar="OUT", help=f"output file: .{', .'.join(RENDER_FORMATS)}")
    p.add_argument(
        "--statements",
        action="store_true",
        help="draw one panel per statement, each computed tensor a node (the fallback for a large diagram)",
    )
    with_sizes(p)
    return parser


def _available_device(command: str, name: str) -> None:
    """`--device cuda` on a machine without one is a usage error, found before any work."""
    from .train import resolve_device

    try:
        resolve_device(name)
    except TdiagError as error:
        raise _UsageError(f"tdiag {command}: error: argument --device: {error.diagnostics[0].message}") from None


def _print_diagnostics(diagnostics: Sequence[Diagnostic]) -> None:
    for d in diagnostics:
        print(format_diagnostic(d), file=sys.stderr)


def _load(file: str, sizes: list[tuple[str, int]]) -> Design:
    per_design = [f"{name}={value}" for name, value in sizes if ":" in name]
    if per_design:
        raise _UsageError(f"tdiag: error: --set {per_design[0]}: sizes of one design are for tdiag train --compare")
    design = load(file, **dict(sizes))
    _print_diagnostics(design.warnings)
    return design


def _check(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    failed = 0
    for file in args.files:
        try:
            design = _load(file, args.sizes)
        except TdiagError as error:
            _print_diagnostics(error.diagnostics)
            failed += 1
            continue
        print(_checked_line(file, design))
    if args.time:
        print(f"checked {len(args.files)} file(s) in {time.perf_counter() - start:.2f} s")
    if failed:
        print(f"{failed} of {len(args.files)} file(s) have errors", file=sys.stderr)
    return 1 if failed else 0


def _list(args: argparse.Namespace) -> int:
    folder = designs_folder()
    designs = [(name, _title(folder / f"{name}.td")) for name in bundled_designs()]
    spaces = [(name, _title(folder / "spaces" / f"{name}.tds")) for name in bundled_spaces()]
    width = max(len(name) for name, _ in designs + spaces)
    print(f"bundled designs ({len(designs)}; e.g. tdiag check fish):")
    print("\n".join(f"  {name:<{width}}  {title}" for name, title in designs))
    print(f"bundled design spaces ({len(spaces)}; e.g. tdiag space tuformer):")
    print("\n".join(f"  {name:<{width}}  {title}" for name, title in spaces))
    return 0


def _title(file: Path, width: int = 80) -> str:
    """A bundled file's title: the first sentence of its leading comment, cut at a word to
    `width` characters (`Gated linear attention (GLA)`)."""
    comment = []
    for line in file.read_text(encoding="utf-8").split("\n"):
        if not line.startswith("#") or line.startswith(("# Paper:", "# Spec:")):
            break
        comment.append(line.removeprefix("#").strip())
    sentence = re.split(r"(?<=[.;])\s", " ".join(comment), maxsplit=1)[0].rstrip(".;")
    return sentence if len(sentence) <= width else sentence[: width - 3].rsplit(" ", 1)[0] + "..."


def _show(args: argparse.Namespace) -> int:
    print(_load(args.file, args.sizes).show())
    return 0


def _render(args: argparse.Namespace) -> int:
    from .render import DiagramTooLarge, RenderError

    suffix = args.output.rsplit(".", 1)[-1].lower() if "." in args.output else ""
    if suffix not in RENDER_FORMATS:
        raise _UsageError(
            f"tdiag render: error: cannot tell the format of '{args.output}'; "
            f"use a file ending in one of: .{', .'.join(RENDER_FORMATS)}"
        )
    check_output(args.output, [design_file(args.file)], flag="-o")
    design = _load(args.file, args.sizes)
    try:
        with warnings.catch_warnings(record=True) as notes:
            warnings.simplefilter("always", DiagramTooLarge)
            path = design.render(args.output, inline=not args.statements)
    except RenderError as error:
        print(f"tdiag render: error: {error}", file=sys.stderr)
        return 1
    for note in notes:
        if issubclass(note.category, DiagramTooLarge):
            print(f"tdiag render: note: {note.message}", file=sys.stderr)
        else:
            warnings.showwarning(note.message, note.category, note.filename, note.lineno)
    print(f"wrote {path}")
    return 0


def _compile(args: argparse.Namespace) -> int:
    from .codegen import class_name

    check_output(args.output, [design_file(args.file)], flag="-o")
    design = _load(args.file, args.sizes)
    if args.causal:
        design = design.with_causal_mask()
    sizes = {"N": args.plan_n} if args.plan_n else {}
    if args.plan_n and "N" not in design.graph.sizes:
        raise _UsageError(f"tdiag compile: error: design '{design.name}' has no size N to plan for")
    options = {"checkpoint_boxes": args.checkpoint_boxes, "objective": args.objective, "attention": args.attention}
    plan = design.plan(**options, **sizes)
    source = design.source(**options, **sizes)
    write_output(args.output, source, design.graph.sources, flag="-o")
    print(f"wrote {args.output}: class {class_name(design.graph.name)}, {len(plan.steps)} steps")
    for note in plan.lowered or ["every box is computed as written (no lowering was cheaper)"]:
        print(f"  {note}")
    return 0


def _checked_line(file: str, design: Design) -> str:
    """`fish: ok (...)`: the file as named, then the summary; the design's name is added where
    the file's name is not the design's (`variant.td: ok (design mhsa; ...)`)."""
    name = design.graph.name
    status = design.summary().removeprefix(f"{name}: ")
    if Path(file).name.removesuffix(".td") != name:
        status = status.replace("ok (", f"ok (design {name}; ", 1)
    return f"{file}: {status}"


def _cost(args: argparse.Namespace) -> int:
    from .cost import cost_report, table, to_json

    designs = [_load(f, []) for f in args.files]
    known = set().union(*(d.graph.sizes for d in designs))
    unknown = [k for k in args.at if k not in known]
    if unknown:
        raise _UsageError(
            f"tdiag cost: error: no design has a size {', '.join(unknown)}; their sizes are: {', '.join(sorted(known))}"
        )
    reports = []
    for design in designs:
        own = {k: v for k, v in args.at.items() if k in design.graph.sizes}
        fixed = {k: v for k, v in own.items() if not design.graph.sizes[k].is_free}
        if fixed:
            design = load(design.graph.file, **fixed)
        runtime = {k: v for k, v in own.items() if design.graph.sizes[k].is_free}
        design = design.with_causal_mask() if args.causal else design
        reports.append(cost_report(design.plan(objective=args.objective, **runtime), args.convention))
    print(to_json(reports, args.at) if args.format == "json" else table(reports, args.at))
    return 0


def _catalog(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .catalog import catalog

    paths: list[Path] = []
    for text in args.paths:
        given = Path(text)
        if not text:  # Path("") would be the current folder
            raise _UsageError("tdiag catalog: error: an empty path is neither a folder nor a .td file")
        if os.path.isdir(given):
            paths += sorted(given.glob("*.td"))
        elif os.path.isfile(given):
            paths.append(given)
        else:
            raise _UsageError(f"tdiag catalog: error: '{given}' is neither a folder nor a .td file")
    if not paths:
        raise _UsageError(f"tdiag catalog: error: no .td files in {', '.join(args.paths)}")
    if args.output:
        check_output(args.output, paths, flag="-o")
    at = ",".join(f"{k}={v}" for k, v in args.at.items())
    command = " ".join(["tdiag catalog", *args.paths, *(["--at", at] if at else [])])
    command += f" --objective {args.objective}" if args.objective != COST_OBJECTIVE else ""
    text = catalog(paths, args.at, command, objective=args.objective)
    if args.output:
        write_output(args.output, text, paths, flag="-o")
        print(f"wrote {args.output}: {len(paths)} designs")
    else:
        print(text, end="")
    return 0


def _plan(args: argparse.Namespace) -> int:
    from .plan.report import plan_table

    design = _load(args.file, [])
    unknown = [k for k in args.at if k not in design.graph.sizes and k != "B"]
    if unknown:
        known = ", ".join(sorted(design.graph.sizes))
        raise _UsageError(f"tdiag plan: error: {design.name} has no size {', '.join(unknown)}; its sizes are: {known}")
    fixed = {k: v for k, v in args.at.items() if k in design.graph.sizes and not design.graph.sizes[k].is_free}
    if fixed:
        design = load(design.graph.file, **fixed)
    if args.causal:
        design = design.with_causal_mask()
    runtime = {k: v for k, v in args.at.items() if k == "B" or design.graph.sizes[k].is_free}
    plan = design.plan(
        checkpoint_boxes=args.checkpoint_boxes, objective=args.objective, attention=args.attention, **runtime
    )
    print(plan_table(plan, {k: v for k, v in args.at.items() if k == "B"}))
    return 0


def _bench_settings_text(settings: dict) -> str:
    """`forward + backward on cpu, N=64, batch 8, F=256, H=4, plain, objective time, median of 5`."""
    parts = [
        f"forward + backward on {settings['device']}",
        f"N={settings['n']}",
        f"batch {settings['batch']}",
        f"F={settings['width']}",
        f"H={settings['heads']}",
        "causal" if settings["causal"] else "plain",
        f"objective {settings['objective']}",
        f"median of {settings['repeat']} (round-robin)",
    ]
    if settings.get("baseline"):
        parts.append(f"against the baseline in {settings['baseline']}")
    return ", ".join(parts)


def _bench(args: argparse.Namespace) -> int:
    from . import bench

    check_output(args.out, flag="--out", folder=True)
    for file in args.files:
        _load(file, [])
    if args.device == "auto":
        args.device = "cuda" if _has_cuda() else "cpu"
    _available_device("bench", args.device)
    if args.baseline is not None and not os.path.isdir(args.baseline):
        raise _UsageError(f"tdiag bench: error: argument --baseline: '{args.baseline}' is not a folder")
    names = ("n", "batch", "width", "heads", "repeat", "causal", "objective", "device", "baseline")
    settings = {k: getattr(args, k) for k in names}
    print(f"tdiag bench: {_bench_settings_text(settings)}")
    rows = bench.run(args.files, log=lambda line: print(line, flush=True), **settings)
    print()
    print(bench.table(rows))
    written = bench.write(rows, Path(args.out), settings)
    for path in written:
        print(f"wrote {path}")
    return 0


def _train(args: argparse.Namespace) -> int:
    import subprocess

    from . import train as training

    _available_device("train", args.device)
    resumed_config = _resumed_config(args) if args.resume else None  # refused flags: once, before torchrun

    if args.nproc > 1 and "RANK" not in os.environ:
        argv = [a for a in sys.argv[2:] if a != "--nproc" and not a.startswith("--nproc=")]
        if "--nproc" in sys.argv:
            index = sys.argv.index("--nproc")
            argv = sys.argv[2:index] + sys.argv[index + 2 :]
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.nproc}"]
        return subprocess.call([*command, "-m", "tdiag.train", *argv])
    if resumed_config is not None:
        result = training.train(resumed_config, resume=True, progress=not args.no_progress)
        return _report_training(result)
    if not args.designs:
        raise _UsageError("tdiag train: error: give a design file, e.g. tdiag train designs/mhsa.td")
    designs = {file: _load(file, []) for file in args.designs}
    if args.compare:
        if len(args.designs) < 2:
            raise _UsageError("tdiag train: error: --compare needs two or more designs")
        out = Path(args.out or "runs/compare")
        configs = [config_from(args, d, _design_sizes(d, designs, args.sizes)) for d in args.designs]
        configs = [seeded for config in configs for seeded in _seeded(config, out, args.seeds)]
        results = training.compare(configs, out, progress=not args.no_progress, overwrite=args.overwrite)
        if os.environ.get("RANK", "0") == "0":  # one report under torchrun
            print((out / "compare.md").read_text())
            print(f"wrote {out}/compare.md, compare.csv, compare.json, compare.png")
        return 0 if results else 1
    if args.seeds > 1:
        raise _UsageError("tdiag train: error: --seeds is for --compare (train several designs over several seeds)")
    if len(args.designs) != 1:
        raise _UsageError("tdiag train: error: train one design, or several with --compare")
    own = _design_sizes(args.designs[0], designs, args.sizes)
    config = config_from(args, args.designs[0], own)
    result = training.train(config, overwrite=args.overwrite, progress=not args.no_progress)
    return _report_training(result)


def _seeded(config: TrainConfig, out: Path, seeds: int) -> list[TrainConfig]:
    """One design's runs under --compare: its folder OUT/DESIGN, or OUT/DESIGN-seedS for each of
    `seeds` seeds from --seed on."""
    folder = out / Path(config.design).stem
    if seeds == 1:
        return [dataclasses.replace(config, out=str(folder))]
    if config.seed + seeds - 1 > MAX_SEED:
        raise _UsageError(f"tdiag train: error: --seed {config.seed} --seeds {seeds}: seeds go past {MAX_SEED:,}")
    return [
        dataclasses.replace(config, seed=seed, out=f"{folder}-seed{seed}")
        for seed in range(config.seed, config.seed + seeds)
    ]


def _resumed_config(args: argparse.Namespace) -> TrainConfig:
    """The settings of the run in --resume's folder with the flags given explicitly applied: each
    either may change (RESUMABLE: steps, evaluation, device, ...) or must equal the run's own, else
    it is refused by name; none is ignored."""
    from .runs import read_run_config, recorded_design

    for flag, given in (("--overwrite", args.overwrite), ("--compare", args.compare), ("--seeds", args.seeds > 1)):
        if given:
            raise _UsageError(f"tdiag train: error: --resume continues one run; {flag} cannot go with it")
    folder = Path(args.resume)
    config, _, _ = read_run_config(folder)
    wanted = given_settings(args)
    if "data" in wanted:
        wanted["data"] = str(Path(str(wanted["data"])).resolve())
    if args.designs:
        wanted["design"] = recorded_design(args.designs[0]) if len(args.designs) == 1 else ",".join(args.designs)
    refusals = resume_refusals(config, wanted)
    if args.out and Path(args.out).resolve() != folder.resolve():
        refusals.append(f"--out cannot change on resume: the run's folder is {folder}")
    if any(":" in name for name, _ in args.sizes):
        refusals.append("--set DESIGN:NAME=N is for --compare, not --resume")
    if refusals:
        raise _UsageError("\n".join(f"tdiag train: error: {refusal}" for refusal in refusals))
    return resumed(config, wanted)


def _design_sizes(file: str, designs: dict[str, Design], settings: list[tuple[str, int]]) -> dict[str, int]:
    """The `--set` sizes for one design: NAME=N for every design that has the size (an error if
    none has it), DESIGN:NAME=N for the design whose file is DESIGN.td only."""

    stems = {Path(f).stem for f in designs}
    sizes: dict[str, int] = {}
    for name, value in settings:
        stem, _, size = name.rpartition(":")
        if stem and stem not in stems:
            raise _UsageError(
                f"tdiag train: error: --set {name}={value}: no design '{stem}' among {', '.join(sorted(stems))}"
            )
        if not stem and not any(size in d.graph.sizes for d in designs.values()):
            known = sorted(set().union(*(d.graph.sizes for d in designs.values())))
            raise _UsageError(
                f"tdiag train: error: --set {name}={value}: no design has a size {size}; sizes: {', '.join(known)}"
            )
        if stem == Path(file).stem or (not stem and (size in designs[file].graph.sizes or len(designs) == 1)):
            sizes[size] = value
    return sizes


def _generate(args: argparse.Namespace) -> int:
    from .train import generate

    _available_device("generate", args.device)
    text = generate(Path(args.run), args.prompt, args.length, args.seed, args.device)
    print(args.prompt + text)
    return 0


def _report_training(result: dict) -> int:

    if result.get("final_val_loss") is not None and os.environ.get("RANK", "0") == "0":
        print(
            f"{result['design']}: validation loss {result['final_val_loss']:.4f} nats/char "
            f"(unigram baseline {result['unigram_val_loss']:.4f}); run folder {result['folder']}"
        )
    return 0


def _space(args: argparse.Namespace) -> int:
    from .space.command import run

    return run(args)


COMMANDS = {
    "space": _space,
    "train": _train,
    "generate": _generate,
    "list": _list,
    "check": _check,
    "show": _show,
    "render": _render,
    "compile": _compile,
    "cost": _cost,
    "plan": _plan,
    "catalog": _catalog,
    "bench": _bench,
}


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = argument_parser().parse_args(argv)
        with one_command():
            code = COMMANDS[args.command](args)
        sys.stdout.flush()  # a closed pipe shows here, inside the handler, not at exit
        return code
    except BrokenPipeError:
        # the reader went away (`tdiag cost ... | head`): stop quietly, like a command killed by SIGPIPE
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    except _UsageError as error:
        print(error, file=sys.stderr)
        print("run 'tdiag --help' for usage", file=sys.stderr)
        return 2
    except OutputRefusedError as error:
        _print_diagnostics(error.diagnostics)
        return 2
    except TdiagError as error:
        _print_diagnostics(error.diagnostics)
        return 1
    except KeyboardInterrupt:
        print("tdiag: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
