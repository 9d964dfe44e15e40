#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment with the pinned stack.
#
#   book/tools/setup_env.sh            # create .venv if needed and install the pins
#   book/tools/setup_env.sh --relock   # re-resolve from pyproject.toml and rewrite the pins
#   book/tools/setup_env.sh --bench    # add the [bench] extra (benchmark anchors) to .venv
#
# Both README commands (make book, make test) call this first. It is idempotent: a
# stamp file records the hash of constraints.txt + pyproject.toml, so an unchanged
# environment is not reinstalled.
#
# Variables: PYTHON (interpreter to build the venv from, default python3),
# VENV (default .venv), TORCH_INDEX_URL (index holding CPU-only torch wheels, default
# the PyTorch CPU index; set it empty to use only the default package index).
set -euo pipefail
cd "$(dirname "$0")/../.."

PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
TORCH_INDEX_URL=${TORCH_INDEX_URL-https://download.pytorch.org/whl/cpu}
PIP_PIN="pip==26.3"
relock=0
bench=0
case "${1:-}" in
    --relock) relock=1 ;;
    --bench) bench=1 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    "") ;;
    *) echo "setup_env: unknown argument ${1}; see --help" >&2; exit 2 ;;
esac

want=$(cat constraints.txt pyproject.toml | sha256sum | cut -c1-16)
stamp="$VENV/.nn-kernels-book-installed"

if [ $bench = 1 ]; then
    # The [bench] extra of pyproject.toml, pinned in constraints.txt, into an existing venv
    # (make bench runs make env first). ffht-unofficial's setup.py imports numpy and
    # pybind11, which pip's build isolation hides from it: pybind11 and setuptools (a fresh
    # venv may have none: the project builds in isolation) are installed first and
    # the anchors are then built with --no-build-isolation. The project itself is not
    # reinstalled. A failed build is a warning: the benchmark skips that anchor's column.
    bench_stamp="$VENV/.nn-kernels-book-bench-installed"
    if [ -f "$bench_stamp" ] && [ "$(cat "$bench_stamp")" = "$want" ]; then
        exit 0
    fi
    [ -x "$VENV/bin/python" ] || { echo "setup_env --bench: no $VENV; run make env first" >&2; exit 1; }
    mapfile -t extra < <("$VENV/bin/python" -c 'import tomllib
for r in tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["bench"]:
    print(r)')
    pip=("$VENV/bin/python" -m pip)
    echo "setup_env: installing the [bench] extra into $VENV: ${extra[*]}"
    "${pip[@]}" install --progress-bar on -c constraints.txt pybind11 setuptools numpy
    if "${pip[@]}" install --progress-bar on --no-build-isolation -c constraints.txt "${extra[@]}"; then
        echo "$want" > "$bench_stamp"
    else
        echo "setup_env: WARNING: the [bench] extra did not build (see above); the benchmarks" \
             "skip the anchors that are not installed" >&2
    fi
    exit 0
fi
if [ $relock = 0 ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    exit 0
fi

if ! "$PYTHON" -c 'import sys; sys.exit(not ((3, 10) <= sys.version_info[:2] <= (3, 12)))'; then
    echo "setup_env: $PYTHON is $("$PYTHON" --version 2>&1); Python 3.10-3.12 is required" \
         "(the pins were resolved on 3.11). Set PYTHON=/path/to/python3.11." >&2
    exit 1
fi

if [ ! -x "$VENV/bin/python" ]; then
    echo "setup_env: creating $VENV with $("$PYTHON" --version 2>&1)"
    "$PYTHON" -m venv "$VENV"
fi
pip=("$VENV/bin/python" -m pip)
echo "setup_env: installing the pinned stack into $VENV (about 3 minutes on a fresh machine)"
"${pip[@]}" install --quiet "$PIP_PIN"

# torch: the CPU build. On the PyPI index a plain 'torch' for Linux pulls several GB
# of CUDA libraries; the PyTorch CPU index serves 'torch==X+cpu', which satisfies the
# 'torch==X' pin and is preferred (a local version sorts above the plain one).
# Machines without access to that index (offline mirrors, or this project's CI, which
# has a local CPU wheel on its find-links path) skip it.
torch_args=()
if [ -n "$TORCH_INDEX_URL" ] && "$VENV/bin/python" - "$TORCH_INDEX_URL" <<'PY'
import sys, urllib.request
try:
    urllib.request.urlopen(sys.argv[1], timeout=5)
except Exception:
    sys.exit(1)
PY
then
    torch_args=(--extra-index-url "$TORCH_INDEX_URL")
else
    echo "setup_env: $TORCH_INDEX_URL not reachable; taking torch from the configured index/find-links"
fi

if [ $relock = 1 ]; then
    # Resolve afresh from pyproject.toml's ranges, then freeze the result.
    "${pip[@]}" install "${torch_args[@]}" "torch==$(grep -E '^torch==' constraints.txt | cut -d= -f3)"
    "${pip[@]}" install -e ".[test]"
    cp constraints.txt constraints.txt.bak
    {
        echo "# Pinned environment for the book, the tests and the benchmarks (Python 3.11, Linux x86-64)."
        echo "# Used as a pip constraints file by book/tools/setup_env.sh; environment.yml mirrors it."
        echo "# Regenerate with: book/tools/setup_env.sh --relock (see book/guide.md, 'Pins, and why')."
        "${pip[@]}" freeze --exclude-editable | sed -E 's/^(torch==[^+]*)\+cpu$/\1/' \
            | grep -viE '^(ffht-unofficial|pybind11|setuptools)=='
        # The optional [bench] block is kept as it was (it is not part of this resolve).
        sed -n '/^# \[bench\] optional extra/,$p' constraints.txt.bak
    } > constraints.txt
    rm -f constraints.txt.bak
    "$VENV/bin/python" book/tools/lock.py --write-environment
    want=$(cat constraints.txt pyproject.toml | sha256sum | cut -c1-16)
else
    # Not --quiet: pip's "Collecting"/"Downloading" lines and bars are the progress.
    "${pip[@]}" install --progress-bar on "${torch_args[@]}" -c constraints.txt torch
    "${pip[@]}" install --progress-bar on -c constraints.txt -e ".[test]"
fi
# Chapter 5's compiled CPU kernels (kernels/csrc, g++ and ninja): build them now so
# that the first notebook or test does not pay for it. Without a compiler the package
# falls back to pure torch (the tests of the compiled path then fail and say why).
echo "setup_env: compiling chapter 5's C++ kernels (about a minute)"
if ! "$VENV/bin/python" -m kernels._ext; then
    echo "setup_env: WARNING: the C++ extension did not build; kernels.hadamard/lookup use pure torch" >&2
fi
echo "$want" > "$stamp"
echo "setup_env: $VENV is ready ($("$VENV/bin/python" -c 'import torch; print("torch", torch.__version__)'))"
