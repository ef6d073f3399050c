#!/usr/bin/env bash
# Is --compile faster over a whole run, its compile included? (docs/speed.md#--compile-on-the-cpu) One ppo_ewma.py
# command run eager and with --compile, whole processes, each with an empty inductor cache and one torch thread,
# ROUNDS rounds (default 1) interleaved: eager first in odd rounds, compiled first in even ones. It prints the
# wall-clock and CPU seconds (user + system, compile workers included) of each process, and eager / compiled.
# Usage: bash benchmark/compile.sh [flags of ppo_ewma.py]; without flags, the docstring's MuJoCo recipe (HalfCheetah-v5
# PPO, 1M steps: about 19 minutes a round here). Time nothing else meanwhile: the load (uptime) is printed at the
# start and the end. ppo_ewma.py lost --compile in 98e904e, after these measurements found no gain: CODE names a
# checkout that has it (git worktree add /tmp/with-compile 8cd22cd; CODE=/tmp/with-compile bash benchmark/compile.sh).
set -euo pipefail
ROOT=${CODE:-$(cd "$(dirname "$0")/.." && pwd)}
grep -q "compile: bool" "$ROOT/ppo_ewma.py" ||
  { echo "$ROOT/ppo_ewma.py has no --compile (removed in 98e904e): set CODE to a checkout of 8cd22cd" >&2; exit 1; }
ROUNDS=${ROUNDS:-1}
FLAGS=${*:-"--env-id HalfCheetah-v5 --num-envs 1 --num-steps 2048 --num-minibatches 32 --update-epochs 10 \
  --shuffle-samples --learning-rate 3e-4 --gamma 0.99 --no-ewma --total-timesteps 1000000"}
WORK=$(mktemp -d)
trap 'echo "load at the end: $(uptime)"; rm -rf "$WORK"' EXIT
export OMP_NUM_THREADS=1
seconds() {  # "wall cpu" of one whole run of ppo_ewma.py with these extra flags, in the scratch directory
  local cache
  cache=$(mktemp -d -p "$WORK")
  (cd "$WORK" && TORCHINDUCTOR_CACHE_DIR=$cache /usr/bin/time -f "%e %U %S" -o "$WORK/time" python "$ROOT/ppo_ewma.py" \
    $FLAGS --no-cuda --torch-threads 1 --checkpoint-every 0 --no-save-model "$@" > "$WORK/log" 2>&1) ||
    { tail -5 "$WORK/log" >&2; exit 1; }
  rm -rf "$cache" "$WORK/runs"
  awk '{print $1, $2 + $3}' "$WORK/time"
}
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); ppo_ewma.py $FLAGS; $ROUNDS rounds"
echo "commit $(git -C "$ROOT" describe --always --dirty 2> /dev/null || echo unknown); load at the start: $(uptime)"
eager=() compiled=()
for round in $(seq "$ROUNDS"); do
  if [ $((round % 2)) -eq 1 ]; then
    eager+=("$(seconds)")
    compiled+=("$(seconds --compile)")
  else
    compiled+=("$(seconds --compile)")
    eager+=("$(seconds)")
  fi
  echo "round $round: eager ${eager[-1]/ / s wall, } s CPU; --compile ${compiled[-1]/ / s wall, } s CPU"
done
python - "${eager[*]}" "${compiled[*]}" <<'PY'
import sys
eager, compiled = [[float(x) for x in arg.split()] for arg in sys.argv[1:3]]
for name, index in (("wall-clock", 0), ("CPU time", 1)):
    e, c = sum(eager[index::2]) / len(eager[index::2]), sum(compiled[index::2]) / len(compiled[index::2])
    print(f"{name}: eager {e:.1f} s, --compile {c:.1f} s: --compile {e / c:.2f}x as fast")
PY
