#!/usr/bin/env bash
# make lock's uv, at the Makefile's version (UV_VERSION), in its own venv (.tools/lock-venv): installed there with pip
# when missing or of another version; prints the uv binary's path. Used by `make lock` and by scripts/install.sh.
# Usage: scripts/uv.sh UV_VENV UV_VERSION PYTHON   (exit 1, nothing printed, when uv cannot be installed)
set -euo pipefail
UV_VENV="${1:?usage: scripts/uv.sh UV_VENV UV_VERSION PYTHON}"; UV_VERSION="${2:?}"; PYTHON="${3:?}"
ready() { [[ -x "$UV_VENV/bin/uv" && "$("$UV_VENV/bin/uv" --version 2>/dev/null)" == "uv $UV_VERSION"* ]]; }
if ! ready; then
  [[ -x "$UV_VENV/bin/python" ]] || "$PYTHON" -m venv "$UV_VENV" >&2
  "$UV_VENV/bin/python" -m pip install -q --disable-pip-version-check "uv==$UV_VERSION" >&2
  ready
fi
echo "$UV_VENV/bin/uv"
