# Two commands for a newcomer (see README.md):
#   make demo   installs modelcut in .venv and runs the main job: modelcut's default model against every
#               published run (out of sample), the deck's seed model beside it, the bubble table, results.md
#   make test   installs modelcut with its test tools (and Debian's chromium for the browser tests) and runs the tests
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test install install-test browser

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

install: $(BIN)/python
	$(BIN)/pip install --quiet -e .

install-test: $(BIN)/python
	$(BIN)/pip install --quiet -e '.[test,torch]'

browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; \
	  else sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; fi; }

demo: install
	$(BIN)/modelcut validate --mode default
	$(BIN)/modelcut validate
	$(BIN)/modelcut bubble-table
	$(BIN)/modelcut report

# The tests run on two processes (pytest-xdist); the few that time real processes or a loaded server
# (marked serial) run afterwards, alone, so that the other process's work cannot slow them.
test: install-test browser
	$(BIN)/python -m pytest -q -n 2 -m "not serial"
	$(BIN)/python -m pytest -q -m serial
