# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export RAY_AUTH_MODE ?= disabled
export RLLIB_TEST_NO_TF_IMPORT ?= 1
export RAY_USAGE_STATS_ENABLED ?= 0
# Ray's 30 s wait for a starting control store's port file ran out on a fresh clone's first Ray start (2 cores,
# both test workers starting at once); the tests' own clusters (ray.cluster_utils) get the same wait as placer's
# local start (cluster/ray_setup.py).
export RAY_gcs_server_port_wait_time_s ?= 120

.PHONY: demo test bench venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first and pinned, so pip takes the CPU build and never a multi-GB CUDA one.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/placer search

# Two test processes (pytest-xdist), each taking whole files, so a file's Ray or traced graph is made once.
# A test that kills its worker fails the run at once: xdist's replacement worker left the suite hanging.
TEST_WORKERS ?= 2

test: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile --max-worker-restart=0 \
		--durations=15 tests

bench: $(STAMP)
	@for script in tests/bench/bench_*.py; do echo "## $$script"; $(PY) $$script || exit 1; done

clean:
	rm -rf $(VENV) .cache

# On a GPU machine: real PyTorch measurements against the profiled simulator, then the user's placer commands
# each in its own process (both skip cleanly without CUDA).
gpu-check: $(STAMP)
	$(PY) tests/gpu_check.py && $(PY) tests/gpu_cli_check.py
