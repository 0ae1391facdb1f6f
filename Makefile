# Two commands do everything on a fresh machine with Python 3.10+:
#   make lab    install into .venv and open the course in JupyterLab
#   make test   install into .venv and run the whole test suite (notebooks included)
PYTHON ?= python3
VENV   ?= .venv
# The torch build the course is tested with; override, e.g. `make lab TORCH="torch>=2.3"` to keep a CUDA build.
TORCH  ?= torch==2.13.0
BIN     = $(VENV)/bin
# The tests' order: as written (pytest-randomly, in the dev extra, is switched off); `make test-random` shuffles it.
PYTEST_ORDER ?= -p no:randomly
# Extra arguments for `dpteach lab`, e.g. `make lab LAB_ARGS="--no-browser --port 8890"`.
LAB_ARGS ?=

.PHONY: lab test test-random test-fast install browser axe bench clean site site-outputs

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# The tests also need the instructors' extras (nbgrader, the site builder). nbgrader's JupyterLab and server
# extensions are switched off in this environment: the tests use its command line, and a learner's lab
# from a clone should look like everyone else's.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet "$(TORCH)"
	$(BIN)/python -m pip install --quiet -e ".[dev,nbgrader,site]"
	-$(BIN)/jupyter labextension disable --level=sys_prefix @jupyter/nbgrader >/dev/null 2>&1
	-for e in formgrader validate_assignment assignment_list course_list; do \
	  $(BIN)/jupyter server extension disable --sys-prefix nbgrader.server_extensions.$$e >/dev/null 2>&1; done
	touch $@

install: $(VENV)/.installed

lab: install
	$(BIN)/dpteach lab $(LAB_ARGS)

# The browser test drives Debian's Chromium; install it where we can (root with apt), else it skips.
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } \
	      || echo "could not install Chromium: the browser test will be skipped"; \
	  else echo "Chromium not found and not installable here: the browser test will be skipped"; fi; }

# axe-core (npm), which the site's accessibility test injects into each page from this local copy; without npm
# that test is skipped with the reason.
AXE := build/axe/node_modules/axe-core/axe.min.js
axe:
	@test -f $(AXE) || { command -v npm >/dev/null 2>&1 \
	  && npm install --silent --no-audit --no-fund --prefix build/axe axe-core@4.14 >/dev/null \
	  || echo "could not install axe-core from npm: the accessibility test will be skipped"; }

test: install browser axe
	$(BIN)/python -m pytest -q $(PYTEST_ORDER) tests exercises --nbval-lax --durations=25

# The whole suite in a random order (pytest-randomly prints its seed; `PYTEST_ADDOPTS=--randomly-seed=N` repeats one).
test-random: install browser axe
	$(BIN)/python -m pytest -q tests exercises --nbval-lax --durations=25

# The unit and multi-process tests alone: no notebooks, no browser, nothing marked slow (about 3 minutes
# on 2 cores; `make test` runs everything, these included: about 35, installs aside).
test-fast: install
	$(BIN)/python -m pytest -q $(PYTEST_ORDER) tests -m "not slow and not browser"

# The course as a static website (site/README.md), built offline from the stored runs in site/outputs.
site: install
	$(BIN)/python site/build.py

# Run every lesson and exercise again and store their outputs for the site (about 10 minutes on 2 cores).
site-outputs: install
	$(BIN)/python site/build.py --execute

bench: install
	$(BIN)/dpteach bench allreduce --world-size 4 --sizes 4KiB,1MiB,16MiB --iters 20

clean:
	rm -rf $(VENV) .pytest_cache
