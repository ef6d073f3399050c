#!/usr/bin/env bash
# When does batch size-invariance hold? The Sec. 4 adjustments hold only while the batch is small against the
# critical batch size (Appendix C), which the gradient noise scale B_simple of McCandlish et al. (2018) estimates.
# PPG-EWMA and PPO-EWMA with one policy epoch, all adjustments and the linear step-size rule (Fig. 5), at
# c = 1, 8, 32 (c = 1 is the same run under both rules), 4 seeds, on two tasks:
# - Acrobot-v1: invariance.sh's base config (64 envs x 32 steps at c = 1, 8 minibatches, N_pi 4, aux
#   minibatch 256, gamma 0.99, 80k steps);
# - CartPole-v1: 32 envs x 32 steps at c = 1, 8 minibatches, N_pi 4, aux minibatch 256, gamma 0.99, 50k steps.
# Every run evaluates its policy at 10 fixed env-step marks on 20 envs of its own (--eval-every): the tables
# compare the final evaluation, which does not lag as episode ends do, and log B_simple (charts/grad_noise_scale)
# next to the minibatch size (charts/minibatch_size).
# Cost here (2 CPU cores, JOBS=1 beside the MuJoCo runs on the other core): see docs/benchmarks.md.
# `bash benchmark/regime.sh --list` prints the runs, one per line; `bash benchmark/regime.sh 'REGEX'` runs only those
# whose line matches (the others keep their committed data).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
JOBS=${JOBS:-1}
OUT="$ROOT/benchmark/runs/regime"
DATA=${RESULTS:-$ROOT/benchmark/results}/regime.csv.xz  # the committed curves, which the tables and plots read

runs() {
  for seed in 1 2 3 4; do
    for task in Acrobot-v1 CartPole-v1; do
      if [ $task = Acrobot-v1 ]; then
        base="--env-id $task --num-envs 64 --num-steps 32 --gamma 0.99 --total-timesteps 80000 --eval-every 8000"
      else
        base="--env-id $task --num-envs 32 --num-steps 32 --gamma 0.99 --total-timesteps 50000 --eval-every 5000"
      fi
      base="$base --eval-episodes 20 --seed $seed"
      for c in 1 8 32; do for rule in sqrt linear; do
        echo "python $ROOT/ppg_ewma.py $base --n-pi 4 --aux-minibatch-size 256 --batch-divisor $c --lr-rule $rule --noise-scale --exp-name ppg-$rule-c$c"
        echo "python $ROOT/ppo_ewma.py $base --update-epochs 1 --batch-divisor $c --lr-rule $rule --noise-scale --exp-name ppo-$rule-c$c"
      done; done
    done
  done
}
if [ "${1:-}" = --list ]; then runs; exit 0; fi

if [ "${1:-}" != --plot ]; then  # --plot: the tables and plots alone, from $DATA
  mkdir -p "$OUT" && cd "$OUT"
  export OMP_NUM_THREADS=1
  runs | { grep -E -- "${1:-.}" || true; } | xargs -r -P "$JOBS" -I{} sh -c '{} > /dev/null 2>&1'
  python "$ROOT/benchmark/plot.py" "$OUT/runs" --export "$DATA" --tags charts/episodic_return charts/SPS \
    eval/mean_return charts/grad_noise_trace charts/grad_sq_norm charts/minibatch_size
fi
for task in Acrobot-v1 CartPole-v1; do
  envs=$([ $task = Acrobot-v1 ] && echo 64 || echo 32)
  labels=()
  for c in 1 8 32; do n=$((envs / c)); labels+=(--label "-c$c\$=c = $c ($n env$([ $n = 1 ] || echo s))"); done
  for algo in ppg ppo; do for rule in sqrt linear; do
    what=$([ $algo = ppg ] && echo "PPG-EWMA" || echo "PPO-EWMA, 1 epoch")
    rule_text=$([ $rule = sqrt ] && echo "all adjustments" || echo "linear step-size rule")
    python "$ROOT/benchmark/plot.py" "$DATA" --group "^${task}__(${algo}-${rule}-c\d+)__\d+__\d+$" \
      --tag eval/mean_return --bins 10 --window 0.05 --divisor-regex='-c(\d+)$' "${labels[@]}" \
      --out "$ROOT/docs/img/regime_${task%-v1}_${algo}_${rule}.png" --title "$what, $rule_text: batch / c ($task)"
  done; done
  for half in 1.0 0.5; do  # B_simple over the whole run and over its second half: tr(Sigma) / |G|^2 of the window
    python "$ROOT/benchmark/plot.py" "$DATA" --group "^${task}__((?:ppg|ppo)-sqrt-c\d+)__\d+__\d+$" \
      --tag charts/grad_noise_trace --per charts/grad_sq_norm --window $half
  done
  python "$ROOT/benchmark/plot.py" "$DATA" --group "^${task}__((?:ppg|ppo)-sqrt-c\d+)__\d+__\d+$" \
    --tag charts/minibatch_size --window 0.5
done
