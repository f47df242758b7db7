#!/usr/bin/env bash
# The whole test suite, natively on the GPU machine (CI has no GPU, so the CUDA-only tests run
# only here). Prints one summary line; the full log and JUnit XML go to ${OUT:-/tmp}.
#   bash tests/run_gpu.sh            # from the repo root on the GPU machine (see ../shared/device)
# The whole suite takes longer than one 10-minute device command on the H200: run it in parts,
# one device command each (times measured there on 2026-11-30, one part at a time):
#   PART=cuda bash tests/run_gpu.sh       # the files holding the CUDA-only tests (these skip in CI): 53 s
#   PART=search bash tests/run_gpu.sh     # the search service (real Ray, Optuna, MLflow)
#   PART=modules bash tests/run_gpu.sh    # tests/test_search_*.py, the search modules end to end (bad
#                                         # input, signals, state, disks, addresses, export): its Ctrl-C
#                                         # and end-to-end searches take about a minute each there
#   PART=rest bash tests/run_gpu.sh       # everything else
# SHARD=i/n runs every n-th test of the part from the i-th (1-based): PART=modules SHARD=1/2, then 2/2.
# Run the parts one at a time. Side by side (each with its own OUT; the install below is locked)
# they slow each other down past a device command: on 2026-12-01 cuda took 520 s instead of 53 s
# beside search and modules (then named hardening), which finished 12 and 8 tests in 10 minutes; and
# the `--address auto` test (tests/test_search_cluster.py) found the Ray instance the search part had started and failed.
# On the H200 the search tests run slower than on a 2-core CI machine (the Ctrl-C test: over
# 140 s against 52 s; on 2026-12-01 the `ray start` test took 180 s, README's main job 186 s, and
# PART=search finished 13 of its 15 tests in 570 s): run search and modules as SHARD=1/2 and
# SHARD=2/2, one device command each. On 2026-12-02 PART=search SHARD=1/2 finished 8 of its 9 tests
# in 480 s: the search and modules parts alone need more device time than a session has.
#   GPU_WORKERS=6 PART=ray bash tests/run_gpu.sh   # (carry .device/wheels) search and modules
# together, their end-to-end searches six at a time (they run on the CPU: the 16 cores idle under
# one at a time), then the `ray_cluster` tests alone. On the 2-core CPU machine, `pytest -n 3 -m
# "not ray_cluster"` over these files passed all 51 in 1,008 s (2026-12-02). Timed on the H200
# (2026-12-02, one part at a time): PART=cuda 140 passed, 34 skipped in 87 s; GPU_WORKERS=6
# PART=rest 320 tests in 181 s; GPU_WORKERS=8 PART=ray finished 33 of its tests (none failed) in
# the 420 s it was given: eight at a time is not eight times faster there. The whole suite
# natively is about 15 device minutes: give PART=ray a command of its own. With tests/test_compiled.py
# in it (real Inductor compiles), PART=cuda took 172 s on 2026-12-02 (151 passed, 34 skipped).
# (PYTEST_ARGS=... runs whatever pytest arguments you give instead.)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp}
mkdir -p "$out" || { echo "tests/run_gpu.sh: cannot make OUT folder $out" >&2; exit 2; }
if [ -f .device/site.tar.xz ] && ! python3 -c "import ray, optuna, mlflow" 2>/dev/null; then
  mkdir -p /tmp/site && tar xJf .device/site.tar.xz -C /tmp/site && export PYTHONPATH=/tmp/site
fi
# locked: two parts started together raced here and one failed to install (2026-11-30)
lock=(); command -v flock >/dev/null && lock=(flock /tmp/triaccel-gpu-suite.lock)
${lock[@]+"${lock[@]}"} python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 \
  || { echo "GPU suite: install failed"; exit 2; }
# GPU_WORKERS=N: pytest-xdist with N workers, its wheels carried in .device/wheels
# (pip download pytest-xdist execnet -d .device/wheels). Not for PART=cuda: on the H200 six workers
# were slower than one process there (each compiles the Triton kernels and initialises CUDA;
# 2026-11-30). With workers, the tests marked ray_cluster run afterwards, alone.
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
  # another test's Ray, `--address auto` joins it: 2026-12-01); exit 5 (none selected) is no failure
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
