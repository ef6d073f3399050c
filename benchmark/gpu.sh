#!/usr/bin/env bash
# The GPU measurements of docs/speed.md#gpu, on a machine with one GPU:
#   bash benchmark/gpu.sh timing        # the main job (--batch-divisor 4), PPO-EWMA and PPO: 6 iterations each,
#                                       # time split between env stepping, rollout inference and update, peak memory
#   bash benchmark/gpu.sh nccl          # torchrun with 1 worker on the GPU (NCCL), one iteration of the main job
#   bash benchmark/gpu.sh curve SECONDS [CHECKPOINT]
#                                       # starpilot (easy) with the paper's settings for SECONDS of wall-clock, then
#                                       # SIGTERM: the run stops at the next iteration end with a checkpoint;
#                                       # pass that checkpoint to go on (--resume), command after command
#   bash benchmark/gpu.sh plot [RUNS]   # that curve (RUNS: the folder holding its run directory; default runs),
#                                       # with CleanRL's PPO at 25M steps on starpilot easy (30.99) as the line
#   bash benchmark/gpu.sh bf16 [CLEANRL]
#                                       # the main job's iteration in float32 and with --bf16 (6 iterations each),
#                                       # CleanRL's ppo_procgen.py (CLEANRL: its file) for 10 iterations, then
#                                       # starpilot (easy) at the main job's settings for 1M steps, seeds 1 and 2, in
#                                       # float32 and with --bf16, the four runs side by side (runs/*__bf16-*)
#   bash benchmark/gpu.sh bf16-plot [RUNS]  # those four curves (default: benchmark/results/gpu_bf16.csv.xz)
# Cost here (one H100, 16 CPU cores, 2026-11-22): see docs/speed.md#gpu.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
export PYTHONUNBUFFERED=1
cd "$ROOT"

case "${1:-}" in
  timing)
    python3 benchmark/gpu_timing.py --iterations 6 -- --batch-divisor 4 2>&1 | grep -v "^step "
    python3 benchmark/gpu_timing.py --iterations 6 -- --batch-divisor 4 --no-ewma 2>&1 | grep -v "^step " ;;
  nccl)
    torchrun --standalone --nproc_per_node 1 ppo_ewma.py --batch-divisor 4 --total-timesteps 16384 \
      --exp-name nccl --no-save-model ;;
  curve)
    if [ -n "${3:-}" ]; then run=(--resume "$3"); else run=(--env-id starpilot --distribution-mode easy --exp-name curve); fi
    timeout -s TERM -k 120 "$2" python3 ppo_ewma.py "${run[@]}" || [ $? = 124 ] ;;
  plot)
    python3 benchmark/plot.py "${2:-runs}" --group "^starpilot__(curve)__\d+__\d+$" --window 0.1 --threshold 30.99 \
      --out docs/img/gpu_starpilot_easy.png --title "PPO-EWMA on starpilot (easy), paper settings, one H100" \
      --label '^curve$=PPO-EWMA, 256 envs x 256 steps (line: CleanRL PPO at 25M)' ;;
  bf16)
    for precision in "" --bf16; do
      timeout 120 python3 benchmark/gpu_timing.py --iterations 6 -- --batch-divisor 4 $precision 2>&1 | grep -v "^step "
    done
    [ -z "${2:-}" ] || (export PYTHONPATH=${CLEANRL_PYTHONPATH:-$PYTHONPATH}
                        timeout 120 python3 "$2" --total-timesteps 163840 2>&1 | grep "SPS")
    for seed in 1 2; do for precision in fp32 bf16; do
      timeout -s TERM 330 python3 ppo_ewma.py --distribution-mode easy --batch-divisor 4 --total-timesteps 1000000 \
        --seed "$seed" --exp-name "bf16-$precision" $([ $precision = bf16 ] && echo --bf16) --checkpoint-every 0 \
        --no-save-model > /dev/null 2>&1 &
    done; done
    wait ;;
  bf16-plot)
    python3 benchmark/plot.py "${2:-benchmark/results/gpu_bf16.csv.xz}" --group "^starpilot__(bf16-\w+)__\d+__\d+$" \
      --compare bf16-bf16=bf16-fp32 --out docs/img/gpu_bf16_starpilot_easy.png \
      --title "PPO-EWMA on starpilot (easy), --batch-divisor 4, one H200" \
      --label '^bf16-fp32$=float32' --label '^bf16-bf16$=--bf16' ;;
  *)
    echo "usage: bash benchmark/gpu.sh timing | nccl | curve SECONDS [CHECKPOINT] | plot [RUNS] | bf16 [CLEANRL] |" \
      "bf16-plot [RUNS]"; exit 2 ;;
esac
