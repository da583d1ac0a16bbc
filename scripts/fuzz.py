"""Offline fuzzing of tdiag (`make fuzz`): grammar-generated designs (tests/test_fuzz.py's
generator) that must be refused with positioned errors or compile, run forward and backward and
equal the reference in float64; causal designs written at the seams users found (seam_design:
run-time splits of the position leg, strictly causal factors, tensors declared over the key leg
and read at the query leg, key sides that read N, decay matrices as statements, leg typos); and
byte and token mutations of designs/*.td that must be refused with positioned errors or check,
plan and generate Python that compiles. Every generated design with a causal form is also
decoded, token by token and a prompt then chunks, and must equal its causal forward over each
prefix (float64, 1e-10 relative) or be refused by the cache with a reason. Each input runs under
a limit of CPU time. The report counts each outcome (crashes: any other exception, a mismatch
with the reference, generated code that does not compile; unpositioned errors; hangs; decode
mismatches), groups the failures by their message with the shortest input of each, tallies the
cache kinds the decoded seam designs got and whether check warned of each leg typo that ran,
and is written as JSON (default docs/results/fuzz/fuzz.json) with the seed, commit, seconds
and load.

    python scripts/fuzz.py --seconds 1200 --out docs/results/fuzz/fuzz.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
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
    """An input ran past its time limit, counted in the process's CPU time (user and system) so
    that other jobs on a loaded machine do not turn slow inputs into hangs."""


def _alarm(signum, frame):
    raise HangError


def _load_generator():
    spec = importlib.util.spec_from_file_location("fuzz_generator", ROOT / "tests" / "test_fuzz.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


FAILURES = ("crash", "unpositioned", "hang", "decode_mismatch")


def classify(run, text: str, limit: float) -> tuple[str, str]:
    """(outcome, detail): what `run` returns (an outcome, or an outcome and its detail: ok,
    decoded, not_decodable, causal_refused), refused, unpositioned, crash, hang, or the outcome an
    exception names (decode_mismatch)."""
    signal.setitimer(signal.ITIMER_PROF, limit)
    try:
        outcome = run()
        return outcome if isinstance(outcome, tuple) else (outcome, "")
    except HangError:
        return "hang", ""
    except TdiagError as error:
        if error.diagnostics and all(d.spans and d.spans[0].line >= 1 for d in error.diagnostics):
            return "refused", ""
        return "unpositioned", str(error)[:500]
    except RecursionError:
        return "crash", "RecursionError"
    except Exception as error:  # every other exception is what the fuzzer looks for
        named = getattr(error, "fuzz_outcome", None)
        if named:
            return named, str(error)[:500]
        return "crash", _relative(traceback.format_exc(limit=-4))[-1500:]
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)


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


GENERATED = {"refused": "refused", "ran": "ok", "fixed length": "ok"}


def run_generated(generator, text: str, sizes: dict[str, int], mode: str, causal: bool = False) -> tuple[str, str]:
    """A generated design run and decoded (the generator's run_design): its outcome, with the
    cache's kind where it decoded or its reason where it refused, and for a seam design that has
    no causal form (with_causal_mask refuses it, or the cache one `causal` as written),
    causal_refused and why."""
    result = generator.run_design(text, sizes, decode=True, causal=causal)
    if result.startswith("no causal form"):
        return ("causal_refused", result) if mode == "seam" else ("ok", "")
    if result.startswith("decoded as "):
        return "decoded", result.removeprefix("decoded as ")
    if result.startswith("not decodable: "):
        return "not_decodable", result.removeprefix("not decodable: ")
    return GENERATED[result], ""


def typo_outcome(text: str, outcome: str) -> str:
    """What became of a design with a leg typo: refused, warned (check warned of something, as it
    should of a leg summed away alone), silent (it ran and nothing was said) or failed."""
    if outcome in FAILURES or outcome == "refused":
        return "failed" if outcome in FAILURES else "refused"
    try:
        return "warned" if tdiag.loads(text, "<fuzz>").warnings else "silent"
    except TdiagError:
        return "refused"


def signature(outcome: str, detail: str) -> str:
    """A failure's class: its outcome and the last line of its detail, numbers as '#'."""
    lines = [line.strip() for line in detail.splitlines() if line.strip()]
    last = re.sub(r"\d+(\.\d+)?(e-?\d+)?", "#", lines[-1] if lines else "")
    return f"{outcome}: {last}"[:300]


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
    parser.add_argument("--limit", type=float, default=20.0, help="CPU seconds one input may take before it is a hang")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--grammar-share", type=float, default=0.25, help="share of grammar-generated inputs")
    parser.add_argument("--seam-share", type=float, default=0.35, help="share of seam designs (seam_design)")
    parser.add_argument("--out", default=str(ROOT / "docs" / "results" / "fuzz" / "fuzz.json"))
    args = parser.parse_args(argv)

    import torch
    from hypothesis import HealthCheck, Phase, given, settings

    torch.set_num_threads(1)
    generator = _load_generator()
    signal.signal(signal.SIGPROF, _alarm)
    rng = random.Random(args.seed)
    designs = {p.name: p.read_text() for p in sorted((ROOT / "designs").glob("*.td"))}
    counts = {"grammar": {}, "seam": {}, "mutation": {}}
    failures: list[dict] = []
    distinct: dict[str, dict] = {}
    causal_refusals: list[dict] = []
    cache_kinds: dict[str, dict[str, int]] = {}
    cache_refusals: dict[str, dict] = {}
    typos: dict[str, int] = {}
    commit = _commit()  # the code under test is the code at the start
    load_at_start = os.getloadavg()
    started = time.monotonic()

    def record(mode: str, outcome: str, detail: str, text: str, extra: dict | None = None) -> None:
        counts[mode][outcome] = counts[mode].get(outcome, 0) + 1
        tried = sum(sum(c.values()) for c in counts.values())
        if tried % 1000 == 0:  # progress for a long run, on stderr
            bad = sum(c.get(o, 0) for c in counts.values() for o in FAILURES)
            print(f"{tried} inputs, {time.monotonic() - started:.0f} s, {bad} failures", file=sys.stderr, flush=True)
        entry = {"mode": mode, "outcome": outcome, "detail": detail, "input": text, **(extra or {})}
        if outcome == "decoded":  # the cache kind each form got: a decay as a statement should keep a state
            form = cache_kinds.setdefault((extra or {}).get("kinds", [mode])[0], {})
            form[detail] = form.get(detail, 0) + 1
        if outcome == "not_decodable":  # each reason a cache gave, with its shortest design
            reason = cache_refusals.setdefault(signature(mode, detail), {"count": 0, "shortest": entry})
            reason["count"] += 1
            if len(text) < len(reason["shortest"]["input"]):
                reason["shortest"] = entry
        if outcome == "causal_refused" and len(causal_refusals) < 50:
            causal_refusals.append(entry)
        if outcome not in FAILURES:
            return
        if len(failures) < 200:
            failures.append(entry)
        kind = distinct.setdefault(signature(outcome, detail), {"count": 0, "shortest": entry})
        kind["count"] += 1
        if len(text) < len(kind["shortest"]["input"]):
            kind["shortest"] = entry

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
        outcome, detail = classify(lambda: run_generated(generator, text, sizes, "grammar"), text, args.limit)
        record("grammar", outcome, detail, text, {"sizes": sizes})

    def seams() -> None:
        for _ in range(10):
            if done():
                return
            case = generator.seam_design(rng)
            run = lambda case=case: run_generated(generator, case.text, case.sizes, "seam", case.causal)  # noqa: E731
            outcome, detail = classify(run, case.text, args.limit)
            extra = {"sizes": case.sizes, "kinds": list(case.kinds), "causal_as_written": case.causal}
            record("seam", outcome, detail, case.text, extra)
            if "typo" in case.kinds:
                told = typo_outcome(case.text, outcome)
                typos[told] = typos.get(told, 0) + 1

    names = sorted(designs)
    while not done():
        draw = rng.random()
        if draw < args.grammar_share:
            grammar()
            continue
        if draw < args.grammar_share + args.seam_share:
            seams()
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
        "limit_clock": "process CPU time",
        "inputs_tried": sum(tried.values()),
        "by_mode": {mode: {"tried": tried[mode], **counts[mode]} for mode in counts},
        "crashes": total("crash"),
        "unpositioned": total("unpositioned"),
        "hangs": total("hang"),
        "decode_mismatches": total("decode_mismatch"),
        "load": {"start": [round(v, 2) for v in load_at_start], "end": [round(v, 2) for v in os.getloadavg()]},
        "machine": f"{platform.machine()} Python {platform.python_version()} torch {torch.__version__}",
        "tdiag": tdiag.__version__,
        "commit": commit,
        "distinct_failures": [
            {"signature": k, **v} for k, v in sorted(distinct.items(), key=lambda kv: -kv[1]["count"])
        ],
        "cache_kinds": cache_kinds,
        "typos": typos,
        "cache_refusals": [
            {"reason": k, **v} for k, v in sorted(cache_refusals.items(), key=lambda kv: -kv[1]["count"])
        ],
        "causal_refusals": causal_refusals,
        "failures": failures,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(
        f"{report['inputs_tried']} inputs in {report['seconds']} s: {report['crashes']} crashes, "
        f"{report['unpositioned']} unpositioned errors, {report['hangs']} hangs, "
        f"{report['decode_mismatches']} decode mismatches ({json.dumps(report['by_mode'])}); report in {out}"
    )
    return 1 if any(total(outcome) for outcome in FAILURES) else 0


if __name__ == "__main__":
    raise SystemExit(main())
