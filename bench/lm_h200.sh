#!/usr/bin/env bash
# Issue 30 item 4 on the H200, in one device command (under 10 minutes with the install: the search is stopped
# at 340 s, no final run starts that would end after 530 s, the whole bench is killed at 560 s): a fresh search
# of spaces/shakespeare_gpt.yaml (6 trials of 3 epochs, 4 sharing the GPU, after its 8 static baselines:
# bf16/fp16 x eager/captured x compiled or not), its export, then the export trained alone against the best
# static baseline of each dtype, 4 epochs, seeds 0,1,2 interleaved (bench/lm_h200.py). Arguments after the
# script go to bench/lm_h200.py (--trials, --epochs, ...).
# The corpus ships with the package: no data to carry. Where Ray and its kin are not installed, carry
# .device/site.tar.xz (a site-packages folder) as for bench/h200_space10.sh. From the repo root:
#   GIT_REV=$(git rev-parse HEAD) bash bench/lm_h200.sh        (results: $OUT/h200_lm.json and h200_lm.log)
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-bench/results}
mkdir -p "$OUT"
if [ -f .device/site.tar.xz ]; then
  mkdir -p /tmp/site && tar xJf .device/site.tar.xz -C /tmp/site && export PYTHONPATH=/tmp/site
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
rm -rf /tmp/lm_bench
timeout -k 10 560 python3 bench/lm_h200.py --out "$OUT/h200_lm.json" --work /tmp/lm_bench "$@" 2>&1 \
  | tee "$OUT/h200_lm.log" \
  | grep -E "^(baseline|reference|exported|static|---|wrote)|trial|promot|Traceback|Error" | tail -60
echo "exit ${PIPESTATUS[0]}"
