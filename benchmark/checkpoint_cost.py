"""What a checkpoint costs at the paper's size: build the pieces that ppo_ewma.py and ppg_ewma.py save on Procgen
(networks, EWMA copy, Adam state after one step, 256 envs' next observations) and time the write that
harness.Run.save does, several times. Prints size and seconds per write.

    python benchmark/checkpoint_cost.py [--dir DIR] [--repeats 5]
"""
import argparse
import copy
import os
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import checkpoints
import harness  # noqa: E402
import ppg_ewma  # noqa: E402
import ppo_ewma  # noqa: E402


def adam_after_one_step(parameters, loss):
    optimizer = torch.optim.Adam(parameters, lr=5e-4)
    loss.backward()
    optimizer.step()
    return optimizer


def time_writes(path, checkpoint, repeats):
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        checkpoints.save_checkpoint(path, checkpoint)
        seconds.append(time.perf_counter() - start)
    return seconds


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", default=None, help="where to write (default: a temporary directory)")
    parser.add_argument("--repeats", type=int, default=5)
    cli = parser.parse_args()
    out_dir = cli.dir or tempfile.mkdtemp()
    torch.manual_seed(0)

    args = ppo_ewma.Args()  # the paper's Procgen configuration: starpilot, 256 envs
    envs = ppo_ewma.make_env(args)
    next_obs = torch.as_tensor(envs.reset(seed=args.seed)[0])
    agent = ppo_ewma.Agent(envs)
    optimizer = adam_after_one_step(agent.parameters(), agent.get_value(next_obs[:8]).sum())
    models = {"agent": agent, "ewma_agent": copy.deepcopy(agent)}
    cases = {"ppo_ewma.py": (args, models, {"optimizer": optimizer})}

    ppg_args = ppg_ewma.Args()
    policy, value_net = ppg_ewma.PolicyNetwork(envs), ppg_ewma.ValueNetwork(envs)
    parameters = [*policy.parameters(), *value_net.parameters()]
    optimizer = adam_after_one_step(parameters, value_net(next_obs[:8]).sum() + policy.get_pi(next_obs[:8]).sum())
    aux_optimizer = adam_after_one_step(parameters, value_net(next_obs[:8]).sum())
    cases["ppg_ewma.py"] = (ppg_args, {"policy": policy, "value_net": value_net, "ewma_policy": copy.deepcopy(policy)},
                            {"optimizer": optimizer, "aux_optimizer": aux_optimizer})

    print(f"writing to {out_dir}, {cli.repeats} times each")
    for name, (run_args, run_models, optimizers) in cases.items():
        checkpoint = checkpoints.make_checkpoint(run_args, checkpoints.Saved(run_models, optimizers), envs, next_obs,
                                             torch.zeros(args.num_envs), global_step=0, iteration=1,
                                             num_iterations=100, episode_returns=[])
        path = os.path.join(out_dir, f"{name}.checkpoint.pt")
        seconds = time_writes(path, checkpoint, cli.repeats)
        print(f"{name}: {os.path.getsize(path) / 2**20:.1f} MiB, {min(seconds):.2f}-{max(seconds):.2f} s per write "
              f"(median {sorted(seconds)[len(seconds) // 2]:.2f} s)")
        os.remove(path)
    envs.close()


if __name__ == "__main__":
    main()
