#!/usr/bin/env bash
# Build + install Horovod (PyTorch, Gloo; plus NCCL when torch sees a GPU) into a virtualenv.
# The built wheel is cached, keyed by horovod version + exact torch version + python tag +
# cpu/gpu flavour (+ CUDA version and architecture list for a CUDA torch; scripts/cuda_toolkit.py key),
# so a compile (~10 min on 2 cores) only happens when one of those changes.
# A CUDA torch needs a CUDA toolkit of torch's CUDA version (Horovod's CMake always compiles its CUDA parts
# then): CUDA_HOME if set, else a matching system toolkit, else one assembled from PyPI's compiler wheels
# pinned to torch's nvidia-cuda-runtime version, in BENCH_CUDA_CACHE (scripts/cuda_toolkit.py ensure).
# Offline (no package registry): WHEELS=DIR, a folder from `make wheels` (its Horovod source archive and the build and
# runtime requirements), or pip's own PIP_NO_INDEX=1 with PIP_FIND_LINKS: every pip this script starts, and those that
# Horovod's setup.py (setup_requires), cuda_toolkit.py and setuptools start, then reads that folder only.
# Usage: scripts/build_horovod.sh [VENV_DIR]          (default: <repo>/.venv)
# Env:   HOROVOD_VERSION (requirements.lock's; that one's source archive is hash-checked)
#        BENCH_WHEEL_CACHE (~/.cache/torch-parallel-bench/wheels)   WHEELS (a folder, offline; see above)
#        HOROVOD_SDIST (local sdist instead of PyPI)   HOROVOD_BUILD_CUDA_CC_LIST (75,80,90)
#        CUDA_HOME (a toolkit to use whatever its version)   BUILD_JOBS (nproc)
#        BENCH_CUDA_CACHE (~/.cache/torch-parallel-bench/cuda: compiler wheels, ~280 MB per CUDA version)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${1:-$REPO/.venv}"
[[ -x "$VENV/bin/python" ]] || { echo "build_horovod: FAILED: no $VENV/bin/python" >&2; exit 1; }
VENV="$(cd "$VENV" && pwd)"; PY="$VENV/bin/python"
LOCKED_VER="$(sed -n 's/^horovod==\([^ ;\\]*\).*/\1/p' "$REPO/requirements.lock")"   # its sdist's hash is in the lock
HVD_VER="${HOROVOD_VERSION:-$LOCKED_VER}"
[[ -n "$HVD_VER" ]] || { echo "build_horovod: no horovod pin in $REPO/requirements.lock; set HOROVOD_VERSION" >&2; exit 2; }
STAMP="$VENV/.horovod-built-against"; LOG="$VENV/horovod-build.log"  # stamp: key of last verified install
export PIP_DISABLE_PIP_VERSION_CHECK=1
# Offline: the folder first in pip's find-links and no index, in the environment, so that every pip started below
# (here, by setuptools for Horovod's setup_requires, by cuda_toolkit.py) inherits it and none tries the network.
OFFLINE=""
if [[ -n "${WHEELS:-}" ]]; then
  [[ -d "$WHEELS" ]] || { echo "build_horovod: WHEELS=$WHEELS: no such directory (a folder from \`make wheels\`)" >&2; exit 2; }
  WHEELS="$(cd "$WHEELS" && pwd)"
  export PIP_NO_INDEX=1 PIP_FIND_LINKS="$WHEELS${PIP_FIND_LINKS:+ $PIP_FIND_LINKS}"
fi
case "$(tr '[:upper:]' '[:lower:]' <<<"${PIP_NO_INDEX:-}")" in  # pip's own reading of a yes/no variable
  ""|0|false|no|off) ;;
  1|true|yes|on) OFFLINE="no package index; from ${PIP_FIND_LINKS:-(no PIP_FIND_LINKS: nothing)}" ;;
  *) echo "build_horovod: PIP_NO_INDEX=$PIP_NO_INDEX: pip reads 1/true/yes/on or 0/false/no/off" >&2; exit 2 ;;
esac

fail() {  # first errors (usually far above the tail) + log tail, then one clear line, exit 1
  if [[ -s "$LOG" ]]; then
    ERRS="$(grep -n -m 8 -E 'error:|CMake Error|ERROR:|FATAL' "$LOG" | cut -c1-300)" || true
    [[ -n "$ERRS" ]] && printf -- '----- first errors in %s -----\n%s\n' "$LOG" "$ERRS" >&2
    echo "----- last 30 lines of $LOG -----" >&2; tail -n 30 "$LOG" | cut -c1-300 >&2
  fi
  echo "build_horovod: FAILED: $1 (full build log: $LOG)" >&2
  exit 1
}

# Serialise concurrent callers (parallel `make test`s): the second one waits, then fast-paths.
exec 9>"$VENV/.horovod-build.lock"; flock 9

# One interpreter start (~3 s, mostly `import torch`) gives everything the fast path needs.
PROBE='import sys, torch
try:
    import horovod, horovod.torch as hvd; have = horovod.__version__ if callable(hvd.init) else "none"
except Exception: have = "none"
gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
print(torch.__version__, torch.version.cuda or "none", "cp%d%d" % sys.version_info[:2], have, gpus)'
OUT="$("$PY" -c "$PROBE" 2>/dev/null | tail -n 1)" \
  || { "$PY" -c 'import torch' >&2; echo "build_horovod: FAILED: cannot import torch with $PY" >&2; exit 1; }
read -r TORCH_VER TORCH_CUDA PYTAG HVD_HAVE NGPU <<<"$OUT"
# gpu = CUDA torch that sees a GPU (torch, not nvidia-smi: a driver too old for torch's CUDA lists GPUs in
# nvidia-smi while torch sees none) -> also build NCCL GPU ops and smoke-test them
FLAVOUR=cpu; [[ "$TORCH_CUDA" != none && "${NGPU:-0}" -gt 0 ]] && FLAVOUR=gpu
# Horovod's default is every arch nvcc knows (slow). T4/A100(+8.x)/H100, newer via PTX of 90.
CC_LIST="${HOROVOD_BUILD_CUDA_CC_LIST:-75,80,90}"
KEY="$("$PY" "$REPO/scripts/cuda_toolkit.py" key --horovod "$HVD_VER" --torch "$TORCH_VER" --pytag "$PYTAG" \
        --flavour "$FLAVOUR" --cuda "$TORCH_CUDA" --cc "$CC_LIST")" || { echo "build_horovod: FAILED: cache key" >&2; exit 1; }

if [[ "$HVD_HAVE" == "$HVD_VER" && -f "$STAMP" && "$(<"$STAMP")" == "$KEY" ]]; then
  echo "horovod $HVD_VER already built against torch $TORCH_VER"; exit 0
fi

# ---- slow path: install from the wheel cache, building the wheel first if needed ----
rm -f "$STAMP"; : >"$LOG"
CACHE="${BENCH_WHEEL_CACHE:-$HOME/.cache/torch-parallel-bench/wheels}/$KEY"
TMP="$(mktemp -d)"; trap 'rm -rf "$TMP"' EXIT
shopt -s nullglob
WHLS=("$CACHE"/horovod-*.whl); WHL="${WHLS[0]:-}"; BUILT=0
export PATH="$VENV/bin:$PATH"          # a pip-installed cmake and horovodrun are found first

if [[ -n "$WHL" ]]; then
  echo "build_horovod: installing cached wheel $WHL"
else
  echo "build_horovod: compiling horovod $HVD_VER for $KEY (~10 min on 2 cores; log: $LOG)"
  if [[ -n "$OFFLINE" ]]; then echo "build_horovod: offline: $OFFLINE" | tee -a "$LOG"; fi
  [[ -x "$REPO/scripts/cxx20" ]] || fail "$REPO/scripts/cxx20 missing or not executable"
  # The source: HOROVOD_SDIST, else the locked one (hash-checked) from the folder or PyPI, else (another
  # HOROVOD_VERSION) that version unchecked.
  if [[ -n "${HOROVOD_SDIST:-}" ]]; then
    SRC=("$HOROVOD_SDIST")
  elif [[ "$HVD_VER" == "$LOCKED_VER" ]]; then
    "$PY" "$REPO/scripts/lockfile.py" pin horovod >"$TMP/horovod.txt" 2>>"$LOG" || fail "reading horovod's pin from the lock"
    SRC=(-r "$TMP/horovod.txt")
  else
    SRC=("horovod==$HVD_VER")
  fi
  if [[ -n "${WHEELS:-}" && -z "${HOROVOD_SDIST:-}" ]] && ! compgen -G "$WHEELS/horovod-$HVD_VER.tar.gz" >/dev/null; then
    echo "build_horovod: no horovod-$HVD_VER.tar.gz in WHEELS=$WHEELS: make the folder where pip works with \`make wheels WHEELS=DIR HAVE=...\` (or WHEELS_HOROVOD=1)" >&2
    exit 2
  fi
  # pyproject.toml's `build` extra: setuptools (which also provides the distutils horovod's CMake calls on
  # python >= 3.12), wheel for bdist_wheel, and setup.py's setup_requires, which are its runtime requirements:
  # packaging (imported by setup.py), cloudpickle, psutil, pyyaml, cffi. Any installed version will do.
  REQS="$("$PY" "$REPO/scripts/lockfile.py" requires build 2>>"$LOG")" || fail "reading the build requirements from pyproject.toml"
  # shellcheck disable=SC2086  # one requirement a line, none with spaces
  "$PY" -m pip install $REQS >>"$LOG" 2>&1 || fail "installing build prerequisites ($(echo $REQS)) into $VENV"
  CMV="$(cmake --version 2>/dev/null | head -n1 | grep -Eo '[0-9]+\.[0-9]+' | head -n1)" || CMV=0
  if [[ "$(printf '%s\n' 3.13 "$CMV" | sort -V | head -n1)" != 3.13 ]]; then  # need cmake >= 3.13
    "$PY" -m pip install 'cmake>=3.13,<4' >>"$LOG" 2>&1 \
      || fail "no cmake >= 3.13 on PATH, and pip install cmake failed${OFFLINE:+ (offline: install cmake, or put a cmake wheel in the folder)}"
  fi
  export CMAKE_POLICY_VERSION_MINIMUM=3.5  # CMake 4 rejects gloo's old cmake_minimum_required()
  export CXX="$REPO/scripts/cxx20"        # Horovod pins -std=c++14; torch 2.14 headers need C++20
  export MAKEFLAGS="-j${BUILD_JOBS:-$(nproc)}"  # setup.py forces -j8 unless MAKEFLAGS is set
  export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1  # fail loudly instead of silently skipping
  export HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1  # unused
  export HOROVOD_CPU_OPERATIONS=GLOO      # CPU collectives through Gloo (no MPI)
  if [[ "$TORCH_CUDA" != none ]]; then
    # A CUDA torch makes Horovod's CMake always compile its CUDA parts (even without a GPU), so it must
    # find nvcc, cudart and the toolkit of torch's CUDA version. A system toolkit of another version is
    # skipped with a line saying so; with none matching, the compiler wheels are fetched (exact pins).
    CUDA_HOME="$("$PY" "$REPO/scripts/cuda_toolkit.py" ensure --want "$TORCH_CUDA" \
        --cache "${BENCH_CUDA_CACHE:-$HOME/.cache/torch-parallel-bench/cuda}" ${CUDA_HOME:+--cuda-home "$CUDA_HOME"} \
        2> >(tee -a "$LOG" >&2))" || fail "no CUDA $TORCH_CUDA toolkit for torch's CUDA build (see the line above)"
    echo "build_horovod: CUDA toolkit $CUDA_HOME" | tee -a "$LOG"
    export CUDA_HOME CUDACXX="$CUDA_HOME/bin/nvcc" CUDAToolkit_ROOT="$CUDA_HOME" HOROVOD_CUDA_HOME="$CUDA_HOME"
    export HOROVOD_BUILD_CUDA_CC_LIST="$CC_LIST"   # part of the cache key
  fi
  if [[ "$FLAVOUR" == gpu ]]; then
    export HOROVOD_GPU_OPERATIONS=NCCL    # GPU collectives through NCCL
    NCCL="$("$PY" -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null)" || NCCL=""
    if [[ -n "$NCCL" && -e "$NCCL/lib/libnccl.so.2" ]]; then
      # Use the NCCL torch itself loads (pip wheel nvidia-nccl-cu*); it only ships libnccl.so.2,
      # so give the linker a libnccl.so. At runtime `import torch` has already loaded it.
      mkdir -p "$TMP/nccl-lib"; ln -s "$NCCL/lib/libnccl.so.2" "$TMP/nccl-lib/libnccl.so"
      export HOROVOD_NCCL_LINK=SHARED HOROVOD_NCCL_INCLUDE="$NCCL/include" HOROVOD_NCCL_LIB="$TMP/nccl-lib"
    fi
  fi
  # --no-build-isolation: build against the venv's torch; --no-binary/--no-cache-dir: really compile,
  # never reuse pip's own cached wheel (which does not know which torch it was built against).
  nice -n 10 "$PY" -m pip wheel -v --no-build-isolation --no-deps --no-binary horovod --no-cache-dir \
    -w "$TMP" "${SRC[@]}" >>"$LOG" 2>&1 || fail "compiling the horovod wheel"
  WHLS=("$TMP"/horovod-*.whl); WHL="${WHLS[0]:-}"; BUILT=1
  [[ -n "$WHL" ]] || fail "pip wheel reported success but left no horovod wheel in $TMP"
fi

"$PY" -m pip uninstall -y horovod >>"$LOG" 2>&1 || true   # same version may be installed (old torch)
"$PY" -m pip install "$WHL" >>"$LOG" 2>&1 || fail "pip install $WHL"   # with its runtime requirements
# Under TORCH=system the interpreter may have a horovod of the same version outside the venv, which pip takes as
# installed (and does not uninstall): then put this one, built against this torch, in the venv (first on sys.path).
if [[ ! -x "$VENV/bin/horovodrun" ]]; then
  "$PY" -m pip install --ignore-installed --no-deps "$WHL" >>"$LOG" 2>&1 || fail "pip install --ignore-installed $WHL"
fi

# ---- verify: features compiled in, and a real 2-process Gloo allreduce ----
HINT=""; [[ $BUILT == 0 ]] && HINT=" (cached wheel; delete $CACHE to force a rebuild)"
CHECK="$("$VENV/bin/horovodrun" --check-build 2>&1)" || { echo "$CHECK" >>"$LOG"; fail "horovodrun --check-build$HINT"; }
echo "$CHECK" | tee -a "$LOG"
NEED=(PyTorch Gloo); [[ "$FLAVOUR" == gpu ]] && NEED+=(NCCL)
for f in "${NEED[@]}"; do
  grep -q "\[X\] $f" <<<"$CHECK" || fail "horovod was built without $f$HINT"
done
SMOKE='import torch, horovod.torch as hvd; hvd.init(); assert hvd.size() == 2, hvd.size()
t = hvd.allreduce(torch.tensor([hvd.rank() + 1.0]), op=hvd.Sum); assert t.item() == 3.0, t
print("smoke ok: rank %d of %d, allreduce(sum) = %s" % (hvd.rank(), hvd.size(), t.item()))'
echo "== horovodrun -np 2 smoke test" >>"$LOG"
timeout 300 "$VENV/bin/horovodrun" -np 2 -H localhost:2 --gloo "$PY" -c "$SMOKE" 2>&1 | tee -a "$LOG" \
  || fail "2-process horovodrun --gloo smoke test$HINT"
if [[ "$FLAVOUR" == gpu ]]; then  # NCCL on the GPU: one rank per GPU (NCCL refuses two ranks on one GPU)
  NPG=$(( NGPU >= 2 ? 2 : 1 ))
  GSMOKE='import torch, horovod.torch as hvd; hvd.init(); torch.cuda.set_device(hvd.local_rank())
g = hvd.allreduce(torch.ones(4, device="cuda"), op=hvd.Sum); torch.cuda.synchronize()
assert g.device.type == "cuda" and g.sum().item() == 4.0 * hvd.size(), g
print("gpu smoke ok: rank %d of %d on cuda:%d" % (hvd.rank(), hvd.size(), torch.cuda.current_device()))'
  echo "== horovodrun -np $NPG GPU smoke test" >>"$LOG"
  timeout 300 "$VENV/bin/horovodrun" -np "$NPG" -H "localhost:$NPG" --gloo "$PY" -c "$GSMOKE" 2>&1 | tee -a "$LOG" \
    || fail "$NPG-process horovodrun NCCL allreduce on the GPU$HINT"
fi

if [[ $BUILT == 1 ]]; then  # cache only a verified wheel; copy+rename so readers never see half a file
  { mkdir -p "$CACHE" && cp "$WHL" "$CACHE/.partial.whl" && mv "$CACHE/.partial.whl" "$CACHE/${WHL##*/}"; } \
    || fail "storing the verified wheel in $CACHE"
fi
echo "$KEY" >"$STAMP"
echo "build_horovod: horovod $HVD_VER installed and verified against torch $TORCH_VER ($FLAVOUR) in ${SECONDS}s"
