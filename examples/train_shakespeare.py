"""Train a character language model whose attention is a module written by `tdiag compile`.
Plain PyTorch: this script does not import tdiag.

    tdiag compile designs/mhsa.td --causal --set F=128 --set H=4 --plan-n 128 -o mhsa_module.py
    python examples/train_shakespeare.py mhsa_module.py --steps 1000
"""

import argparse
import gzip
import importlib.util
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as functional
from torch import nn

CORPUS = Path("data") / "shakespeare_gut.txt.gz"


def default_data() -> Path:
    """The Shakespeare corpus tdiag ships: in this repository's tdiag/ package, else in an
    installed tdiag, found without importing it (this script imports only torch)."""
    beside = Path(__file__).resolve().parent.parent / "tdiag" / CORPUS
    spec = importlib.util.find_spec("tdiag") if not beside.is_file() else None
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations))) / CORPUS
    return beside


def load_attention_class(path: str) -> type[nn.Module]:
    """The nn.Module class defined in a generated file."""
    spec = importlib.util.spec_from_file_location("compiled_attention", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    classes = [
        v for v in vars(module).values() if isinstance(v, type) and issubclass(v, nn.Module) and v is not nn.Module
    ]
    return classes[0]


class Block(nn.Module):
    def __init__(self, attention: nn.Module, width: int):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attention = attention
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x):
        x = x + self.attention(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class CharModel(nn.Module):
    def __init__(self, attention_class, vocab: int, width: int, context: int, layers: int):
        super().__init__()
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(attention_class(seed=k), width) for k in range(layers))
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, ids):
        x = self.tokens(ids) + self.positions(torch.arange(ids.shape[1], device=ids.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("module", help="a file written by tdiag compile (use --causal)")
    parser.add_argument(
        "--data", default=str(default_data()), help="UTF-8 text, plain or gzipped (default: tdiag's Shakespeare corpus)"
    )
    parser.add_argument("--width", type=int, default=128, help="must be the compiled module's F (default 128)")
    parser.add_argument("--context", type=int, default=128, help="characters per sequence (default 128)")
    parser.add_argument("--layers", type=int, default=2, help="transformer blocks (default 2)")
    parser.add_argument("--batch", type=int, default=16, help="sequences per step (default 16)")
    parser.add_argument("--steps", type=int, default=1000, help="optimizer steps (default 1000)")
    parser.add_argument("--lr", type=float, default=3e-3, help="AdamW peak learning rate (default 3e-3)")
    args = parser.parse_args()

    if not Path(args.module).is_file():
        parser.error(f"no compiled module '{args.module}'; write one with tdiag compile --causal (see above)")
    if not Path(args.data).is_file():
        parser.error(f"argument --data: no file '{args.data}'")
    raw = Path(args.data).read_bytes()
    text = (gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw).decode("utf-8")
    chars = sorted(set(text))
    lookup = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([lookup[c] for c in text])
    train, val = data[: int(0.9 * len(data))], data[int(0.9 * len(data)) :]

    torch.manual_seed(0)
    model = CharModel(load_attention_class(args.module), len(chars), args.width, args.context, args.layers)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)

    def batch(split):
        starts = torch.randint(len(split) - args.context - 1, (args.batch,))
        rows = starts[:, None] + torch.arange(args.context + 1)
        return split[rows][:, :-1], split[rows][:, 1:]

    def loss_on(x, y):
        return functional.cross_entropy(model(x).flatten(0, 1), y.flatten())

    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        for group in optimizer.param_groups:
            group["lr"] = args.lr * 0.5 * (1 + math.cos(math.pi * step / args.steps))
        loss = loss_on(*batch(train))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 100 == 0 or step == args.steps:
            with torch.no_grad():
                model.eval()
                val_loss = sum(loss_on(*batch(val)).item() for _ in range(5)) / 5
                model.train()
            rate = step * args.batch * args.context / (time.perf_counter() - start)
            print(f"step {step:5d}  train {loss.item():.3f}  val {val_loss:.3f}  {rate:,.0f} tokens/s", flush=True)


if __name__ == "__main__":
    main()
