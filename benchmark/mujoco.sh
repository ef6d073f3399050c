#!/usr/bin/env bash
# PPO-ER at the paper's budget: 1M env steps on HalfCheetah-v5 and Hopper-v5, seeds 1-3, ppo_er.py with the
# PPO-ER paper's Table II settings (K = 1 actor, N = 2048, M = 64, 10 epochs, step size and clip factor annealed
# by alpha): replay of L = 2 batches (PPO-ER) against L = 1 (its PPO baseline). PPO-EWMA on MuJoCo:
# benchmark/mujoco_ewma.sh.
# 12 runs. A run whose directory already holds model.pt is skipped, and an unfinished one starts again, so the
# script can be stopped and rerun.
# Cost here (2 CPU cores, JOBS=1, OMP_NUM_THREADS=1): see docs/benchmarks.md.
# `bash benchmark/mujoco.sh --list` prints the runs, one per line.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
JOBS=${JOBS:-1}
OUT=${OUT:-$ROOT/benchmark/runs/mujoco}
DATA=${RESULTS:-$ROOT/benchmark/results}/mujoco.csv.gz  # the committed curves, which the tables and plots read

runs() {
  for env in HalfCheetah-v5 Hopper-v5; do for seed in 1 2 3; do for L in 1 2; do
    echo "python $ROOT/ppo_er.py --env-id $env --replay-batches $L --seed $seed --exp-name ppo-er-L$L --save-model"
  done; done; done
}
unfinished() {  # drop the runs that finished; remove what an interrupted one left behind
  while read -r cmd; do
    name=$(sed -E 's/.*--env-id ([^ ]+).*--seed ([0-9]+) --exp-name ([^ ]+).*/\1__\3__\2/' <<<"$cmd")
    if ls "$OUT"/runs/"$name"__*/model.pt > /dev/null 2>&1; then continue; fi
    rm -rf "$OUT"/runs/"$name"__*
    echo "$cmd"
  done
}
if [ "${1:-}" = --list ]; then runs; exit 0; fi

if [ "${1:-}" != --plot ]; then  # --plot: the tables and plots alone, from $DATA
  mkdir -p "$OUT" && cd "$OUT"
  export OMP_NUM_THREADS=1
  runs | unfinished | xargs -P "$JOBS" -I{} sh -c '{} > /dev/null 2>&1'
  rm -rf "$OUT/finished" && mkdir "$OUT/finished"
  for dir in "$OUT"/runs/*/; do [ ! -e "$dir/model.pt" ] || ln -s "$dir" "$OUT/finished/"; done
  python "$ROOT/benchmark/plot.py" "$OUT/finished" --export "$DATA"
fi
for env in HalfCheetah Hopper; do
  threshold=$([ $env = HalfCheetah ] && echo 1000 || echo 1500)
  grep -q "^$env-v5," <(zcat "$DATA") || continue
  compare=$(grep -q "^$env-v5,ppo-er-L1," <(zcat "$DATA") && echo "--baseline ppo-er-L1" || true)  # once L = 1 ran
  python "$ROOT/benchmark/plot.py" "$DATA" --group "^${env}-v5__(ppo-er-L\d)__\d+__\d+$" --window 0.1 $compare \
    --threshold "$threshold" --out "$ROOT/docs/img/mujoco_ppo_er_$env.png" --title "PPO vs PPO-ER, $env-v5, 1M steps" \
    --label '-L1$=PPO (L = 1)' --label '-L2$=PPO-ER (L = 2)'
done
