# tdiag: set up and run everything from a fresh clone.
#   make demo   venv + graphviz, then check/show/render the bundled designs
#   make test   venv + graphviz, then the test suite
#   make fuzz   a longer offline fuzz (FUZZ_SECONDS, default 1200) with a JSON report

PYTHON        ?= python3
VENV          := .venv
BIN           := $(VENV)/bin
STAMP         := $(VENV)/.installed
TORCH_VERSION := 2.13.0

.PHONY: venv graphviz demo test lint format clean fuzz

venv: $(STAMP)

# torch is installed first, by itself and pinned: pip then takes the local CPU wheel.
# Anything that lets pip resolve torch on its own would pull the CUDA build (GBs of nvidia-*).
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	$(BIN)/pip install torch==$(TORCH_VERSION)
	$(BIN)/pip install -e '.[dev]'
	@if $(BIN)/pip list 2>/dev/null | grep -qi '^nvidia-'; then \
	  echo "error: nvidia-* packages got installed into $(VENV) (CUDA torch); expected CPU only" >&2; exit 1; fi
	touch $@

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

demo: venv graphviz
	mkdir -p out
	$(BIN)/tdiag check designs/*.td
	$(BIN)/tdiag show designs/thsa.td
	$(BIN)/tdiag render designs/mhsa.td -o out/mhsa.svg
	$(BIN)/tdiag render designs/thsa.td -o out/thsa.svg
	$(BIN)/tdiag render designs/mhsa.td -o out/mhsa.dot

test: venv graphviz
	$(BIN)/python -m pytest

lint: venv
	$(BIN)/ruff format --check . && $(BIN)/ruff check .

format: venv
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf out build dist .pytest_cache .ruff_cache .mypy_cache .hypothesis *.egg-info
	find . -path ./$(VENV) -prune -o -type d -name __pycache__ -exec rm -rf {} +

# Offline fuzzing: grammar-generated designs and mutations of designs/*.td for FUZZ_SECONDS;
# inputs tried, crashes, unpositioned errors and hangs go to docs/results/fuzz/fuzz.json.
FUZZ_SECONDS ?= 1200
fuzz: venv
	$(BIN)/python scripts/fuzz.py --seconds $(FUZZ_SECONDS) --out docs/results/fuzz/fuzz.json
