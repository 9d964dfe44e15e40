# The two commands of the README. Both set up .venv from the pins first.
#   make book   [PROFILE=ci|full] [CHAPTERS="01_ntk ..."] [ASSETS=cdn]  -> _build/html
#   make test                                                -> every test
#     (installs Debian's chromium for the browser checks when it is missing and we are
#      root on a fresh CI machine; NN_KERNELS_NO_SYSTEM_INSTALL=1 turns that off)
PROFILE ?= ci
CHAPTERS ?=
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: book test env bench clean

env:
	@VENV=$(VENV) bash book/tools/setup_env.sh

book: env
	$(PY) book/tools/build_book.py --profile $(PROFILE) $(if $(CHAPTERS),--chapters $(CHAPTERS)) $(if $(filter cdn,$(ASSETS)),--cdn)

test: env
	@bash book/tools/ensure_chromium.sh
	$(PY) -m pytest

bench: env
	for f in benchmarks/bench_*.py; do $(PY) $$f || exit 1; done

clean:
	rm -rf _build
