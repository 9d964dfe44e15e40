# The two commands of the README, and a few more. Every target sets up .venv from the pins
# first (book/tools/setup_env.sh: a no-op when it is up to date). `make help` lists them.
PROFILE ?= ci
CHAPTERS ?=
RECORD_PROFILE ?= record
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: help book test test-lab test-load env lab bench record clean clean-results

help:  ## list the targets
	@echo "make book    [PROFILE=ci|record|paper] [CHAPTERS=\"01_ntk ...\"] [ASSETS=cdn]"
	@echo "               run the chapters (unchanged ones are reused) and build _build/html"
	@echo "               (a failed chapter's page is built and marked; the exit status is then 3)"
	@echo "make test    every test: package, chapters (ci profile), book, browser"
	@echo "make test-lab  chapters 1 and 4 run in JupyterLab in Chromium, read as in the book (~20 min)"
	@echo "make test-load [CHAPTERS=\"01_ntk ...\"]  chapters on one core shared with 2 busy loops"
	@echo "               (3x busier) must pass, and a hanging cell must be stopped and named (~10 min)"
	@echo "make lab     JupyterLab in .venv with chapters/ open, read as in the book (run a chapter as a reader would)"
	@echo "make env     only create/update .venv from constraints.txt"
	@echo "make record  CHAPTERS=\"02_random_features\" [RECORD_PROFILE=record|paper] [SET=\"use_real_data=false\"] [NOTE=\"why\"]"
	@echo "               record-scale runs (about 90 min each) of those chapters, in book/runs/<chapter>.<profile>.json"
	@echo "make bench   the speed benchmarks (benchmarks/README.md)"
	@echo "make clean   remove _build (executed chapters, their cache, the HTML), not the result store"
	@echo "make clean-results  remove the per-configuration result store (_build/results or \$$NN_KERNELS_RESULTS)"
	@echo "SCHEDULER=tcp://host:8786 (book, record): run the chapters and their configurations on a Dask cluster"
	@echo "logs: each chapter's cell output streams to _build/executed/<profile>/<chapter>.log"

env:
	@VENV=$(VENV) bash book/tools/setup_env.sh

book: env
	$(PY) book/tools/build_book.py --profile $(PROFILE) $(if $(CHAPTERS),--chapters $(CHAPTERS)) $(if $(SCHEDULER),--scheduler $(SCHEDULER)) $(if $(filter cdn,$(ASSETS)),--cdn)

# (installs Debian's chromium for the browser checks when it is missing and we are root
#  on a fresh CI machine; NN_KERNELS_NO_SYSTEM_INSTALL=1 turns that off)
test: env
	@bash book/tools/ensure_chromium.sh
	$(PY) -m pytest

test-lab: env
	@bash book/tools/ensure_chromium.sh
	NN_KERNELS_LAB_CHAPTERS=1 $(PY) -m pytest tests/test_lab.py

test-load: env
	$(PY) book/tools/load_test.py $(if $(CHAPTERS),--chapters $(CHAPTERS))

# book/lab holds the JupyterLab extension that renders the chapters' MyST (glued numbers,
# references, notes, figure captions); --allow-root only when running as root (containers).
lab: env
	$(VENV)/bin/jupyter lab --ServerApp.root_dir=chapters --LabApp.extra_labextensions_path=$(CURDIR)/book/lab $(if $(filter 0,$(shell id -u)),--allow-root)

record: env
	@test -n "$(CHAPTERS)" || { echo "make record needs CHAPTERS=\"...\" (a record run takes up to 90 min per chapter)"; exit 2; }
	rm -rf _build/run/ci-results; NN_KERNELS_THREADS=1 NN_KERNELS_RESULTS=_build/run/ci-results $(PY) book/tools/run_chapters.py --profile ci --no-cache --out _build/run $(CHAPTERS)
	$(PY) book/tools/run_chapters.py --profile $(RECORD_PROFILE) --out _build/run $(foreach s,$(SET),--set $(s)) $(if $(SCHEDULER),--scheduler $(SCHEDULER)) $(CHAPTERS)
	for c in $(CHAPTERS); do $(PY) book/tools/record_run.py _build/run/$(RECORD_PROFILE)/$$c.ipynb --profile $(RECORD_PROFILE) --teaching _build/run/ci/$$c.ipynb $(foreach s,$(SET),--set $(s)) --note "$(NOTE)" || exit 1; done
	$(PY) book/tools/lab_metadata.py

# (adds the [bench] extra, the third-party anchors, to .venv: book/tools/setup_env.sh --bench)
bench: env
	@VENV=$(VENV) bash book/tools/setup_env.sh --bench
	for f in benchmarks/bench_*.py; do $(PY) -m benchmarks.$$(basename $$f .py) || exit 1; done

# The result store (_build/results) may hold hours of record runs: only clean-results removes it.
clean:
	find _build -mindepth 1 -maxdepth 1 ! -name results -exec rm -rf {} + 2>/dev/null || true

clean-results: env
	$(PY) -m nnk_book.store clean
