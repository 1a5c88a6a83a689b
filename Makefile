PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean

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

bench: $(STAMP)
	$(PY) experiments/bench_ppo.py

clean:
	rm -rf $(VENV) runs .pytest_cache
