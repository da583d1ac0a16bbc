"""`tdiag space --train`: train the Pareto points of a space (or the points named by --points)
with `tdiag train`'s machinery, one run folder per point (resumed when it holds a checkpoint),
the same seed and data for all; then the `--compare` table and plots, and the front in
(training FLOPs, validation loss)."""

from __future__ import annotations

import argparse
import io
import json
import shlex
import sys
from pathlib import Path

from ..errors import Diagnostic, TdiagError
from ..files import output_folder, write_output


def chosen_rows(rows: list, names: str | None) -> list:
    """The rows to train: by point name, choices or the design file a point equals; else the front."""
    if not names:
        return [r for r in rows if r.front]
    picked = []
    for name in (n.strip() for n in names.split(",") if n.strip()):
        match = [r for r in rows if r.point.ok and name in (r.point.name, r.point.label, *r.known)]
        if not match:
            raise TdiagError(
                Diagnostic(
                    f"--points: no point '{name}' in this space (give a name, the choices, or a design it equals)"
                )
            )
        row = next((r for r in match if r.representative), match[0])
        if all(row is not other for other in picked):
            picked.append(row)
    return picked


def train_points(args: argparse.Namespace, space, rows: list, at: dict) -> int:
    from .. import train as training
    from ..cli import argument_parser
    from ..train_config import config_from

    picked = chosen_rows(rows, args.points)
    if not picked:
        raise TdiagError(Diagnostic("no point to train (the front is empty: every point failed check)"))
    out = Path(args.out)
    folder = output_folder(out / "points", flag="--out")
    files = [str(write_output(folder / f"{row.point.name}.td", row.point.text())) for row in picked]
    flags = ["train", *files, "--compare", "--steps", str(args.steps), *shlex.split(args.train_args)]
    train_args = argument_parser().parse_args(flags)
    _refuse_run_flags(args, train_args, len(files))
    results = []
    for row, file in zip(picked, files, strict=True):
        config = config_from(train_args, file, {})
        config.out = str(out / row.point.name)
        resume = (Path(config.out) / "checkpoint.pt").is_file()
        print(f"tdiag space: training {row.point.label}" + (" (resumed)" if resume else ""), file=sys.stderr)
        result = training.train(config, resume=resume, progress=not train_args.no_progress)
        result["choices"] = row.point.label
        result["equals_design"] = row.known
        results.append(result)
    training.write_comparison(out, results)
    _write_front(out, results)
    print((out / "compare.md").read_text())
    print((out / "front.md").read_text())
    print(f"wrote {out}/compare.md, compare.csv, compare.json, compare.png, front.md, front.png")
    return 0


def _refuse_run_flags(args: argparse.Namespace, train_args: argparse.Namespace, points: int) -> None:
    """`tdiag space` chooses each point's run folder, resumes a point that has a checkpoint and
    trains in one process: --train-args that would choose otherwise are refused, never ignored."""
    given = {
        "--resume": train_args.resume is not None,
        "--out": bool(train_args.out),
        "--overwrite": train_args.overwrite,
        "--nproc": train_args.nproc != 1,
        "--seeds": train_args.seeds != 1,  # one run per point: front.md has no spread to read
        "a design file": len(train_args.designs) != points,
    }
    refused = [flag for flag, is_given in given.items() if is_given]
    if refused:
        raise args.usage_error(
            f"tdiag space: error: argument --train-args: {', '.join(refused)} cannot go in --train-args "
            "(tdiag space names each point's run folder under --out and resumes a point that has a checkpoint)"
        )


def _write_front(out: Path, results: list[dict]) -> None:
    """Which trained points no other beats on both training FLOPs and final validation loss."""
    items = [(r["flops_per_step"] * r["log"][-1]["step"], r["final_val_loss"], r) for r in results]
    lines = [
        "| point | choices | equals | attention params | train FLOPs | final val loss | front |",
        "|---|---|---|---:|---:|---:|:---:|",
    ]
    front = []
    for flops, loss, r in items:
        beaten = any(f <= flops and v <= loss and (f, v) != (flops, loss) for f, v, _ in items)
        front.append(not beaten)
        equals = ", ".join(r["equals_design"]) or "-"
        mark = "*" if not beaten else ""
        lines.append(
            f"| {r['design']} | {r['choices']} | {equals} | {r['attention_parameters']:,} | {flops:.3g} "
            f"| {r['final_val_loss']:.4f} | {mark} |"
        )
    write_output(out / "front.md", "\n".join(lines) + "\n")
    write_output(
        out / "front.json",
        json.dumps(
            [
                {"design": r["design"], "choices": r["choices"], "train_flops": f, "final_val_loss": v, "front": k}
                for (f, v, r), k in zip(items, front, strict=True)
            ],
            indent=2,
        ),
    )
    try:
        import matplotlib
    except ImportError:
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for (flops, loss, r), on in zip(items, front, strict=True):
        ax.scatter([flops], [loss], c="tab:red" if on else "tab:gray")
        ax.annotate(
            ", ".join(r["equals_design"]) or r["choices"],
            (flops, loss),
            fontsize=7,
            xytext=(3, 3),
            textcoords="offset points",
        )
    ax.set_xscale("log")
    ax.set_xlabel("training FLOPs (tdiag cost)")
    ax.set_ylabel("final validation loss (nats/char)")
    ax.set_title("trained points; red: front in (FLOPs, loss)")
    fig.tight_layout()
    image = io.BytesIO()
    fig.savefig(image, format="png", dpi=120)
    plt.close(fig)
    write_output(out / "front.png", image.getvalue())
