#!/usr/bin/env bash
# The tables and figures of the README and docs/ that come from the run data committed in benchmark/results/, without
# event files: every script that has a --plot mode, with --plot (tables printed, PNGs into docs/img/), `gpu.sh
# bf16-plot`, then the algorithm pages' figures (benchmark/figures.py). An experiment whose data is not committed yet
# is named and skipped. The timings (cleanrl_speed.sh, compile.sh, speed.sh, bf16.py, gpu.sh's timing) have no --plot
# mode: they measure the machine at hand, and their kept outputs are the text files of benchmark/results/timings/.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
for name in recipes ewma invariance regime staleness vmpo vmpo_lstm ppo_er torchrun mujoco mujoco_ewma vmpo_mujoco ppo_rnn; do
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
