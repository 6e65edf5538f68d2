# The two commands: `make run` (install, then the sample job on the embedded default) and
# `make test` (install, lint, then the whole suite against a real PostgreSQL).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DATA_DIR ?= .minions

.PHONY: install run up test lint chaos bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch first, pinned: the local CPU build. A bare `torch` requirement could pull a multi-GB CUDA build.
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[agent,data,dev,mlx]'
	# MLX's CPU build on Linux, for the MLX parity tests (on a Mac the [mlx] extra runs on the GPU).
	if [ "$$(uname -s)" = Linux ]; then $(PY) -m pip install --quiet 'mlx[cpu]'; fi
	touch $(STAMP)

# mypy's view of the package-dir mapping (.ci/mypy-view): cheap, so made on every install.
install: $(STAMP)
	$(PY) .ci/mypy-view

run: install
	$(VENV)/bin/minions up --data-dir $(DATA_DIR) --port $${MINIONS_PORT:-8080} --executors 1 --sample

up: install
	$(VENV)/bin/minions up --data-dir $(DATA_DIR) --executors 1

lint: install
	$(VENV)/bin/ruff check .
	$(PY) .ci/mypy

test: install lint
	$(PY) -m pytest -q

chaos: install
	MINIONS_CHAOS=long $(PY) -m pytest -q tests/chaos

# Every pace benchmark adds its ratio to its physical limit to this ledger; the last step prints them all.
LEDGER := $(abspath $(DATA_DIR))/bench-ratios.jsonl

bench: export MINIONS_BENCH_LEDGER := $(LEDGER)
bench: install
	mkdir -p $(DATA_DIR) && rm -f $(LEDGER)
	# PgQueuer, the queue's reference arm (bench/drain.py, bench/claim.py)
	$(PY) -m pip install --quiet -e '.[agent,data,dev,mlx,bench]'
	# the pace guard first: a pipeline that stopped hiding its round trips fails here in under a minute
	$(PY) bench/pace.py
	$(PY) bench/claim.py
	$(PY) bench/claim.py --fair-share --clients 1,8 --runs 5 --seconds 3
	# the plain arms tuned up to batch 256 here (a CPU; 1024, the default, on a GPU)
	$(PY) bench/embed_agent.py --tuned-sizes 32,64,128,256
	$(PY) bench/agent_overhead.py
	$(PY) bench/complete_agent.py
	# torch against MLX per model (on Linux MLX's CPU build: parity, not speed; see BENCHMARKS.md)
	$(PY) bench/backends.py --rounds 3
	$(PY) bench/churn.py
	$(PY) bench/verify_output.py
	$(PY) bench/inline_submit.py
	$(PY) bench/cli_help.py --minions $(VENV)/bin/minions
	$(PY) bench/drain.py --subtasks 20000 --runs 3
	$(PY) bench/sql_profile.py --subtasks 10000 --batch 10
	$(PY) bench/drain_ceiling.py --subtasks 6000 --runs 5
	$(PY) bench/api_floor.py --runs 3
	$(PY) bench/embed_system.py --sentences 2000 --rounds 3
	$(PY) bench/spot_checks.py --runs 4 --fresh-runs 2
	$(PY) bench/idle_pollers.py --executors 1000 --wait-s 5 --cycles 3
	$(PY) bench/results.py --subtasks 10000 --records 20 --rounds 3
	$(PY) bench/kept_input_slices.py --runs 5
	# needs HAProxy (apt-get install haproxy, as .ci/run does)
	$(PY) bench/fleet.py --executors 1000 3000
	# every ratio to its limit, and its target, in one table
	$(PY) bench/limits.py $(LEDGER)

clean:
	rm -rf $(VENV) $(DATA_DIR) .pytest_cache .mypy_cache .mypy_view .ruff_cache
