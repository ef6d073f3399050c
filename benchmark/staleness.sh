#!/usr/bin/env bash
# Fig. 1 in miniature: PPO on data that is k iterations stale, with the three objectives (recent,
# decoupled, behavior), k = 0..32, 3 seeds, CartPole-v1 (SCALE=cpu, the default), or the paper's
# Procgen setting (SCALE=paper: 16 games x 4 seeds, 100M steps each; a GPU job, k = 32 needs ~27 GB of RAM).
# k = 0 runs once per seed: the three objectives are the same run there (a test checks it).
# Cost here (2 CPU cores, 2026-11-22, one run at a time): 57 runs of about 10 s, 10 minutes of wall-clock.
# Then: docs/img/staleness_{recent,decoupled,behavior}.png and the tables printed by benchmark/plot.py.
# `bash benchmark/staleness.sh --list` prints the runs, one per line, for a cluster scheduler.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SCALE=${SCALE:-cpu}
JOBS=${JOBS:-2}
OUT="$ROOT/benchmark/runs/staleness"

runs() {
  for seed in 1 2 3; do for k in 0 1 2 4 8 16 32; do for objective in recent decoupled behavior; do
    if [ "$k" = 0 ] && [ "$objective" != decoupled ]; then continue; fi
    if [ "$SCALE" = cpu ]; then
      echo "python $ROOT/ppo_staleness.py --env-id CartPole-v1 --num-envs 8 --num-steps 32 --num-minibatches 4 --update-epochs 4 --learning-rate 1e-3 --gamma 0.99 --total-timesteps 60000 --staleness $k --objective $objective --seed $seed --exp-name grid"
    else
      for env in bigfish bossfight caveflyer chaser climber coinrun dodgeball fruitbot heist jumper leaper maze miner ninja plunder starpilot; do
        echo "python $ROOT/ppo_staleness.py --env-id $env --staleness $k --objective $objective --seed $seed --exp-name grid"
      done
    fi
  done; done; done
}
if [ "${1:-}" = --list ]; then runs; exit 0; fi

mkdir -p "$OUT" && cd "$OUT"
export OMP_NUM_THREADS=1
runs | xargs -P "$JOBS" -I{} sh -c '{} > /dev/null 2>&1'
for objective in recent decoupled behavior; do
  python "$ROOT/benchmark/plot.py" "$OUT/runs" --group "__grid_(${objective}_k\d+|decoupled_k0)__\d+__\d+$" --window 0.2 \
    --out "$ROOT/docs/img/staleness_$objective.png" --title "PPO on stale data, objective: $objective (CartPole-v1)"
done
python "$ROOT/benchmark/plot.py" "$OUT/runs" --group "__grid_(\w+_k\d+)__\d+__\d+$" --window 0.2 --pivot "^(\w+)_(k\d+)$"
