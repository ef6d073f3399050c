#!/usr/bin/env bash
# torchrun workers against one process with the same total batch: PPO-EWMA with the README's CartPole-v1 CPU recipe
# (8 envs x 128 steps, 200k steps) as 1 process x 8 envs and as 2 torchrun workers x 4 envs, seeds 1, 2, 3
# (SCALE=cpu, the default). SCALE=paper: Procgen starpilot (hard), 100M steps, the paper's default of 4 workers x 64
# envs (4 GPUs), 1 process x 256 envs (1 GPU) and the paper's 1-worker run (--batch-divisor 4): a GPU job.
# Cost here (2 CPU cores, OMP_NUM_THREADS=1, one run at a time, 2026-11-22): 6 runs, 2.4 minutes of wall-clock
# (16 s per one-process run, 30 s per 2-worker run).
# Then: docs/img/torchrun_cartpole.png, benchmark/plot.py's final-return table, and per run: the step where the mean of
# the last 100 episodes first reached 450, that mean at the end, wall-clock seconds and steps per second.
# `bash benchmark/torchrun.sh --list` prints the runs, one per line, for a cluster scheduler.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SCALE=${SCALE:-cpu}
OUT="$ROOT/benchmark/runs/torchrun"
DATA=${RESULTS:-$ROOT/benchmark/results}/torchrun.csv.xz  # the committed curves, which the tables and plots read

runs() {
  for seed in 1 2 3; do
    if [ "$SCALE" = cpu ]; then
      echo "python $ROOT/ppo_ewma.py --env-id CartPole-v1 --num-envs 8 --num-steps 128 --gamma 0.99 --total-timesteps 200000 --seed $seed --exp-name one_process"
      echo "torchrun --standalone --nproc_per_node 2 $ROOT/ppo_ewma.py --env-id CartPole-v1 --num-envs 8 --num-steps 128 --gamma 0.99 --total-timesteps 200000 --seed $seed --exp-name two_workers"
    else
      echo "python $ROOT/ppo_ewma.py --seed $seed --exp-name one_process"
      echo "torchrun --standalone --nproc_per_node 4 $ROOT/ppo_ewma.py --seed $seed --exp-name four_workers"
      echo "python $ROOT/ppo_ewma.py --batch-divisor 4 --seed $seed --exp-name one_worker_c4"
    fi
  done
}
if [ "${1:-}" = --list ]; then runs; exit 0; fi

if [ "${1:-}" != --plot ]; then  # --plot: the tables and plots alone, from $DATA (wall-clock: from $OUT, if there)
  mkdir -p "$OUT" && cd "$OUT"
  export OMP_NUM_THREADS=1
  runs | while read -r run; do /usr/bin/time -a -o wall_clock.txt -f "%e $run" sh -c "$run > /dev/null 2>&1"; done
  python "$ROOT/benchmark/plot.py" "$OUT/runs" --export "$DATA"
fi
if [ "$SCALE" = cpu ]; then
  env=CartPole-v1 labels=(--label '^one_process$=1 process x 8 envs' --label '^two_workers$=2 torchrun workers x 4 envs')
else
  env=starpilot labels=(--label '^one_process$=1 process x 256 envs' --label '^four_workers$=4 torchrun workers x 64 envs'
    --label '^one_worker_c4$=1 process x 64 envs (--batch-divisor 4)')
fi
python "$ROOT/benchmark/plot.py" "$DATA" --group "^${env}__(one_process|two_workers|four_workers|one_worker_c4)__\d+__\d+$" \
  --window 0.1 --out "$ROOT/docs/img/torchrun_$([ "$SCALE" = cpu ] && echo cartpole || echo starpilot).png" \
  --title "PPO-EWMA: one process vs torchrun workers, same total batch ($env)" "${labels[@]}"
python - "$ROOT" "$OUT" "$DATA" <<'EOF'
import os, re, sys
import numpy as np
sys.path.insert(0, os.path.join(sys.argv[1], "benchmark"))
from plot import list_runs, read_scalars
wall, timed = {}, os.path.join(sys.argv[2], "wall_clock.txt")
for line in open(timed) if os.path.exists(timed) else []:
    seconds, run = line.split(" ", 1)
    wall[re.search(r"--exp-name (\w+)", run).group(1), re.search(r"--seed (\d+)", run).group(1)] = float(seconds)
print("| variant | seed | first step with 100-episode mean >= 450 | final 100-episode mean | wall-clock (s) | SPS |")
print("|---|---:|---:|---:|---:|---:|")
for run_dir in sorted(list_runs(sys.argv[3])):
    name, seed = re.search(r"__(\w+)__(\d+)__\d+$", run_dir).groups()
    steps, returns = read_scalars(run_dir, "charts/episodic_return")
    means = np.array([returns[max(0, i - 99):i + 1].mean() for i in range(len(returns))])
    reached = steps[np.argmax(means >= 450)] if np.any(means >= 450) else float("nan")
    sps = read_scalars(run_dir, "charts/SPS")[1][-1]
    print(f"| {name} | {seed} | {reached:,.0f} | {means[-1]:.1f} | {wall.get((name, seed), float('nan')):.1f} | {sps:,.0f} |")
EOF
