PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-py312 lint bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test]"
	touch $(STAMP)

# PPO on CartPole-v1, emulated 4-device CPU mesh: 2-way data x 2-way tensor parallel.
demo: $(STAMP)
	$(PY) -m rljax train ppo --env CartPole-v1 --mesh data=2,model=2 --num-devices 4 --measure-comm

test: $(STAMP)
	$(VENV)/bin/ruff check rljax tests experiments notebooks
	$(VENV)/bin/ruff format --check rljax tests experiments notebooks
	$(PY) -m pytest -q -n 2 --dist loadfile --durations=30 tests

# The suite on Python 3.12, where pip resolves the newest jax that rljax's dependencies allow
# (0.11.2 on 2026-12-07: gymnax 1.0.1 caps jax below 0.12). TPU/GPU users run 0.11/0.12; CI runs
# `make test` (Python 3.11, jax 0.10.2). JAX=0.12.0.1 forces that jax past gymnax's cap.
PYTHON312 ?= python3.12
VENV312 := .venv312
JAX ?=
# The install and `test` rules above, run again with VENV and PYTHON pointed at Python 3.12.
test-py312:
	$(MAKE) VENV=$(VENV312) PYTHON=$(PYTHON312) $(VENV312)/.installed
	$(if $(JAX),$(VENV312)/bin/python -m pip install --quiet "jax==$(JAX)" "jaxlib==$(JAX)")
	$(MAKE) VENV=$(VENV312) PYTHON=$(PYTHON312) test

bench: $(STAMP)
	$(PY) experiments/bench_ppo.py

clean:
	rm -rf $(VENV) $(VENV312) runs .pytest_cache
