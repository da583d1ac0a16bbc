"""A sliding window's lowerings against each other: designs/mistral.td (GQA, rotate-half RoPE,
`window(n, m, W)`) with its softmax box planned in each candidate form alone (the banded form;
SDPA grouped over the key heads with the band as its boolean attn_mask; the materialized box, the
band filled with −inf in the N² scores) and, for scale, the same block without its window as
causal SDPA (is_causal, which skips the blocks above the diagonal). `--design gemma2_sliding`
(the tanh softcap inside the window, which SDPA cannot apply) weighs the banded form against the
materialized box alone. Forward + backward, float32,
one thread, batch 1, round-robin in one process (tdiag.bench.measure_all); each ratio over the
banded form's time is taken round by round, its median and min–max printed, with the bytes each
module keeps for backward (measured by autograd's saved tensors). The modules are checked equal
to the banded one first (float32, 1e-4 relative).

    OMP_NUM_THREADS=1 python scripts/bench_window.py --n 2048 4096 --repeat 5 --out docs/results/bench-cpu/window
    OMP_NUM_THREADS=1 python scripts/bench_window.py --design gemma2_sliding --n 1024 4096 --repeat 5"""

from __future__ import annotations

import argparse
import csv
import json
import platform
from pathlib import Path

import torch

import tdiag
from tdiag.bench import columns, measure_all
from tdiag.plan.forms import only_forms

ROOT = Path(__file__).resolve().parent.parent
VARIANTS = ("banded", "sdpa band mask", "materialized", "causal sdpa, no window")


def variants(args: argparse.Namespace) -> tuple[str, ...]:
    return VARIANTS if args.design == "mistral" else (VARIANTS[0], VARIANTS[2])


def sizes_of(args: argparse.Namespace) -> dict[str, int]:
    sizes = {"F": args.width, "H": args.heads, "G": args.groups, "W": args.window}
    if args.design == "gemma2_sliding":
        head = args.width // args.heads
        sizes |= {"R": args.heads // args.groups, "D": head, "QS": head}
    return sizes


def modules(n: int, args: argparse.Namespace) -> dict[str, torch.nn.Module]:
    sizes, names = sizes_of(args), variants(args)
    built = {}
    for name, form in zip(VARIANTS[:3], ("banded", "sdpa_grouped", "materialized"), strict=True):
        if name not in names:
            continue
        with only_forms(form):  # a design of its own each: a design caches its plans by size
            built[name] = tdiag.load(ROOT / "designs" / f"{args.design}.td", **sizes).module(N=n)
        assert [c.taken for c in built[name].tdiag_plan.choices] == [form]
    if args.design != "mistral":
        return checked(built, n, args)
    text = (ROOT / "designs" / "mistral.td").read_text().replace("mask = window(n, m, W)", "mask = causal(n, m)")
    path = Path(args.out) / "mistral_causal.td"
    path.write_text(text)
    built[VARIANTS[3]] = tdiag.load(path, **sizes).module(N=n)
    path.unlink()
    return checked(built, n, args)


def checked(built: dict[str, torch.nn.Module], n: int, args: argparse.Namespace) -> dict[str, torch.nn.Module]:
    """The modules with the banded one's weights, each windowed one checked equal to it."""
    state = built["banded"].state_dict()
    for module in built.values():
        module.load_state_dict(state)
    x = torch.randn(1, n, args.width)
    with torch.no_grad():
        expected = built["banded"](x)
        for name in [v for v in VARIANTS[1:3] if v in built]:
            torch.testing.assert_close(built[name](x), expected, rtol=1e-4, atol=1e-4 * expected.abs().max().item())
    return built


def measure(n: int, args: argparse.Namespace) -> dict:
    torch.manual_seed(0)
    built = modules(n, args)
    measured = measure_all(list(built.values()), torch.randn(1, n, args.width), False, args.repeat)
    timings = dict(zip(built, measured, strict=True))
    row: dict = {"n": n, "window": args.window}
    for name in variants(args):
        row |= columns(name, timings[name], timings["banded"], "banded")
    cells = [
        f"{name}: {row[f'{name} ms']:.0f} ms, x{row[f'{name} / banded']:.2f}"
        f" ({row[f'{name} / banded min']:.2f}-{row[f'{name} / banded max']:.2f}), {row[f'{name} kept MB']:.0f} MB"
        for name in variants(args)
    ]
    print(f"N={n}: " + "; ".join(cells), flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--design", choices=("mistral", "gemma2_sliding"), default="mistral")
    parser.add_argument("--n", type=int, nargs="+", default=[2048, 4096])
    parser.add_argument("--window", type=int, default=256)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", default=None, help="default docs/results/bench-cpu/window (mistral), else a subfolder")
    args = parser.parse_args()
    args.out = args.out or "docs/results/bench-cpu/window" + ("" if args.design == "mistral" else f"/{args.design}")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    rows = [measure(n, args) for n in args.n]
    meta = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "threads": torch.get_num_threads(),
        "args": vars(args),
    }
    (Path(args.out) / "window.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    with open(Path(args.out) / "window.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main()
