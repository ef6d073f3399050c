#!/usr/bin/env bash
# V-MPO on MuJoCo at 1M steps against PPO at the same seeds (docs/vmpo.md): HalfCheetah-v5, Hopper-v5 and
# Walker2d-v5, seeds 1-3, the V-MPO runs first (about 6 minutes each here), then PPO's (ppo_ewma.py --no-ewma at
# the PPO paper's MuJoCo settings: the very command of mujoco_ewma.sh's `ppo`, so both scripts share those runs
# when given the same OUT).
# Fixed before the runs: the final return is each seed's mean over its last 10% of steps (100k); the thresholds
# are 1,000 (HalfCheetah), 1,500 (Hopper, Walker2d), as in mujoco_ewma.sh.
# Then the ablation of docs/vmpo.md, planned before its runs: the recipe with one change each (flags() below, in
# the plan's order), Hopper-v5 and Walker2d-v5, seeds 1-3, against the recipe's and PPO's runs above: 42 runs,
# 8-14 minutes each two at a time (n39: 22-25), about 4.5 hours here (2026-11-25/26).
# Then part two of docs/vmpo.md, planned before its runs: the mean's KL bound, the advantage estimator (PART2, 30
# runs at 1M steps: Hopper-v5 and Walker2d-v5, seeds 1-3; the plan's second bound is one of two; `vmpo-rerun` is the
# recipe again, for its final models), the best variant on HalfCheetah-v5, `--eval` of final models (sampled and
# the policy's mean) and Walker2d-v5 at 5M steps ("5m-" runs, each 5x a 1M run), from a worktree pinned at a commit.
# Resumable: each run writes checkpoint.safetensors every 25 iterations and on SIGINT/SIGTERM; running this again resumes the
# unfinished runs and skips the finished ones (model.safetensors). `bash benchmark/vmpo_mujoco.sh --list` prints the runs;
# `bash benchmark/vmpo_mujoco.sh 'REGEX'` runs only those whose line matches, `--plot` none; then the tables and
# figures are made from the runs that finished. OUT=DIR keeps the runs outside the work tree.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
JOBS=${JOBS:-2}
OUT=${OUT:-$ROOT/benchmark/runs/mujoco}
DATA=${RESULTS:-$ROOT/benchmark/results}/vmpo_mujoco.csv.xz
EVAL=${RESULTS:-$ROOT/benchmark/results}/vmpo_mujoco_eval.csv
VMPO="vmpo.py --num-envs 8 --num-steps 256 --num-minibatches 8 --update-epochs 10 --gamma 0.99"
VMPO="$VMPO --learning-rate 3e-4 --multiplier-lr 1e-2 --total-timesteps 1000000"
PPO="ppo_ewma.py --no-ewma --num-envs 1 --num-steps 2048 --num-minibatches 32 --update-epochs 10 --shuffle-samples"
PPO="$PPO --learning-rate 3e-4 --gamma 0.99 --gae-lambda 0.95 --clip-coef 0.2 --ent-coef 0 --total-timesteps 1000000"

ABLATION="vmpo-std-bound vmpo-std-global vmpo-multiplier-lr vmpo-top-k vmpo-passes vmpo-target-period vmpo-n39"
CHANGES="vmpo-mean-bound vmpo-gae vmpo-mean-bound-0.2 vmpo-mean-bound-0.02 vmpo-mean-bound-gae"  # part two's
PART2="$CHANGES vmpo-rerun"
flags() {  # a V-MPO variant's change to the recipe (given after it, so it overrides the recipe's value)
  case $1 in
    5m-*) echo "$(flags "${1#5m-}") --total-timesteps 5000000" ;;  # the same run, 5M steps
    vmpo-mean-bound) echo "--eps-alpha-mean 0.05" ;;  # 5x the recipe's (and the paper's upper) 0.01
    vmpo-mean-bound-0.2) echo "--eps-alpha-mean 0.2" ;;  # the second bound, if 0.05 still binds (the plan's rule)
    vmpo-mean-bound-0.02) echo "--eps-alpha-mean 0.02" ;;  # the second bound, if 0.05 no longer binds
    vmpo-gae) echo "--gae-lambda 0.95" ;;  # PPO's GAE instead of n-step returns (n = 256, lambda 1)
    vmpo-mean-bound-gae) echo "--eps-alpha-mean 0.05 --gae-lambda 0.95" ;;  # both
    vmpo-rerun) echo "" ;;  # the recipe, run again for its model.safetensors (not committed)
    vmpo-std-bound) echo "--eps-alpha-std 5e-4" ;;  # 10x the upper end of the paper's [5e-6, 5e-5)
    vmpo-std-global) echo "--no-state-dependent-std" ;;  # one learned std vector, as PPO's
    vmpo-multiplier-lr) echo "--multiplier-lr 3e-4" ;;  # = --learning-rate: the paper's one Adam for all
    vmpo-top-k) echo "--top-k-fraction 0.25" ;;  # the top quarter of the advantages, not the paper's half
    vmpo-passes) echo "--update-epochs 5" ;;  # 5 passes over each rollout, not 10
    vmpo-target-period) echo "--target-period 10" ;;  # the target synced 8 times an iteration, not once
    vmpo-n39) echo "--num-steps 39 --target-period 100" ;;  # the paper's n and T_target: 6.6x the learning steps
  esac
}
runs() {
  for name in vmpo ppo; do for seed in 1 2 3; do for env in HalfCheetah-v5 Hopper-v5 Walker2d-v5; do
    echo "$env $seed $name"
  done; done; done
  for name in $ABLATION $PART2; do for seed in 1 2 3; do for env in Hopper-v5 Walker2d-v5; do
    echo "$env $seed $name"
  done; done; done
  for name in $CHANGES; do for seed in 1 2 3; do echo "HalfCheetah-v5 $seed $name"; done; done  # the plan runs one
  for name in ppo vmpo $CHANGES; do for seed in 1 2 3; do echo "Walker2d-v5 $seed 5m-$name"; done; done  # and two
}
run() {  # env seed name: resume, skip or start one run
  local env=$1 seed=$2 name=$3 dir command
  command=$([ "${name#5m-}" = ppo ] && echo "$PPO $(flags "${name%ppo}")" || echo "$VMPO $(flags "$name")")
  dir=$(ls -d "$OUT/runs/${env}__${name}__${seed}__"* 2> /dev/null | head -n 1 || true)
  if [ -n "$dir" ] && [ -e "$dir/model.safetensors" ]; then return; fi
  if [ -n "$dir" ] && [ -e "$dir/checkpoint.safetensors" ]; then
    python "$ROOT/${command%% *}" --resume "$dir/checkpoint.safetensors" --no-cuda --checkpoint-every 25
  else
    [ -z "$dir" ] || rm -rf "$dir"
    python "$ROOT/"$command --env-id "$env" --seed "$seed" --exp-name "$name" --no-cuda --checkpoint-every 25
  fi >> "$OUT/logs/${env}__${name}__${seed}.txt" 2>&1
}
if [ "${1:-}" = --list ]; then runs; exit 0; fi
if [ "${1:-}" = --eval ]; then  # --eval REGEX: the final models of the finished V-MPO runs whose directory matches,
  for dir in "$OUT"/runs/*/; do  # 10 episodes sampled and 10 with the policy's mean, into $EVAL (one row each)
    name=$(basename "$dir"); IFS=_ read -r env variant seed _ <<< "${name//__/_}"
    [[ $name =~ $2 && -e $dir/model.safetensors && $variant = vmpo* ]] || continue
    for mode in sampled deterministic; do
      (cd "$OUT" && python "$ROOT/vmpo.py" --eval-checkpoint "$dir/model.safetensors" --eval-episodes 10 --no-cuda \
        $([ $mode = deterministic ] && echo --eval-deterministic)) | sed -n "s/^eval: mean return \([^,]*\),.*/$env,$variant,$seed,$mode,\1/p"
    done
  done | sort -s -u -t, -k1,4 - <(tail -n +2 "$EVAL" 2> /dev/null) | sed '1i env,variant,seed,mode,mean_return' \
    > "$EVAL.new"  # a new row replaces an old one of the same run and mode
  mv "$EVAL.new" "$EVAL"; exit 0
fi

mkdir -p "$OUT/logs" && cd "$OUT"
export OMP_NUM_THREADS=1 ROOT OUT VMPO PPO
export -f run flags
[ "${1:-}" = --plot ] || runs | { grep -E -- "${1:-.}" || true; } | xargs -r -P "$JOBS" -L 1 bash -c 'run "$@"' run
if [ -d "$OUT/runs" ]; then  # the finished runs' curves into $DATA, which the tables and plots read
  rm -rf "$OUT/finished" && mkdir "$OUT/finished"
  for dir in "$OUT"/runs/*/; do [ ! -e "$dir/model.safetensors" ] || ln -s "$dir" "$OUT/finished/"; done
  python "$ROOT/benchmark/plot.py" "$OUT/finished" --export "$DATA" --tags charts/episodic_return charts/SPS kl/mean kl/std \
    kl/temperature charts/eta charts/alpha_mean charts/alpha_std
fi
for env in HalfCheetah Hopper Walker2d; do  # the tables and figures of docs/vmpo.md
  grep -q "^$env-v5,vmpo," <(xzcat "$DATA" 2> /dev/null) || continue
  threshold=$([ $env = HalfCheetah ] && echo 1000 || echo 1500)
  compare=$(grep -q "^$env-v5,ppo," <(xzcat "$DATA") && echo "--baseline ppo" || true)  # once PPO has a run there
  group="^${env}-v5__(vmpo|ppo)__\d+__\d+$"
  python "$ROOT/benchmark/plot.py" "$DATA" --group "$group" --threshold "$threshold" $compare \
    --out "$ROOT/docs/img/vmpo_mujoco_$env.png" --title "V-MPO and PPO, $env-v5, 1M steps" \
    --label '^vmpo$=V-MPO' --label '^ppo$=PPO'
  for tag in kl/mean kl/std kl/temperature charts/eta charts/alpha_mean charts/alpha_std; do  # each over the last 10%
    python "$ROOT/benchmark/plot.py" "$DATA" --group "^${env}-v5__(vmpo)__\d+__\d+$" --tag "$tag" | tail -n 1
  done
done
for env in Hopper Walker2d; do  # the ablation's table, against the recipe and against PPO, and its figure
  grep -q "^$env-v5,vmpo-" <(xzcat "$DATA" 2> /dev/null) || continue
  group="^(${env}-v5__(?:vmpo|${ABLATION// /|}|ppo))__\d+__\d+$"
  python "$ROOT/benchmark/plot.py" "$DATA" --group "$group" --baseline vmpo --ratio --threshold 1500 \
    --out "$ROOT/docs/img/vmpo_ablation_$env.png" --title "V-MPO, one change each, $env-v5, 1M steps" \
    --label '^.*__vmpo$=V-MPO recipe' --label '^.*__ppo$=PPO' --label '^.*__vmpo-(.*)$=\1'
  python "$ROOT/benchmark/plot.py" "$DATA" --group "$group" --baseline ppo --ratio | sed -n '/^| A - B/,$p'
  for tag in kl/std charts/alpha_std; do  # the std's trust region, over the last 10%
    python "$ROOT/benchmark/plot.py" "$DATA" --group "^(${env}-v5__(?:vmpo|${ABLATION// /|}))__\d+__\d+$" --tag "$tag" \
      | tail -n +3
  done
done
for env in Hopper Walker2d HalfCheetah; do  # part two: each change against the recipe and PPO, the mean's KL, figures
  grep -q "^$env-v5,vmpo-\(mean-bound\|gae\|rerun\)" <(xzcat "$DATA" 2> /dev/null) || continue
  threshold=$([ $env = HalfCheetah ] && echo 1000 || echo 1500)
  group="^(${env}-v5__(?:vmpo|${PART2// /|}|ppo))__\d+__\d+$"
  python "$ROOT/benchmark/plot.py" "$DATA" --group "$group" --baseline vmpo --ratio --threshold "$threshold" \
    --out "$ROOT/docs/img/vmpo_part2_$env.png" --title "V-MPO, part two, $env-v5, 1M steps" \
    --label '^.*__vmpo$=V-MPO recipe' --label '^.*__ppo$=PPO' --label '^.*__vmpo-(.*)$=\1'
  python "$ROOT/benchmark/plot.py" "$DATA" --group "$group" --baseline ppo --ratio | sed -n '/^| A - B/,$p'
  for tag in kl/mean charts/alpha_mean; do  # the mean's trust region, over the last 10%
    python "$ROOT/benchmark/plot.py" "$DATA" --group "^(${env}-v5__(?:vmpo|${PART2// /|}))__\d+__\d+$" --tag "$tag" \
      | tail -n +3
  done
done
if grep -q "^Walker2d-v5,5m-" <(xzcat "$DATA" 2> /dev/null); then  # 5M steps: each run as it stood at 1M, 2M and 5M
  for at in 1000000 2000000 5000000; do
    python "$ROOT/benchmark/plot.py" "$DATA" --group '^(Walker2d-v5__5m-[a-z0-9.-]+)__\d+__\d+$' --at "$at" \
      --baseline 5m-ppo --ratio
  done
  python "$ROOT/benchmark/plot.py" "$DATA" --group '^(Walker2d-v5__5m-[a-z0-9.-]+)__\d+__\d+$' --threshold 1500 \
    --out "$ROOT/docs/img/vmpo_5m_Walker2d.png" --title "V-MPO and PPO, Walker2d-v5, 5M steps" \
    --label '^.*__5m-ppo$=PPO' --label '^.*__5m-(vmpo.*)$=V-MPO (\1)' > /dev/null
fi
if [ -e "$EVAL" ]; then  # the final models played 10 episodes sampled and 10 with the mean: seeds' mean [95% t]
  python - "$EVAL" "$ROOT/benchmark" <<'PY'
import csv, sys
sys.path.insert(0, sys.argv[2])
import numpy as np
import plot
rows = list(csv.DictReader(open(sys.argv[1])))
print("| env | variant | seeds | sampled | mean action | mean action - sampled (paired) |\n|---|---|---:|---:|---:|---:|")
for env, variant in sorted({(row["env"], row["variant"]) for row in rows}):
    returns = {mode: {row["seed"]: float(row["mean_return"]) for row in rows
                      if (row["env"], row["variant"], row["mode"]) == (env, variant, mode)}
               for mode in ("sampled", "deterministic")}
    seeds = sorted(set(returns["sampled"]) & set(returns["deterministic"]))
    sampled, mode = (np.array([returns[key][seed] for seed in seeds]) for key in ("sampled", "deterministic"))
    print(f"| {env} | {variant} | {len(seeds)} | {plot.mean_interval(sampled)} | {plot.mean_interval(mode)} | "
          f"{plot.mean_interval(mode - sampled)} |")
PY
fi
