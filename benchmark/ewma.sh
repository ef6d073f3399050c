#!/usr/bin/env bash
# Fig. 4 in miniature: PPO vs PPO-EWMA and PPG vs PPG-EWMA at the default batch size, 3 seeds each (paper: 4).
# SCALE=cpu (default): the base config of benchmark/invariance.sh (Acrobot-v1, 64 envs x 32 steps, 80k
# steps; PPO with the paper's 3 epochs). SCALE=paper: Procgen starpilot hard, the paper's defaults (GPU).
# Cost here (2 CPU cores, 2026-11-22, JOBS=2): 12 runs, 1 minute of wall-clock.
# `bash benchmark/ewma.sh --list` prints the runs, one per line.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SCALE=${SCALE:-cpu}
JOBS=${JOBS:-2}
OUT="$ROOT/benchmark/runs/ewma"
DATA=${RESULTS:-$ROOT/benchmark/results}/ewma.csv.xz  # the committed curves, which the tables and plots read

if [ "$SCALE" = cpu ]; then
  env=Acrobot-v1 seeds="1 2 3"
  base="--env-id $env --num-envs 64 --num-steps 32 --gamma 0.99 --total-timesteps 80000"
  ppg="$base --n-pi 4 --aux-minibatch-size 256"
else
  env=starpilot seeds="1 2 3 4"  # the paper's Fig. 4: 4 seeds
  base="--env-id $env"
  ppg="$base"
fi
runs() {
  for seed in $seeds; do
    echo "python $ROOT/ppo_ewma.py $base --seed $seed --exp-name ppo-ewma"
    echo "python $ROOT/ppo_ewma.py $base --seed $seed --exp-name ppo --no-ewma"
    echo "python $ROOT/ppg_ewma.py $ppg --seed $seed --exp-name ppg-ewma"
    echo "python $ROOT/ppg_ewma.py $ppg --seed $seed --exp-name ppg --no-ewma"
  done
}
if [ "${1:-}" = --list ]; then runs; exit 0; fi

if [ "${1:-}" != --plot ]; then  # --plot: the tables and plots alone, from $DATA
  mkdir -p "$OUT" && cd "$OUT"
  export OMP_NUM_THREADS=1
  runs | xargs -P "$JOBS" -I{} sh -c '{} > /dev/null 2>&1'
  python "$ROOT/benchmark/plot.py" "$OUT/runs" --export "$DATA"
fi
python "$ROOT/benchmark/plot.py" "$DATA" --group "^${env}__(.+)__\d+__\d+$" --window 0.2 \
  --compare ppo-ewma=ppo --compare ppg-ewma=ppg \
  --out "$ROOT/docs/img/ewma.png" --title "PPO vs PPO-EWMA, PPG vs PPG-EWMA ($env, default batch)" \
  --label '^ppo$=PPO' --label '^ppo-ewma$=PPO-EWMA' --label '^ppg$=PPG' --label '^ppg-ewma$=PPG-EWMA'
