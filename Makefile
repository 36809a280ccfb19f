# The two entry points README.md promises, and the documentation site; each does all of its own set-up.
VENV ?= .venv
PYTEST_ARGS ?= --durations=30  # the slowest tests, where the suite's time goes

.PHONY: bootstrap demo test docs
bootstrap:
	./scripts/bootstrap.sh

demo: bootstrap
	$(VENV)/bin/hvd-elastic demo --consul dev

test: bootstrap
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/python -m pytest $(PYTEST_ARGS)

# The documentation site, docs/ -> site/ (git-ignored); the reference pages are generated from the code
# in the build (docs/hooks.py).  make test builds it too (tests/test_docs.py).
docs: bootstrap
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict
