# The two entry points README.md promises; each does all of its own set-up.
VENV ?= .venv
PYTEST_ARGS ?=

.PHONY: bootstrap demo test
bootstrap:
	./scripts/bootstrap.sh

demo: bootstrap
	$(VENV)/bin/hvd-elastic demo --consul dev

test: bootstrap
	$(VENV)/bin/ruff check .
	$(VENV)/bin/python -m pytest $(PYTEST_ARGS)
