#!/usr/bin/env bash
# PPO-ER vs PPO: the paper's defaults (N = 2048, M = 64, T = 10 epochs, step size and clip annealed),
# replay of L = 2 batches against L = 1 (PPO, same code path), on Pendulum-v1 and HalfCheetah-v5 (MuJoCo),
# 3 seeds each. SCALE=cpu (default): 100k steps per run; SCALE=paper: the paper's 1M steps.
# Cost here (2 CPU cores, 2026-11-22, JOBS=2): 12 runs, 6.4 minutes of wall-clock.
# `bash benchmark/ppo_er.sh --list` prints the runs, one per line.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SCALE=${SCALE:-cpu}
JOBS=${JOBS:-2}
OUT="$ROOT/benchmark/runs/ppo_er"
DATA=${RESULTS:-$ROOT/benchmark/results}/ppo_er.csv.xz  # the committed curves, which the tables and plots read
steps=$([ "$SCALE" = cpu ] && echo 100000 || echo 1000000)

runs() {
  for seed in 1 2 3; do for env in Pendulum-v1 HalfCheetah-v5; do for L in 1 2; do
    obs=$([ $env = Pendulum-v1 ] && echo "--norm-obs False" || true)  # MuJoCo keeps the normalization
    echo "python $ROOT/ppo_er.py --env-id $env --replay-batches $L --total-timesteps $steps $obs --seed $seed --exp-name L$L"
  done; done; done
}
if [ "${1:-}" = --list ]; then runs; exit 0; fi

if [ "${1:-}" != --plot ]; then  # --plot: the tables and plots alone, from $DATA
  mkdir -p "$OUT" && cd "$OUT"
  export OMP_NUM_THREADS=1
  runs | xargs -P "$JOBS" -I{} sh -c '{} > /dev/null 2>&1'
  python "$ROOT/benchmark/plot.py" "$OUT/runs" --export "$DATA"
fi
for env in Pendulum HalfCheetah; do
  python "$ROOT/benchmark/plot.py" "$DATA" --group "^${env}-v\d+__(L\d)__\d+__\d+$" --window 0.2 --baseline L1 \
    --out "$ROOT/docs/img/ppo_er_$env.png" --title "PPO vs PPO-ER, $env, $steps steps" \
    --label '^L1$=PPO (L = 1)' --label '^L2$=PPO-ER (L = 2)'
done
