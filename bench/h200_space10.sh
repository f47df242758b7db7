#!/usr/bin/env bash
# Issue 12 on the H200, in one device command (~545 s): the CUDA tests, then a fresh search of the
# second shipped space (spaces/cifar10_resnet18.yaml on the JPEG pack, 4 trials), its export, and the export
# trained alone against captured static fp16 B=96 (SEEDS, default 0,1). Carry .device/cifar10-jpeg.tar.gz and
# .device/site.tar.xz; run from the repo root: bash bench/h200_space10.sh (results under $OUT).
set -u
export PYTHONUNBUFFERED=1
mkdir -p /tmp/cifar && tar xzf .device/cifar10-jpeg.tar.gz -C /tmp/cifar
mkdir -p /tmp/site && tar xJf .device/site.tar.xz -C /tmp/site
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
t0=$(date +%s)
PART=cuda OUT=$OUT/cuda timeout 110 bash tests/run_gpu.sh 2>&1 | tail -2
export PYTHONPATH=/tmp/site
w=/tmp/svs10b; rm -rf $w; mkdir -p $w
python3 - <<'PY'
import yaml
s = yaml.safe_load(open("spaces/cifar10_resnet18.yaml"))
s["trials"] = 4
d = s["train"]["data"]; d.update(name="imagefolder", data_dir="/tmp/cifar", image_size=32); d.pop("download", None)
open("/tmp/svs10b/space.yaml", "w").write(yaml.safe_dump(s, sort_keys=False))
PY
( cd $w && export TRIACCEL_TUNE_DIR=$w/mlruns/tune MLFLOW_TRACKING_URI=sqlite:///$w/mlruns/mlflow.db
  timeout ${SEARCH_S:-400} python3 -m triaccel.cli search --space space.yaml --name bench > $OUT/space10.log 2>&1
  echo "search rc=$? at $(( $(date +%s)-t0 )) s"
  python3 -m triaccel.cli export bench --out $w/tuned.yaml --force > $OUT/space10_export.log 2>&1
  echo "export rc=$?"; cp $w/tuned.yaml $OUT/h200_search_cifar10_space.tuned.yaml )
tail -25 $OUT/space10.log; cat $OUT/space10_export.log
left=$(( 585 - ($(date +%s)-t0) ))
echo "finals with $left s left"
timeout $left python3 bench/search_vs_static.py --data-dir /tmp/cifar --imagefolder --tuned $OUT/h200_search_cifar10_space.tuned.yaml \
  --space spaces/cifar10_resnet18.yaml --static fp16:96:captured --static-once '' --seeds ${SEEDS:-0,1} --epochs 8 --warm-epochs 1 \
  --out $OUT/h200_search_cifar10_space_finals.json > $OUT/space10finals.log 2>&1
echo "finals rc=$? at $(( $(date +%s)-t0 )) s"; grep -E "^(exported|static) " $OUT/space10finals.log
