#!/usr/bin/env bash
# ppo_ewma_rnn.py's recurrent policy (docs/ppo_ewma_rnn.md) and ppo_ewma.py's --norm-value (docs/ppo_ewma.md).
# The runs were made with ppo_ewma.py --rnn, before the recurrent policy moved into ppo_ewma_rnn.py, which logs them bit for
# bit (benchmark/results/ppo_rnn_move.txt): the lines below run the move's script.
# The plan, committed before any of these runs (seed 1 of --rnn lstm was tried once on the masked task for 141k of
# 300k steps, where it was already at 473, to choose the budget: the CartPole recipe's own 200k steps):
# - CartPole-v1 without its velocities (benchmark/masked_cartpole.py), the README's CartPole recipe (8 envs x 128
#   steps, M = 8: each minibatch one env's whole 128-step unroll, E = 3, gamma 0.99), 200k steps, seeds 1-3:
#   PPO-EWMA with --rnn lstm, with --rnn gru, and feed-forward (the same whole-trajectory minibatches: the default
#   layout while M <= N); and PPO (--no-ewma) with --rnn lstm, against PPO-EWMA's --rnn lstm runs.
#   Rule (the issue's goal): every seed of --rnn lstm and of --rnn gru above 400 over its last 10% of steps, every
#   feed-forward seed below 100, with the difference's 95% Welch interval. PPO-EWMA against PPO: reported as it is.
# - HalfCheetah-v5, the README's MuJoCo recipe (PPO at the PPO paper's settings: 1 env x 2048 steps, 32 minibatches of
#   single samples, 10 epochs, lr 3e-4, --no-ewma), 1M steps, seeds 1-3, with --norm-value against without: the
#   difference over the last 10% of steps and its interval, reported as it is.
# The runs go two at a time (JOBS=2), OMP_NUM_THREADS=1, in the order listed, so that each pair compares under the same
# load (charts/SPS: the cost of the core and of the preprocessor). Cost here (2 cores): the 12 masked CartPole runs
# about 50 minutes, the 6 HalfCheetah runs 12-14 minutes each, about 40 minutes two at a time.
# `bash benchmark/ppo_rnn.sh --list` prints the runs; `bash benchmark/ppo_rnn.sh REGEX` runs those that REGEX matches;
# `bash benchmark/ppo_rnn.sh --plot` prints the tables and draws docs/img/ppo_rnn_*.png from the committed curves.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
JOBS=${JOBS:-2}
OUT="$ROOT/benchmark/runs/ppo_rnn"
DATA=${RESULTS:-$ROOT/benchmark/results}/ppo_rnn.csv.xz  # the committed curves, which the tables and plots read
MASKED="--env-id masked_cartpole:MaskedCartPole-v1 --num-envs 8 --num-steps 128 --gamma 0.99 --total-timesteps 200000"
CHEETAH="--env-id HalfCheetah-v5 --num-envs 1 --num-steps 2048 --num-minibatches 32 --update-epochs 10"
CHEETAH="$CHEETAH --shuffle-samples --learning-rate 3e-4 --gamma 0.99 --no-ewma --total-timesteps 1000000"

runs() {
  for seed in 1 2 3; do
    echo "python $ROOT/ppo_ewma_rnn.py $MASKED --rnn lstm --seed $seed --exp-name lstm"
    echo "python $ROOT/ppo_ewma_rnn.py $MASKED --rnn gru --seed $seed --exp-name gru"
    echo "python $ROOT/ppo_ewma_rnn.py $MASKED --rnn lstm --no-ewma --seed $seed --exp-name lstm-ppo"
    echo "python $ROOT/ppo_ewma.py $MASKED --seed $seed --exp-name ff"
  done
  for seed in 1 2 3; do
    echo "python $ROOT/ppo_ewma.py $CHEETAH --norm-value --seed $seed --exp-name norm-value"
    echo "python $ROOT/ppo_ewma.py $CHEETAH --seed $seed --exp-name recipe"
  done
}
if [ "${1:-}" = --list ]; then runs; exit 0; fi

if [ "${1:-}" != --plot ]; then  # --plot: the tables and plots alone, from $DATA
  mkdir -p "$OUT" && cd "$OUT"
  export OMP_NUM_THREADS=1 PYTHONPATH="$ROOT/benchmark${PYTHONPATH:+:$PYTHONPATH}"  # masked_cartpole's folder
  runs | { grep -E -- "${1:-.}" || true; } | xargs -P "$JOBS" -I{} sh -c '{} --no-cuda > /dev/null 2>&1'
  python "$ROOT/benchmark/plot.py" "$OUT/runs" --export "$DATA"
fi
MASKED_GROUP='^masked_cartpole-MaskedCartPole-v1__(lstm|gru|lstm-ppo|ff)__\d+__\d+$'
python "$ROOT/benchmark/plot.py" "$DATA" --group "$MASKED_GROUP" --window 0.1 \
  --compare lstm=ff --compare gru=ff --compare lstm=lstm-ppo --out "$ROOT/docs/img/ppo_rnn_masked_cartpole.png" \
  --title "PPO-EWMA on CartPole-v1 without velocities, 200k steps" --label '^lstm$=--rnn lstm' \
  --label '^gru$=--rnn gru' --label '^lstm-ppo$=--rnn lstm --no-ewma (PPO)' --label '^ff$=feed-forward'
python "$ROOT/benchmark/plot.py" "$DATA" --group "$MASKED_GROUP" --tag charts/SPS --compare lstm=ff --ratio | tail -n +3
CHEETAH_GROUP='^HalfCheetah-v5__(norm-value|recipe)__\d+__\d+$'
if grep -q ",norm-value," <(xzcat "$DATA"); then
  python "$ROOT/benchmark/plot.py" "$DATA" --group "$CHEETAH_GROUP" --window 0.1 --compare norm-value=recipe \
    --out "$ROOT/docs/img/ppo_norm_value_halfcheetah.png" --title "PPO's HalfCheetah-v5 recipe, 1M steps" \
    --label '^norm-value$=--norm-value' --label '^recipe$=the recipe'
  python "$ROOT/benchmark/plot.py" "$DATA" --group "$CHEETAH_GROUP" --tag charts/SPS --compare norm-value=recipe \
    --ratio | tail -n +3
fi
