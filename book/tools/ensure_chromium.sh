#!/usr/bin/env bash
# Make headless Chromium available for the browser tests (tests/test_book*.py).
#
# `make test` calls this before pytest. When no Chromium/Chrome is on PATH and we run as
# root on a Debian/Ubuntu machine (a fresh CI machine), it installs Debian's `chromium`
# package with apt-get. Anywhere else (a developer's laptop, no root, no apt, or
# NN_KERNELS_NO_SYSTEM_INSTALL=1) it only prints how to install it, and the browser
# tests skip with that reason. It never fails the test command by itself.
set -uo pipefail

for name in chromium chromium-browser google-chrome google-chrome-stable; do
    if command -v "$name" >/dev/null 2>&1; then
        exit 0
    fi
done

hint="the widget/MathJax browser checks will be skipped; install Chromium (Debian/Ubuntu: apt-get install chromium) to run them"
if [ "${NN_KERNELS_NO_SYSTEM_INSTALL:-0}" = "1" ]; then
    echo "ensure_chromium: no Chromium found and NN_KERNELS_NO_SYSTEM_INSTALL=1: $hint" >&2
    exit 0
fi
if [ "$(id -u)" != "0" ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "ensure_chromium: no Chromium found (not root, or no apt-get): $hint" >&2
    exit 0
fi

echo "ensure_chromium: installing Debian's chromium for the browser tests (apt-get)"
export DEBIAN_FRONTEND=noninteractive
if apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1; then
    echo "ensure_chromium: $(chromium --version 2>/dev/null || echo chromium installed)"
else
    echo "ensure_chromium: apt-get could not install chromium: $hint" >&2
fi
exit 0
