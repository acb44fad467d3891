# imaging-ai — the two commands a hospital IT team needs: `make run` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CONFIG ?= deploy/imaging-ai.dev.toml
DEB_TEST_PACKAGES := dcmtk dicom3tools postgresql orthanc chromium chromium-driver prometheus

.PHONY: install lock run test lint typecheck pytest deps-system clean bench-ingest soak demo

install: $(STAMP)

# The exact versions the tests passed with (uv pip compile: every platform, hashes checked by
# pip); the repository's own packages go in editable on top of them, without resolving again.
LOCK := requirements/dev.lock
# The daemon, then its development kit (devkit/: phantoms, benchmarks, the tests' stand-ins),
# which a hospital's server never installs.
PACKAGES := . ./devkit
PYPROJECTS := $(addsuffix /pyproject.toml,$(PACKAGES))

$(STAMP): $(PYPROJECTS) $(LOCK)
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -r $(LOCK)
	$(BIN)/pip install -q --no-deps $(addprefix -e ,$(PACKAGES))
	@$(BIN)/pip check >/dev/null || { $(BIN)/pip check; \
	  echo "$(LOCK) does not satisfy $(PYPROJECTS): run make lock"; exit 1; }
	touch $(STAMP)

# Re-resolves the lock after a pyproject.toml change, keeping every pin that still fits;
# make lock LOCK_ARGS=--upgrade moves them all to the newest allowed. uv is needed only here.
# The gpu and train extras stay out: they are installed by hand where the hardware is.
UV_VERSION := 0.13.10
LOCK_ARGS ?=
lock:
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q 'uv==$(UV_VERSION)'
	$(BIN)/uv pip compile requirements/dev.in --universal --python-version 3.11 \
	  --no-emit-package imaging-ai --no-emit-package imaging-ai-devkit \
	  --generate-hashes --custom-compile-command 'make lock' $(LOCK_ARGS) -o $(LOCK)

run: install
	$(BIN)/imaging-ai serve --config $(CONFIG)

# Debian packages the tests use as real peers; installed only when missing (CI runs as root).
deps-system:
	@missing=""; for p in $(DEB_TEST_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $$missing; \
	fi

lint: install
	$(BIN)/ruff check imaging_ai devkit tests scripts benchmarks
	$(BIN)/ruff format --check imaging_ai devkit tests scripts benchmarks

typecheck: install
	$(BIN)/mypy

# Two workers (pytest-xdist), each module's tests on one worker (module fixtures: daemons,
# peers): most of the suite waits on daemons, peers and sockets, not on the two cores. Tests
# marked serial (timing-sensitive under load) then run alone.
PYTEST_WORKERS ?= 2
pytest: install deps-system
	$(BIN)/pytest -q -n $(PYTEST_WORKERS) --dist loadscope -m "not slow and not serial"
	$(BIN)/pytest -q -m "serial and not slow"

test: lint typecheck pytest

bench-ingest: install deps-system
	$(BIN)/imaging-ai bench ingest

# Orthanc as the PACS, a stand-in RIS and the daemon on loopback, phantom studies pushed from
# Orthanc; prints where to look and keeps running until Ctrl-C (DEMO_ARGS=--once to stop).
demo: install deps-system
	$(BIN)/python scripts/demo.py $(DEMO_ARGS)

# The long reliability runs (tests/reliability, marker slow; docs/reliability.md): a kill at each
# stage boundary, 30 s without the database, PACS and RIS down for minutes, a hung worker, 300 s
# of fuzzing, 2 minutes of 8 senders, a few hundred studies. Each prints its figures.
soak: install deps-system
	IMAGING_AI_FUZZ_SECONDS=300 $(BIN)/pytest -q -s -m slow tests/reliability

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
