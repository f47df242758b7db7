#!/usr/bin/env bash
# The whole test suite, natively on the GPU machine (CI has no GPU, so the CUDA-only tests run
# only here). Prints one summary line; the full log and JUnit XML go to ${OUT:-/tmp}.
#   bash tests/run_gpu.sh            # from the repo root on the GPU machine (see ../shared/device)
# The whole suite takes longer than one 10-minute device command on an H200: run it in parts, one
# device command each, one part at a time (side by side they slow each other past a command's limit,
# and the `--address auto` test would find another part's Ray):
#   PART=cuda bash tests/run_gpu.sh       # the files holding the CUDA-only tests (these skip in CI): 4-6 min
#   PART=search bash tests/run_gpu.sh     # the search service (real Ray, Optuna, MLflow)
#   PART=modules bash tests/run_gpu.sh    # tests/test_search_*.py: bad input, signals, state, disks, export
#   PART=rest bash tests/run_gpu.sh       # everything else: about 3 min with GPU_WORKERS=6
#   GPU_WORKERS=6 PART=ray bash tests/run_gpu.sh   # search and modules together, their end-to-end searches
#                                         # six at a time on the machine's CPU cores (carry .device/wheels),
#                                         # then the `ray_cluster` tests alone: more than one device command
# SHARD=i/n runs every n-th test of the part from the i-th (1-based): PART=modules SHARD=1/2, then 2/2.
# The search tests run slower on the H200 machine than on a 2-core CI machine (each search's start-up), so
# the search and modules parts need SHARD=1/2 and 2/2, or PART=ray, and together more device time than
# one session's 30 minutes after PART=cuda. PYTEST_ARGS=... runs whatever pytest arguments you give instead.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp}
mkdir -p "$out" || { echo "tests/run_gpu.sh: cannot make OUT folder $out" >&2; exit 2; }
if [ -f .device/site.tar.xz ] && ! python3 -c "import ray, optuna, mlflow" 2>/dev/null; then
  mkdir -p /tmp/site && tar xJf .device/site.tar.xz -C /tmp/site && export PYTHONPATH=/tmp/site
fi
# locked: two parts started together would race to install
lock=(); command -v flock >/dev/null && lock=(flock /tmp/triaccel-gpu-suite.lock)
${lock[@]+"${lock[@]}"} python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 \
  || { echo "GPU suite: install failed"; exit 2; }
# GPU_WORKERS=N: pytest-xdist with N workers, its wheels carried in .device/wheels
# (pip download pytest-xdist execnet -d .device/wheels). Not for PART=cuda: six workers are slower
# than one process there (each compiles the Triton kernels and initialises CUDA). With workers, the
# tests marked ray_cluster run afterwards, alone.
if [ -n "${GPU_WORKERS:-}" ] && [ -d .device/wheels ] && ! python3 -c "import xdist" 2>/dev/null; then
  python3 -m pip install -q --no-deps --target /tmp/xdist .device/wheels/*.whl >/dev/null 2>&1 \
    && export PYTHONPATH=/tmp/xdist${PYTHONPATH:+:$PYTHONPATH}
fi
# pyproject's addopts run three pytest-xdist workers (CI on 2 cores); this script chooses its own
# (GPU_WORKERS), and the GPU machine's site may have no xdist: every pytest here replaces addopts
OPTS=(-o "addopts=-ra --durations=40")
XDIST=()
if [ -n "${GPU_WORKERS:-}" ]; then
  [[ $GPU_WORKERS =~ ^[1-9][0-9]?$ ]] || { echo "tests/run_gpu.sh: GPU_WORKERS must be a number of workers, got '$GPU_WORKERS'" >&2; exit 2; }
  python3 -c "import xdist" 2>/dev/null \
    || { echo "tests/run_gpu.sh: GPU_WORKERS needs pytest-xdist (its wheels in .device/wheels)" >&2; exit 2; }
  XDIST=(-n "$GPU_WORKERS" --dist load)
  # the two passes select with -m; a -m of the caller's would replace both (pytest keeps the last)
  if [[ " ${PYTEST_ARGS:-} " =~ [[:space:]]-m([[:space:]=]|[^[:space:]]) ]]; then
    echo "tests/run_gpu.sh: GPU_WORKERS selects with -m itself; leave -m out of PYTEST_ARGS (use -k)" >&2; exit 2
  fi
fi
# the search modules end to end (cluster, params, signals, state, export, tuner): real Ray each
SEARCH_MODULES=$(echo tests/test_search_*.py)
CUDA_FILES="tests/test_capture.py tests/test_compiled.py tests/test_curvature.py tests/test_data.py tests/test_kernels.py tests/test_trainer.py tests/test_control.py tests/test_scaler.py"
case "${PART:-}" in
  cuda) PYTEST_ARGS="$CUDA_FILES" ;;
  search) PYTEST_ARGS="tests/test_search.py" ;;
  modules) PYTEST_ARGS="$SEARCH_MODULES" ;;
  ray) PYTEST_ARGS="tests/test_search.py $SEARCH_MODULES" ;;  # both, for GPU_WORKERS
  rest) PYTEST_ARGS="$(for f in tests/test_search.py $SEARCH_MODULES $CUDA_FILES; do printf -- '--ignore=%s ' "$f"; done)" ;;
  "") ;;
  *) echo "tests/run_gpu.sh: PART must be cuda, search, modules, ray or rest, got '$PART'" >&2; exit 2 ;;
esac
if [ -n "${SHARD:-}" ]; then
  # "3" passed as 3/3, 1/0 ran every test and 0/2 or 3/2 overlapped other shards
  if ! [[ $SHARD =~ ^0*([1-9][0-9]{0,5})/0*([1-9][0-9]{0,5})$ ]] || (( BASH_REMATCH[1] > BASH_REMATCH[2] )); then
    echo "tests/run_gpu.sh: SHARD must be i/n with 1 <= i <= n, got '$SHARD'" >&2; exit 2
  fi
  i=${BASH_REMATCH[1]}; n=${BASH_REMATCH[2]}
  # a file that fails to import fails the shard, as it fails an unsharded run (its tests were
  # dropped from the selection and the rest passed, exit 0)
  # shellcheck disable=SC2086
  collected=$(python3 -m pytest "${OPTS[@]}" --collect-only -q -p no:cacheprovider ${PYTEST_ARGS:-} 2>/dev/null)
  crc=$?
  if [ "$crc" -ne 0 ]; then
    echo "GPU suite${PART:+ (part $PART)}: collecting the tests for SHARD $SHARD failed (exit $crc):"
    grep -E "^(ERROR|E  )" <<<"$collected" | head -20
    exit 2
  fi
  # node ids hold spaces (parametrised ids): one array element each; the ids end at the first blank line
  mapfile -t SEL < <(awk -v i="$i" -v n="$n" '/^$/ { exit } /::/ { k++; if (k >= i && (k - i) % n == 0) print }' \
                     <<<"$collected")
  [ "${#SEL[@]}" -gt 0 ] || { echo "tests/run_gpu.sh: SHARD $SHARD selects no test"; exit 2; }
  PYTEST_ARGS=""
fi
gpu=$(python3 -c "import torch; print(torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA device')")
summary() {  # the pytest summary line of a log, without its = padding
  grep -E "^(=+ )?(no tests ran|[0-9]+ [a-z]+).* in [0-9.]+s" "$1" | tail -1 | sed 's/=//g;s/^ *//;s/ *$//'
}
start=$(date +%s)
if [ ${#XDIST[@]} -eq 0 ]; then
  # shellcheck disable=SC2086
  python3 -m pytest "${OPTS[@]}" -q -p no:cacheprovider --junitxml="$out/gpu_tests.xml" ${PYTEST_ARGS:-} ${SEL[@]+"${SEL[@]}"} \
    > "$out/gpu_tests.log" 2>&1
  rc=$?
  line=$(summary "$out/gpu_tests.log")
else
  # workers side by side, then the tests that start or look for a shared Ray cluster alone (beside
  # another test's Ray, `--address auto` joins it); exit 5 (none selected) is no failure
  # shellcheck disable=SC2086
  python3 -m pytest "${OPTS[@]}" -q -p no:cacheprovider "${XDIST[@]}" -m "not ray_cluster" --junitxml="$out/gpu_tests.xml" \
    ${PYTEST_ARGS:-} ${SEL[@]+"${SEL[@]}"} > "$out/gpu_tests.log" 2>&1
  rc=$?
  # shellcheck disable=SC2086
  python3 -m pytest "${OPTS[@]}" -q -p no:cacheprovider -m ray_cluster --junitxml="$out/gpu_tests_alone.xml" \
    ${PYTEST_ARGS:-} ${SEL[@]+"${SEL[@]}"} > "$out/gpu_tests_alone.log" 2>&1
  rc2=$?
  # exit 5 (no test selected) in one pass is fine; in both, the selection matched nothing
  if [ "$rc" -eq 5 ] && [ "$rc2" -eq 5 ]; then :; else [ "$rc" -eq 5 ] && rc=0; [ "$rc2" -eq 5 ] && rc2=0; fi
  l1=$(summary "$out/gpu_tests.log"); l2=$(summary "$out/gpu_tests_alone.log")
  [ "$rc" -eq 5 ] && l1="no tests ran ($l1)"  # xdist's line then names only the warnings
  [ "$rc2" -eq 5 ] && l2="no tests ran ($l2)"
  line="$l1 with ${GPU_WORKERS} workers; alone: $l2"
  cat "$out/gpu_tests_alone.log" >> "$out/gpu_tests.log"
  [ "$rc" -eq 0 ] && rc=$rc2
fi
echo "GPU suite${PART:+ (part $PART)} on $gpu: ${line:-no summary (see $out/gpu_tests.log)} ($(( $(date +%s) - start )) s, exit $rc)"
grep -E "^(FAILED|ERROR)" "$out/gpu_tests.log" | head -20
exit $rc
