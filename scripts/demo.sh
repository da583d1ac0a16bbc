#!/usr/bin/env bash
# `make demo`: tdiag's main job end to end on its bundled defaults, in about two minutes on 2 cores.
# A bundled design from the FiSHformer paper (fish) is checked, drawn, costed against MHSA as
# formulas, compiled to a standalone PyTorch module, and trained beside MHSA as a tiny character
# model on the bundled Shakespeare corpus; every output's path is printed at the end.
#   bash scripts/demo.sh [OUT]      (default out/demo; TDIAG=path/to/tdiag, default .venv/bin/tdiag)
set -euo pipefail
out=${1:-out/demo}
tdiag=${TDIAG:-.venv/bin/tdiag}
design=fish
mkdir -p "$out"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

echo "== check every bundled design"
"$tdiag" check designs/*.td | tail -n 3

echo "== the design, as its graph"
"$tdiag" show "$design"

echo "== its diagram"
if command -v dot >/dev/null 2>&1; then
  diagram="$out/$design.svg"
else
  diagram="$out/$design.dot"  # DOT text needs no Graphviz program
fi
"$tdiag" render "$design" -o "$diagram"

echo "== its cost beside MHSA's, as formulas and at N = 1024"
"$tdiag" cost mhsa "$design" --at N=1024 | tee "$out/cost.txt"

echo "== compiled to a standalone module"
"$tdiag" compile "$design" -o "$out/${design}_module.py"

echo "== a tiny character model of each, trained on the bundled corpus (2 layers, width 64, context 64)"
"$tdiag" train --compare mhsa "$design" --steps 300 --eval-every 50 --eval-batches 4 --layers 2 \
  --width 64 --heads 4 --context 64 --batch 16 --device cpu --overwrite --out "$out/train"

cat <<EOF

== where everything is
diagram:           $diagram
cost table:        $out/cost.txt
compiled module:   $out/${design}_module.py   (import it: a plain torch.nn.Module)
loss plot:         $out/train/compare.png
comparison:        $out/train/compare.md
runs:              $out/train/mhsa, $out/train/$design   (checkpoint, log.csv, loss.png, sample.txt)
EOF
