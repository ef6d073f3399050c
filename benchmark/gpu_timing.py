"""Where a ppo_ewma.py run spends its time: env stepping, the rollout's inference, and the update.

Runs ppo_ewma.train() with the flags given after `--`, for --iterations iterations, and times each iteration
with timers that synchronize the GPU at the harness hooks: the rollout ends at run.end_rollout(), the update
(GAE, advantages, the epochs) at run.end_iteration(). The env stack's step() is timed on its own; the rest of
the rollout is inference, the device syncs and the storage writes. The first --warmup iterations are left out
of the means (CUDA start-up, cuDNN autotuning). Prints the load average, one line per iteration, the means and the
peak GPU memory.

    python benchmark/gpu_timing.py --iterations 6 -- --batch-divisor 4           # the main job
    python benchmark/gpu_timing.py --iterations 6 -- --batch-divisor 4 --no-ewma # PPO
"""
import argparse
import dataclasses
import os
import sys
import time

import numpy as np
import torch
import tyro

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import harness  # noqa: E402
import ppo_ewma  # noqa: E402


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("flags", nargs="*", help="ppo_ewma.py's flags, after --")
    cli = parser.parse_args()
    args = tyro.cli(ppo_ewma.Args, args=cli.flags)
    run_args = ppo_ewma.apply_batch_divisor(args)
    batch = run_args.num_envs * run_args.num_steps
    args = dataclasses.replace(args, total_timesteps=cli.iterations * batch, save_model=False, checkpoint_every=0)

    env_seconds, marks = [0.0], []  # marks: (what ended, time, env seconds so far)

    make_env = ppo_ewma.make_env

    def timed_make_env(run_args, render_mode=None):
        envs = make_env(run_args, render_mode)
        step = envs.step

        def timed_step(actions):
            start = time.perf_counter()
            result = step(actions)
            env_seconds[0] += time.perf_counter() - start
            return result
        envs.step = timed_step
        return envs

    def mark(what, hook):
        def timed_hook(self, *hook_args, **hook_kwargs):
            sync()
            marks.append((what, time.perf_counter(), env_seconds[0]))
            return hook(self, *hook_args, **hook_kwargs)
        return timed_hook

    ppo_ewma.make_env = timed_make_env  # the envs train() makes
    harness.Run.restore = mark("start", harness.Run.restore)
    harness.Run.end_rollout = mark("rollout", harness.Run.end_rollout)
    harness.Run.end_iteration = mark("update", harness.Run.end_iteration)
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    load = os.getloadavg()
    ppo_ewma.train(args)

    rows = []  # per iteration: (total, env, inference, update) seconds
    for i in range(0, len(marks) - 2, 2):
        (_, start, env_start), (_, rollout, env_end), (_, update, _) = marks[i:i + 3]
        rows.append((update - start, env_end - env_start, rollout - start - (env_end - env_start), update - rollout))
        marks[i + 2] = ("start", update, env_end)  # the next iteration starts where this one ended
    print(f"\n{batch:,} steps per iteration ({run_args.num_envs} envs x {run_args.num_steps} steps), "
          f"ewma {args.ewma}, device {'cuda' if torch.cuda.is_available() and args.cuda else 'cpu'}; "
          f"load average (1, 5, 15 min) {load} at the start, {os.getloadavg()} at the end")
    print("iteration | total s | SPS | env step s | rollout inference s | update s")
    for i, (total, env, inference, update) in enumerate(rows, 1):
        print(f"{i} | {total:.2f} | {batch / total:,.0f} | {env:.2f} | {inference:.2f} | {update:.2f}")
    total, env, inference, update = np.mean(rows[cli.warmup:], axis=0)
    share = {name: f"{seconds:.2f} s ({100 * seconds / total:.0f}%)"
             for name, seconds in [("env step", env), ("rollout inference", inference), ("update", update)]}
    print(f"mean of iterations {cli.warmup + 1}-{len(rows)}: {total:.2f} s, SPS {batch / total:,.0f}; "
          + ", ".join(f"{name} {text}" for name, text in share.items()))
    if torch.cuda.is_available():
        print(f"peak GPU memory: {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB allocated, "
              f"{torch.cuda.max_memory_reserved() / 2**30:.2f} GiB reserved by PyTorch")


if __name__ == "__main__":
    main()
