#!/usr/bin/env bash
# MuJoCo at the papers' budget: 1M env steps on HalfCheetah-v5 and Hopper-v5, seeds 1-3.
# - ppo_er.py, the PPO-ER paper's Table II settings (K = 1 actor, N = 2048, M = 64, 10 epochs, step size and
#   clip factor annealed by alpha): replay of L = 2 batches (PPO-ER) against L = 1 (its PPO baseline).
# - ppo_ewma.py with Box actions and the PPO paper's MuJoCo settings (1 env x 2048 steps, 32 minibatches of
#   shuffled samples, 10 epochs, step size 3e-4, gamma 0.99, lambda 0.95, clip 0.2, no entropy bonus): PPO
#   (--no-ewma) against PPO-EWMA; and PPO-EWMA with its EWMA's centre of mass at a third of an iteration's 320
#   gradient steps (--ewma-com 107), as the paper's default 8 is of its 24 on Procgen (`ewma_com`), on
#   HalfCheetah only, where the default collapsed.
# 27 runs. `bash benchmark/mujoco.sh ppo_er` (or `ppo_ewma`, or `ewma_com`) runs one part. A run whose directory already
# holds model.pt is skipped, and an unfinished one starts again, so the script can be stopped and rerun.
# Cost here (2 CPU cores, JOBS=1, OMP_NUM_THREADS=1): see docs/benchmarks.md.
# `bash benchmark/mujoco.sh --list` prints the runs, one per line.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
JOBS=${JOBS:-1}
OUT="$ROOT/benchmark/runs/mujoco"
PART=${1:-all}

runs() {
  for env in HalfCheetah-v5 Hopper-v5; do for seed in 1 2 3; do
    if [ "$PART" = all ] || [ "$PART" = ppo_er ]; then for L in 1 2; do
      echo "python $ROOT/ppo_er.py --env-id $env --replay-batches $L --seed $seed --exp-name ppo-er-L$L --save-model"
    done; fi
    mujoco="--env-id $env --num-envs 1 --num-steps 2048 --num-minibatches 32 --update-epochs 10 --shuffle-samples"
    mujoco="$mujoco --learning-rate 3e-4 --gamma 0.99 --gae-lambda 0.95 --clip-coef 0.2 --ent-coef 0"
    if [ "$PART" = all ] || [ "$PART" = ppo_ewma ]; then for ewma in no-ewma ewma; do
      echo "python $ROOT/ppo_ewma.py $mujoco --total-timesteps 1000000 --$ewma --seed $seed --exp-name ppo-$ewma --save-model"
    done; fi
    if { [ "$PART" = all ] || [ "$PART" = ewma_com ]; } && [ $env = HalfCheetah-v5 ]; then
      echo "python $ROOT/ppo_ewma.py $mujoco --total-timesteps 1000000 --ewma-com 107 --seed $seed --exp-name ppo-ewma-com107"
    fi
  done; done
}
unfinished() {  # drop the runs that finished; remove what an interrupted one left behind
  while read -r cmd; do
    name=$(sed -E 's/.*--env-id ([^ ]+).*--seed ([0-9]+) --exp-name ([^ ]+).*/\1__\3__\2/' <<<"$cmd")
    if ls "$OUT"/runs/"$name"__*/model.pt > /dev/null 2>&1; then continue; fi
    rm -rf "$OUT"/runs/"$name"__*
    echo "$cmd"
  done
}
if [ "$PART" = --list ]; then PART=all; runs; exit 0; fi

mkdir -p "$OUT" && cd "$OUT"
export OMP_NUM_THREADS=1
runs | unfinished | xargs -P "$JOBS" -I{} sh -c '{} > /dev/null 2>&1'
for env in HalfCheetah Hopper; do
  threshold=$([ $env = HalfCheetah ] && echo 1000 || echo 1500)
  python "$ROOT/benchmark/plot.py" "$OUT/runs" --group "^${env}-v5__(ppo-er-L\d)__\d+__\d+$" --window 0.1 \
    --threshold "$threshold" --out "$ROOT/docs/img/mujoco_ppo_er_$env.png" --title "PPO vs PPO-ER, $env-v5, 1M steps" \
    --label '-L1$=PPO (L = 1)' --label '-L2$=PPO-ER (L = 2)'
  python "$ROOT/benchmark/plot.py" "$OUT/runs" --group "^${env}-v5__(ppo-(?:no-)?ewma(?:-com107)?)__\d+__\d+$" \
    --window 0.1 --threshold "$threshold" --out "$ROOT/docs/img/mujoco_ppo_ewma_$env.png" \
    --title "PPO vs PPO-EWMA, $env-v5, 1M steps" --label '^ppo-no-ewma$=PPO' \
    --label '^ppo-ewma$=PPO-EWMA (centre of mass 8)' --label '-com107$=PPO-EWMA (centre of mass 107)'
done
