#!/usr/bin/env bash
# ppo_ewma.py's PPO against CleanRL's ppo_continuous_action.py on the same CPU (docs/speed.md#against-cleanrl):
# Hopper-v5 at the PPO paper's MuJoCo settings (1 env x 2048 steps, 10 epochs of 32 minibatches, step size 3e-4),
# both with CleanRL's defaults (the step size annealed linearly, a clipped value loss, gradient norm 0.5), STEPS env
# steps each (default 40,960: 20 iterations), one torch thread each, run alternately ROUNDS times (default 3). Whole
# processes are timed, start-up included; it prints each time and mean(CleanRL) / mean(ours), the ratio of steps
# per second. Time nothing else meanwhile.
# CleanRL's file is taken at commit fe8d8a03 (2026-04-20), CLEANRL=path/to/ppo_continuous_action.py or fetched from
# GitHub, and patched in its one line that Gymnasium 1.x refuses: TransformObservation now takes the observation
# space (PATCH below). Cost here: about 6 minutes at the defaults.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
STEPS=${STEPS:-40960}
ROUNDS=${ROUNDS:-3}
COMMIT=fe8d8a03c41a7ef5b523e2e354bd01c363e786bb
PATCH='s/TransformObservation(env, lambda obs: np.clip(obs, -10, 10))/TransformObservation(env, lambda obs: np.clip(obs, -10, 10), env.observation_space)/'
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
if [ -n "${CLEANRL:-}" ]; then
  cp "$CLEANRL" "$WORK/original.py"
else
  curl -fsSL "https://raw.githubusercontent.com/vwxyzjn/cleanrl/$COMMIT/cleanrl/ppo_continuous_action.py" \
    -o "$WORK/original.py"
fi
sed "$PATCH" "$WORK/original.py" > "$WORK/ppo_continuous_action.py"
diff "$WORK/original.py" "$WORK/ppo_continuous_action.py" > /dev/null && { echo "the patch did not apply"; exit 1; }

export OMP_NUM_THREADS=1
ours="python $ROOT/ppo_ewma.py --env-id Hopper-v5 --no-ewma --num-envs 1 --num-steps 2048 --num-minibatches 32 \
  --update-epochs 10 --shuffle-samples --learning-rate 3e-4 --gamma 0.99 --lr-schedule linear --clip-vloss \
  --max-grad-norm 0.5 --total-timesteps $STEPS --no-cuda --torch-threads 1 --checkpoint-every 0 --no-save-model"
cleanrl="python $WORK/ppo_continuous_action.py --env-id Hopper-v5 --total-timesteps $STEPS --no-cuda"
seconds() {  # the wall-clock seconds of one whole process, run in the scratch directory
  local start end
  start=$(date +%s.%N)
  (cd "$WORK" && $1 > /dev/null 2>&1)
  end=$(date +%s.%N)
  python -c "print(round($end - $start, 2))"
}
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); $STEPS steps, $ROUNDS rounds"
ours_times=() cleanrl_times=()
for round in $(seq "$ROUNDS"); do
  ours_times+=("$(seconds "$ours")")
  cleanrl_times+=("$(seconds "$cleanrl")")
  echo "round $round: ours ${ours_times[-1]} s, CleanRL ${cleanrl_times[-1]} s"
done
python - "${ours_times[*]}" "${cleanrl_times[*]}" "$STEPS" <<'PY'
import sys
ours, cleanrl, steps = [float(x) for x in sys.argv[1].split()], [float(x) for x in sys.argv[2].split()], int(sys.argv[3])
mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
print(f"ours {mean(ours):.1f} s ({steps / mean(ours):,.0f} steps/s), CleanRL {mean(cleanrl):.1f} s "
      f"({steps / mean(cleanrl):,.0f} steps/s): ours {mean(cleanrl) / mean(ours):.2f}x CleanRL's steps per second")
PY
