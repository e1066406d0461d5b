# Two entry points, both from a fresh clone:
#   make demo   set up, then swap faces on the built-in samples (writes out/)
#   make test   set up, then run the test suite
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup models demo test clean

$(BIN)/swapstream: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	@touch $@

setup: $(BIN)/swapstream

# Takes the built-in face models out of the pinned mediapipe wheel (one PyPI download, verified by
# SHA-256); a no-op once they are in place.
models: setup
	$(BIN)/swapstream setup

demo: models
	$(BIN)/swapstream demo --out-dir out

test: models
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) out .pytest_cache
