#!/usr/bin/env bash
# PPO-ER at the paper's budget: 1M env steps on HalfCheetah-v5 and Hopper-v5, seeds 1-3, ppo_er.py with the
# PPO-ER paper's Table II settings (K = 1 actor, N = 2048, M = 64, 10 epochs, step size and clip factor annealed
# by alpha): replay of L = 2 batches (PPO-ER) against L = 1 (its PPO baseline). PPO-EWMA on MuJoCo:
# benchmark/mujoco_ewma.sh.
# 12 runs. Resumable: each run writes checkpoint.safetensors every 25 iterations and on SIGINT/SIGTERM; running this again
# resumes the unfinished runs with --resume and skips the finished ones (model.safetensors). OUT=DIR keeps the runs outside
# the work tree.
# Cost here (2 CPU cores, JOBS=1, OMP_NUM_THREADS=1): see docs/benchmarks.md.
# `bash benchmark/mujoco.sh --list` prints the runs, one per line.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
JOBS=${JOBS:-1}
OUT=${OUT:-$ROOT/benchmark/runs/mujoco}
DATA=${RESULTS:-$ROOT/benchmark/results}/mujoco.csv.xz  # the committed curves, which the tables and plots read

runs() {
  for env in HalfCheetah-v5 Hopper-v5; do for seed in 1 2 3; do for L in 1 2; do echo "$env $seed $L"; done; done; done
}
run() {  # env seed L: resume, skip or start one run
  local env=$1 seed=$2 L=$3 dir
  dir=$(ls -d "$OUT/runs/${env}__ppo-er-L${L}__${seed}__"* 2> /dev/null | head -n 1 || true)
  if [ -n "$dir" ] && [ -e "$dir/model.safetensors" ]; then return; fi
  if [ -n "$dir" ] && [ -e "$dir/checkpoint.safetensors" ]; then
    python "$ROOT/ppo_er.py" --resume "$dir/checkpoint.safetensors" --no-cuda --checkpoint-every 25
  else
    [ -z "$dir" ] || rm -rf "$dir"
    python "$ROOT/ppo_er.py" --env-id "$env" --replay-batches "$L" --seed "$seed" --exp-name "ppo-er-L$L" --no-cuda \
      --checkpoint-every 25
  fi >> "$OUT/logs/${env}__ppo-er-L${L}__${seed}.txt" 2>&1
}
if [ "${1:-}" = --list ]; then runs; exit 0; fi

if [ "${1:-}" != --plot ]; then  # --plot: the tables and plots alone, from $DATA
  mkdir -p "$OUT/logs" && cd "$OUT"
  export OMP_NUM_THREADS=1 ROOT OUT
  export -f run
  runs | xargs -r -P "$JOBS" -L 1 bash -c 'run "$@"' run
  rm -rf "$OUT/finished" && mkdir "$OUT/finished"
  for dir in "$OUT"/runs/*/; do [ ! -e "$dir/model.safetensors" ] || ln -s "$dir" "$OUT/finished/"; done
  python "$ROOT/benchmark/plot.py" "$OUT/finished" --export "$DATA" --tags charts/episodic_return charts/SPS \
    losses/clipfrac losses/clipfrac_fresh losses/clipfrac_replayed losses/ratio_max
fi
for env in HalfCheetah Hopper; do
  threshold=$([ $env = HalfCheetah ] && echo 1000 || echo 1500)
  grep -q "^$env-v5," <(xzcat "$DATA") || continue
  compare=$(grep -q "^$env-v5,ppo-er-L1," <(xzcat "$DATA") && echo "--baseline ppo-er-L1" || true)  # once L = 1 ran
  python "$ROOT/benchmark/plot.py" "$DATA" --group "^${env}-v5__(ppo-er-L\d)__\d+__\d+$" --window 0.1 $compare \
    --threshold "$threshold" --out "$ROOT/docs/img/mujoco_ppo_er_$env.png" --title "PPO vs PPO-ER, $env-v5, 1M steps" \
    --label '-L1$=PPO (L = 1)' --label '-L2$=PPO-ER (L = 2)'
  grep -q "^$env-v5,ppo-er-L2,[0-9]*,losses/clipfrac," <(xzcat "$DATA") || continue  # once an L = 2 run logged them
  for tag in losses/clipfrac losses/clipfrac_fresh losses/clipfrac_replayed losses/ratio_max charts/SPS; do
    python "$ROOT/benchmark/plot.py" "$DATA" --group "^${env}-v5__(ppo-er-L\d)__\d+__\d+$" --tag $tag --window 1
  done  # the diagnostics of docs/ppo_er.md: each a mean over all iterations
done
