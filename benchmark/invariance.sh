#!/usr/bin/env bash
# Fig. 2, 3 and 5 in miniature: is PPG-EWMA batch size-invariant with the Sec. 4 adjustments, and does
# taking one adjustment away break it? Batch divisors c = 1, 4, 16, 64, from one base config; the
# ablations of Fig. 2 (no Adam step-size adjustment, no advantage-normalization adjustment, no EWMA
# adjustment, no EWMA at all = PPG), the linear step-size rule of Fig. 5, and PPO-EWMA with one policy
# epoch. 3 seeds each.
# SCALE=cpu (default): Acrobot-v1, 64 envs x 32 steps at c = 1 (so c = 64 still has one env), N_pi 4,
#   aux minibatch 256 (8 trajectories), gamma 0.99, 80k steps: learning is gradual over most of the run.
# SCALE=paper: Procgen starpilot hard, the paper's 256 envs and 100M steps, c = 1, 4, 16, 64, 256 (GPU).
# Cost here (2 CPU cores, 2026-11-22, JOBS=2): 84 runs, 18.4 minutes of wall-clock (c = 64 runs are the longest);
# since --adjust-aux (4x the auxiliary minibatches from c = 4 on) the 54 PPG runs with c > 1 alone take 24.7 minutes.
# `bash benchmark/invariance.sh --list` prints the runs, one per line, for a cluster scheduler;
# `bash benchmark/invariance.sh 'REGEX'` runs only those whose line matches (the others keep their committed data).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SCALE=${SCALE:-cpu}
JOBS=${JOBS:-2}
OUT="$ROOT/benchmark/runs/invariance"
DATA=${RESULTS:-$ROOT/benchmark/results}/invariance.csv.xz  # the committed curves, which the tables and plots read

if [ "$SCALE" = cpu ]; then
  env=Acrobot-v1 envs=64
  base="--env-id $env --num-envs $envs --num-steps 32 --gamma 0.99 --total-timesteps 80000"
  ppg="$base --n-pi 4 --aux-minibatch-size 256"
  divisors="1 4 16 64"
else
  env=starpilot envs=256
  base="--env-id $env"
  ppg="$base"
  divisors="1 4 16 64 256"
fi
runs() {
  for seed in 1 2 3; do for c in $divisors; do
    echo "python $ROOT/ppg_ewma.py $ppg --batch-divisor $c --seed $seed --exp-name all_c$c"
    echo "python $ROOT/ppg_ewma.py $ppg --batch-divisor $c --seed $seed --exp-name no-adam-adj_c$c --no-adjust-lr"
    echo "python $ROOT/ppg_ewma.py $ppg --batch-divisor $c --seed $seed --exp-name no-advnorm-adj_c$c --no-adjust-adv-norm"
    echo "python $ROOT/ppg_ewma.py $ppg --batch-divisor $c --seed $seed --exp-name no-ewma-adj_c$c --no-adjust-ewma"
    echo "python $ROOT/ppg_ewma.py $ppg --batch-divisor $c --seed $seed --exp-name ppg_c$c --no-ewma"
    echo "python $ROOT/ppg_ewma.py $ppg --batch-divisor $c --seed $seed --exp-name linear-lr_c$c --lr-rule linear"
    echo "python $ROOT/ppo_ewma.py $base --batch-divisor $c --seed $seed --exp-name ppo-ewma-e1_c$c --update-epochs 1"
  done; done
}
if [ "${1:-}" = --list ]; then runs; exit 0; fi

if [ "${1:-}" != --plot ]; then  # --plot: the tables and plots alone, from $DATA
  mkdir -p "$OUT" && cd "$OUT"
  export OMP_NUM_THREADS=1
  runs | { grep -E -- "${1:-.}" || true; } | xargs -r -P "$JOBS" -I{} sh -c '{} > /dev/null 2>&1'
  python "$ROOT/benchmark/plot.py" "$OUT/runs" --export "$DATA"
fi
labels=()  # "c = 4 (16 envs)": the batch divisor and the envs it leaves
for c in $divisors; do n=$((envs / c)); labels+=(--label "_c$c\$=c = $c ($n env$([ $n = 1 ] || echo s))"); done
plot() { python "$ROOT/benchmark/plot.py" "$DATA" --window 0.2 --divisor-regex '_c(\d+)$' "$@"; }
for variant in all no-adam-adj no-advnorm-adj no-ewma-adj ppg linear-lr ppo-ewma-e1; do
  case $variant in
    all) what="PPG-EWMA, all adjustments" ;;
    no-adam-adj) what="PPG-EWMA without the Adam step-size adjustment" ;;
    no-advnorm-adj) what="PPG-EWMA without the advantage-normalization adjustment" ;;
    no-ewma-adj) what="PPG-EWMA without the EWMA adjustment" ;;
    ppg) what="PPG (no EWMA), other adjustments" ;;
    linear-lr) what="PPG-EWMA, linear step-size rule (Fig. 5)" ;;
    ppo-ewma-e1) what="PPO-EWMA with one policy epoch" ;;
  esac
  plot --group "^${env}__(${variant}_c\d+)__\d+__\d+$" --out "$ROOT/docs/img/invariance_$variant.png" \
    --title "$what: batch / c ($env)" "${labels[@]}"
done
plot --group "^${env}__([a-z0-9-]+_c\d+)__\d+__\d+$" --pivot '^([a-z0-9-]+)_(c\d+)$'
