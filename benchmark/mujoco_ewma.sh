#!/usr/bin/env bash
# PPO-EWMA with many epochs: the EWMA's age against the iteration's gradient steps, on MuJoCo (docs/ppo_ewma.md).
# ppo_ewma.py at the PPO paper's MuJoCo settings (1 env x 2048 steps, 10 epochs x 32 minibatches = 320 gradient
# steps an iteration), 1M env steps, HalfCheetah-v5, Hopper-v5 and Walker2d-v5, seeds 1-3:
#   ppo             PPO (--no-ewma), the baseline at the same seeds
#   com107 com320 com960    PPO-EWMA with the EWMA's centre of mass at E x M / 3, E x M and 3 x E x M
#   com8-tkl        the paper's centre of mass, 8 gradient steps, with --target-kl 0.02: a hard anchor to pi_behav
#   com8            the paper's centre of mass alone
# then a second part:
#   com$BEST-tkl    the best centre of mass of the first part (by its mean over envs of final return / PPO's), anchored
#   ppo-tkl         PPO with the same anchor, to tell the anchor's effect from the EWMA's
# Fixed before the runs: the final return is each seed's mean over its last 10% of steps (100k); the thresholds
# are 1,000 (HalfCheetah), 1,500 (Hopper, Walker2d); --target-kl 0.02 (Spinning Up stops at 1.5 x 0.01).
# Resumable: each run writes checkpoint.pt every 25 iterations and on SIGINT/SIGTERM; running this again resumes the
# unfinished runs with --resume and skips the finished ones (model.pt). Stop it with Ctrl-C, or
# `kill -TERM -- -PGID` when started with setsid. `bash benchmark/mujoco_ewma.sh --list` prints the runs.
# Cost here (2 CPU cores, JOBS=2, OMP_NUM_THREADS=1): docs/benchmarks.md.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
JOBS=${JOBS:-2}
OUT="$ROOT/benchmark/runs/mujoco_ewma"
SETTINGS="--num-envs 1 --num-steps 2048 --num-minibatches 32 --update-epochs 10 --shuffle-samples --learning-rate 3e-4"
SETTINGS="$SETTINGS --gamma 0.99 --gae-lambda 0.95 --clip-coef 0.2 --ent-coef 0 --total-timesteps 1000000"

BEST=320  # the best centre of mass of the first part, chosen from its results
FIRST=("ppo --no-ewma" "com107 --ewma-com 107" "com320 --ewma-com 320" "com960 --ewma-com 960"
       "com8-tkl --ewma-com 8 --target-kl 0.02" "com8 --ewma-com 8")
SECOND=("com$BEST-tkl --ewma-com $BEST --target-kl 0.02" "ppo-tkl --no-ewma --target-kl 0.02")
runs() {  # seed-major, so that every variant has a first seed early; the second part after the first
  for variants in FIRST SECOND; do
    local -n list=$variants
    for seed in 1 2 3; do for env in HalfCheetah-v5 Hopper-v5 Walker2d-v5; do for variant in "${list[@]}"; do
      echo "$env $seed $variant"
    done; done; done
  done
}
run() {  # env seed name flags...: resume, skip or start one run
  local env=$1 seed=$2 name=$3 dir
  shift 3
  dir=$(ls -d "$OUT/runs/${env}__${name}__${seed}__"* 2> /dev/null | head -n 1 || true)
  if [ -n "$dir" ] && [ -e "$dir/model.pt" ]; then return; fi
  if [ -n "$dir" ] && [ -e "$dir/checkpoint.pt" ]; then
    python "$ROOT/ppo_ewma.py" --resume "$dir/checkpoint.pt" --no-cuda --checkpoint-every 25
  else
    [ -z "$dir" ] || rm -rf "$dir"
    python "$ROOT/ppo_ewma.py" --env-id "$env" $SETTINGS "$@" --seed "$seed" --exp-name "$name" --no-cuda \
      --checkpoint-every 25
  fi >> "$OUT/logs/${env}__${name}__${seed}.txt" 2>&1
}
if [ "${1:-}" = --list ]; then runs; exit 0; fi

mkdir -p "$OUT/logs" && cd "$OUT"
export OMP_NUM_THREADS=1 ROOT OUT SETTINGS
export -f run
runs | xargs -P "$JOBS" -L 1 bash -c 'run "$@"' run
