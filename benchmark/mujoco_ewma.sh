#!/usr/bin/env bash
# PPO-EWMA with many epochs: the EWMA's age against the iteration's gradient steps, on MuJoCo (docs/ppo_ewma.md).
# ppo_ewma.py at the PPO paper's MuJoCo settings (1 env x 2048 steps, 10 epochs x 32 minibatches = 320 gradient
# steps an iteration), 1M env steps, HalfCheetah-v5, Hopper-v5 and Walker2d-v5, seeds 1-3, in three parts, the
# runs that decide the continuous default first:
#   1. ppo              PPO (--no-ewma), the baseline at the same seeds
#      com320           PPO-EWMA at centre of mass E x M = 320
#   2. com107 com960    centre of mass E x M / 3 and 3 x E x M (960: the continuous default)
#   3. com8             the paper's centre of mass, 8 gradient steps
#      com8-tkl com320-tkl ppo-tkl    the same three with --target-kl 0.02, a hard anchor to pi_behav
# Fixed before the runs: the final return is each seed's mean over its last 10% of steps (100k); the thresholds
# are 1,000 (HalfCheetah), 1,500 (Hopper, Walker2d); --target-kl 0.02 (Spinning Up stops at 1.5 x 0.01).
# The non-inferiority margin for the continuous default (centre of mass 3 x E x M = 960), fixed on 2026-11-25
# before any run past seed 3: PPO-EWMA is no worse than PPO by more than 15% of PPO's mean final return when the
# lower end of the two-sided 90% Welch interval of (PPO-EWMA - PPO) lies above minus that margin, per env; the
# default passes only if it does so on all three envs. With the spreads of seeds 1-3 (sample std, PPO / 960:
# HalfCheetah 1280 / 1522, Hopper 444 / 222, Walker2d 413 / 1446), 80% power at a true difference of 0 needs about
# 9 seeds each on Hopper, 39 on Walker2d and 200 on HalfCheetah. The cap is 5 seeds each (SEEDS="1 2 3 4 5": 12
# more runs, about 6 hours here two at a time): 5 can show non-inferiority only where PPO-EWMA is in fact ahead
# (as HalfCheetah's seeds 1-3 suggest, +1407), and will leave Walker2d and Hopper unresolved unless their gap
# closes. If the default fails the margin on any env, the docstring's MuJoCo recipe runs PPO.
# Judged on 2026-11-25 at 5 seeds each: not shown on any env, so the recipe runs PPO (docs/ppo_ewma.md).
# Resumable: each run writes checkpoint.safetensors every 25 iterations and on SIGINT/SIGTERM; running this again resumes the
# unfinished runs with --resume and skips the finished ones (model.safetensors). Stop it with Ctrl-C, or
# `kill -TERM -- -PGID` when started with setsid. `bash benchmark/mujoco_ewma.sh --list` prints the runs;
# `bash benchmark/mujoco_ewma.sh 'REGEX'` runs only those whose line matches (e.g. '^Walker2d-v5 1 '), `--plot` none;
# then the tables and figures are made from the runs that finished. OUT=DIR keeps the runs outside the work tree.
# 72 runs; docs/ppo_ewma.md gives the seeds of each that ran here, in the time there was, and their cost (2 CPU
# cores, JOBS=2, OMP_NUM_THREADS=1) is in docs/benchmarks.md. A rerun adds the missing seeds to its tables.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
JOBS=${JOBS:-2}
OUT=${OUT:-$ROOT/benchmark/runs/mujoco_ewma}
SEEDS=${SEEDS:-1 2 3}
DATA=${RESULTS:-$ROOT/benchmark/results}/mujoco_ewma.csv.xz
SETTINGS="--num-envs 1 --num-steps 2048 --num-minibatches 32 --update-epochs 10 --shuffle-samples --learning-rate 3e-4"
SETTINGS="$SETTINGS --gamma 0.99 --gae-lambda 0.95 --clip-coef 0.2 --ent-coef 0 --total-timesteps 1000000"

PARTS=("ppo --no-ewma" "com320 --ewma-com 320"
       "com107 --ewma-com 107" "com960 --ewma-com 960"
       "com8 --ewma-com 8" "com8-tkl --ewma-com 8 --target-kl 0.02" "com320-tkl --ewma-com 320 --target-kl 0.02"
       "ppo-tkl --no-ewma --target-kl 0.02")
runs() {  # part by part (2, 2 and 4 variants), seed-major within a part, so that every env has a first seed early
  for part in "0 2" "2 2" "4 4"; do set -- $part
    for seed in $SEEDS; do for env in HalfCheetah-v5 Hopper-v5 Walker2d-v5; do
      for variant in "${PARTS[@]:$1:$2}"; do echo "$env $seed $variant"; done
    done; done
  done
}
run() {  # env seed name flags...: resume, skip or start one run
  local env=$1 seed=$2 name=$3 dir
  shift 3
  dir=$(ls -d "$OUT/runs/${env}__${name}__${seed}__"* 2> /dev/null | head -n 1 || true)
  if [ -n "$dir" ] && [ -e "$dir/model.safetensors" ]; then return; fi
  if [ -n "$dir" ] && [ -e "$dir/checkpoint.safetensors" ]; then
    python "$ROOT/ppo_ewma.py" --resume "$dir/checkpoint.safetensors" --no-cuda --checkpoint-every 25
  else
    [ -z "$dir" ] || rm -rf "$dir"
    python "$ROOT/ppo_ewma.py" --env-id "$env" $SETTINGS "$@" --seed "$seed" --exp-name "$name" --no-cuda \
      --checkpoint-every 25
  fi >> "$OUT/logs/${env}__${name}__${seed}.txt" 2>&1
}
if [ "${1:-}" = --list ]; then runs; exit 0; fi

mkdir -p "$OUT/logs" && cd "$OUT"
export OMP_NUM_THREADS=1 ROOT OUT SETTINGS
export -f run
[ "${1:-}" = --plot ] || runs | { grep -E -- "${1:-.}" || true; } | xargs -r -P "$JOBS" -L 1 bash -c 'run "$@"' run
if [ -d "$OUT/runs" ]; then  # the finished runs' curves into $DATA, which the tables and plots read
  rm -rf "$OUT/finished" && mkdir "$OUT/finished"
  for dir in "$OUT"/runs/*/; do [ ! -e "$dir/model.safetensors" ] || ln -s "$dir" "$OUT/finished/"; done
  python "$ROOT/benchmark/plot.py" "$OUT/finished" --export "$DATA" --tags charts/episodic_return charts/SPS \
    losses/approx_kl_behav_last losses/clipfrac losses/entropy losses/is_capped_frac charts/update_epochs_run
fi
FIGURES=("mujoco_ewma;ppo|com960;PPO-EWMA's centre of mass;--margin 0.15"  # image;variants;title;comparison
         "mujoco_ewma_ages;ppo|com(?:8|107|320)(?:-tkl)?|ppo-tkl;PPO-EWMA's other centres of mass;")
logged=$(xzcat "$DATA" 2> /dev/null | cut -d, -f1,2,4 | sort -u || true)  # env,variant,tag: what the runs logged
for env in HalfCheetah Hopper Walker2d; do  # the tables and figures of docs/ppo_ewma.md
  grep -q "^$env-v5," <<< "$logged" || continue
  threshold=$([ $env = HalfCheetah ] && echo 1000 || echo 1500)
  for figure in "${FIGURES[@]}"; do  # the margin's pair, then PPO against the other ages and the KL anchors
    IFS=";" read -r image variants title margin <<< "$figure"
    grep -qP "^$env-v5,(${variants#ppo|})," <<< "$logged" || continue  # not run yet
    compare=$(grep -q "^$env-v5,ppo," <<< "$logged" && echo "--baseline ppo $margin" || true)  # once PPO ran
    python "$ROOT/benchmark/plot.py" "$DATA" --group "^${env}-v5__($variants)__\d+__\d+$" --threshold "$threshold" \
      $compare --out "$ROOT/docs/img/${image}_$env.png" --title "$title, $env-v5, 1M steps" \
      --label '^ppo$=PPO' --label '^ppo-tkl$=PPO, --target-kl 0.02' --label '^com(\d+)$=PPO-EWMA, centre of mass \1' \
      --label '^com(\d+)-tkl$=PPO-EWMA, centre of mass \1, --target-kl 0.02'
  done
  group="^${env}-v5__(ppo|com\d+(?:-tkl)?|ppo-tkl)__\d+__\d+$"
  for tag in losses/{approx_kl_behav_last,clipfrac,entropy,is_capped_frac} charts/update_epochs_run; do  # why
    grep -q "^$env-v5,[^,]*,$tag$" <<< "$logged" || continue  # the epochs run: logged with --target-kl
    python "$ROOT/benchmark/plot.py" "$DATA" --group "$group" --tag "$tag"  # each over the last 10% of steps
  done
done
