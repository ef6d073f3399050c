#!/usr/bin/env bash
# torchrun workers against one process with the same total batch, seeds 1, 2, 3 (SCALE=cpu, the default):
# - PPO-EWMA with the README's CartPole-v1 CPU recipe (8 envs x 128 steps, 200k steps): 1 process x 8 envs and 2
#   torchrun workers x 4 envs. Cost here (2 CPU cores, OMP_NUM_THREADS=1, one run at a time, 2026-11-22): 6 runs, 2.4
#   minutes of wall-clock (16 s per one-process run, 30 s per 2-worker run).
# - V-MPO with its CartPole-v1 and Pendulum-v1 CPU recipes (8 envs each), and PPO-ER on Pendulum-v1 (its recipe with
#   4 actors x 512 steps, the same batch of 2,048 as the recipe's 1 x 2,048, so that 2 workers can split the actors),
#   as 1 process and 2 workers x half the envs (vmpo_*, ppo_er_* variants).
# SCALE=paper: Procgen starpilot (hard), 100M steps, the paper's default of 4 workers x 64 envs (4 GPUs), 1 process x
# 256 envs (1 GPU) and the paper's 1-worker run (--batch-divisor 4): a GPU job.
# Then: docs/img/torchrun_*.png, benchmark/plot.py's final-return tables with two workers minus one process, and for
# the PPO-EWMA runs: the step where the mean of the last 100 episodes first reached 450, that mean at the end,
# wall-clock seconds and steps per second.
# `bash benchmark/torchrun.sh --list` prints the runs, one per line, for a cluster scheduler; `bash
# benchmark/torchrun.sh REGEX` runs those of them that REGEX matches (e.g. 'vmpo|ppo_er').
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SCALE=${SCALE:-cpu}
OUT="$ROOT/benchmark/runs/torchrun"
DATA=${RESULTS:-$ROOT/benchmark/results}/torchrun.csv.xz  # the committed curves, which the tables and plots read
VMPO_CARTPOLE="--env-id CartPole-v1 --num-envs 8 --num-steps 128 --num-minibatches 4 --gamma 0.99 --total-timesteps 150000 --learning-rate 1e-3 --multiplier-lr 1e-2"
VMPO_PENDULUM="--env-id Pendulum-v1 --num-envs 8 --num-steps 256 --num-minibatches 8 --update-epochs 10 --gamma 0.9 --total-timesteps 300000 --learning-rate 1e-3 --multiplier-lr 1e-2 --norm-obs False"
PPO_ER_PENDULUM="--env-id Pendulum-v1 --num-envs 4 --num-steps 512 --total-timesteps 100000 --norm-obs False"

runs() {
  for seed in 1 2 3; do
    if [ "$SCALE" = cpu ]; then
      echo "python $ROOT/ppo_ewma.py --env-id CartPole-v1 --num-envs 8 --num-steps 128 --gamma 0.99 --total-timesteps 200000 --seed $seed --exp-name one_process"
      echo "torchrun --standalone --nproc_per_node 2 $ROOT/ppo_ewma.py --env-id CartPole-v1 --num-envs 8 --num-steps 128 --gamma 0.99 --total-timesteps 200000 --seed $seed --exp-name two_workers"
      for script_flags in "vmpo.py $VMPO_CARTPOLE" "vmpo.py $VMPO_PENDULUM" "ppo_er.py $PPO_ER_PENDULUM"; do
        name=${script_flags%%.py*}
        echo "python $ROOT/$script_flags --seed $seed --exp-name ${name}_one_process"
        echo "torchrun --standalone --nproc_per_node 2 $ROOT/$script_flags --seed $seed --exp-name ${name}_two_workers"
      done
    else
      echo "python $ROOT/ppo_ewma.py --seed $seed --exp-name one_process"
      echo "torchrun --standalone --nproc_per_node 4 $ROOT/ppo_ewma.py --seed $seed --exp-name four_workers"
      echo "python $ROOT/ppo_ewma.py --batch-divisor 4 --seed $seed --exp-name one_worker_c4"
    fi
  done
}
if [ "${1:-}" = --list ]; then runs; exit 0; fi

if [ "${1:-}" != --plot ]; then  # --plot: the tables and plots alone, from $DATA (wall-clock: from $OUT, if there)
  mkdir -p "$OUT" && cd "$OUT"
  export OMP_NUM_THREADS=1
  runs | { grep -E -- "${1:-.}" || true; } | while read -r run; do
    /usr/bin/time -a -o wall_clock.txt -f "%e $run" sh -c "$run > /dev/null 2>&1"
  done
  python "$ROOT/benchmark/plot.py" "$OUT/runs" --export "$DATA"
fi
if [ "$SCALE" = cpu ]; then
  env=CartPole-v1 labels=(--label '^one_process$=1 process x 8 envs' --label '^two_workers$=2 torchrun workers x 4 envs')
else
  env=starpilot labels=(--label '^one_process$=1 process x 256 envs' --label '^four_workers$=4 torchrun workers x 64 envs'
    --label '^one_worker_c4$=1 process x 64 envs (--batch-divisor 4)')
fi
python "$ROOT/benchmark/plot.py" "$DATA" --group "^${env}__(one_process|two_workers|four_workers|one_worker_c4)__\d+__\d+$" \
  --window 0.1 --out "$ROOT/docs/img/torchrun_$([ "$SCALE" = cpu ] && echo cartpole || echo starpilot).png" \
  --title "PPO-EWMA: one process vs torchrun workers, same total batch ($env)" "${labels[@]}"
if [ "$SCALE" = cpu ]; then  # V-MPO and PPO-ER: the final return over the last 10% of steps, two workers - one process
  for script_env in vmpo:CartPole-v1 vmpo:Pendulum-v1 ppo_er:Pendulum-v1; do
    script=${script_env%%:*} env=${script_env#*:}
    grep -q "^$env,${script}_one_process," <(xzcat "$DATA" 2> /dev/null) || continue
    python "$ROOT/benchmark/plot.py" "$DATA" --group "^${env}__(${script}_one_process|${script}_two_workers)__\d+__\d+$" \
      --window 0.1 --compare "${script}_two_workers=${script}_one_process" \
      --out "$ROOT/docs/img/torchrun_${script}_${env%%-*}.png" --title "$script: one process vs 2 torchrun workers ($env)" \
      --label "_one_process$=1 process x all envs" --label "_two_workers$=2 torchrun workers x half the envs"
  done
fi
python - "$ROOT" "$OUT" "$DATA" <<'EOF'
import os, re, sys
import numpy as np
sys.path.insert(0, os.path.join(sys.argv[1], "benchmark"))
from plot import list_runs, read_scalars
wall, timed = {}, os.path.join(sys.argv[2], "wall_clock.txt")
for line in open(timed) if os.path.exists(timed) else []:
    seconds, run = line.split(" ", 1)
    wall[re.search(r"--exp-name (\w+)", run).group(1), re.search(r"--seed (\d+)", run).group(1)] = float(seconds)
print("| variant | seed | first step with 100-episode mean >= 450 | final 100-episode mean | wall-clock (s) | SPS |")
print("|---|---:|---:|---:|---:|---:|")
for run_dir in sorted(list_runs(sys.argv[3])):
    name, seed = re.search(r"__(\w+)__(\d+)__\d+$", run_dir).groups()
    if name not in ("one_process", "two_workers", "four_workers", "one_worker_c4"):  # PPO-EWMA's runs only
        continue
    steps, returns = read_scalars(run_dir, "charts/episodic_return")
    means = np.array([returns[max(0, i - 99):i + 1].mean() for i in range(len(returns))])
    reached = steps[np.argmax(means >= 450)] if np.any(means >= 450) else float("nan")
    sps = read_scalars(run_dir, "charts/SPS")[1][-1]
    print(f"| {name} | {seed} | {reached:,.0f} | {means[-1]:.1f} | {wall.get((name, seed), float('nan')):.1f} | {sps:,.0f} |")
EOF
