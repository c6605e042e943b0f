#!/usr/bin/env bash
# Create the virtualenv and install the project into it from requirements.lock (called by every make target that
# needs the environment; does nothing when the environment already matches the lock and the mode).
# Usage: scripts/install.sh VENV PYTHON [TORCH] [WHEELS]
#   TORCH=locked  (default) every package at its locked version, torch and torchvision included (PyPI's builds).
#   TORCH=system  keep the torch that PYTHON already imports (an NGC container, a module system, a build matched to
#                 the driver) and whatever else PYTHON already has; install the rest at their locked versions.
#   WHEELS=DIR    install from the wheels in DIR only, for a machine with no package registry.
# With a registry, and UV_VERSION and UV_VENV set (the Makefile sets both: make lock's uv, in .tools/lock-venv), uv
# installs the lock's files, hashes checked as pip checks them and bytecode compiled as pip compiles it: a fresh .venv
# in 66-74 s against pip's 148-183 s on the 2-core VM (docs/tests.md). Without them, from a folder, or where uv cannot
# be had: pip.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${1:?usage: scripts/install.sh VENV PYTHON [TORCH] [WHEELS]}"; PYTHON="${2:?}"; TORCH="${3:-locked}"; WHEELS="${4:-}"
LOCK="$REPO/requirements.lock"; STAMP="$VENV/.installed"
err() { echo "make: $*" >&2; exit 2; }

case "$TORCH" in locked|system) ;; *) err "TORCH=$TORCH: choose locked (the default: torch from requirements.lock) or system (the torch $PYTHON already has)";; esac
[[ -z "$WHEELS" || -d "$WHEELS" ]] || err "WHEELS=$WHEELS: no such directory (a folder of .whl files for an install without a package registry)"
KEY="torch=$TORCH $(cat "$LOCK" "$REPO/pyproject.toml" | sha256sum | cut -c1-16)"
if [[ -x "$VENV/bin/python" && -f "$STAMP" && "$(<"$STAMP")" == "$KEY" ]]; then exit 0; fi

# A venv made for the other mode is made again (only one this script made: it carries the mode file).
if [[ -f "$VENV/.torch-mode" && "$(<"$VENV/.torch-mode")" != "$TORCH" ]]; then
  echo "make: $VENV was made for TORCH=$(<"$VENV/.torch-mode"); making it again for TORCH=$TORCH" >&2
  rm -rf "$VENV"
fi
if [[ ! -x "$VENV/bin/python" ]]; then
  if [[ "$TORCH" == system ]]; then
    TORCH_DIR="$("$PYTHON" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))' 2>/dev/null)" \
      || err "TORCH=system: $PYTHON cannot import torch; install torch for it (or pass PYTHON=/path/to/python), or drop TORCH=system to use the locked torch"
    "$PYTHON" -m venv --system-site-packages "$VENV"
    # A venv (or conda env) python makes a venv on its base interpreter, whose site-packages do not hold that torch:
    # then name torch's directory in a .pth file, which puts it on sys.path after the venv's own packages.
    if ! "$VENV/bin/python" -c 'import os, sys, torch; sys.exit(os.path.dirname(os.path.dirname(torch.__file__)) != sys.argv[1])' "$TORCH_DIR" 2>/dev/null; then
      SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
      echo "$TORCH_DIR" > "$SITE/_system_torch.pth"
    fi
  else
    "$PYTHON" -m venv "$VENV"
  fi
  echo "$TORCH" > "$VENV/.torch-mode"
fi

PY="$VENV/bin/python"
SELECTED="$VENV/.lock-selected.txt"
"$PY" "$REPO/scripts/lockfile.py" select --mode "$TORCH" -o "$SELECTED" ${WHEELS:+--wheels "$WHEELS"}  # exit 1: stale lock
PIP=(-m pip install -q --disable-pip-version-check --no-deps)
[[ -n "$WHEELS" ]] && PIP+=(--no-index --find-links "$WHEELS")
UV=""
if [[ -s "$SELECTED" && -z "$WHEELS" && -n "${UV_VERSION:-}" && -n "${UV_VENV:-}" ]]; then
  UV="$("$REPO/scripts/uv.sh" "$UV_VENV" "$UV_VERSION" "$PYTHON")" \
    || { UV=""; echo "make: could not install uv $UV_VERSION into $UV_VENV; installing with pip" >&2; }
fi
if [[ -n "$UV" ]]; then
  "$UV" pip install -q --python "$PY" --no-deps --require-hashes --compile-bytecode -r "$SELECTED"
elif [[ -s "$SELECTED" ]]; then
  "$PY" "${PIP[@]}" --require-hashes -r "$SELECTED"
fi
"$PY" "${PIP[@]}" --no-build-isolation -e "$REPO"
"$PY" -c 'import os, torch, torchvision; print("make: environment ready: torch", torch.__version__, "from", os.path.dirname(os.path.dirname(torch.__file__)))' >&2
echo "$KEY" > "$STAMP"
