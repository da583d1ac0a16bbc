"""Multi-Token Attention's key-query convolution, three ways, causal: designs/multi_token_attention.td
(`conv[...]`, one grouped conv2d), the same design written the old way (one-hot shift tensors from
index(), Sq[n a i] and Sk[m b j], contracted with the scores over a and b; Mask_0 as the factor
causal(a, b), Mask_-inf as the box's mask), and a hand-written PyTorch module as the authors' code
computes it (masked_fill 0, F.pad, conv2d with groups = heads, −inf, softmax, the head mix, the group
norm). Forward + backward, float32, one thread, batch 1, round-robin in one process
(tdiag.bench.measure_all); each ratio over the conv design's time is taken round by round, its
median and min–max printed, with the bytes each module keeps for backward. The modules are checked
equal to the conv design first (float32, 1e-4 relative). The shift-tensor design is timed up to
--shifted-up-to (256): it keeps 0.76 GB for backward at N = 256, and N² as much beyond.

    OMP_NUM_THREADS=1 python scripts/bench_conv.py --n 256 1024 --repeat 5 --out docs/results/bench-cpu/conv"""

from __future__ import annotations

import argparse
import csv
import json
import math
import platform
from pathlib import Path

import torch

import tdiag
from tdiag.bench import columns, measure_all

ROOT = Path(__file__).resolve().parent.parent
VARIANTS = ("conv", "shift tensors", "hand-written")
CONV_LINE = "A[h n m] = softmax[m](conv[n = n - i, m = m - j + (CK - 1) / 2](S[h n m], theta[h i j]))"
SHIFTED_LINES = (
    "Sq[n a i] = relu(1 - abs(index(n) - index(i) - index(a)))\n"
    "Sk[m b j] = relu(1 - abs(index(m) - index(j) + (CK - 1) / 2 - index(b)))\n"
    "A[h n m] = softmax[m, mask = causal(n, m)](theta[h i j] Sq[n a i] Sk[m b j] S[h a b] causal(a, b))"
)


class HandWritten(torch.nn.Module):
    """MTA as the authors' code computes it (facebookresearch/RAM projects/mta/mta_transformer.py):
    scores masked to 0 above the diagonal, padded by (c_q − 1, 0) queries and (P, P) keys, one
    conv2d with groups = heads, −inf above the diagonal, softmax, the head mix within groups, the
    values, an RMS norm per head times the gain and 1 − λ_init, the output projection."""

    def __init__(self, state: dict[str, torch.Tensor]):
        super().__init__()
        for name, value in state.items():
            self.register_parameter(name, torch.nn.Parameter(value.detach().clone()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        heads, cq, ck = self.theta.shape
        groups, ch, _ = self.w.shape
        q = torch.einsum("bnf,fhd->bhnd", x, self.WQ)
        k = torch.einsum("bnf,fhd->bhnd", x, self.WK)
        v = torch.einsum("bnf,fhd->bhnd", x, self.WV)
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        n = scores.shape[-1]
        future = torch.ones(n, n, dtype=torch.bool, device=x.device).triu(1)
        scores = torch.nn.functional.pad(scores.masked_fill(future, 0.0), ((ck - 1) // 2, (ck - 1) // 2, cq - 1, 0))
        scores = torch.nn.functional.conv2d(scores, self.theta.flip((1, 2))[:, None], groups=heads)
        attention = scores.masked_fill(future, -math.inf).softmax(-1)
        b = x.shape[0]
        mixed = torch.einsum("bgknm,gkc->bgcnm", attention.reshape(b, groups, ch, n, n), self.w)
        out = mixed.reshape(b, heads, n, n) @ v
        out = out * (out.pow(2).mean(-1, keepdim=True) + 1e-5).rsqrt() * self.gn
        return 0.8 * torch.einsum("bhne,heo->bno", out, self.WO)


def modules(n: int, args: argparse.Namespace) -> dict[str, torch.nn.Module]:
    sizes = {"F": args.width, "H": args.heads, "CQ": args.cq, "CK": args.ck}
    design = tdiag.load(ROOT / "designs" / "multi_token_attention.td", **sizes).with_causal_mask()
    text = (ROOT / "designs" / "multi_token_attention.td").read_text()
    assert CONV_LINE in text
    path = Path(args.out) / "multi_token_attention_shifted.td"
    path.write_text(
        text.replace(CONV_LINE, SHIFTED_LINES).replace("design multi_token_attention", "design mta_shifted")
    )
    built = {"conv": design.module(N=n)}
    if n <= args.shifted_up_to:
        built["shift tensors"] = tdiag.load(path, **sizes).module(N=n)
    path.unlink()
    state = built["conv"].state_dict()
    if "shift tensors" in built:
        built["shift tensors"].load_state_dict(state)
    built["hand-written"] = HandWritten(state)
    x = torch.randn(1, n, args.width)
    with torch.no_grad():
        expected = built["conv"](x)
        for name in [v for v in VARIANTS[1:] if v in built]:
            torch.testing.assert_close(built[name](x), expected, rtol=1e-4, atol=1e-4 * expected.abs().max().item())
    return built


def measure(n: int, args: argparse.Namespace) -> dict:
    torch.manual_seed(0)
    built = modules(n, args)
    measured = measure_all(list(built.values()), torch.randn(1, n, args.width), False, args.repeat)
    timings = dict(zip(built, measured, strict=True))
    row: dict = {"n": n}
    for name in VARIANTS:
        if name in timings:
            row |= columns(name, timings[name], timings["conv"], "conv")
    cells = [
        f"{name}: {row[f'{name} ms']:.0f} ms ({row[f'{name} ms min']:.0f}-{row[f'{name} ms max']:.0f}),"
        f" x{row[f'{name} / conv']:.2f} ({row[f'{name} / conv min']:.2f}-{row[f'{name} / conv max']:.2f}),"
        f" {row[f'{name} kept MB']:.0f} MB"
        for name in VARIANTS
        if name in timings
    ]
    print(f"N={n}: " + "; ".join(cells), flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--cq", type=int, default=6)
    parser.add_argument("--ck", type=int, default=11)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--shifted-up-to",
        type=int,
        default=256,
        help="time the shift-tensor design up to this N (it keeps N² · c_q · D)",
    )
    parser.add_argument("--out", default="docs/results/bench-cpu/conv")
    args = parser.parse_args()
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
    (Path(args.out) / "conv.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    with open(Path(args.out) / "conv.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for row in rows for k in row)))
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main()
