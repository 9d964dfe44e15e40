# The two commands of the README. Both set up .venv from the pins first.
#   make book   [PROFILE=ci|full] [CHAPTERS="01_ntk ..."] [ASSETS=cdn]  -> _build/html
#   make test                                                -> every test
#   make record CHAPTERS="02_random_features" [SET="use_real_data=false"] [NOTE="why"]
#     -> a paper-scale (full) run of those chapters, recorded in book/runs/ (hours)
#     (installs Debian's chromium for the browser checks when it is missing and we are
#      root on a fresh CI machine; NN_KERNELS_NO_SYSTEM_INSTALL=1 turns that off)
PROFILE ?= ci
CHAPTERS ?=
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: book test env bench record clean

env:
	@VENV=$(VENV) bash book/tools/setup_env.sh

book: env
	$(PY) book/tools/build_book.py --profile $(PROFILE) $(if $(CHAPTERS),--chapters $(CHAPTERS)) $(if $(filter cdn,$(ASSETS)),--cdn)

test: env
	@bash book/tools/ensure_chromium.sh
	$(PY) -m pytest

record: env
	@test -n "$(CHAPTERS)" || { echo "make record needs CHAPTERS=\"...\" (a full run takes hours)"; exit 2; }
	$(PY) book/tools/run_chapters.py --profile full --out _build/run $(foreach s,$(SET),--set $(s)) $(CHAPTERS)
	for c in $(CHAPTERS); do $(PY) book/tools/record_run.py _build/run/full/$$c.ipynb --profile full --note "$(NOTE)" || exit 1; done

bench: env
	for f in benchmarks/bench_*.py; do $(PY) $$f || exit 1; done

clean:
	rm -rf _build
