#!/usr/bin/env bash
# The CPU recipes of ppo_ewma.py and ppg_ewma.py, 3 seeds each: does each still learn, and how fast? On
# CartPole-v1: PPO-EWMA with the official minibatch layout (whole trajectories), with --shuffle-samples for
# comparison, and with 16 envs x 64 steps (same batch); PPG-EWMA's recipe. On Pendulum-v1 (continuous actions),
# ppo_ewma.py's continuous recipe: PPO-EWMA, PPO (--no-ewma), and PPO-EWMA at the paper's Procgen centre of mass
# (--ewma-com 8) and at E x M (--ewma-com 80). The tables give the return over the last 10% of steps and each seed's first step where the
# 100-episode mean reaches 450 (PPO), 475 (PPG) or -300 (Pendulum).
# SCALE is cpu only: these are the laptop recipes.
# Cost here (2 CPU cores, 2026-11-22): 18 runs, 10.3 minutes of wall-clock with JOBS=1 beside a MuJoCo run and
# other work; the 12 CartPole runs alone took 2.2 minutes with JOBS=2. The 3 --ewma-com 8 runs came later (21 runs).
# The 12 Pendulum runs again on 2026-11-25, for the new default: 15 minutes, JOBS=2, beside MuJoCo runs at first.
# `bash benchmark/recipes.sh --list` prints the runs, one per line.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
JOBS=${JOBS:-2}
OUT="$ROOT/benchmark/runs/recipes"
DATA=${RESULTS:-$ROOT/benchmark/results}/recipes.csv.xz  # the committed curves, which the tables and plots read

runs() {
  for seed in 1 2 3; do
    echo "python $ROOT/ppo_ewma.py --env-id CartPole-v1 --num-envs 8 --num-steps 128 --gamma 0.99 --total-timesteps 200000 --seed $seed --exp-name ppo-ewma"
    echo "python $ROOT/ppo_ewma.py --env-id CartPole-v1 --num-envs 8 --num-steps 128 --gamma 0.99 --total-timesteps 200000 --seed $seed --exp-name ppo-ewma-shuffled --shuffle-samples"
    echo "python $ROOT/ppo_ewma.py --env-id CartPole-v1 --num-envs 16 --num-steps 64 --gamma 0.99 --total-timesteps 200000 --seed $seed --exp-name ppo-ewma-16x64"
    echo "python $ROOT/ppg_ewma.py --env-id CartPole-v1 --num-envs 8 --num-steps 128 --gamma 0.99 --n-pi 8 --aux-minibatch-size 64 --total-timesteps 147456 --seed $seed --exp-name ppg-ewma"
    for ewma in "ewma" "no-ewma" "ewma --ewma-com 8" "ewma --ewma-com 80"; do  # the paper's 8; E x M, before 11-25
      echo "python $ROOT/ppo_ewma.py --env-id Pendulum-v1 --num-envs 8 --num-steps 256 --num-minibatches 8 --update-epochs 10 --shuffle-samples --learning-rate 3e-4 --gamma 0.9 --gae-lambda 0.99 --norm-obs False --total-timesteps 300000 --$ewma --seed $seed --exp-name pendulum-${ewma/ --ewma-com /-com}"
    done
  done
}
if [ "${1:-}" = --list ]; then runs; exit 0; fi

if [ "${1:-}" != --plot ]; then  # --plot: the tables and plots alone, from $DATA
  mkdir -p "$OUT" && cd "$OUT"
  export OMP_NUM_THREADS=1
  runs | xargs -P "$JOBS" -I{} sh -c '{} > /dev/null 2>&1'
  python "$ROOT/benchmark/plot.py" "$OUT/runs" --export "$DATA"
fi
python "$ROOT/benchmark/plot.py" "$DATA" --group "^CartPole-v1__(ppo-ewma[a-z0-9-]*)__\d+__\d+$" --threshold 450 \
  --out "$ROOT/docs/img/recipes_ppo_ewma.png" --title "PPO-EWMA CPU recipe, CartPole-v1" \
  --label '^ppo-ewma$=8 envs x 128 steps, whole trajectories (the recipe)' \
  --label '-shuffled$=8 envs x 128 steps, shuffled samples' --label '-16x64$=16 envs x 64 steps, whole trajectories'
python "$ROOT/benchmark/plot.py" "$DATA" --group "^CartPole-v1__(ppg-ewma)__\d+__\d+$" --threshold 475
python "$ROOT/benchmark/plot.py" "$DATA" --group "^Pendulum-v1__(pendulum-(?:no-)?ewma(?:-com\d+)?)__\d+__\d+$" --threshold -300 \
  --baseline pendulum-no-ewma --out "$ROOT/docs/img/recipes_pendulum.png" --title "ppo_ewma.py continuous recipe, Pendulum-v1" \
  --label '^pendulum-ewma$=PPO-EWMA (the default, centre of mass 240)' --label '^pendulum-no-ewma$=PPO (--no-ewma)' \
  --label '-com(\d+)$=PPO-EWMA, --ewma-com \1'
