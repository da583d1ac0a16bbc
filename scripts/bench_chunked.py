"""Causal chunked linear attention against its plain form: for each bundled design that takes
the linear-time order with causal prefix sums, time fwd+bwd of the plain and the causal module
round-robin in one process (one thread, batch 1) and print causal / plain with its min–max over
rounds, and the bytes each keeps for backward. With --baseline DIR, also a causal module compiled
earlier (`DIR/N/STEM.causal.py` or `DIR/STEM.causal.py`, e.g. by `tdiag compile --causal` at main) in the same rounds.
With --hand, for lfish also a hand-written chunkwise causal form (`HandChunkedLfish`: the global
heads mixed into the local ones inside each chunk first, the states per (global, local) pair, one
exclusive cumsum over chunks) with the compiled module's weights, checked equal to it first: a
bound on what the chunked order can reach against the plain form.

    python scripts/bench_chunked.py --n 1024 4096 --repeat 7 [--baseline DIR]"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

import tdiag
from tdiag.bench import load_baseline, measure_all

DESIGNS = ("lfish", "mlk", "performer", "smlk", "thsa_elu")


class HandChunkedLfish(torch.nn.Module):
    """Causal Hard LFiSH (designs/lfish.td) written by hand in chunks of C: within a chunk the M
    global kernel matrices elu1(Q_k) elu1(K_k)ᵀ, masked, are mixed into the H local ones before the
    values (the cheapest order of the within-chunk product), across chunks the states
    elu1(K_k)ᵀ [V, 1] summed before each chunk and read by the mixed queries."""

    def __init__(self, compiled: torch.nn.Module, chunk: int = 64):
        super().__init__()
        self.compiled, self.chunk = compiled, chunk

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m = self.compiled
        (b, n, f), c = x.shape, self.chunk
        (_, g, d), (_, h, e) = m.WQ.shape, m.WV.shape
        chunks = n // c
        q = torch.nn.functional.elu(x @ m.WQ.reshape(f, g * d)) + 1
        k = torch.nn.functional.elu(x @ m.WK.reshape(f, g * d)) + 1
        v = torch.nn.functional.pad((x @ m.WV.reshape(f, h * e)).reshape(b, n, h, e), (0, 1), value=1.0)
        mixing = m.P.softmax(0)  # [global k, local h]
        qc = q.reshape(b, chunks, c, g, d).transpose(2, 3)
        kc = k.reshape(b, chunks, c, g, d).transpose(2, 3)
        vc = v.reshape(b, chunks, c, h, e + 1).transpose(2, 3)
        scores = (qc @ kc.mT) * torch.ones(c, c, dtype=x.dtype).tril()
        within = torch.einsum("bcknm,kh->bchnm", scores, mixing) @ vc
        states = kc.mT.reshape(b, chunks, g * d, c) @ v.reshape(b, chunks, c, h * (e + 1))
        states = torch.cat([torch.zeros_like(states[:, :1]), states[:, :-1].cumsum(1)], 1)
        mixed = (qc.transpose(2, 3).unsqueeze(3) * mixing.t()[:, :, None]).reshape(b, chunks, c, h, g * d)
        across = mixed.transpose(2, 3) @ states.reshape(b, chunks, g * d, h, e + 1).transpose(2, 3)
        numerator = (within + across).transpose(2, 3).reshape(b, n, h, e + 1)
        out = numerator[..., :-1] / (numerator[..., -1:] + 1e-6)
        return out.reshape(b, n, h * e) @ m.WO.reshape(h * e, -1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--designs", nargs="+", default=list(DESIGNS))
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--baseline", default=None)
    parser.add_argument("--hand", action="store_true", help="lfish only: a hand-written chunkwise form too")
    args = parser.parse_args()
    torch.set_num_threads(1)
    root = Path(tdiag.__file__).resolve().parent.parent / "designs"
    print(
        f"{'design':<10} {'N':>5} {'plain ms':>9} {'causal ms':>9} {'causal/plain (min-max)':>24}"
        f" {'plain kept':>11} {'causal kept':>11}"
        + ("  base/plain (min-max)   base kept" if args.baseline else "")
        + ("  hand/plain (min-max)   hand kept" if args.hand else "")
    )
    for stem in args.designs:
        design = tdiag.load(str(root / f"{stem}.td"), F=args.width, H=args.heads)
        for n in args.n:
            torch.manual_seed(0)
            plain = design.module(N=n)
            causal = design.with_causal_mask().module(N=n)
            modules = [plain, causal]
            if args.baseline:
                folder = Path(args.baseline) / str(n)
                old = load_baseline(folder if folder.is_dir() else Path(args.baseline), stem, True)
                old.load_state_dict(causal.state_dict())
                modules.append(old)
            if args.hand and stem == "lfish":
                hand = HandChunkedLfish(causal)
                with torch.no_grad():
                    check = torch.randn(1, n, args.width)
                    torch.testing.assert_close(hand(check), causal(check), rtol=1e-4, atol=1e-5)
                modules.append(hand)
            x = torch.randn(1, n, args.width)
            timings = measure_all(modules, x, False, args.repeat)
            p = timings[0].seconds
            cells = []
            for t in timings[1:]:
                r = sorted(c / q for c, q in zip(t.seconds, p, strict=True))
                cells.append(f"{r[len(r) // 2]:6.2f} ({r[0]:.2f}-{r[-1]:.2f})")
            med = [sorted(t.seconds)[len(t.seconds) // 2] * 1e3 for t in timings]
            kept = [t.saved_bytes / 1e6 for t in timings]
            line = f"{stem:<10} {n:>5} {med[0]:9.1f} {med[1]:9.1f} {cells[0]:>24} {kept[0]:10.1f}M {kept[1]:10.1f}M"
            for cell, kept_mb in zip(cells[1:], kept[2:], strict=True):
                line += f"  {cell:>20} {kept_mb:10.1f}M"
            print(line, flush=True)


if __name__ == "__main__":
    main()
