"""What a checkpoint costs at the paper's size: build the pieces that ppo_ewma.py and ppg_ewma.py save on Procgen
(networks, EWMA copy, Adam state after one step, 256 envs' next observations), time the write that harness.Run.save
does and the read that --resume does (both passes, into a rebuilt run), and the peak memory of a process that resumes
(its VmHWM once the run is built, and once the checkpoint is read into it). Each measurement runs in a process of its
own. --code DIR measures another checkout's code (e.g. a git worktree of 18fb459, the last one that wrote torch.save's
.pt files), so that two versions can be timed side by side:

    python benchmark/checkpoint_cost.py [--code DIR] [--repeats 5]
    python benchmark/checkpoint_cost.py --header-envs 1000   # the header of a Hopper run of 1,000 envs
    git worktree add /tmp/before 18fb459 && for i in 1 2 3; do python benchmark/checkpoint_cost.py --code /tmp/before;
        python benchmark/checkpoint_cost.py; done
"""
import argparse
import copy
import importlib.util
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def peak_memory() -> int:
    """This process's peak resident memory so far, bytes (Linux's VmHWM)."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM"))


def measure(name: str, out_dir: str, repeats: int) -> None:
    """In this process: build `name`'s run, write its checkpoint `repeats` times, read it back `repeats` times."""
    import torch

    import checkpoints
    import harness
    import ppg_ewma
    import ppo_ewma
    new = hasattr(harness, "save_checkpoint")  # the safetensors version; before it, checkpoints.py did everything
    writer = harness if new else checkpoints

    def adam_after_one_step(parameters, loss):
        optimizer = torch.optim.Adam(parameters, lr=5e-4)
        loss.backward()
        optimizer.step()
        return optimizer

    def built():  # the run's objects, as a resume rebuilds them
        torch.manual_seed(0)
        module = ppo_ewma if name == "ppo_ewma.py" else ppg_ewma
        args = module.Args()  # the paper's Procgen configuration: starpilot, 256 envs
        envs = module.make_env(args)
        next_obs = torch.as_tensor(envs.reset(seed=args.seed)[0])
        if name == "ppo_ewma.py":
            agent = ppo_ewma.Agent(envs)
            models = {"agent": agent, "ewma_agent": copy.deepcopy(agent)}
            optimizers = {"optimizer": adam_after_one_step(agent.parameters(), agent.get_value(next_obs[:8]).sum())}
        else:
            policy, value_net = ppg_ewma.PolicyNetwork(envs), ppg_ewma.ValueNetwork(envs)
            parameters = [*policy.parameters(), *value_net.parameters()]
            models = {"policy": policy, "value_net": value_net, "ewma_policy": copy.deepcopy(policy)}
            optimizers = {"optimizer": adam_after_one_step(parameters, value_net(next_obs[:8]).sum()),
                          "aux_optimizer": adam_after_one_step(parameters, policy.get_pi(next_obs[:8]).sum())}
        saved = writer.Saved(models, optimizers, keys={"ewma_weight": 1.0})
        return module, args, envs, saved, next_obs, torch.zeros(args.num_envs)

    module, args, envs, saved, next_obs, next_done = built()
    checkpoint = writer.make_checkpoint(args, saved, envs, next_obs, next_done, global_step=args.num_envs * 256,
                                        iteration=1, num_iterations=100, episode_returns=[], ewma_weight=1.5,
                                        script=name)
    path = os.path.join(out_dir, "checkpoint.safetensors" if new else "checkpoint.pt")
    writes = []
    for _ in range(repeats):
        start = time.perf_counter()
        writer.save_checkpoint(path, checkpoint)
        writes.append(time.perf_counter() - start)
    envs.close()
    del checkpoint, saved
    module, args, envs, saved, next_obs, next_done = built()  # a fresh run, as --resume rebuilds it
    built_peak, reads = peak_memory(), []
    for _ in range(repeats):
        start = time.perf_counter()
        if new:
            loaded = checkpoints.read(path, "--resume", module.SCRIPT, kinds=("checkpoint",))
            has_resume = importlib.util.find_spec("resume") is not None  # resume.py holds it since checkpoints.py split
            restoring = importlib.import_module("resume") if has_resume else checkpoints
            restoring.restore_run(loaded, saved, envs, next_obs, next_done, "--resume", args.num_envs * 256, 100,
                                  harness)
        else:
            loaded = checkpoints.load_checkpoint(path, "--resume", module.SCRIPT)
            checkpoints.restore_run(loaded, saved, envs, next_obs, next_done, "--resume", args.num_envs * 256, 100)
        reads.append(time.perf_counter() - start)
        del loaded
    envs.close()
    median = lambda seconds: sorted(seconds)[len(seconds) // 2]  # noqa: E731
    print(f"{'after' if new else 'before'} {name}: {os.path.getsize(path) / 2**20:.1f} MiB; write "
          f"{min(writes):.3f}-{max(writes):.3f} s (median {median(writes):.3f}); read and restore "
          f"{min(reads):.3f}-{max(reads):.3f} s (median {median(reads):.3f}); peak memory {built_peak / 2**20:.0f} MiB "
          f"once the run is built, {peak_memory() / 2**20:.0f} MiB once the checkpoint is read into it", flush=True)
    os.remove(path)


def header(num_envs: int) -> None:
    """The header of a vmpo.py checkpoint of `num_envs` Hopper envs (MuJoCo's state, the most a Gymnasium env stack
    holds here): its bytes, and its metadata's nesting and values as checkpoints.parsed() counts them."""
    import json
    import re
    from itertools import accumulate

    import torch

    import checkpoints
    import harness
    import vmpo
    args = vmpo.with_defaults(vmpo.Args(env_id="Hopper-v5", num_envs=num_envs))
    envs = vmpo.make_env(args)
    next_obs = torch.as_tensor(envs.reset(seed=1)[0], dtype=torch.float32)
    envs.step(envs.action_space.sample())
    agent = vmpo.Agent(envs)
    saved = harness.Saved({"agent": agent}, {"optimizer": torch.optim.Adam(agent.parameters())})
    checkpoint = harness.make_checkpoint(args, saved, envs, next_obs, torch.zeros(num_envs), global_step=0,
                                         iteration=1, num_iterations=2, episode_returns=[], script="vmpo.py")
    data = harness.checkpoint_bytes(checkpoint)
    text = json.loads(data[8:8 + int.from_bytes(data[:8], "little")])["__metadata__"]["checkpoint"]
    skeleton = checkpoints.STRING.sub('""', text)
    depth = max(accumulate(1 if c in "[{" else -1 for c in re.findall(r"[\[\]{}]", skeleton)))
    print(f"vmpo.py, Hopper-v5, {num_envs:,} envs: header {int.from_bytes(data[:8], 'little') / 2**20:.2f} MiB, "
          f"metadata nested {depth} deep, {sum(map(skeleton.count, ',:[{')) + 1:,} values")
    envs.close()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--code", default=ROOT, help="the checkout whose code is measured (default: this one)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--header-envs", type=int, help="print the header of a Hopper checkpoint of this many envs")
    parser.add_argument("--script", help=argparse.SUPPRESS)  # a measuring process's own
    cli = parser.parse_args()
    if cli.header_envs:
        sys.path.insert(0, cli.code)
        return header(cli.header_envs)
    if cli.script:
        sys.path.insert(0, cli.code)
        with tempfile.TemporaryDirectory() as out_dir:
            measure(cli.script, out_dir, cli.repeats)
        return
    print(f"load average {os.getloadavg()[0]:.2f}; code {os.path.abspath(cli.code)} at " + subprocess.run(
        ["git", "-C", cli.code, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip(),
        flush=True)
    for name in ("ppo_ewma.py", "ppg_ewma.py"):
        subprocess.run([sys.executable, __file__, "--code", cli.code, "--repeats", str(cli.repeats), "--script", name],
                       check=True, cwd=cli.code)


if __name__ == "__main__":
    main()
