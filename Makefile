# The two entry points README.md promises, and the documentation site; each does all of its own set-up.
VENV ?= .venv
PYTEST_ARGS ?= --durations=30  # the slowest tests, where the suite's time goes

.PHONY: bootstrap demo test docs
bootstrap:
	./scripts/bootstrap.sh

demo: bootstrap
	$(VENV)/bin/hvd-elastic demo --consul dev

# pytest runs twice: the tests that can share the machine side by side (TEST_JOBS workers, a file each, in
# tests/conftest.py's order: longest first), then those marked serial one at a time (tests/conftest.py says
# which).  Both always run; pytest's 5 ("no tests selected", as PYTEST_ARGS naming one file can make it) is
# no failure.
TEST_JOBS ?= 2
test: bootstrap
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	status=0; \
	$(VENV)/bin/python -m pytest -m "not serial" -n $(TEST_JOBS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS) || status=$$?; \
	[ $$status -eq 5 ] && status=0; \
	$(VENV)/bin/python -m pytest -m serial $(PYTEST_ARGS) || { rc=$$?; [ $$rc -eq 5 ] || status=$$rc; }; \
	exit $$status

# The documentation site, docs/ -> site/ (git-ignored); the reference pages are generated from the code
# in the build (docs/hooks.py).  make test builds it too (tests/test_docs.py).
docs: bootstrap
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict
