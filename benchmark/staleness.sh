#!/usr/bin/env bash
# Fig. 1 in miniature: PPO on data that is k iterations stale, with the three objectives (recent,
# decoupled, behavior), k = 0..32, 3 seeds, CartPole-v1 (SCALE=cpu, the default), or the paper's
# Procgen setting (SCALE=paper: 16 games x 4 seeds, 100M steps each; a GPU job, k = 32 needs ~27 GB of RAM).
# k = 0 runs once per seed: the three objectives are the same run there (a test checks it).
# Cost here (2 CPU cores, 2026-11-22, one run at a time): 57 runs of about 10 s, 10 minutes of wall-clock.
# Then: docs/img/staleness_{recent,decoupled,behavior}.png (SCALE=paper: one per game) and the tables printed by
# benchmark/plot.py.
# `bash benchmark/staleness.sh --list` prints the runs, one per line, for a cluster scheduler.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SCALE=${SCALE:-cpu}
JOBS=${JOBS:-2}
OUT="$ROOT/benchmark/runs/staleness"
DATA=${RESULTS:-$ROOT/benchmark/results}/staleness.csv.xz  # the committed curves, which the tables and plots read
if [ "$SCALE" = cpu ]; then
  envs=CartPole-v1 seeds="1 2 3"
else  # the paper's Fig. 1: 4 seeds
  seeds="1 2 3 4"
  envs="bigfish bossfight caveflyer chaser climber coinrun dodgeball fruitbot heist jumper leaper maze miner ninja plunder starpilot"
fi

runs() {
  for seed in $seeds; do for k in 0 1 2 4 8 16 32; do for objective in recent decoupled behavior; do
    if [ "$k" = 0 ] && [ "$objective" != decoupled ]; then continue; fi
    if [ "$SCALE" = cpu ]; then
      echo "python $ROOT/ppo_staleness.py --env-id CartPole-v1 --num-envs 8 --num-steps 32 --num-minibatches 4 --update-epochs 4 --learning-rate 1e-3 --gamma 0.99 --total-timesteps 60000 --staleness $k --objective $objective --seed $seed --exp-name grid"
    else
      for env in $envs; do
        echo "python $ROOT/ppo_staleness.py --env-id $env --staleness $k --objective $objective --seed $seed --exp-name grid"
      done
    fi
  done; done; done
}
if [ "${1:-}" = --list ]; then runs; exit 0; fi

if [ "${1:-}" != --plot ]; then  # --plot: the tables and plots alone, from $DATA
  mkdir -p "$OUT" && cd "$OUT"
  export OMP_NUM_THREADS=1
  runs | xargs -P "$JOBS" -I{} sh -c '{} > /dev/null 2>&1'
  python "$ROOT/benchmark/plot.py" "$OUT/runs" --export "$DATA"
fi
for env in $envs; do  # one game per plot and table (SCALE=paper: file names end in _GAME)
  suffix=$([ "$SCALE" = cpu ] || echo "_$env")
  for objective in recent decoupled behavior; do
    figure=$(case $objective in recent) echo 1a ;; decoupled) echo 1b ;; behavior) echo 1c ;; esac)
    python "$ROOT/benchmark/plot.py" "$DATA" --group "^${env}__grid_(${objective}_k\d+|decoupled_k0)__\d+__\d+$" \
      --window 0.2 --out "$ROOT/docs/img/staleness_$objective$suffix.png" \
      --title "PPO on data k iterations stale, objective $objective (Fig. $figure), $env" \
      --label '_k0$=k = 0 (fresh data)' --label '_k(\d+)$=k = \1'
  done
  python "$ROOT/benchmark/plot.py" "$DATA" --group "^${env}__grid_(\w+_k\d+)__\d+__\d+$" --window 0.2 \
    --pivot "^(\w+)_(k\d+)$"
done
