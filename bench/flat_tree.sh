#!/usr/bin/env bash
# Lay out the package as installed (triaccel.kernels from kernels/, triaccel.search from search/, ...) under $1,
# for running two revisions side by side with PYTHONPATH (bench/idle_cost.py's before/after runs on the GPU).
set -euo pipefail
dst=$1/triaccel
mkdir -p "$dst"
cp -r triaccel/. "$dst"/
for d in kernels search spaces configs; do cp -r "$d" "$dst/$d"; done
