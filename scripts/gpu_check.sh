#!/usr/bin/env bash
# The one command for the GPU machine: build in place, self-check, the whole test suite,
# compute-sanitizer (memcheck + racecheck), the benchmark, and a summary.
#
#   bash scripts/gpu_check.sh            # everything, about 10 minutes at most: with the whole op
#                                        # set, run tests and benchmark as two calls on a machine
#                                        # with a 10-minute limit (SKIP_BENCH=1, then SKIP_TESTS=1
#                                        # SKIP_SANITIZER=1 SKIP_SELFCHECK=1)
#   SKIP_TESTS=1 SKIP_SANITIZER=1 BENCH_ARGS="--quick" bash scripts/gpu_check.sh
#   SKIP_SELFCHECK=1 SKIP_TESTS=1 SKIP_SANITIZER=1 bash scripts/gpu_check.sh   # build + benchmark
#
# Output goes to $OUT (default ./gpu_check_out), at most 7 files, none deeper than $OUT/bench/:
#   summary.md        GPU, build info, ptxas registers/spills, step results, benchmark tables
#   build.log         the build (ptxas summary first, then warnings/errors and the tail)
#   tests.log         python -m rownorm (self-check), pytest, and the benchmark's progress
#   sanitizer.log     compute-sanitizer memcheck and racecheck on a small workload of every op
#   bench/results.csv, bench/results.md, bench/plots.tar (one PNG per op)  (python -m rownorm.bench)
#
# Environment:
#   SKIP_BUILD, SKIP_SELFCHECK, SKIP_TESTS, SKIP_SANITIZER, SKIP_BENCH = 1 to skip a step
#   REBUILD=1             rebuild every file (build_ext --force), so ptxas reports every kernel
#   TORCH_CUDA_ARCH_LIST  default 9.0
#   PYTEST_ARGS           default: with pytest-xdist (a wheel in $WHEELS) every CUDA test,
#                         `-m 'cuda and not large' -n <cores-1>` (the CPU tests are CI's),
#                         `-m large`, then the tier-edge tests with ROWNORM_DISABLE_CLUSTERS=1
#                         (the pre-Hopper tier table); else one process `-m "large or not large"`
#   BENCH_ARGS            default: --dtypes bf16 (every op, the bf16 grid of 12 N, fwd and
#                         fwd+bwd, and the seeds' workloads, which are fp32)
#   BENCH_BUDGET          seconds the benchmark may start measurements for (default 250): it
#                         measures the seeds, then N = 256..262144 in FIRST_ROUND_NS for every op,
#                         then the other N, and writes what it measured when the time is up
#   WHEELS                folder of wheels installed (--no-deps --no-index): pytest-xdist +
#                         execnet for the tests, and for the benchmark's
#                         optional peers, e.g. Liger-Kernel (default .wheels; nothing can be
#                         downloaded on the GPU machine)
#   SANITIZER_ARGS        extra compute-sanitizer options (e.g. "--kernel-name kns=l2")
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

# The seconds a step may take: at most $1, and never past the deadline less $2 (reserved for
# the steps after it and the summary).
budget() {
  local max=$1 reserve=${2:-15}
  local left=$((DEADLINE - SECONDS - reserve))
  ((left < max)) && echo "$left" || echo "$max"
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
for v in SKIP_BUILD SKIP_SELFCHECK SKIP_TESTS SKIP_SANITIZER SKIP_BENCH REBUILD \
  TORCH_CUDA_ARCH_LIST PYTEST_ARGS BENCH_ARGS BENCH_BUDGET WHEELS SANITIZER_ARGS TOTAL_BUDGET; do
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
  limit=$(budget 330 120)
  # ninja rebuilds only what changed (and ptxas reports only that): REBUILD=1 starts afresh.
  [[ ${REBUILD:-0} == 1 ]] && rm -rf build
  log "build (limit ${limit}s): setup.py build_ext --inplace"
  MAX_JOBS=${MAX_JOBS:-$(nproc)} NVCC_THREADS=${NVCC_THREADS:-4} \
    TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} ROWNORM_PTXAS_VERBOSE=1 \
    timeout -k 10 "$limit" "$PY" setup.py build_ext --inplace >"$WORK/build_full.log" 2>&1
  rc=$?
  # ptxas resource usage per kernel (entry functions), demangled.
  "$PY" - "$WORK/build_full.log" "$WORK/ptxas_top.md" >"$WORK/ptxas.md" <<'EOF'
import re, subprocess, sys

text = open(sys.argv[1], errors="replace").read()
kernels, cur = {}, None
for line in text.splitlines():
    m = re.search(r"Compiling entry function '([^']+)' for '(sm_\w+)'", line)
    if m:
        cur = (m.group(1), m.group(2))
        kernels[cur] = {"regs": 0, "stack": 0, "spill_st": 0, "spill_ld": 0, "smem": 0}
        continue
    if cur is None:
        continue
    m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads",
                  line)
    if m:
        kernels[cur].update(stack=int(m[1]), spill_st=int(m[2]), spill_ld=int(m[3]))
    m = re.search(r"Used (\d+) registers", line)
    if m:
        s = re.search(r"(\d+) bytes smem", line)
        kernels[cur].update(regs=int(m[1]), smem=int(s[1]) if s else 0)
        cur = None
if not kernels:
    sys.exit(0)
names = sorted({k[0] for k in kernels})
try:
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True,
                         check=True).stdout.splitlines()
    pretty = dict(zip(names, out, strict=True))
except (OSError, subprocess.CalledProcessError, ValueError):
    pretty = {n: n for n in names}


def short(name):
    """'void rownorm::K<rownorm::Op<float>, float, 4>(args...)' -> 'K<Op<float>, float, 4>'."""
    name = name.removeprefix("void ").replace("rownorm::", "")
    depth = 0
    for i, ch in enumerate(name):
        depth += ch == "<"
        depth -= ch == ">"
        if ch == "(" and depth == 0:
            return name[:i]
    return name


def spills(v):
    return v["spill_st"] + v["spill_ld"] > 0


def table(rows):
    lines = ["| kernel | arch | regs | spill st/ld (B) | stack (B) | smem (B) |",
             "|---|---|---:|---:|---:|---:|"]
    for (name, arch), v in rows:
        flag = " **spills**" if spills(v) else ""
        lines.append(f"| `{short(pretty[name])}`{flag} | {arch} | {v['regs']} | "
                     f"{v['spill_st']}/{v['spill_ld']} | {v['stack']} | {v['smem']} |")
    return "\n".join(lines)


items = sorted(kernels.items(), key=lambda kv: (not spills(kv[1]), short(pretty[kv[0][0]])))
n_spill = sum(spills(v) for v in kernels.values())
head = (f"{len(kernels)} kernel(s), {n_spill} with spills, at most "
        f"{max(v['regs'] for v in kernels.values())} registers.\n")
print(head)
print(table(items))
# For summary.md: the kernels that spill, then the 12 with the most registers.
top = [kv for kv in items if spills(kv[1])]
top += sorted((kv for kv in items if not spills(kv[1])), key=lambda kv: -kv[1]["regs"])[:12]
with open(sys.argv[2], "w") as f:
    f.write(head + "\nKernels that spill, then the 12 using the most registers (all of them in "
            "build.log):\n\n" + table(top) + "\n")
EOF
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
  limit=$(budget 90 120)
  log "self-check: python -m rownorm (limit ${limit}s)"
  { echo "==== python -m rownorm"; } >>"$TESTS_LOG"
  timeout -k 10 "$limit" "$PY" -m rownorm 2>&1 | tee "$WORK/selfcheck.log" | tee -a "$TESTS_LOG"
  rc=${PIPESTATUS[0]}
  grep -E '^\s+FAIL ' "$WORK/selfcheck.log" >"$WORK/selfcheck_fail.txt"
  sed -n '/^quick timing/,/^$/p' "$WORK/selfcheck.log" >"$WORK/quick_timing.txt"
  last=$(grep -E '^(PASS|FAIL):' "$WORK/selfcheck.log" | tail -1)
  record self-check "$(status_of "$rc")" $((SECONDS - t0)) "${last:-no verdict line}"
fi

# ---- tests ---------------------------------------------------------------------------------
# Wheels carried in $WHEELS (nothing can be downloaded on the GPU machine): pytest-xdist and
# execnet for the tests, Liger-Kernel for the benchmark's peers. Installed once into a private
# folder with --no-deps --no-index (torch and triton are the image's); a wheel that does not
# install only makes its feature unavailable (tests in one process, peer "not run").
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

install_wheels

if [[ ${SKIP_TESTS:-0} == 1 ]]; then
  record tests skipped 0 "SKIP_TESTS=1"
else
  t0=$SECONDS
  limit=$(budget 330 100)
  extra=(-rfE -p no:cacheprovider)
  "$PY" -c 'import pytest_timeout' 2>/dev/null && extra+=(--timeout=120)
  # The suite is ~22 500 tests (~14 minutes in one process): with pytest-xdist the tests that
  # are not `large` run on one worker per core but one, then `large` in this process (each of
  # those holds tens of GB of device memory).
  phases=('-q -m "large or not large"')
  if [[ -v PYTEST_ARGS ]]; then
    phases=("$PYTEST_ARGS")
  elif "$PY" -c 'import xdist' 2>/dev/null; then
    workers=$(($(nproc) > 2 ? $(nproc) - 1 : 1))
    # ... and the tier-edge tests again with the pre-Hopper tier table (no clusters). The CPU
    # tests are CI's (`.ci/run`); here they would double the time (oversubscribed CPU ops).
    phases=("-q -m 'cuda and not large' -n $workers" '-q -m large'
      "ROWNORM_DISABLE_CLUSTERS=1 -q -m 'cuda and not large' -k tier_edges -n $workers")
  fi
  rc=0
  line=""
  : >"$WORK/pytest.log"
  for phase in "${phases[@]}"; do
    pytest_args=()
    eval "pytest_args=($phase)"
    phase_env=()  # a leading VAR=value word is the phase's environment
    if [[ ${pytest_args[0]:-} == *=* ]]; then
      phase_env=("${pytest_args[0]}")
      pytest_args=("${pytest_args[@]:1}")
    fi
    left=$((limit - (SECONDS - t0)))
    ((left < 10)) && left=10
    log "tests: ${phase_env[*]} pytest tests ${extra[*]} ${pytest_args[*]} (limit ${left}s)"
    echo "==== ${phase_env[*]} pytest tests ${extra[*]} ${pytest_args[*]}" >>"$TESTS_LOG"
    timeout -k 10 "$left" env "${phase_env[@]}" "$PY" -m pytest tests "${extra[@]}" \
      "${pytest_args[@]}" 2>&1 \
      | tee "$WORK/pytest_phase.log" | tee -a "$TESTS_LOG" >>"$WORK/pytest.log"
    prc=${PIPESTATUS[0]}
    ((prc != 0 && rc == 0)) && rc=$prc
    pline=$(grep -E '[0-9]+ (passed|failed|error|errors|skipped|deselected)|no tests ran' \
      "$WORK/pytest_phase.log" | tail -1 | sed -e 's/^=* *//' -e 's/ *=*$//')
    line="${line:+$line; }${pline:-no pytest summary line} (${phase_env[*]:+${phase_env[*]} }${pytest_args[*]})"
  done
  grep -E '^(FAILED|ERROR) ' "$WORK/pytest.log" >"$WORK/tests_fail.txt"
  st=$(status_of "$rc")
  [[ $rc == 5 ]] && st="FAIL (no tests ran)"
  record tests "$st" $((SECONDS - t0)) "$line"
  log "tests: $st — $line"
fi

# ---- compute-sanitizer ---------------------------------------------------------------------
SANITIZER=$(command -v compute-sanitizer)
[[ -z $SANITIZER && -x $CUDA_HOME/compute-sanitizer/compute-sanitizer ]] \
  && SANITIZER=$CUDA_HOME/compute-sanitizer/compute-sanitizer
if [[ ${SKIP_SANITIZER:-0} == 1 ]]; then
  record sanitizer skipped 0 "SKIP_SANITIZER=1"
elif [[ -z $SANITIZER || $HAVE_GPU == 0 ]]; then
  record sanitizer skipped 0 "no compute-sanitizer or no GPU"
else
  cat >"$WORK/sanitize_ops.py" <<'EOF'
"""Small workload for compute-sanitizer: every op, forward + backward (parameter gradients
included), on every tier: CUDA results against the same op on the CPU in float64."""
import torch

import rownorm

DEVICE = "cuda"
# (shape, dim, slice_cols): tiers by N (group / warp / CTA / cluster / beyond), the fused
# weight-gradient CTA path (4096), strided reductions over dim 0 and 1 (scalar, streamed and
# 16-byte-pack columns), row-strided input.
CASES = [
    ((64, 100), -1, None), ((16, 1500), -1, None), ((40, 4096), -1, None),
    ((4, 65535), -1, None), ((2, 300000), -1, None), ((300, 4, 5), 0, None),
    ((3, 70, 33), 1, None), ((2, 48, 264), 1, None), ((8, 1024), -1, 1000),
]


def ops(x, dim, w, b, r):
    """(name, output, parameters to differentiate) of every op on x."""
    yield "l2_normalize", rownorm.l2_normalize(x, dim), ()
    yield "mean_abs", rownorm.l1_normalize(x, dim, 1e-12, True), ()
    yield "rms_norm", rownorm.rms_norm(x, w, dim, 1e-6), (w,)
    yield "layer_norm", rownorm.layer_norm(x, w, b, dim, 1e-5), (w, b)
    yield "softmax", rownorm.softmax(x, dim), ()
    yield "log_softmax", rownorm.log_softmax(x, dim), ()
    if dim in (-1, x.dim() - 1):
        out, h = rownorm.add_rms_norm(x, r, w, 1e-6)
        yield "add_rms_norm", out * 2 + h, (w, r)


def results(dtype, device, x0, w0, b0, r0, dim, view_of, grad_dtype):
    t = [v.to(device=device, dtype=dtype).requires_grad_(True) for v in (x0, w0, b0, r0)]
    if view_of is not None:  # the same values as a row-strided view of a wider tensor
        wide = torch.zeros(view_of, dtype=dtype, device=device)
        wide[:, : x0.shape[-1]] = t[0].detach()
        t[0] = wide[:, : x0.shape[-1]].requires_grad_(True)
    out = {}
    for name, y, params in ops(t[0], dim, t[1], t[2], t[3]):
        dy = torch.cos(torch.arange(y.numel(), dtype=torch.float64)).reshape(y.shape)
        dy = dy.to(grad_dtype)  # the same rounded values in both runs
        grads = torch.autograd.grad(y, (t[0], *params), dy.to(device=device, dtype=dtype))
        out[name] = [y.detach(), *grads]
    return out


worst = 0.0
for i, (shape, dim, cols) in enumerate(CASES):
    g = torch.Generator().manual_seed(i)
    x0 = torch.randn(shape, generator=g)
    x0 = x0[:, :cols].contiguous() if cols else x0
    n = x0.shape[dim]
    w0, b0 = torch.randn(n, generator=g), torch.randn(n, generator=g)
    r0 = torch.randn(x0.shape, generator=g)
    for dtype in (torch.float32, torch.bfloat16):
        rounded = [v.to(dtype).double() for v in (x0, w0, b0, r0)]
        got = results(dtype, DEVICE, *rounded, dim, shape if cols else None, dtype)
        ref = results(torch.float64, "cpu", *rounded, dim, None, dtype)
        case_worst = 0.0
        for name in ref:
            for a, c in zip(got[name], ref[name]):
                a = a.double().cpu()
                fin = torch.isfinite(c)
                scale = c[fin].abs().max().clamp_min(1e-30)
                err = ((a - c).abs()[fin].max() / scale).item()
                tol = 2e-5 if dtype == torch.float32 else 3e-2
                case_worst = max(case_worst, err / tol)
        worst = max(worst, case_worst)
        print(f"{str(dtype):<15} {str(shape):<14} dim={dim:<2} cols={cols} "
              f"worst error / tolerance {case_worst:.2f}", flush=True)
print("sanitizer workload:", "results OK" if worst <= 1 else "RESULTS WRONG")
EOF
  : >"$WORK/sanitizer_summary.txt"
  for tool in memcheck racecheck; do
    t0=$SECONDS
    reserve=80 # racecheck leaves this much for the benchmark
    [[ $tool == memcheck ]] && reserve=200
    limit=$(budget 150 $reserve)
    if ((limit < 20)); then
      record "$tool" skipped 0 "no time left"
      continue
    fi
    log "sanitizer: $tool (limit ${limit}s)"
    echo "==== compute-sanitizer --tool $tool" >>"$SAN_LOG"
    # racecheck looks at rownorm's kernels only: PyTorch's own reduce kernels (the float64
    # reference in the workload) report shared-memory hazards of their warp-synchronous code.
    filter=()
    [[ $tool == racecheck ]] && filter=(--kernel-name kns=rownorm)
    # One cudaMalloc per tensor, so an access past a tensor's end is outside any allocation.
    # shellcheck disable=SC2086
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout -k 10 "$limit" "$SANITIZER" --tool "$tool" \
      "${filter[@]}" --print-limit 30 --error-exitcode 99 ${SANITIZER_ARGS:-} \
      "$PY" "$WORK/sanitize_ops.py" \
      >"$WORK/$tool.log" 2>&1
    rc=$?
    head -c 400000 "$WORK/$tool.log" >>"$SAN_LOG"
    sum=$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|HAZARD SUMMARY' "$WORK/$tool.log" | tail -1 \
      | sed -e 's/^=* *//')
    res=$(grep -E 'sanitizer workload:' "$WORK/$tool.log" | tail -1)
    res=${res#sanitizer workload: }
    { echo "$tool: ${sum:-no summary line} (rc $rc); ${res:-workload did not finish}"; } \
      >>"$WORK/sanitizer_summary.txt"
    st=$(status_of "$rc")
    [[ $rc == 99 ]] && st="FAIL (errors found)"
    [[ $rc == 0 && $res == *WRONG* ]] && st="FAIL (wrong results)"
    record "$tool" "$st" $((SECONDS - t0)) "${sum:-no summary line}; ${res:-workload did not finish}"
    log "$tool: $st — $sum"
  done
fi

# ---- benchmark ----------------------------------------------------------------------------
if [[ ${SKIP_BENCH:-0} == 1 ]]; then
  record bench skipped 0 "SKIP_BENCH=1"
elif [[ $HAVE_GPU == 0 ]]; then
  record bench skipped 0 "no GPU"
else
  t0=$SECONDS
  bench_budget=${BENCH_BUDGET:-250}
  # The budget, plus start-up (imports, the copy-limit measurement), the measurement in flight
  # when the budget ends and the reports.
  limit=$(budget $((bench_budget + 60)) 10)
  if ((limit < 40)); then
    record bench skipped 0 "no time left (${limit}s)"
  else
    log "bench: $WHEELS_NOTE"
    tb=$((limit - 40))
    ((tb > bench_budget)) && tb=$bench_budget
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
