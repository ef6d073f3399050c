#!/usr/bin/env bash
# Every table and figure of the README and docs/ from the run data committed in benchmark/results/, without event
# files: each experiment's script with --plot (tables printed, PNGs into docs/img/), `gpu.sh bf16-plot`, then the
# algorithm pages' figures (benchmark/figures.py). An experiment whose data is not committed yet is named and skipped.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
for name in recipes ewma invariance regime staleness vmpo vmpo_lstm ppo_er torchrun mujoco mujoco_ewma vmpo_mujoco; do
  if [ ! -e "$ROOT/benchmark/results/$name.csv.xz" ]; then
    echo "## $name: no data in benchmark/results/ yet (bash benchmark/$name.sh runs it)"
    continue
  fi
  echo "## $name"
  bash "$ROOT/benchmark/$name.sh" --plot
done
echo "## gpu_bf16"
bash "$ROOT/benchmark/gpu.sh" bf16-plot
echo "## the algorithm pages' figures"
python "$ROOT/benchmark/figures.py"
