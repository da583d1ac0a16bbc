# tdiag: set up and run everything from a fresh clone.
#   make demo         venv + graphviz, then the main job: compile, draw, cost and train a design beside mhsa
#   make test         venv + graphviz, then the whole test suite
#   make test-fast    the suite without the tests marked slow (training, gradcheck, sweeps): the inner loop
#   make wheel-check  build the wheel, install it into a fresh venv outside the repo, run the CLI there
#   make lint         ruff, and the layers' import contract (scripts/architecture.py check)
#   make goldens-check every bundled design's plans, module hashes and cost formulas against tests/goldens
#   make fuzz         a longer offline fuzz (FUZZ_SECONDS, default 1200) with a JSON report
#   make bench-baseline  every bundled design timed against its plan at an older commit (BASELINE_COMMIT)
#   make gpu-report   on a CUDA machine: gpu tests, benchmarks, training -> docs/results/gpu-DEVICE-DATE/
#                     (REPORT_FLAGS="--device cpu" is the dry run; REPORT_PYTHON: a Python with CUDA torch)

PYTHON        ?= python3
VENV          := .venv
BIN           := $(VENV)/bin
STAMP         := $(VENV)/.installed
TORCH_VERSION := 2.13.0
# the suite in two processes of one thread each (pytest-xdist; a test module's tests run in one
# process, so that its fixtures are built once): 2 cores. PYTEST_WORKERS= runs it in one process
PYTEST_WORKERS ?= -n 2 --dist loadscope

.PHONY: venv cpu-only-check graphviz demo test test-fast wheel wheel-check lint format clean fuzz bench-baseline gpu-report goldens goldens-check

venv: $(STAMP)

# torch is installed first, by itself and pinned: pip then takes the local CPU wheel, and the
# package's own range (torch>=2.4) is already met. Anything that lets pip resolve torch on its own
# would pull the CUDA build (GBs of nvidia-*). The same holds for the venv of wheel-check.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	$(BIN)/pip install torch==$(TORCH_VERSION)
	$(BIN)/pip install -e '.[dev]'
	@$(MAKE) --no-print-directory cpu-only-check CHECK_VENV=$(VENV)
	touch $@

cpu-only-check:
	@if $(CHECK_VENV)/bin/pip list 2>/dev/null | grep -qi '^nvidia-'; then \
	  echo "error: nvidia-* packages got installed into $(CHECK_VENV) (CUDA torch); expected CPU only" >&2; exit 1; fi

# DOT output works without the Graphviz programs; SVG/PNG/PDF need `dot`.
graphviz:
	@if command -v dot >/dev/null 2>&1; then \
	  dot -V; \
	else \
	  SUDO=""; \
	  if [ "$$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then SUDO="sudo"; fi; \
	  if command -v apt-get >/dev/null 2>&1 && \
	     $$SUDO apt-get update && \
	     $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y graphviz; then \
	    dot -V; \
	  else \
	    echo "warning: could not install graphviz (no apt-get or no permission);" \
	         "rendering to .svg/.png/.pdf will fail, .dot output still works" >&2; \
	  fi; \
	fi

# The main job end to end (scripts/demo.sh): check, draw, cost, compile fish and train it beside
# mhsa on the bundled corpus; prints where the diagram, cost table, module and loss plot are.
demo: venv graphviz
	TDIAG=$(BIN)/tdiag bash scripts/demo.sh out/demo

test: venv graphviz
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest $(PYTEST_WORKERS)

test-fast: venv
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest $(PYTEST_WORKERS) -m "not slow"

# The wheel into dist/; --no-build-isolation builds with the venv's setuptools (no download).
wheel: venv
	rm -rf dist build
	$(BIN)/pip wheel . --no-deps --no-build-isolation -w dist
	rm -rf build *.egg-info

# A user's install: the wheel (with its dependencies) into a fresh venv in a temporary folder,
# then the CLI and a short training run from another temporary folder, far from the repository.
wheel-check: wheel
	@set -eu; \
	tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	$(PYTHON) -m venv "$$tmp/venv"; \
	"$$tmp/venv/bin/pip" install -q torch==$(TORCH_VERSION); \
	"$$tmp/venv/bin/pip" install -q dist/tdiag-*.whl; \
	$(MAKE) --no-print-directory cpu-only-check CHECK_VENV="$$tmp/venv"; \
	mkdir "$$tmp/work"; cd "$$tmp/work"; \
	set -x; \
	"$$tmp/venv/bin/tdiag" --version; \
	"$$tmp/venv/bin/tdiag" check fish; \
	"$$tmp/venv/bin/tdiag" cost mgk --at N=1024; \
	"$$tmp/venv/bin/tdiag" compile mhsa -o mhsa_module.py; \
	"$$tmp/venv/bin/tdiag" train mgk --steps 4 --eval-every 2 --eval-batches 1 --layers 1 --width 32 \
	  --heads 2 --context 32 --batch 4 --device cpu --no-progress --out run; \
	test -f run/checkpoint.pt; \
	"$$tmp/venv/bin/python" -c "import tdiag, sys; sys.exit(not tdiag.__file__.startswith('$$tmp/venv/'))"
# ruff, then the layers' import contract (scripts/architecture.py): every import goes down a
# layer, function-local and TYPE_CHECKING ones included, or is in scripts/architecture_allow.txt
lint: venv
	$(BIN)/ruff format --check . && $(BIN)/ruff check . && $(BIN)/python scripts/architecture.py check

format: venv
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf out build dist .pytest_cache .ruff_cache .mypy_cache .hypothesis *.egg-info
	find . -path ./$(VENV) -prune -o -type d -name __pycache__ -exec rm -rf {} +

# The planner's goldens (scripts/goldens.py): a refactor that keeps behaviour keeps them; `make
# goldens` records them again after a change that means to alter plans (say which in its commit).
goldens: venv
	OMP_NUM_THREADS=1 $(BIN)/python scripts/goldens.py record

goldens-check: venv
	OMP_NUM_THREADS=1 $(BIN)/python scripts/goldens.py check

# Offline fuzzing: grammar-generated designs, causal designs at the seams (run-time splits,
# strictly causal factors, key sides that read N, decay matrices as statements, leg typos) and
# mutations of designs/*.td for FUZZ_SECONDS; every causal design is also decoded against its
# forward. Inputs tried, crashes, unpositioned errors, hangs and decode mismatches go to
# docs/results/fuzz/fuzz.json.
FUZZ_SECONDS ?= 1200
fuzz: venv
	$(BIN)/python scripts/fuzz.py --seconds $(FUZZ_SECONDS) --out docs/results/fuzz/fuzz.json

# The pre-redesign comparison: every bundled design compiled by tdiag at BASELINE_COMMIT into
# standalone files (BASELINE_DIR), timed next to today's plans, plain and causal (BENCH_OUT).
BASELINE_COMMIT ?= 40fcdb1
BASELINE_DIR    ?= out/baseline-$(BASELINE_COMMIT)
BENCH_OUT       ?= out/bench-baseline
BENCH_REPEAT    ?= 10
bench-baseline: venv
	$(BIN)/python scripts/bench_baseline.py $(BASELINE_COMMIT) --baseline $(BASELINE_DIR) \
	  --out $(BENCH_OUT) --repeat $(BENCH_REPEAT)

# The GPU report (tdiag/gpu_report.py) with the Python that holds the CUDA torch: not the venv,
# whose torch is the CPU build. This source tree comes first on the path.
REPORT_PYTHON ?= python3
REPORT_FLAGS  ?=
gpu-report:
	PYTHONPATH=$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH} $(REPORT_PYTHON) -m tdiag.gpu_report $(REPORT_FLAGS)
