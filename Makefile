# The two commands in the README, plus the pieces they are made of.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

# The suite's lanes (tests/lanes.py says which test is in which, and what each starts).
LANES := unit contract ledger platform batch faults-and-processes
JUNIT := .local/junit

.PHONY: demo test lint install services-up services-down services-status unit bench $(addprefix test-,$(LANES))

demo: install
	$(PY) -m api.cli demo

# The whole suite (every lane) on every service. Each test's time goes to
# $(JUNIT)/test.xml; the slowest and each lane's total are printed after, pass or fail,
# and the exit status is pytest's.
test: install lint services-up
	@mkdir -p $(JUNIT) && rm -f $(JUNIT)/test.xml && set -a && . .local/services.env && set +a && \
	  status=0 && $(PY) -m pytest -p no:cacheprovider --junitxml=$(JUNIT)/test.xml $(PYTEST_ARGS) || status=$$?; \
	  $(PY) -m tests.durations_report $(JUNIT)/test.xml; exit $$status

# One lane (`make test-ledger`): starts only the services it needs, runs `pytest -m LANE`.
$(addprefix test-,$(LANES)): test-%: install
	@services="$$($(PY) -m tests.lanes services $*)" && \
	  if [ -n "$$services" ]; then bash infra/services.sh up $$services; fi
	@mkdir -p $(JUNIT) && rm -f $(JUNIT)/$*.xml && \
	  if [ -f .local/services.env ]; then set -a && . .local/services.env && set +a; fi && \
	  status=0 && $(PY) -m pytest -p no:cacheprovider -m $* --junitxml=$(JUNIT)/$*.xml $(PYTEST_ARGS) || status=$$?; \
	  $(PY) -m tests.durations_report $(JUNIT)/$*.xml; exit $$status

# The linter's rules are in pyproject.toml ([tool.ruff]); a finding fails `make test`.
lint: install
	$(PY) -m ruff check .

install:
	bash infra/install_python.sh
	bash infra/install_browser.sh
	bash infra/install_helm.sh

services-up:
	bash infra/services.sh up

services-down:
	bash infra/services.sh down

services-status:
	bash infra/services.sh status

# Tests that need no services and no engine: a quick check while editing.
unit: install
	$(PY) -m pytest -p no:cacheprovider tests/unit $(PYTEST_ARGS)
