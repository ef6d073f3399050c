#!/usr/bin/env bash
# V-MPO: learning curves on CartPole-v1 (discrete) and Pendulum-v1 (continuous, decoupled mean/std KL
# bounds), 3 seeds each, with the KL-constraint diagnostics (each KL against its bound eps) that show the
# trust regions hold. The README's CPU recipes (--learning-rate 1e-3 --multiplier-lr 1e-2: the paper's
# 1e-4 is too slow for runs this short). SCALE=paper: Procgen starpilot hard and HalfCheetah-v5 (GPU).
# Cost here (2 CPU cores, 2026-11-22, JOBS=2): 6 runs, 2.1 minutes of wall-clock.
# `bash benchmark/vmpo.sh --list` prints the runs, one per line.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SCALE=${SCALE:-cpu}
JOBS=${JOBS:-2}
OUT="$ROOT/benchmark/runs/vmpo"
DATA=${RESULTS:-$ROOT/benchmark/results}/vmpo.csv.xz  # the committed curves, which the tables and plots read

runs() {
  for seed in 1 2 3; do
    if [ "$SCALE" = cpu ]; then
      echo "python $ROOT/vmpo.py --env-id CartPole-v1 --num-envs 8 --num-steps 128 --num-minibatches 4 --gamma 0.99 --total-timesteps 150000 --learning-rate 1e-3 --multiplier-lr 1e-2 --seed $seed --exp-name vmpo"
      echo "python $ROOT/vmpo.py --env-id Pendulum-v1 --num-envs 8 --num-steps 256 --num-minibatches 8 --update-epochs 10 --gamma 0.9 --total-timesteps 300000 --learning-rate 1e-3 --multiplier-lr 1e-2 --norm-obs False --seed $seed --exp-name vmpo"
    else
      echo "python $ROOT/vmpo.py --seed $seed --exp-name vmpo"
      echo "python $ROOT/vmpo.py --env-id HalfCheetah-v5 --num-envs 8 --num-steps 256 --num-minibatches 8 --update-epochs 10 --gamma 0.99 --total-timesteps 1000000 --learning-rate 3e-4 --multiplier-lr 1e-2 --seed $seed --exp-name vmpo"
    fi
  done
}
if [ "${1:-}" = --list ]; then runs; exit 0; fi

if [ "${1:-}" != --plot ]; then  # --plot: the tables and plots alone, from $DATA
  mkdir -p "$OUT" && cd "$OUT"
  export OMP_NUM_THREADS=1
  runs | xargs -P "$JOBS" -I{} sh -c '{} > /dev/null 2>&1'
  python "$ROOT/benchmark/plot.py" "$OUT/runs" --export "$DATA" --tags charts/episodic_return charts/SPS kl/policy \
    kl/policy_bound kl/mean kl/mean_bound kl/std kl/std_bound kl/temperature kl/temperature_bound charts/eta \
    charts/alpha_policy charts/alpha_mean charts/alpha_std
fi
plot() {  # one variant per env; the labels name its action space
  python "$ROOT/benchmark/plot.py" "$DATA" --group "^([A-Za-z]+)-v\d+__vmpo__\d+__\d+$" --window 0.2 \
    --label '^CartPole$=CartPole-v1 (discrete)' --label '^Pendulum$=Pendulum-v1 (continuous)' \
    --label '^HalfCheetah$=HalfCheetah-v5 (continuous)' "$@"
}
plot --out "$ROOT/docs/img/vmpo_return.png" --title "V-MPO: episodic return"
for tag in kl/policy kl/mean kl/std kl/temperature; do  # each KL next to its bound (printed: the table)
  plot --tag "$tag" --out "$ROOT/docs/img/vmpo_${tag#kl/}.png" --title "V-MPO: $tag (its bound: the table)"
  plot --tag "${tag}_bound" | tail -n +3
done
