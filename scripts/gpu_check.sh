#!/usr/bin/env bash
# The one command for the GPU machine: build in place, self-check, the whole test suite, the
# CUDA fuzz net, compute-sanitizer (memcheck, racecheck, initcheck, synccheck) and PyTorch's CUDA
# stream sanitizer, the benchmark, and a summary.
#
#   bash scripts/gpu_check.sh            # everything: more than the 10 minutes one call on the
#                                        # GPU machine may take. As four calls (each builds
#                                        # first: nothing to do on a machine still warm):
#   SKIP_FUZZ=1 SKIP_SANITIZER=1 SKIP_BENCH=1 bash scripts/gpu_check.sh   # self-check, tests
#   S="SKIP_SELFCHECK=1 SKIP_TESTS=1"
#   env $S SKIP_SANITIZER=1 SKIP_BENCH=1 bash scripts/gpu_check.sh   # fuzz net (52,000 cases:
#                                        # 84 s with 15 workers on a 32-core H200 machine)
#   env $S SKIP_FUZZ=1 SKIP_BENCH=1 bash scripts/gpu_check.sh        # sanitizers (~1-2 min each)
#   env $S SKIP_FUZZ=1 SKIP_SANITIZER=1 bash scripts/gpu_check.sh    # benchmark
#   env $S SKIP_FUZZ=1 SKIP_SANITIZER=1 BENCH_ARGS="--quick" bash scripts/gpu_check.sh
#
# Output goes to $OUT (default ./gpu_check_out), at most 7 files, none deeper than $OUT/bench/:
#   summary.md        GPU, build info, ptxas registers/spills, step results, benchmark tables
#   build.log         the build (ptxas summary first, then warnings/errors and the tail)
#   tests.log         python -m rownorm (self-check), pytest, the fuzz net, the benchmark's progress
#   sanitizer.log     compute-sanitizer's tools on a small workload of every op of the op table on
#                     every tier and dtype (scripts/sanitize_workload.py), and the stream
#                     sanitizer's pytest run
#   bench/results.csv, bench/results.md, bench/plots.tar (one PNG per op)  (python -m rownorm.bench)
#
# Environment:
#   SKIP_BUILD, SKIP_SELFCHECK, SKIP_TESTS, SKIP_FUZZ, SKIP_SANITIZER, SKIP_BENCH = 1 to skip a
#                         step
#   REBUILD=1             rebuild every file (build_ext --force), so ptxas reports every kernel
#   TORCH_CUDA_ARCH_LIST  default 9.0
#   PYTEST_ARGS           one pytest run with these arguments instead of the default three:
#                         `-m 'cuda and not large' -n <cores-1>` (pytest-xdist, which the GPU
#                         image ships; the CPU tests are CI's), `-m large`, then the tier-edge
#                         and extreme-value tests with ROWNORM_DISABLE_CLUSTERS=1 (the
#                         pre-Hopper tier table)
#   FUZZ_ARGS             extra pytest arguments of the fuzz net (e.g. "-x"); it runs the
#                         property tests' CUDA examples with ROWNORM_HYPOTHESIS_PROFILE=gpu
#                         (ROWNORM_FUZZ_EXAMPLES per test, default 2,000: 52,000 in the 26
#                         fuzz shards, 84 s with 15 workers on a 32-core H200 machine, ~620
#                         cases/s; fewer cores run fewer), its count in the step's detail
#   SANITIZER_TOOLS       default "memcheck racecheck initcheck synccheck csan": compute-
#                         sanitizer's tools over scripts/sanitize_workload.py, each at most 150 s
#                         and failing on any error (--error-exitcode); csan: the tests marked
#                         `streams` under PyTorch's CUDA stream sanitizer (TORCH_CUDA_SANITIZER=1)
#   BENCH_ARGS            default: --dtypes bf16 (every op, the bf16 grid of 12 N, fwd and
#                         fwd+bwd, and the seeds' workloads, which are fp32)
#   BENCH_BUDGET          seconds the benchmark may start measurements for (default 250): it
#                         measures the seeds, then N = 256..262144 in FIRST_ROUND_NS for every op,
#                         then the other N, and writes what it measured when the time is up
#   WHEELS                folder of wheels of the benchmark's optional peers (Liger-Kernel),
#                         installed with --no-deps --no-index for the benchmark (default
#                         .wheels; nothing can be downloaded on the GPU machine)
#   SANITIZER_ARGS        extra compute-sanitizer options (e.g. "--kernel-name kns=l2")
#   WORKLOAD_ARGS         arguments of sanitize_workload.py (e.g. "--dtypes fp32,bf16")
#   SANITIZER_SHARDS      processes racecheck and initcheck run at once, each on every N-th
#                         case of the workload (default 6; racecheck's whole workload took
#                         170 s on the H100 so, and about a minute for memcheck or synccheck)
#   TOTAL_BUDGET          seconds for the whole script (default 540); every step is cut to fit
#   PYTHON                default python3
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 2
OUT=${OUT:-$ROOT/gpu_check_out}
mkdir -p "$OUT/bench"
WORK=$(mktemp -d /tmp/gpu_check.XXXXXX)
PY=${PYTHON:-python3}
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
# The system compiler: the GPU image sets CXX=/opt/gcc/bin/g++, which links libstdc++
# statically, and a library built that way crashes on its first error (setup.py refuses to
# build it). ROWNORM_CXX / ROWNORM_CC choose another.
if [[ -x ${ROWNORM_CXX:-/usr/bin/g++} ]]; then
  export CXX=${ROWNORM_CXX:-/usr/bin/g++} CC=${ROWNORM_CC:-/usr/bin/gcc}
fi
export PATH="$CUDA_HOME/bin:$PATH"
export PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
TOTAL_BUDGET=${TOTAL_BUDGET:-540}
START=$SECONDS
DEADLINE=$((START + TOTAL_BUDGET))

BUILD_LOG=$OUT/build.log
TESTS_LOG=$OUT/tests.log
SAN_LOG=$OUT/sanitizer.log
SUMMARY=$OUT/summary.md
: >"$TESTS_LOG"
: >"$SAN_LOG"
rm -f "$OUT"/bench/results.csv "$OUT"/bench/results.md "$OUT"/bench/*.png "$OUT"/bench/plots.tar

# Step results, in order: name|status|seconds|detail
STEPS=()
FAILED=0

log() { echo "[gpu_check $(date +%H:%M:%S) +$((SECONDS - START))s] $*"; }

# The seconds a step may take: at most $1, and never past the deadline less $2, the time kept
# for the steps after it (reserve_after): a slow step shortens the later ones, never skips them.
budget() {
  local max=$1 reserve=${2:-15}
  local left=$((DEADLINE - SECONDS - reserve))
  ((left < max)) && echo "$left" || echo "$max"
}

SANITIZER_TOOLS=${SANITIZER_TOOLS:-memcheck racecheck initcheck synccheck csan}
# The seconds to keep for the steps after step $1 that will run: self-check 60, tests 100,
# fuzz 120, 60 per sanitizer tool, benchmark 90, and 10 for the summary.
reserve_after() {
  local total=10 later=0 step
  for step in build selfcheck tests fuzz sanitizer bench; do
    if ((later)); then
      case $step in
        selfcheck) [[ ${SKIP_SELFCHECK:-0} == 1 ]] || total=$((total + 60)) ;;
        tests) [[ ${SKIP_TESTS:-0} == 1 ]] || total=$((total + 100)) ;;
        fuzz) [[ ${SKIP_FUZZ:-0} == 1 ]] || total=$((total + 120)) ;;
        sanitizer)
          [[ ${SKIP_SANITIZER:-0} == 1 ]] || total=$((total + 60 * $(wc -w <<<"$SANITIZER_TOOLS")))
          ;;
        bench) [[ ${SKIP_BENCH:-0} == 1 ]] || total=$((total + 90)) ;;
      esac
    fi
    [[ $step == "$1" ]] && later=1
  done
  echo "$total"
}

record() { # name status seconds detail
  STEPS+=("$1|$2|$3|$4")
  case "$2" in FAIL*|ERROR*|TIMEOUT*) FAILED=1 ;; esac
  write_summary
}

status_of() { # exit code -> word
  case "$1" in
    0) echo ok ;;
    124|137) echo TIMEOUT ;;
    *) echo "FAIL (rc $1)" ;;
  esac
}

write_summary() {
  {
    echo "# rownorm GPU check — $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo
    echo "- GPU: ${GPU_INFO:-unknown}"
    echo "- runtime: ${RUNTIME_INFO:-unknown}"
    echo "- build info: ${BUILD_INFO:-not built}"
    echo "- command: \`${COMMAND}\`"
    echo "- elapsed: $((SECONDS - START)) s of $TOTAL_BUDGET s"
    echo
    echo "| step | result | seconds | detail |"
    echo "|---|---|---:|---|"
    local s
    for s in "${STEPS[@]}"; do
      IFS='|' read -r name st secs detail <<<"$s"
      echo "| $name | $st | $secs | ${detail//|/\\|} |"
    done
    echo
    if [[ -s $WORK/ptxas_top.md ]]; then
      echo "## ptxas: registers and spills per kernel"
      echo
      cat "$WORK/ptxas_top.md"
      echo
    fi
    if [[ -s $WORK/selfcheck_fail.txt ]]; then
      echo "## Self-check failures"
      echo
      echo '```'
      head -40 "$WORK/selfcheck_fail.txt"
      echo '```'
      echo
    fi
    if [[ -s $WORK/tests_fail.txt ]]; then
      echo "## Test failures (pytest short summary)"
      echo
      echo '```'
      head -60 "$WORK/tests_fail.txt"
      echo '```'
      echo
    fi
    if [[ -s $WORK/sanitizer_summary.txt ]]; then
      echo "## compute-sanitizer"
      echo
      echo '```'
      cat "$WORK/sanitizer_summary.txt"
      echo '```'
      echo
    fi
    if [[ -s $WORK/quick_timing.txt ]]; then
      echo "## Quick timing (python -m rownorm)"
      echo
      echo '```'
      cat "$WORK/quick_timing.txt"
      echo '```'
      echo
    fi
    if [[ -s $OUT/bench/results.md ]]; then
      echo "## Benchmark"
      echo
      sed -e 's/^# /### /' -e 's/^## /### /' "$OUT/bench/results.md"
    fi
  } >"$SUMMARY"
}

# --------------------------------------------------------------------------------------------
COMMAND=""
for v in SKIP_BUILD SKIP_SELFCHECK SKIP_TESTS SKIP_FUZZ SKIP_SANITIZER SKIP_BENCH REBUILD \
  TORCH_CUDA_ARCH_LIST PYTEST_ARGS FUZZ_ARGS BENCH_ARGS BENCH_BUDGET WHEELS SANITIZER_TOOLS \
  SANITIZER_ARGS SANITIZER_SHARDS WORKLOAD_ARGS ROWNORM_FUZZ_EXAMPLES TOTAL_BUDGET; do
  [[ -v $v ]] && COMMAND+="$v=$(printf %q "${!v}") "
done
COMMAND+="bash scripts/gpu_check.sh"
log "$COMMAND"
log "repo $ROOT, output $OUT, budget ${TOTAL_BUDGET}s"
GPU_INFO=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null \
  | head -1)
HAVE_GPU=0
[[ -n $GPU_INFO ]] && HAVE_GPU=1
RUNTIME_INFO=$($PY -c 'import sys, torch; print(f"python {sys.version.split()[0]}, torch {torch.__version__}, CUDA available {torch.cuda.is_available()}")' 2>&1 | tail -1)
log "GPU: ${GPU_INFO:-none}; $RUNTIME_INFO"
write_summary

# ---- build ---------------------------------------------------------------------------------
if [[ ${SKIP_BUILD:-0} == 1 ]]; then
  record build skipped 0 "SKIP_BUILD=1"
else
  t0=$SECONDS
  limit=$(budget 330 "$(reserve_after build)")
  # ninja rebuilds only what changed (and ptxas reports only that): REBUILD=1 starts afresh.
  [[ ${REBUILD:-0} == 1 ]] && rm -rf build
  log "build (limit ${limit}s): setup.py build_ext --inplace"
  MAX_JOBS=${MAX_JOBS:-$(nproc)} NVCC_THREADS=${NVCC_THREADS:-4} \
    TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} ROWNORM_PTXAS_VERBOSE=1 \
    timeout -k 10 "$limit" "$PY" setup.py build_ext --inplace >"$WORK/build_full.log" 2>&1
  rc=$?
  # ptxas resource usage per kernel (entry functions), demangled.
  "$PY" scripts/ptxas_report.py "$WORK/build_full.log" "$WORK/ptxas_top.md" >"$WORK/ptxas.md"
  if [[ ! -s $WORK/ptxas.md && -s build/rownorm_ptxas.md ]]; then
    note="(from an earlier build on this machine: nothing was recompiled; REBUILD=1 to redo)"
    { echo "$note"; echo; cat build/rownorm_ptxas.md; } >"$WORK/ptxas.md"
    { echo "$note"; echo; cat build/rownorm_ptxas_top.md 2>/dev/null; } >"$WORK/ptxas_top.md"
  elif [[ -s $WORK/ptxas.md ]]; then
    mkdir -p build && cp "$WORK/ptxas.md" build/rownorm_ptxas.md
    cp "$WORK/ptxas_top.md" build/rownorm_ptxas_top.md
  fi
  # The returned log: ptxas summary, then warnings and errors, then the tail.
  {
    echo "==== ptxas summary"
    cat "$WORK/ptxas.md" 2>/dev/null
    echo
    echo "==== warnings and errors (first 150)"
    grep -E -i '(error|warning)' "$WORK/build_full.log" | grep -v 'ptxas info' | head -150
    echo
    echo "==== last 300 lines of $(wc -l <"$WORK/build_full.log") (ptxas info lines left out)"
    grep -v -E '^(ptxas info|    [0-9]+ bytes stack frame)' "$WORK/build_full.log" | tail -300
  } >"$BUILD_LOG"
  st=$(status_of "$rc")
  so=$(find python/rownorm -maxdepth 1 -name '_C*.so' | head -1)
  record build "$st" $((SECONDS - t0)) "${so:-no _C*.so}; $(grep -c 'Compiling entry' "$WORK/build_full.log") kernel(s) compiled; $(grep -E -ic ' warning' "$WORK/build_full.log") warning line(s)"
  log "build: $st ($((SECONDS - t0))s)"
  if [[ $rc != 0 ]]; then
    tail -40 "$WORK/build_full.log"
    log "build failed: the remaining steps need the library; stopping"
    write_summary
    sed -n '/^| step/,/^$/p' "$SUMMARY"
    exit 1
  fi
fi
BUILD_INFO=$($PY -c 'import rownorm; print(rownorm.build_info())' 2>&1 | tail -1)
write_summary

# ---- self-check ----------------------------------------------------------------------------
if [[ ${SKIP_SELFCHECK:-0} == 1 ]]; then
  record self-check skipped 0 "SKIP_SELFCHECK=1"
else
  t0=$SECONDS
  limit=$(budget 90 "$(reserve_after selfcheck)")
  log "self-check: python -m rownorm (limit ${limit}s)"
  { echo "==== python -m rownorm"; } >>"$TESTS_LOG"
  timeout -k 10 "$limit" "$PY" -m rownorm 2>&1 | tee "$WORK/selfcheck.log" | tee -a "$TESTS_LOG"
  rc=${PIPESTATUS[0]}
  grep -E '^\s+FAIL ' "$WORK/selfcheck.log" >"$WORK/selfcheck_fail.txt"
  sed -n '/^quick timing/,/^$/p' "$WORK/selfcheck.log" >"$WORK/quick_timing.txt"
  last=$(grep -E '^(PASS|FAIL):' "$WORK/selfcheck.log" | tail -1)
  record self-check "$(status_of "$rc")" $((SECONDS - t0)) "${last:-no verdict line}"
fi

# A pytest run cut by its time limit (rc 124 or 137) ends before pytest prints its failures:
# those the run wrote as they happened (ROWNORM_FAILURE_LOG, tests/conftest.py) go to
# tests.log and, as FAILED lines, to the run's log (read for the summary's failure list).
keep_live_failures() {  # rc run-log
  [[ $1 == 124 || $1 == 137 ]] && [[ -s $WORK/failures_live.txt ]] || return 0
  {  # (after a newline: the cut run's last line of progress dots has none)
    echo
    echo "==== the run was cut at its time limit; failures written before the cut:"
    cat "$WORK/failures_live.txt"
  } >>"$TESTS_LOG"
  {
    echo
    sed -n -e 's/^===== FAILED \(.*\) ([a-z]*)$/FAILED \1 (before the cut)/p' \
      "$WORK/failures_live.txt"
  } >>"$2"
}

# ---- tests ---------------------------------------------------------------------------------
if [[ ${SKIP_TESTS:-0} == 1 ]]; then
  record tests skipped 0 "SKIP_TESTS=1"
else
  t0=$SECONDS
  limit=$(budget 330 "$(reserve_after tests)")
  extra=(-rfE -p no:cacheprovider)
  "$PY" -c 'import pytest_timeout' 2>/dev/null && extra+=(--timeout=120)
  : >"$WORK/pytest.log"
  rc=0
  line=""
  # One pytest run, cut to what is left of the step's limit: [VAR=value] pytest-arguments...
  pytest_phase() {
    local phase_env=() left=$((limit - (SECONDS - t0))) prc pline
    if [[ ${1:-} == *=* ]]; then
      phase_env=("$1")
      shift
    fi
    ((left < 10)) && left=10
    log "tests: ${phase_env[*]} pytest tests ${extra[*]} $* (limit ${left}s)"
    echo "==== ${phase_env[*]} pytest tests ${extra[*]} $*" >>"$TESTS_LOG"
    : >"$WORK/failures_live.txt"
    timeout -k 10 "$left" env "${phase_env[@]}" ROWNORM_FAILURE_LOG="$WORK/failures_live.txt" \
      "$PY" -m pytest tests "${extra[@]}" "$@" 2>&1 \
      | tee "$WORK/pytest_phase.log" | tee -a "$TESTS_LOG" >>"$WORK/pytest.log"
    prc=${PIPESTATUS[0]}
    keep_live_failures "$prc" "$WORK/pytest.log"
    ((prc != 0 && rc == 0)) && rc=$prc
    pline=$(grep -E '[0-9]+ (passed|failed|error|errors|skipped|deselected)|no tests ran' \
      "$WORK/pytest_phase.log" | tail -1 | sed -e 's/^=* *//' -e 's/ *=*$//')
    line="${line:+$line; }${pline:-no pytest summary line} (${phase_env[*]:+${phase_env[*]} }$*)"
  }
  if [[ -v PYTEST_ARGS ]]; then
    args=()
    eval "args=($PYTEST_ARGS)"
    pytest_phase "${args[@]}"
  else
    # The tests that are not `large` on one worker per core but one, then `large` in one
    # process (each holds tens of GB of device memory), then the tier-edge tests again with
    # the pre-Hopper tier table (no clusters). The CPU tests are CI's (`.ci/run`); here they
    # would double the time (oversubscribed CPU ops).
    xdist=()
    "$PY" -c 'import xdist' 2>/dev/null && xdist=(-n $(($(nproc) > 2 ? $(nproc) - 1 : 1)))
    pytest_phase -q -m 'cuda and not large' "${xdist[@]}"
    pytest_phase -q -m large
    pytest_phase ROWNORM_DISABLE_CLUSTERS=1 -q -m 'cuda and not large' \
      -k 'gpu_tiers or tier_edge or extremal' "${xdist[@]}"
  fi
  grep -E '^(FAILED|ERROR) ' "$WORK/pytest.log" >"$WORK/tests_fail.txt"
  st=$(status_of "$rc")
  [[ $rc == 5 ]] && st="FAIL (no tests ran)"
  record tests "$st" $((SECONDS - t0)) "$line"
  log "tests: $st — $line"
fi

# ---- fuzz net --------------------------------------------------------------------------------
if [[ ${SKIP_FUZZ:-0} == 1 ]]; then
  record fuzz skipped 0 "SKIP_FUZZ=1"
elif [[ $HAVE_GPU == 0 ]]; then
  record fuzz skipped 0 "no GPU"
else
  t0=$SECONDS
  limit=$(budget 300 "$(reserve_after fuzz)")
  fuzz=(-q -rfE -p no:cacheprovider -m cuda)
  "$PY" -c 'import xdist' 2>/dev/null && fuzz+=(-n $(($(nproc) > 2 ? $(nproc) - 1 : 1)))
  # shellcheck disable=SC2206
  fuzz+=(${FUZZ_ARGS:-})
  log "fuzz: ROWNORM_HYPOTHESIS_PROFILE=gpu pytest tests/test_properties.py ${fuzz[*]} (limit ${limit}s)"
  echo "==== ROWNORM_HYPOTHESIS_PROFILE=gpu pytest tests/test_properties.py ${fuzz[*]}" >>"$TESTS_LOG"
  : >"$WORK/failures_live.txt"
  ROWNORM_HYPOTHESIS_PROFILE=gpu ROWNORM_FAILURE_LOG="$WORK/failures_live.txt" \
    timeout -k 10 "$limit" "$PY" -m pytest tests/test_properties.py "${fuzz[@]}" 2>&1 \
    | tee "$WORK/fuzz.log" | tail -40 >>"$TESTS_LOG"
  rc=${PIPESTATUS[0]}
  keep_live_failures "$rc" "$WORK/fuzz.log"
  grep -E '^(FAILED|ERROR) ' "$WORK/fuzz.log" >>"$WORK/tests_fail.txt"
  count=$(grep -E '^rownorm fuzz:' "$WORK/fuzz.log" | tail -1)
  pline=$(grep -E '[0-9]+ (passed|failed|error|errors|skipped)|no tests ran' "$WORK/fuzz.log" \
    | tail -1 | sed -e 's/^=* *//' -e 's/ *=*$//')
  st=$(status_of "$rc")
  [[ $st == ok && ! $count =~ fuzz:\ [1-9] ]] && st="FAIL (no fuzz cases ran)"
  record fuzz "$st" $((SECONDS - t0)) "${count:-no fuzz count line}; ${pline:-no pytest summary line}"
  log "fuzz: $st — ${count:-no count}"
fi

# ---- sanitizers ------------------------------------------------------------------------------
SANITIZER=$(command -v compute-sanitizer)
[[ -z $SANITIZER && -x $CUDA_HOME/compute-sanitizer/compute-sanitizer ]] \
  && SANITIZER=$CUDA_HOME/compute-sanitizer/compute-sanitizer
if [[ ${SKIP_SANITIZER:-0} == 1 ]]; then
  record sanitizer skipped 0 "SKIP_SANITIZER=1"
elif [[ $HAVE_GPU == 0 ]]; then
  record sanitizer skipped 0 "no GPU"
else
  : >"$WORK/sanitizer_summary.txt"
  read -r -a tools <<<"$SANITIZER_TOOLS"
  for i in "${!tools[@]}"; do
    tool=${tools[$i]}
    t0=$SECONDS
    # The later tools' 60 s each and the steps after this one
    limit=$(budget 150 $(($(reserve_after sanitizer) + 60 * (${#tools[@]} - i - 1))))
    if ((limit < 20)); then
      record "$tool" skipped 0 "no time left"
      continue
    fi
    if [[ $tool == csan ]]; then
      # PyTorch's CUDA stream sanitizer: every op (rownorm's included) is checked for an
      # access to a tensor from one stream racing another stream's, without synchronization.
      # One process (no xdist); a race raises in the op, and the test fails.
      log "sanitizer: TORCH_CUDA_SANITIZER=1 pytest -m 'cuda and streams' (limit ${limit}s)"
      echo "==== TORCH_CUDA_SANITIZER=1 pytest tests -m 'cuda and streams'" >>"$SAN_LOG"
      TORCH_CUDA_SANITIZER=1 timeout -k 10 "$limit" "$PY" -m pytest tests -q -rfE \
        -p no:cacheprovider -p no:xdist -m 'cuda and streams' >"$WORK/csan.log" 2>&1
      rc=$?
      head -c 200000 "$WORK/csan.log" >>"$SAN_LOG"
      sum=$(grep -E '[0-9]+ (passed|failed|error|errors)|no tests ran' "$WORK/csan.log" \
        | tail -1 | sed -e 's/^=* *//' -e 's/ *=*$//')
      echo "csan: ${sum:-no pytest summary line} (rc $rc)" >>"$WORK/sanitizer_summary.txt"
      st=$(status_of "$rc")
      [[ $rc == 5 ]] && st="FAIL (no tests ran)"
      record csan "$st" $((SECONDS - t0)) "TORCH_CUDA_SANITIZER=1: ${sum:-no pytest summary line}"
      log "csan: $st — $sum"
      continue
    fi
    if [[ -z $SANITIZER ]]; then
      record "$tool" skipped 0 "no compute-sanitizer"
      continue
    fi
    log "sanitizer: $tool (limit ${limit}s)"
    echo "==== compute-sanitizer --tool $tool" >>"$SAN_LOG"
    # racecheck and synccheck look at rownorm's kernels only: PyTorch's own kernels
    # (reductions, fills, casts) are not rownorm's to check, and its warp-synchronous reduce
    # code reports shared-memory hazards under racecheck. memcheck and initcheck see every
    # kernel: initcheck counts only the writes of the kernels it instruments, so with the
    # filter every copy of a PyTorch kernel's result (a cast before a comparison) is reported
    # as uninitialized (the H100 run of 2026-11-23: 30 such reports in each shard's first case).
    filter=()
    [[ $tool == racecheck || $tool == synccheck ]] && filter=(--kernel-name kns=rownorm)
    # One cudaMalloc per tensor, so an access past a tensor's end is outside any allocation
    # (memcheck) and bytes no one wrote are uninitialized (initcheck). racecheck and initcheck
    # run the workload in SANITIZER_SHARDS processes at once (--shard k/N): one process is
    # bound by the tool's host side (racecheck: 11 of the 94 cases in 45 s on the H100; in six
    # processes at once, the whole workload in 170 s).
    shards=1
    [[ $tool == racecheck || $tool == initcheck ]] && shards=${SANITIZER_SHARDS:-6}
    pids=()
    for ((k = 0; k < shards; k++)); do
      shard_args=()
      ((shards > 1)) && shard_args=(--shard "$k/$shards")
      # shellcheck disable=SC2086
      PYTORCH_NO_CUDA_MEMORY_CACHING=1 OMP_NUM_THREADS=1 timeout -k 10 "$limit" "$SANITIZER" \
        --tool "$tool" "${filter[@]}" --print-limit 30 --error-exitcode 99 ${SANITIZER_ARGS:-} \
        "$PY" scripts/sanitize_workload.py ${WORKLOAD_ARGS:-} "${shard_args[@]}" \
        >"$WORK/$tool.$k.log" 2>&1 &
      pids+=($!)
    done
    rc=0 sum="" res=""
    for k in "${!pids[@]}"; do
      wait "${pids[$k]}"
      shard_rc=$?
      # the worst status: errors found (99) over any other failure over success
      if [[ $shard_rc == 99 || ($shard_rc != 0 && $rc != 99) ]]; then rc=$shard_rc; fi
      head -c $((400000 / shards)) "$WORK/$tool.$k.log" >>"$SAN_LOG"
      line=$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|HAZARD SUMMARY' "$WORK/$tool.$k.log" \
        | tail -1 | sed -e 's/^=* *//')
      done_line=$(grep -E 'sanitizer workload:' "$WORK/$tool.$k.log" | tail -1)
      done_line=${done_line#sanitizer workload: }
      prefix=""
      ((shards > 1)) && prefix="shard $k/$shards: "
      sum+="${sum:+; }$prefix${line:-no summary line}"
      res+="${res:+; }$prefix${done_line:-workload did not finish}"
    done
    { echo "$tool: $sum (rc $rc); $res"; } >>"$WORK/sanitizer_summary.txt"
    st=$(status_of "$rc")
    [[ $rc == 99 ]] && st="FAIL (errors found)"
    [[ $rc != 99 && $res == *WRONG* ]] && st="FAIL (wrong results)"
    record "$tool" "$st" $((SECONDS - t0)) "$sum; $res"
    log "$tool: $st — $sum"
  done
fi

# Wheels carried in $WHEELS (nothing can be downloaded on the GPU machine) for the benchmark's
# peers, installed into a private folder with --no-deps --no-index (torch and triton are the
# image's); a wheel that does not install only makes its peer "not run".
install_wheels() {
  local dir=${WHEELS:-$ROOT/.wheels} site=$WORK/site
  local whls=("$dir"/*.whl)
  if [[ ! -e ${whls[0]} ]]; then
    WHEELS_NOTE="no wheels in $dir"
    return
  fi
  if "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" \
    "${whls[@]}" >"$WORK/pip.log" 2>&1; then
    export PYTHONPATH="$site:$PYTHONPATH"
    WHEELS_NOTE="installed $(basename -a "${whls[@]}" | tr '\n' ' ')"
  else
    WHEELS_NOTE="pip install of $dir/*.whl failed: $(tail -1 "$WORK/pip.log")"
  fi
}

# ---- benchmark ----------------------------------------------------------------------------
if [[ ${SKIP_BENCH:-0} == 1 ]]; then
  record bench skipped 0 "SKIP_BENCH=1"
elif [[ $HAVE_GPU == 0 ]]; then
  record bench skipped 0 "no GPU"
else
  t0=$SECONDS
  bench_budget=${BENCH_BUDGET:-250}
  # The harness's --time-budget is the step's limit less 60 s: start-up (imports, the copy
  # limit), the measurement in flight when the budget ends, and the reports.
  limit=$(budget $((bench_budget + 60)) 10)
  if ((limit < 90)); then
    record bench skipped 0 "no time left (${limit}s)"
  else
    install_wheels
    log "bench: $WHEELS_NOTE"
    tb=$((limit - 60))
    # shellcheck disable=SC2206
    bench_args=(${BENCH_ARGS:---dtypes bf16})
    log "bench: python -m rownorm.bench --time-budget $tb ${bench_args[*]} (limit ${limit}s)"
    echo "==== python -m rownorm.bench --time-budget $tb ${bench_args[*]}" >>"$TESTS_LOG"
    echo "peers: $WHEELS_NOTE" >>"$TESTS_LOG"
    # The harness stops starting measurements at --time-budget and writes what it has; SIGTERM
    # from timeout makes it write too.
    timeout -s TERM -k 20 "$limit" "$PY" -m rownorm.bench --out "$OUT/bench" --no-command-file \
      --time-budget "$tb" "${bench_args[@]}" 2>&1 | tee -a "$TESTS_LOG" \
      | grep -v -E '^\[ *[0-9]+/[0-9]+\] .*: [0-9.]+ ms' # progress stays in tests.log
    rc=${PIPESTATUS[0]}
    # One file for the plots: what comes back from the GPU machine is limited in number.
    pngs=("$OUT"/bench/*.png)
    if [[ -e ${pngs[0]} ]]; then
      tar -cf "$OUT/bench/plots.tar" -C "$OUT/bench" "${pngs[@]##*/}" && rm -f "${pngs[@]}"
    fi
    n_ok=$(grep -c ',ok,' "$OUT/bench/results.csv" 2>/dev/null)
    n_all=$(($(wc -l <"$OUT/bench/results.csv" 2>/dev/null || echo 1) - 1))
    n_budget=$(grep -c 'time budget exhausted' "$OUT/bench/results.csv" 2>/dev/null)
    copy=$(grep -o 'copy limit: \*\*[0-9]* GB/s' "$OUT/bench/results.md" 2>/dev/null | grep -o '[0-9]* GB/s')
    st=$(status_of "$rc")
    [[ $rc == 1 ]] && st="FAIL (rownorm failed a check)"
    record bench "$st" $((SECONDS - t0)) "${n_ok:-0} of ${n_all} measurements ok, ${n_budget:-0} left out by the time budget (${tb}s); copy limit ${copy:-?}; peers: $WHEELS_NOTE"
    log "bench: $st"
  fi
fi

# ---- summary -------------------------------------------------------------------------------
write_summary
rm -rf "$WORK"
echo
echo "==== gpu_check summary ($((SECONDS - START)) s; files in $OUT)"
printf '%-12s %-28s %7s  %s\n' step result seconds detail
for s in "${STEPS[@]}"; do
  IFS='|' read -r name st secs detail <<<"$s"
  printf '%-12s %-28s %7s  %s\n' "$name" "$st" "$secs" "$detail"
done
exit $FAILED
