#!/usr/bin/env bash
# shellcheck disable=SC2317  # the step functions are called by name ("step_$step")
# The GPU evidence in one script (issue 63; docs/gpu-machine.md, "GPU evidence in one script"): what a lent GPU
# machine should measure first, in order of value, each step under its own `timeout`, the whole inside BUDGET_S:
#   horovod   make gpu-check FULL=1 for Horovod's rows: Horovod compiled with NCCL beside its launches, its bf16, fp16
#             and fp32 (verify) rows, its measured run (OUT/horovod: the table in doctor.md)
#   tune      bench tune --preset gpu-best: single, ddp, fsdp2 at their best on ResNet-50 and gpt-350m, MFU against
#             the measured peak (OUT/tune, its report in OUT/tune/report)
#   parity    FSDP2's ResNet-50 parity at world size 1 beside its own plain loop, traced (issue 46): the library's
#             price and the harness's part (OUT/parity, its report in OUT/parity/report)
#   baseline  make baseline GPUS=1: results/baselines/<GPU model>-x1.json, to commit (its runs in OUT/regress)
# A step starts only when what is left of the budget holds its least useful time, and its limits (its reports' and
# the 30 s a stopped command is given included) never reach beyond the budget; a step cut by its timeout gets SIGINT
# first (bench keeps what finished), then SIGKILL. Every step's output is in OUT/<step>.log, and OUT/evidence.md says
# what was reached and how each step ended; the last line says how to go on from there. With PACK=DIR, DIR gets two
# files at the end, whatever ended it: evidence.md and evidence.tgz (OUT whole, the Horovod build's log and a baseline
# written to results/baselines; without the traces where it would pass 16 MB): what a lent machine's $OUT returns (8
# files at most, 2 folders deep, 16 MiB each).
# Usage: scripts/gpu_evidence.sh OUT [BUDGET_S]   (default 480: one 10-minute call of the device tool, the install too)
# Env:   PY (default <repo>/.venv/bin/python)   STEPS (default: horovod,tune,parity,baseline)   FROM (a step to start
#        at: the steps before it are left out)   PACK (a folder for the two files)   MAKE (default make; TORCH, WHEELS,
#        PYTHON reach it from the environment)   BUILD_JOBS (Horovod's compile jobs; default every core: its launches
#        wait for it, nothing else runs beside it)   VENV, BASELINES (where the build's log and a new baseline are
#        looked for: <repo>/.venv, <repo>/results/baselines)
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ALL_STEPS="horovod,tune,parity,baseline"
usage() { echo "usage: scripts/gpu_evidence.sh OUT [BUDGET_S]  (steps: $ALL_STEPS)" >&2; exit 2; }
[[ $# -ge 1 && $# -le 2 && -n "$1" ]] || usage
OUT="$1"; BUDGET="${2:-480}"
[[ "$BUDGET" =~ ^[0-9]+$ && "$BUDGET" -gt 0 ]] || { echo "gpu_evidence: BUDGET_S $BUDGET: a positive number of seconds" >&2; exit 2; }
PY="${PY:-$REPO/.venv/bin/python}"
MAKE="${MAKE:-make}"
STEPS="${STEPS:-$ALL_STEPS}"
for s in ${STEPS//,/ } ${FROM:-}; do
  [[ ",$ALL_STEPS," == *",$s,"* ]] || { echo "gpu_evidence: step '$s': unknown; choose from $ALL_STEPS" >&2; exit 2; }
done
if [[ -n "${FROM:-}" ]]; then  # from that step on, in the order of value
  STEPS="$(tr , '\n' <<<"$STEPS" | sed -n "/^$FROM\$/,\$p" | paste -sd, -)"
  [[ -n "$STEPS" ]] || { echo "gpu_evidence: FROM=$FROM is not among STEPS" >&2; exit 2; }
fi
mkdir -p "$OUT" || { echo "gpu_evidence: cannot create $OUT" >&2; exit 2; }
OUT="$(cd "$OUT" && pwd)"
START=$SECONDS
left() { echo $(( BUDGET - (SECONDS - START) )); }
min() { if (( $1 < $2 )); then echo "$1"; else echo "$2"; fi; }
SUMMARY="$OUT/evidence.md"
STARTED="$OUT/.started"  # what this run wrote outside OUT is newer than this
: >"$STARTED"
{ echo "# GPU evidence ($(date -u +%Y-%m-%dT%H:%M:%SZ), budget ${BUDGET} s)"; echo
  echo "| step | status | seconds | what it wrote | log |"; echo "|---|---|---:|---|---|"; } >"$SUMMARY"

# run STEP LIMIT_S CMD...: the command under `timeout` (SIGINT at the limit, SIGKILL 30 s later: so a command given
# LIMIT_S may take LIMIT_S + 30), its output in OUT/STEP.log and on the terminal; returns its exit status (124 or
# 130+: stopped by the limit)
run() {
  local step="$1" limit="$2"; shift 2
  echo "gpu_evidence: [$step] $* (at most ${limit} s)" | tee -a "$OUT/$step.log"
  timeout --signal=INT --kill-after=30 "$limit" "$@" 2>&1 | tee -a "$OUT/$step.log"
  return "${PIPESTATUS[0]}"
}

# each step: its least useful time, then what it runs with the seconds it is given ($1), all of it inside them
# (tune: 6 starting trials need about 150 s of its own budget; parity's plan is about 114 s on one GPU)
need() { case "$1" in horovod) echo 300;; tune) echo 300;; parity) echo 210;; baseline) echo 180;; esac; }
step_horovod() {  # the doctor stops itself at its budget; the timeout only guards a hang. Its launches wait for the
  # build and nothing else runs beside it: every core compiles
  local budget; budget=$(min 420 $(( $1 - 70 )))
  BUILD_JOBS="${BUILD_JOBS:-$(nproc)}" run horovod $(( budget + 40 )) "$MAKE" --no-print-directory -o venv gpu-check \
    FULL=1 PY="$PY" ARGS="--backends horovod --budget-s $budget --results $OUT/horovod"
}
step_tune() {  # its report whatever tune's exit (3: a disturbed trial, 1: a failed one)
  local budget; budget=$(min 540 $(( $1 - 190 )))  # the report's minute: a fresh machine's first matplotlib import
  run tune $(( budget + 60 )) "$PY" -m bench tune --preset gpu-best --budget-s "$budget" --results "$OUT/tune"
  local rc=$?
  run tune 60 "$PY" -m bench report --results "$OUT/tune" --out "$OUT/tune/report" || true
  return "$rc"
}
step_parity() {
  local budget; budget=$(min 240 "$1")
  run parity $(( budget - 90 )) "$PY" -m bench run --backends single,fsdp2 --gpus 1 --device cuda --model resnet50 \
    --precision bf16 --batch-size 256 --channels-last --repeat 1 --reference --trace 2 --results "$OUT/parity/raw"
  local rc=$?
  run parity 30 "$PY" -m bench report --results "$OUT/parity/raw" --out "$OUT/parity/report" || true
  return "$rc"
}
step_baseline() {
  run baseline $(( $(min 420 "$1") - 30 )) "$MAKE" --no-print-directory -o install baseline GPUS=1 PY="$PY" \
    REGRESS_RESULTS="$OUT/regress" REGRESS_WAIT_QUIET=30
}
# PACK=DIR: evidence.md and evidence.tgz there, whatever ended the script (an EXIT trap)
pack() {
  [[ -n "${PACK:-}" ]] || return 0
  local build="${VENV:-$REPO/.venv}/horovod-build.log" baselines="${BASELINES:-$REPO/results/baselines}"
  [[ -f "$build" && "$build" -nt "$STARTED" ]] && cp "$build" "$OUT/horovod-build.log"
  if [[ -d "$baselines" ]]; then  # a baseline this run wrote, to commit
    find "$baselines" -name '*.json' -newer "$STARTED" -exec sh -c 'mkdir -p "$0" && cp "$@" "$0"' "$OUT/baselines" {} +
  fi
  if ! { mkdir -p "$PACK" && cp "$SUMMARY" "$PACK/evidence.md" &&
          tar czf "$PACK/evidence.tgz" -C "$(dirname "$OUT")" "$(basename "$OUT")"; }; then
    echo "gpu_evidence: could not pack into $PACK" >&2; return 1
  fi
  if (( $(stat -c %s "$PACK/evidence.tgz") > ${PACK_MAX_BYTES:-16000000} )); then  # the device tool's 16 MiB a file
    tar czf "$PACK/evidence.tgz" --exclude='*.trace.json.gz' -C "$(dirname "$OUT")" "$(basename "$OUT")"
    echo "gpu_evidence: evidence.tgz was over ${PACK_MAX_BYTES:-16000000} bytes: packed again without the traces" >&2
  fi
  echo "gpu_evidence: packed $PACK/evidence.md and $PACK/evidence.tgz" >&2
}
trap pack EXIT
wrote() {
  case "$1" in
    horovod) echo "$OUT/horovod/doctor.md";; tune) echo "$OUT/tune/report/REPORT.md";;
    parity) echo "$OUT/parity/report/REPORT.md";; baseline) echo "results/baselines/ (git status shows the new file)";;
  esac
}

reached=() ; notreached=()
for step in ${STEPS//,/ }; do
  have=$(left)
  if (( have < $(need "$step") )); then
    notreached+=("$step")
    echo "| $step | not reached: ${have} s left, it needs $(need "$step") s | 0 |  |  |" >>"$SUMMARY"
    echo "gpu_evidence: [$step] not reached: ${have} s of the budget left, it needs $(need "$step") s" >&2
    continue
  fi
  t0=$SECONDS
  : >"$OUT/$step.log"
  "step_$step" "$have"; rc=$?
  took=$(( SECONDS - t0 ))
  case $rc in
    0) status="ok";; 124|130|137) status="stopped at its limit (exit $rc)";; *) status="failed (exit $rc)";;
  esac
  reached+=("$step")
  echo "| $step | $status | $took | $(wrote "$step") | $OUT/$step.log |" >>"$SUMMARY"
  echo "gpu_evidence: [$step] $status in ${took} s" >&2
done

{ echo; echo "reached: ${reached[*]:-none}; not reached: ${notreached[*]:-none}; $(( SECONDS - START )) s of ${BUDGET} s"
  if (( ${#notreached[@]} )); then
    echo "go on with: make gpu-evidence OUT=$OUT FROM=${notreached[0]}"
  fi; } >>"$SUMMARY"
cat "$SUMMARY"
# exit 1 when a step reached failed (its log says why), 0 when every step reached ended ok or at its limit: a step the
# budget did not reach is not a failure; a bad call exited 2 above
if grep -q '| failed (exit' "$SUMMARY"; then exit 1; fi
exit 0
