# The two commands of the README. Both set up .venv from the pins first.
#   make book   [PROFILE=ci|full] [CHAPTERS="01_ntk ..."]  -> _build/html
#   make test                                                -> every test
PROFILE ?= ci
CHAPTERS ?=
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: book test env bench clean

env:
	@VENV=$(VENV) bash book/tools/setup_env.sh

book: env
	$(PY) book/tools/build_book.py --profile $(PROFILE) $(if $(CHAPTERS),--chapters $(CHAPTERS))

test: env
	$(PY) -m pytest

bench: env
	$(PY) benchmarks/run_all.py

clean:
	rm -rf _build
