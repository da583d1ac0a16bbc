"""Chunkwise decayed attention against hand-written PyTorch: for each design (RetNet's multi-scale
retention, Mamba-2's SSD layer, GLA), time fwd+bwd of tdiag's module (the planner's chunked
form), a hand-written chunkwise implementation of the same block (RetNet: Sun et al. 2023 eq. 7
as the PyTorch reference chunk forms write it, the decay matrix within a chunk, chunk states
decayed to the chunk's end, a loop over chunks carrying the state; Mamba-2: the authors'
ssd_minimal algorithm; GLA: its chunkwise form, Yang et al. 2024 Sec. 4.2, in chunks of 16) with
the same weights, and tdiag's masked O(N²) form (the design planned at N = 8, where the planner
keeps the masked product), round-robin in one process (one thread, batch 1). Prints each time
over tdiag's with its min-max over rounds and the bytes each keeps for backward, and writes
JSON/CSV/PNG to --out. Each hand-written block is checked equal to tdiag's in float64 first.

    OMP_NUM_THREADS=1 python scripts/bench_decay.py --n 1024 4096 --repeat 5 --out docs/results/bench-cpu/decay"""

from __future__ import annotations

import argparse
import csv
import json
import platform
import re
from pathlib import Path

import torch
import torch.nn.functional as functional
from torch import nn

import tdiag
from tdiag.bench import measure_all

ROOT = Path(__file__).resolve().parent.parent


class HandWrittenRetention(nn.Module):
    """Multi-scale retention, chunkwise (RetNet eq. 7-8), from leg-shaped weights of retnet.td."""

    def __init__(self, compiled: nn.Module, chunk: int = 64):
        super().__init__()
        self.wq, self.wk, self.wv = (nn.Parameter(getattr(compiled, w).detach().clone()) for w in ("WQ", "WK", "WV"))
        self.wg, self.wo = nn.Parameter(compiled.WG.detach().clone()), nn.Parameter(compiled.WO.detach().clone())
        self.chunk = chunk

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, f = x.shape
        h, d, e = self.wq.shape[1], self.wq.shape[2], self.wv.shape[2]
        q = (x @ self.wq.reshape(f, h * d)).view(b, n, h, d).transpose(1, 2)
        k = (x @ self.wk.reshape(f, h * d)).view(b, n, h, d).transpose(1, 2)
        v = (x @ self.wv.reshape(f, h * e)).view(b, n, h, e).transpose(1, 2)
        theta = 10000.0 ** (-2 * torch.arange(d // 2, dtype=x.dtype) / d)
        angle = torch.arange(n, dtype=x.dtype)[:, None] * theta
        cos, sin = angle.cos().repeat_interleave(2, -1), angle.sin().repeat_interleave(2, -1)

        def rotate(t):
            pairs = t.unflatten(-1, (d // 2, 2))
            return t * cos + torch.stack([-pairs[..., 1], pairs[..., 0]], -1).flatten(-2) * sin

        o = self.retention(rotate(q), rotate(k), v)  # [b, h, n, e]
        o = o - o.mean(-1, keepdim=True)
        o = o * torch.rsqrt(o.square().mean(-1, keepdim=True) + 1e-5)
        gate = functional.silu(x @ self.wg.reshape(f, h * e)).view(b, n, h, e)
        return (gate * o.transpose(1, 2)).reshape(b, n, h * e) @ self.wo.reshape(h * e, f)

    def retention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        h, n = q.shape[1], q.shape[2]
        c = self.chunk
        count = -(-n // c)
        q, k, v = (functional.pad(t, (0, 0, 0, count * c - n)).unflatten(2, (count, c)) for t in (q, k, v))
        log_gamma = torch.log(1 - 2.0 ** (-5 - torch.arange(h, dtype=q.dtype)))
        i = torch.arange(c, dtype=q.dtype)
        lag = i[:, None] - i[None, :]
        within = torch.exp((log_gamma[:, None, None] * lag).masked_fill(lag < 0, float("-inf")))  # [h, c, c]
        inner = ((q @ k.transpose(-1, -2)) * within[:, None]) @ v
        to_end = torch.exp(log_gamma[:, None] * (c - 1 - i))  # [h, c]
        states = (k * to_end[:, None, :, None]).transpose(-1, -2) @ v  # [b, h, count, d, e]
        across = torch.exp(log_gamma * c)[:, None, None]
        state = torch.zeros_like(states[:, :, 0])
        earlier = []
        for chunk in range(count):
            earlier.append(state)
            state = across * state + states[:, :, chunk]
        since_start = torch.exp(log_gamma[:, None] * (i + 1))  # [h, c]
        cross = (q * since_start[:, None, :, None]) @ torch.stack(earlier, 2)
        return (inner + cross).flatten(2, 3)[:, :, :n]


def _segsum(x: torch.Tensor) -> torch.Tensor:
    """Mamba-2's reference segsum (ssd_minimal.py): S[..., i, j] = x[j+1] + ... + x[i], −inf above."""
    t = x.size(-1)
    x = x[..., None].expand(*x.shape, t)
    below = torch.tril(torch.ones(t, t, dtype=torch.bool), -1)
    sums = torch.cumsum(x.masked_fill(~below, 0), dim=-2)
    return sums.masked_fill(~torch.tril(torch.ones(t, t, dtype=torch.bool)), -torch.inf)


class HandWrittenSSD(nn.Module):
    """Mamba-2's SSD layer with the authors' minimal chunked algorithm (ssd_minimal.py, Dao & Gu
    2024 Sec. 6: diagonal blocks with L = exp(segsum), chunk states, a segsum over chunks for the
    inter-chunk recurrence), from the leg-shaped weights of mamba2_ssd.td."""

    def __init__(self, compiled: nn.Module, chunk: int = 64):
        super().__init__()
        for name in ("Wx", "WB", "WC", "Wdt", "bdt", "Alog", "Dskip", "WO"):
            setattr(self, name, nn.Parameter(getattr(compiled, name).detach().clone()))
        self.chunk = chunk

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, f = x.shape
        h, p = self.Wx.shape[1], self.Wx.shape[2]
        c = self.chunk
        count = -(-n // c)
        dt = functional.softplus(x @ self.Wdt + self.bdt)  # [b n h]
        xs = (x @ self.Wx.reshape(f, h * p)).view(b, n, h, p)
        a = dt * -torch.exp(self.Alog)  # [b n h]
        xb, bb, cb = dt[..., None] * xs, x @ self.WB, x @ self.WC  # Δ x, B, C
        pad = count * c - n
        xb, a, bb, cb = (functional.pad(t, (0, 0) * (t.dim() - 2) + (0, pad)) for t in (xb, a, bb, cb))
        xb, bb, cb = (t.unflatten(1, (count, c)) for t in (xb, bb, cb))
        a = a.unflatten(1, (count, c)).permute(0, 3, 1, 2)  # [b h chunk l]
        a_cumsum = torch.cumsum(a, dim=-1)
        within = torch.exp(_segsum(a))  # [b h chunk l s]
        y_diag = torch.einsum("bcln,bcsn,bhcls,bcshp->bclhp", cb, bb, within, xb)
        decay_states = torch.exp(a_cumsum[..., -1:] - a_cumsum)
        states = torch.einsum("bcln,bhcl,bclhp->bchpn", bb, decay_states, xb)
        states = torch.cat([torch.zeros_like(states[:, :1]), states], dim=1)
        decay_chunk = torch.exp(_segsum(functional.pad(a_cumsum[..., -1], (1, 0))))
        states = torch.einsum("bhzc,bchpn->bzhpn", decay_chunk, states)[:, :-1]
        y_off = torch.einsum("bcln,bchpn,bhcl->bclhp", cb, states, torch.exp(a_cumsum))
        y = (y_diag + y_off).flatten(1, 2)[:, :n] + self.Dskip[:, None] * xs
        return y.reshape(b, n, h * p) @ self.WO.reshape(h * p, f)


class HandWrittenGLA(nn.Module):
    """GLA's layer with its chunkwise form (Yang et al. 2024, Sec. 4.2): gates cumulated within
    each chunk, the intra-chunk scores with the relative gates exp(g_i − g_j) per feature (masked
    before the exp), chunk states decayed to the chunk's end, a loop over chunks carrying the
    state with the chunk's total gate; from the leg-shaped weights of gla.td."""

    def __init__(self, compiled: nn.Module, chunk: int = 16):
        super().__init__()
        for name in ("WQ", "WK", "WV", "Wa1", "Wa2", "ba", "Wr", "WO"):
            setattr(self, name, nn.Parameter(getattr(compiled, name).detach().clone()))
        self.chunk = chunk

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, f = x.shape
        h, d, e = self.WQ.shape[1], self.WQ.shape[2], self.WV.shape[2]
        c = self.chunk
        count = -(-n // c)
        q = (x @ self.WQ.reshape(f, h * d)).view(b, n, h, d).transpose(1, 2)
        k = (x @ self.WK.reshape(f, h * d)).view(b, n, h, d).transpose(1, 2) / d**0.5
        v = (x @ self.WV.reshape(f, h * e)).view(b, n, h, e).transpose(1, 2)
        gate = torch.einsum("bnr,rhd->bhnd", x @ self.Wa1, self.Wa2) + self.ba[:, None, :]
        g = -functional.softplus(-gate) / 16  # log α
        q, k, v, g = (functional.pad(t, (0, 0, 0, count * c - n)).unflatten(2, (count, c)) for t in (q, k, v, g))
        g = g.cumsum(-2)  # within each chunk
        future = torch.ones(c, c, dtype=torch.bool).triu(1)
        relative = (g[..., :, None, :] - g[..., None, :, :]).masked_fill(future[..., None], float("-inf")).exp()
        inner = torch.einsum("bhkid,bhkjd,bhkijd->bhkij", q, k, relative) @ v
        states = (k * torch.exp(g[..., -1:, :] - g)).transpose(-1, -2) @ v  # [b h count d e]
        state = torch.zeros_like(states[:, :, 0])
        earlier = []
        for chunk in range(count):
            earlier.append(state)
            state = torch.exp(g[:, :, chunk, -1])[..., None] * state + states[:, :, chunk]
        cross = (q * torch.exp(g)) @ torch.stack(earlier, 2)
        o = (inner + cross).flatten(2, 3)[:, :, :n]
        o = o - o.mean(-1, keepdim=True)
        o = o * torch.rsqrt(o.square().mean(-1, keepdim=True) + 1e-5)
        gate_out = functional.silu(x @ self.Wr.reshape(f, h * e)).view(b, n, h, e)
        return (gate_out * o.transpose(1, 2)).reshape(b, n, h * e) @ self.WO.reshape(h * e, f)


HAND_WRITTEN = {"retnet": HandWrittenRetention, "mamba2_ssd": HandWrittenSSD, "gla": HandWrittenGLA}


def check_equal(design: tdiag.Design, hand: type[nn.Module]) -> float:
    """Max |hand-written − tdiag| in float64 at a length off the chunk size."""
    compiled = design.module(N=4096, dtype=torch.float64)
    written = hand(compiled).double()
    x = torch.randn(2, 150, compiled.WO.shape[-1], dtype=torch.float64)
    with torch.no_grad():
        return float((written(x) - compiled(x)).abs().max())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--designs", nargs="+", default=["retnet", "mamba2_ssd", "gla"])
    parser.add_argument("--n", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows, errors = [], {}
    print(f"{'design':<11} {'N':>5} {'C':>4} {'tdiag ms':>9} {'hand ms':>9} {'masked ms':>10}"
          f"  {'hand/tdiag (min-max)':>22} {'masked/tdiag (min-max)':>24}  kept MB tdiag, hand, masked")  # fmt: skip
    for stem in args.designs:
        design = tdiag.load(ROOT / "designs" / f"{stem}.td", F=args.width, H=args.heads)
        hand = HAND_WRITTEN.get(stem)
        if hand is not None:
            errors[stem] = check_equal(design, hand)
            assert errors[stem] < 1e-9, (stem, errors[stem])
        for n in args.n:
            rows.append(measure(stem, design, hand, n, args))
    print("hand-written vs tdiag, float64, N=150: max |difference| "
          + ", ".join(f"{k} {v:.1e}" for k, v in errors.items()))  # fmt: skip
    if args.out:
        write(Path(args.out), rows, args, errors)


NAMES = ("tdiag", "hand-written chunkwise", "tdiag masked N^2")


def measure(stem: str, design: tdiag.Design, hand: type[nn.Module] | None, n: int, args) -> dict:
    """One length: tdiag's chunked module, the hand-written one (if any) and the masked product
    (the design planned at N = 8; skipped where it would keep more than 4 GB), round-robin."""
    torch.manual_seed(0)
    chunked = design.module(N=n)
    modules = {"tdiag": chunked}
    if hand is not None:
        modules["hand-written chunkwise"] = hand(chunked)
    masked = design.module(N=8)
    assert "_decayed_earlier" in chunked.tdiag_source and "_decayed_earlier" not in masked.tdiag_source
    if design.cost(N=8).saved_bytes_at(B=1, N=n) < 4e9:
        masked.load_state_dict(chunked.state_dict())
        modules["tdiag masked N^2"] = masked
    timings = dict(
        zip(
            modules, measure_all(list(modules.values()), torch.randn(1, n, args.width), False, args.repeat), strict=True
        )
    )
    base = timings["tdiag"].seconds
    row: dict = {"design": stem, "n": n, "chunk": _chunk(chunked)}
    cells = {}
    for name in NAMES:
        if name not in timings:
            row |= {f"{name} ms": None, f"{name} kept MB": None, f"{name} / tdiag": None}
            cells[name] = "n/a"
            continue
        t = timings[name]
        ratios = sorted(a / b for a, b in zip(t.seconds, base, strict=True))
        row |= {
            f"{name} ms": 1e3 * sorted(t.seconds)[len(t.seconds) // 2],
            f"{name} kept MB": t.saved_bytes / 1e6,
            f"{name} / tdiag": ratios[len(ratios) // 2],
            f"{name} / tdiag min": ratios[0],
            f"{name} / tdiag max": ratios[-1],
        }
        cells[name] = f"{ratios[len(ratios) // 2]:.2f} ({ratios[0]:.2f}-{ratios[-1]:.2f})"
    ms = [f"{row[name + ' ms']:.1f}" if row[name + " ms"] is not None else "n/a" for name in NAMES]
    kept = [f"{row[name + ' kept MB']:.1f}" if row[name + " kept MB"] is not None else "n/a" for name in NAMES]
    print(f"{stem:<11} {n:>5} {row['chunk']:>4} {ms[0]:>9} {ms[1]:>9} {ms[2]:>10}  {cells[NAMES[1]]:>22}"
          f" {cells[NAMES[2]]:>24}  {', '.join(kept)}", flush=True)  # fmt: skip
    return row


def _chunk(module: nn.Module) -> int:
    found = (re.search(r"chunks of C = (\d+)", line) for line in module.tdiag_plan.lowered)
    return next(int(match.group(1)) for match in found if match)


def write(out: Path, rows: list[dict], args: argparse.Namespace, errors: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    settings = {"width": args.width, "heads": args.heads, "repeat": args.repeat, "batch": 1, "threads": 1}
    settings |= {"torch": torch.__version__, "machine": platform.platform(), "float64 max difference": errors}
    (out / "decay.json").write_text(json.dumps({"settings": settings, "rows": rows}, indent=2))
    fields = list(dict.fromkeys(k for r in rows for k in r))
    with (out / "decay.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    designs = list(dict.fromkeys(r["design"] for r in rows))
    fig, axes = plt.subplots(1, len(designs), figsize=(4.5 * len(designs), 4), squeeze=False)
    for ax, stem in zip(axes[0], designs, strict=True):
        mine = [r for r in rows if r["design"] == stem]
        for name, color in zip(NAMES, ("tab:blue", "tab:orange", "tab:green"), strict=True):
            points = [(r["n"], r[f"{name} ms"]) for r in mine if r[f"{name} ms"] is not None]
            if points:
                ax.plot(*zip(*points, strict=True), marker="o", color=color, label=name)
        ax.set(xscale="log", yscale="log", xlabel="N", ylabel="fwd+bwd ms (median)", title=stem)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "decay.png", dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
