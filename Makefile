# stanvi — one command to set up and run a real fit (`make demo`), one to set up and run the tests
# (`make test`).  Both create the virtual environment .venv on first use (Python >= 3.12; on the
# project's machines that is pyenv's 3.12.1).

PYTHON ?= python3.12
VENV := .venv
PY := $(VENV)/bin/python
export PYENV_VERSION ?= 3.12.1

.PHONY: venv demo test bench api clean

# The API reference (docs/api.md): pdoc renders these modules' docstrings to build/api/
# (tests/test_api_reference.py builds the same list and checks its links).
API_MODULES := stanvi stanvi.reference stanvi.gp stanvi.discrete stanvi.targets stanvi.families \
	stanvi.diagnostics stanvi.output.plots stanvi.evaluation.compare stanvi.errors

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

venv: $(VENV)/.installed

demo: venv
	$(PY) -m stanvi.demo

# Two test processes (pytest-xdist): the suite is mostly single-threaded Python and the CI machine
# has 2 cores; Stan compiles are shared through the on-disk cache's locks.  ``worksteal``: a
# process that runs out of tests takes queued ones from the other (a fresh clone's first tests
# wait on compiles of very different lengths).
test: venv
	$(PY) -m pytest tests -q -rs -n 2 --dist worksteal --durations=25

bench: venv
	$(VENV)/bin/stanvi bench target

api: venv
	$(PY) -m pdoc --docformat google --output-directory build/api $(API_MODULES)
	@echo "API reference: build/api/index.html"

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
