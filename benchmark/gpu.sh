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
  *)
    echo "usage: bash benchmark/gpu.sh timing | nccl | curve SECONDS [CHECKPOINT] | plot [RUNS]"; exit 2 ;;
esac
