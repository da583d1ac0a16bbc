"""Offline fuzzing of tdiag (`make fuzz`): grammar-generated designs (tests/test_fuzz.py's
generator) that must be refused with positioned errors or compile, run forward and backward and
equal the reference in float64; and byte and token mutations of designs/*.td that must be refused
with positioned errors or check, plan and generate Python that compiles. Each input runs under a
time limit; the report counts inputs tried, crashes (any other exception, a mismatch with the
reference, generated code that does not compile), unpositioned errors and hangs, and is written as
JSON (default docs/results/fuzz/fuzz.json).

    python scripts/fuzz.py --seconds 1200 --out docs/results/fuzz/fuzz.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import random
import re
import shlex
import signal
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import tdiag  # noqa: E402
from tdiag import TdiagError  # noqa: E402


class HangError(Exception):
    """An input ran past its time limit."""


def _alarm(signum, frame):
    raise HangError


def _load_generator():
    spec = importlib.util.spec_from_file_location("fuzz_generator", ROOT / "tests" / "test_fuzz.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def classify(run, text: str, limit: float) -> tuple[str, str]:
    """(outcome, detail): ok, refused, unpositioned, crash or hang."""
    signal.setitimer(signal.ITIMER_REAL, limit)
    try:
        outcome = run()
        return outcome, ""
    except HangError:
        return "hang", ""
    except TdiagError as error:
        if error.diagnostics and all(d.spans and d.spans[0].line >= 1 for d in error.diagnostics):
            return "refused", ""
        return "unpositioned", str(error)[:500]
    except RecursionError:
        return "crash", "RecursionError"
    except Exception:  # every other exception is what the fuzzer looks for
        return "crash", _relative(traceback.format_exc(limit=-4))[-1500:]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def _relative(text: str) -> str:
    """A traceback with this checkout's and the environment's paths shortened, so a committed
    report names files as the repository does and no machine's folders."""
    text = text.replace(f"{ROOT}/", "")
    return re.sub(r'"[^"]*/site-packages/', '"site-packages/', text)


# ---- mutations of the bundled designs ----------------------------------------------------------

TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|\s+|.", re.S)
NOISE = ["[", "]", "(", ")", "=", ",", ":", "+", "-", "*", "/", "^", "\n", "#", "softmax", "normalize", "exp", "size"]
NOISE += ["param", "input", "mask", "output", "extends", "replace", "update", "0", "1e400", "9" * 40, "-1", "é", "\f"]
NOISE += ["\u2028", "\ufeff", "\x00", "class", "self", "B", "torch", "__init__", "scale", "eps", "causal", "mean"]


def _commit() -> str:
    """The checkout's commit, with '+changes' when its tracked files differ from it; '' outside git."""
    import subprocess

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False).stdout.strip()

    head = git("rev-parse", "--short", "HEAD")
    return head + ("+changes" if head and git("status", "--porcelain", "--untracked-files=no") else "")


def mutate(text: str, rng: random.Random) -> str:
    """One to four byte or token edits: delete, duplicate, swap, insert noise, flip a byte, truncate."""
    for _ in range(rng.randint(1, 4)):
        tokens = TOKEN.findall(text) or [""]
        k = rng.randrange(len(tokens))
        kind = rng.randrange(7)
        if kind == 0:
            del tokens[k]
        elif kind == 1:
            tokens.insert(k, tokens[k])
        elif kind == 2:
            j = rng.randrange(len(tokens))
            tokens[k], tokens[j] = tokens[j], tokens[k]
        elif kind == 3:
            tokens.insert(k, rng.choice(NOISE))
        elif kind == 4:
            tokens[k] = rng.choice(NOISE)
        text = "".join(tokens)
        if kind == 5 and text:
            data = bytearray(text.encode())
            i = rng.randrange(len(data))
            data[i] = rng.randrange(256)
            text = data.decode("utf-8", errors="replace")
        elif kind == 6:
            text = text[: rng.randrange(len(text) + 1)]
    return text


def check_and_generate(text: str) -> str:
    """Check, plan and generate the module's source; the source must be valid Python."""
    design = tdiag.loads(text, "<fuzz>")
    source = design.source()
    compile(source, "<generated>", "exec")
    return "ok"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=1200, help="wall-clock budget (default 1200)")
    parser.add_argument("--inputs", type=int, default=0, help="stop after this many inputs (0: no limit)")
    parser.add_argument("--limit", type=float, default=20.0, help="seconds one input may take before it is a hang")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--grammar-share", type=float, default=0.25, help="share of grammar-generated inputs")
    parser.add_argument("--out", default=str(ROOT / "docs" / "results" / "fuzz" / "fuzz.json"))
    args = parser.parse_args(argv)

    import torch
    from hypothesis import HealthCheck, Phase, given, settings

    torch.set_num_threads(1)
    generator = _load_generator()
    signal.signal(signal.SIGALRM, _alarm)
    rng = random.Random(args.seed)
    designs = {p.name: p.read_text() for p in sorted((ROOT / "designs").glob("*.td"))}
    counts = {"grammar": {}, "mutation": {}}
    failures: list[dict] = []
    commit = _commit()  # the code under test is the code at the start
    started = time.monotonic()

    def record(mode: str, outcome: str, detail: str, text: str, extra: dict | None = None) -> None:
        counts[mode][outcome] = counts[mode].get(outcome, 0) + 1
        tried = sum(sum(c.values()) for c in counts.values())
        if tried % 1000 == 0:  # progress for a long run, on stderr
            bad = sum(c.get(o, 0) for c in counts.values() for o in ("crash", "unpositioned", "hang"))
            print(f"{tried} inputs, {time.monotonic() - started:.0f} s, {bad} failures", file=sys.stderr, flush=True)
        if outcome in ("crash", "unpositioned", "hang") and len(failures) < 200:
            failures.append({"mode": mode, "outcome": outcome, "detail": detail, "input": text, **(extra or {})})

    def done() -> bool:
        tried = sum(sum(c.values()) for c in counts.values())
        return time.monotonic() - started > args.seconds or (args.inputs and tried >= args.inputs)

    grammar_batch = 50

    @settings(
        max_examples=grammar_batch,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=generator.design_text())
    def grammar(case):
        if done():
            return
        text, sizes = case
        outcome, detail = classify(
            lambda: {"ran": "ok"}.get(generator.run_design(text, sizes), "refused"), text, args.limit
        )
        record("grammar", outcome, detail, text, {"sizes": sizes})

    names = sorted(designs)
    while not done():
        if rng.random() < args.grammar_share:
            grammar()
            continue
        for _ in range(50):
            if done():
                break
            name = rng.choice(names)
            text = mutate(designs[name], rng)
            outcome, detail = classify(lambda text=text: check_and_generate(text), text, args.limit)
            record("mutation", outcome, detail, text, {"from": name})

    tried = {mode: sum(c.values()) for mode, c in counts.items()}
    total = lambda outcome: sum(c.get(outcome, 0) for c in counts.values())  # noqa: E731
    report = {
        "command": "python scripts/fuzz.py "
        + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])),
        "seed": args.seed,
        "seconds": round(time.monotonic() - started, 1),
        "per_input_limit_s": args.limit,
        "inputs_tried": sum(tried.values()),
        "by_mode": {mode: {"tried": tried[mode], **counts[mode]} for mode in counts},
        "crashes": total("crash"),
        "unpositioned": total("unpositioned"),
        "hangs": total("hang"),
        "machine": f"{platform.machine()} Python {platform.python_version()} torch {torch.__version__}",
        "tdiag": tdiag.__version__,
        "commit": commit,
        "failures": failures,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(
        f"{report['inputs_tried']} inputs in {report['seconds']} s: {report['crashes']} crashes, "
        f"{report['unpositioned']} unpositioned errors, {report['hangs']} hangs ({json.dumps(report['by_mode'])}); "
        f"report in {out}"
    )
    return 1 if report["crashes"] or report["unpositioned"] or report["hangs"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
