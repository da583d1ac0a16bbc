"""How much of the score work does the CPU flash kernel skip under is_causal? For each N this
times torch's scaled_dot_product_attention forward + backward on (batch, heads, N, head size)
with is_causal=True and with no mask, round-robin in one process, and prints the ratio (median of
the per-round ratios, min–max) beside the two block rules: (N + b)/(2N) with b the kernel's key
block of 512 (tdiag/plan/program.py `sdpa_causal_block`, what the time model uses) and with b its
query block (256 from 768 queries, 64 from 192, else 32; the rule before).

    OMP_NUM_THREADS=1 python scripts/bench_causal_blocks.py --n 256 512 1024 2048 4096 --repeat 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


def query_block(n: int) -> int:
    return 32 if n < 192 else 64 if n < 768 else 256


def skipped_share(n: int, block: int) -> float:
    b = min(block, n)
    return (n + b) / (2 * n)


def step(attention, operands: tuple, causal: bool) -> float:
    """Seconds of one forward and backward of `attention` on (q, k, v) with the output gradient."""
    q, k, v, grad = operands
    start = time.perf_counter()
    attention(q, k, v, is_causal=causal).backward(grad)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-size", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    attention = torch.nn.functional.scaled_dot_product_attention
    print(f"load average {os.getloadavg()[0]:.2f}; heads {args.heads}, head size {args.head_size}, fwd+bwd, 1 thread")
    columns = f"{'no mask ms':>12} {'causal ms':>12} {'causal / no mask (min–max)':>28}"
    print(f"{'N':>5} {columns} {'(N+512)/2N':>11} {'(N+q)/2N':>9}")
    for n in args.n:
        q, k, v = (torch.randn(1, args.heads, n, args.head_size, requires_grad=True) for _ in range(3))
        grad = torch.randn(1, args.heads, n, args.head_size)

        operands = (q, k, v, grad)
        step(attention, operands, False), step(attention, operands, True)
        rounds = [(step(attention, operands, False), step(attention, operands, True)) for _ in range(args.repeat)]
        ratios = sorted(c / p for p, c in rounds)
        plain = 1e3 * statistics.median(p for p, _ in rounds)
        causal = 1e3 * statistics.median(c for _, c in rounds)
        ratio = f"{statistics.median(ratios):.3f} ({ratios[0]:.3f}–{ratios[-1]:.3f})"
        print(
            f"{n:>5} {plain:>12.1f} {causal:>12.1f} {ratio:>28} {skipped_share(n, 512):>11.3f}"
            f" {skipped_share(n, query_block(n)):>9.3f}",
            flush=True,
        )
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
