#!/usr/bin/env bash
# The whole test suite, natively on the GPU machine (CI has no GPU, so the CUDA-only tests run
# only here). Prints one summary line; the full log and JUnit XML go to ${OUT:-/tmp}.
#   bash tests/run_gpu.sh            # from the repo root on the GPU machine (see ../shared/device)
# The whole suite takes longer than one 10-minute device command on the H200 (2026-11-30: run as
# two halves side by side, 222 of the 302 tests had passed after 6.5 minutes): run it in three
# parts, one device command each,
#   PART=cuda bash tests/run_gpu.sh     # the files holding the CUDA-only tests (these skip in CI)
#   PART=search bash tests/run_gpu.sh   # the search service (real Ray, Optuna, MLflow)
#   PART=rest bash tests/run_gpu.sh     # everything else
# (PYTEST_ARGS=... runs whatever pytest arguments you give instead.)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp}
if [ -f .device/site.tar.xz ] && ! python3 -c "import ray, optuna, mlflow" 2>/dev/null; then
  mkdir -p /tmp/site && tar xJf .device/site.tar.xz -C /tmp/site && export PYTHONPATH=/tmp/site
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || { echo "GPU suite: install failed"; exit 2; }
# GPU_WORKERS=N: pytest-xdist with N workers, its wheels carried in .device/wheels
# (pip download pytest-xdist execnet -d .device/wheels). Not the default: on the H200 six workers
# were slower than one process (each compiles the Triton kernels and initialises CUDA; 2026-11-30).
if [ -n "${GPU_WORKERS:-}" ] && [ -d .device/wheels ] && ! python3 -c "import xdist" 2>/dev/null; then
  python3 -m pip install -q --no-deps --target /tmp/xdist .device/wheels/*.whl >/dev/null 2>&1 \
    && export PYTHONPATH=/tmp/xdist${PYTHONPATH:+:$PYTHONPATH}
fi
if [ -n "${GPU_WORKERS:-}" ] && [ -z "${PYTEST_ARGS+x}" ] && python3 -c "import xdist" 2>/dev/null; then
  PYTEST_ARGS="-n $GPU_WORKERS --dist load"
fi
CUDA_FILES="tests/test_capture.py tests/test_curvature.py tests/test_data.py tests/test_kernels.py tests/test_trainer.py tests/test_triaccel.py"
case "${PART:-}" in
  cuda) PYTEST_ARGS="$CUDA_FILES" ;;
  search) PYTEST_ARGS="tests/test_search.py" ;;
  rest) PYTEST_ARGS="--ignore=tests/test_search.py $(for f in $CUDA_FILES; do printf -- '--ignore=%s ' "$f"; done)" ;;
  "") ;;
  *) echo "tests/run_gpu.sh: PART must be cuda, search or rest, got '$PART'" >&2; exit 2 ;;
esac
gpu=$(python3 -c "import torch; print(torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA device')")
start=$(date +%s)
python3 -m pytest -q -p no:cacheprovider --junitxml="$out/gpu_tests.xml" ${PYTEST_ARGS:-} > "$out/gpu_tests.log" 2>&1
rc=$?
line=$(grep -E "^(=+ )?[0-9]+ (passed|failed)" "$out/gpu_tests.log" | tail -1 | sed 's/=//g;s/^ *//;s/ *$//')
echo "GPU suite${PART:+ (part $PART)} on $gpu: ${line:-no summary (see $out/gpu_tests.log)} ($(( $(date +%s) - start )) s, exit $rc)"
grep -E "^(FAILED|ERROR)" "$out/gpu_tests.log" | head -20
exit $rc
