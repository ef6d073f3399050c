#!/usr/bin/env bash
# Speed: steps per second of each script with and without its extra machinery (the EWMA, the noise scale, the
# replay, the staleness queue), on its CPU recipes and on
# one Procgen iteration (starpilot easy, 64 envs x 256 steps = 16,384 steps, the paper's per-worker batch;
# PPO-ER, continuous-only, on HalfCheetah-v5 instead).
# Prints a Markdown table: label, the SPS the script reports (env steps / training-loop seconds), and the
# whole process's wall-clock and CPU seconds (start-up included).
# Timings of jobs that run side by side disturb each other: keep JOBS=1 and the machine otherwise idle.
# SCALE=cpu (default) runs every row; SCALE=paper runs the Procgen rows only (use a GPU machine for those).
# Cost here (2 CPU cores, 2026-11-23, JOBS=1, idle machine): 22 runs, 13.7 minutes of wall-clock.
# `bash benchmark/speed.sh --list` prints the runs, one per line (without running them).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SCALE=${SCALE:-cpu}
JOBS=${JOBS:-1}
OUT="$ROOT/benchmark/runs/speed"

cartpole="--env-id CartPole-v1 --num-envs 8 --num-steps 128 --gamma 0.99"
procgen="--env-id starpilot --distribution-mode easy --num-envs 64 --num-steps 256 --total-timesteps 16384"
pendulum="--env-id Pendulum-v1 --num-envs 8 --num-steps 256 --num-minibatches 8 --update-epochs 10 --shuffle-samples \
  --learning-rate 3e-4 --gamma 0.9 --gae-lambda 0.99 --norm-obs False --total-timesteps 300000"
rows() {
  if [ "$SCALE" = cpu ]; then cat <<ROWS
ppo_ewma.cartpole.ewma      python $ROOT/ppo_ewma.py $cartpole --total-timesteps 200000 --exp-name speed --noise-scale
ppo_ewma.cartpole.no-ewma   python $ROOT/ppo_ewma.py $cartpole --total-timesteps 200000 --exp-name speed --no-ewma --noise-scale
ppo_ewma.cartpole.no-noise  python $ROOT/ppo_ewma.py $cartpole --total-timesteps 200000 --exp-name speed
ppo_ewma.pendulum.ewma      python $ROOT/ppo_ewma.py $pendulum --exp-name speed --noise-scale
ppo_ewma.pendulum.no-ewma   python $ROOT/ppo_ewma.py $pendulum --exp-name speed --no-ewma --noise-scale
ppg_ewma.cartpole.ewma      python $ROOT/ppg_ewma.py $cartpole --n-pi 8 --aux-minibatch-size 64 --total-timesteps 147456 --exp-name speed --noise-scale
ppg_ewma.cartpole.no-ewma   python $ROOT/ppg_ewma.py $cartpole --n-pi 8 --aux-minibatch-size 64 --total-timesteps 147456 --exp-name speed --no-ewma --noise-scale
ppg_ewma.cartpole.no-noise  python $ROOT/ppg_ewma.py $cartpole --n-pi 8 --aux-minibatch-size 64 --total-timesteps 147456 --exp-name speed
ppo_staleness.cartpole.k8   python $ROOT/ppo_staleness.py --env-id CartPole-v1 --num-envs 8 --num-steps 32 --num-minibatches 4 --update-epochs 4 --learning-rate 1e-3 --gamma 0.99 --total-timesteps 60000 --staleness 8 --exp-name speed
ppo_staleness.cartpole.k0   python $ROOT/ppo_staleness.py --env-id CartPole-v1 --num-envs 8 --num-steps 32 --num-minibatches 4 --update-epochs 4 --learning-rate 1e-3 --gamma 0.99 --total-timesteps 60000 --staleness 0 --exp-name speed
vmpo.cartpole               python $ROOT/vmpo.py $cartpole --num-minibatches 4 --total-timesteps 150000 --learning-rate 1e-3 --multiplier-lr 1e-2 --exp-name speed
ppo_er.pendulum.L2          python $ROOT/ppo_er.py --env-id Pendulum-v1 --total-timesteps 100000 --replay-batches 2 --exp-name speed
ppo_er.pendulum.L1          python $ROOT/ppo_er.py --env-id Pendulum-v1 --total-timesteps 100000 --replay-batches 1 --exp-name speed
ROWS
  fi
  cat <<ROWS
ppo_ewma.procgen.ewma       python $ROOT/ppo_ewma.py $procgen --exp-name speed --noise-scale
ppo_ewma.procgen.no-ewma    python $ROOT/ppo_ewma.py $procgen --exp-name speed --no-ewma --noise-scale
ppo_ewma.procgen.no-noise   python $ROOT/ppo_ewma.py $procgen --exp-name speed
ppg_ewma.procgen.ewma       python $ROOT/ppg_ewma.py $procgen --exp-name speed --noise-scale
ppg_ewma.procgen.no-ewma    python $ROOT/ppg_ewma.py $procgen --exp-name speed --no-ewma --noise-scale
ppo_staleness.procgen.k0    python $ROOT/ppo_staleness.py $procgen --staleness 0 --exp-name speed
vmpo.procgen                python $ROOT/vmpo.py $procgen --exp-name speed
ppo_er.halfcheetah.L2       python $ROOT/ppo_er.py --env-id HalfCheetah-v5 --total-timesteps 16384 --replay-batches 2 --exp-name speed
ppo_er.halfcheetah.L1       python $ROOT/ppo_er.py --env-id HalfCheetah-v5 --total-timesteps 16384 --replay-batches 1 --exp-name speed
ROWS
}

if [ "${1:-}" = --list ]; then rows | sed -E 's/^[^ ]+ +//'; exit 0; fi

run_row() {  # label command...: the command's output to label.log, its wall and CPU seconds to label.time
  label=$1; shift
  /usr/bin/time -f "%e %U %S" -o "$label.time" "$@" > "$label.log" 2>&1
}
export -f run_row
mkdir -p "$OUT" && cd "$OUT"
rows | xargs -P "$JOBS" -L 1 bash -c 'run_row "$@"' _

echo "| run | steps | SPS (script) | wall-clock s | CPU s (user + sys) |"
echo "|---|---:|---:|---:|---:|"
rows | while read -r label _; do
  last=$(grep '^step ' "$label.log" | tail -n 1)  # "step N/TOTAL (100%)  mean_return R  SPS S  elapsed ..."
  steps=$(echo "$last" | awk '{split($2, a, "/"); print a[1]}')
  sps=$(echo "$last" | awk '{for (i = 1; i < NF; i++) if ($i == "SPS") print $(i + 1)}')
  read -r wall user sys < "$label.time"
  echo "| $label | $steps | $sps | $wall | $(awk "BEGIN {print $user + $sys}") |"
done
