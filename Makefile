# The two commands in the README, plus the pieces they are made of.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: demo test lint install services-up services-down services-status unit bench

demo: install
	$(PY) -m api.cli demo

test: install lint services-up
	@set -a && . .local/services.env && set +a && \
	  $(PY) -m pytest -p no:cacheprovider $(PYTEST_ARGS)

# The linter's rules are in pyproject.toml ([tool.ruff]); a finding fails `make test`.
lint: install
	$(PY) -m ruff check .

install:
	bash infra/install_python.sh
	bash infra/install_browser.sh

services-up:
	bash infra/services.sh up

services-down:
	bash infra/services.sh down

services-status:
	bash infra/services.sh status

# Tests that need no services and no engine: a quick check while editing.
unit: install
	$(PY) -m pytest -p no:cacheprovider tests/unit $(PYTEST_ARGS)
