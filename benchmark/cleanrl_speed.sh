#!/usr/bin/env bash
# ppo_ewma.py's PPO against CleanRL's ppo_continuous_action.py on the same CPU
# (docs/speed.md#against-cleanrl-on-the-cpu):
# Hopper-v5 at the PPO paper's MuJoCo settings (1 env x 2048 steps, 10 epochs of 32 minibatches, step size 3e-4),
# both with CleanRL's defaults (the step size annealed linearly, a clipped value loss, gradient norm 0.5), STEPS env
# steps each (default 40,960: 20 iterations), one torch thread each. Whole processes are timed, start-up included,
# wall-clock and CPU time (user + system, of the process and its children: inductor's compile workers). The rounds
# interleave, ours first in odd rounds and CleanRL first in even ones, so that a drift of the machine's load falls on
# both. OURS_FLAGS adds flags to ours (e.g. OURS_FLAGS=--no-ewma); each process gets an empty inductor cache, so that
# a compiled run pays its compile. It prints each time and mean(CleanRL) / mean(ours), the ratio of steps per
# second, for both clocks. Time nothing else meanwhile: the load (uptime) is printed at the start and the end.
# Usage: bash benchmark/cleanrl_speed.sh, which fetches CleanRL's file with curl; without a network,
# CLEANRL=path/to/ppo_continuous_action.py bash benchmark/cleanrl_speed.sh (the file at commit fe8d8a03, 2026-04-20);
# SPLIT=1 adds where each spends an iteration (below), a minute more.
# The file is patched in its one line that Gymnasium 1.x refuses: TransformObservation now takes the observation
# space (PATCH below). Cost here: about 5 minutes at the defaults.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
STEPS=${STEPS:-40960}
ROUNDS=${ROUNDS:-3}
OURS_FLAGS=${OURS_FLAGS:-}
COMMIT=fe8d8a03c41a7ef5b523e2e354bd01c363e786bb
PATCH='s/TransformObservation(env, lambda obs: np.clip(obs, -10, 10))/TransformObservation(env, lambda obs: np.clip(obs, -10, 10), env.observation_space)/'
WORK=$(mktemp -d)
trap 'echo "load at the end: $(uptime)"; rm -rf "$WORK"' EXIT
if [ -n "${CLEANRL:-}" ]; then
  cp "$CLEANRL" "$WORK/original.py"
elif ! curl -fsSL "https://raw.githubusercontent.com/vwxyzjn/cleanrl/$COMMIT/cleanrl/ppo_continuous_action.py" \
    -o "$WORK/original.py"; then
  echo "CleanRL's file could not be fetched: give it as CLEANRL=path/to/ppo_continuous_action.py (commit ${COMMIT:0:8})"
  exit 1
fi
sed "$PATCH" "$WORK/original.py" > "$WORK/ppo_continuous_action.py"
diff "$WORK/original.py" "$WORK/ppo_continuous_action.py" > /dev/null && { echo "the patch did not apply"; exit 1; }

export OMP_NUM_THREADS=1
flags="--env-id Hopper-v5 --no-ewma --num-envs 1 --num-steps 2048 --num-minibatches 32 --update-epochs 10 \
  --shuffle-samples --learning-rate 3e-4 --gamma 0.99 --lr-schedule linear --clip-vloss --max-grad-norm 0.5 \
  --total-timesteps $STEPS --no-cuda --torch-threads 1 --checkpoint-every 0 --no-save-model $OURS_FLAGS"
ours="python $ROOT/ppo_ewma.py $flags"
cleanrl="python $WORK/ppo_continuous_action.py --env-id Hopper-v5 --total-timesteps $STEPS --no-cuda"
seconds() {  # "wall cpu": the seconds of one whole process, run in the scratch directory with an empty inductor cache
  local cache
  cache=$(mktemp -d -p "$WORK")
  (cd "$WORK" && TORCHINDUCTOR_CACHE_DIR=$cache /usr/bin/time -f "%e %U %S" -o "$WORK/time" $1 > "$WORK/log" 2>&1) ||
    { tail -5 "$WORK/log" >&2; exit 1; }
  rm -rf "$cache"
  awk '{print $1, $2 + $3}' "$WORK/time"
}
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); $STEPS steps, $ROUNDS rounds${OURS_FLAGS:+; ours with $OURS_FLAGS}"
echo "commit $(git -C "$ROOT" describe --always --dirty 2> /dev/null || echo unknown); load at the start: $(uptime)"
ours_times=() cleanrl_times=()
for round in $(seq "$ROUNDS"); do
  if [ $((round % 2)) -eq 1 ]; then
    ours_times+=("$(seconds "$ours")")
    cleanrl_times+=("$(seconds "$cleanrl")")
  else
    cleanrl_times+=("$(seconds "$cleanrl")")
    ours_times+=("$(seconds "$ours")")
  fi
  echo "round $round: ours ${ours_times[-1]/ / s wall, } s CPU, CleanRL ${cleanrl_times[-1]/ / s wall, } s CPU"
done
python - "${ours_times[*]}" "${cleanrl_times[*]}" "$STEPS" <<'PY'
import sys
ours, cleanrl, steps = [[float(x) for x in arg.split()] for arg in sys.argv[1:3]] + [int(sys.argv[3])]
for name, index in (("wall-clock", 0), ("CPU time", 1)):
    mine, theirs = sum(ours[index::2]) / len(ours[index::2]), sum(cleanrl[index::2]) / len(cleanrl[index::2])
    print(f"{name}: ours {mine:.1f} s ({steps / mine:,.0f} steps/s), CleanRL {theirs:.1f} s ({steps / theirs:,.0f} "
          f"steps/s): ours {theirs / mine:.2f}x CleanRL's steps per second")
PY

# SPLIT=1: then where an iteration's time goes in each, means of iterations 2-5: the env stack's steps, the rest of the
# rollout (the acting pass, the conversions and storage) and the update (GAE and the logging included). CleanRL's
# file with timer lines added (at its rollout's start, around its env steps, and at its bootstrap, where its update
# starts), ours through benchmark/gpu_timing.py. CleanRL scales the rewards in its env stack, ours in the update.
[ "${SPLIT:-0}" = 1 ] || exit 0
cat > "$WORK/timers.sed" <<'SED'
/^        for step in range(0, args.num_steps):/i\
        if "sp_t1" in globals(): print("split", sp_env, sp_t1 - sp_t0 - sp_env, time.time() - sp_t1)
s/^        for step in range(0, args.num_steps):/        sp_t0, sp_env = time.time(), 0.0\n&/
s/^            next_obs, .* = envs.step(.*/            sp_e = time.time()\n&\n            sp_env += time.time() - sp_e/
s/^        # bootstrap value if not done/        sp_t1 = time.time()\n&/
SED
sed -f "$WORK/timers.sed" "$WORK/ppo_continuous_action.py" > "$WORK/split.py"
[ "$(grep -c "sp_" "$WORK/split.py")" = 5 ] || { echo "the timer lines did not apply"; exit 1; }
(cd "$WORK" && python split.py --env-id Hopper-v5 --total-timesteps 12288 --no-cuda > log 2>&1) ||
  { tail -5 "$WORK/log" >&2; exit 1; }
awk '/^split/ && ++n > 1 {
  e += $2; r += $3; u += $4 } END { n -= 1
  printf "CleanRL: env step %.2f s, rollout inference %.2f s, update %.2f s\n", e / n, r / n, u / n }' "$WORK/log"
(cd "$WORK" && python "$ROOT/benchmark/gpu_timing.py" --iterations 5 -- $flags > log 2>&1) ||
  { tail -5 "$WORK/log" >&2; exit 1; }
grep "^mean of iterations" "$WORK/log" | sed 's/^/ours: /'
