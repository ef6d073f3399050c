"""What bfloat16 autocast gives on this machine (docs/speed.md): the IMPALA CNN's forward and backward on 512 Procgen
frames (an update minibatch's share on the CPU), its no-grad forward on 64 frames (one acting step of the main job),
and a 64-64 tanh MLP's forward and backward on 64 samples (a MuJoCo minibatch), each in float32 and under
torch.autocast(bfloat16), alternately; prints the medians and float32 / bfloat16. Time nothing else meanwhile.

    python benchmark/bf16.py                          # this CPU as it is
    DNNL_MAX_CPU_ISA=AVX2 python benchmark/bf16.py    # as a CPU without bfloat16 instructions (oneDNN's AVX2)
    python benchmark/bf16.py --device cuda            # the GPU
"""
import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import ppo_ewma  # noqa: E402


class ProcgenLike:
    single_observation_space = ppo_ewma.gym.spaces.Box(0, 255, (64, 64, 3), "uint8")
    single_action_space = ppo_ewma.gym.spaces.Discrete(15)


def seconds(work, repeats):
    """Median wall-clock seconds of work() over `repeats` calls, after one warm-up call."""
    work()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--device", default="cpu")
    cli = parser.parse_args()
    torch.set_num_threads(cli.threads)
    torch.manual_seed(0)
    device = torch.device(cli.device)
    cnn = ppo_ewma.Agent(ProcgenLike()).to(device)
    frames = torch.randint(0, 256, (512 if device.type == "cpu" else 2048, 64, 64, 3), dtype=torch.uint8, device=device)
    mlp = ppo_ewma.mlp(11, 1, out_std=1.0).to(device)
    samples = torch.randn(64, 11, device=device)
    sync = torch.cuda.synchronize if device.type == "cuda" else lambda: None

    def update(bf16):
        with torch.autocast(device.type, torch.bfloat16, enabled=bf16):
            pi, value = cnn(frames)
        (pi.float().logsumexp(-1).mean() + value.float().square().mean()).backward()
        sync()

    def act(bf16):
        with torch.no_grad(), torch.autocast(device.type, torch.bfloat16, enabled=bf16):
            cnn(frames[:64])
        sync()

    def mlp_update(bf16):
        with torch.autocast(device.type, torch.bfloat16, enabled=bf16):
            out = mlp(samples).float()
        out.square().mean().backward()
        sync()

    machine = torch.cuda.get_device_name() if device.type == "cuda" else \
        open("/proc/cpuinfo").read().split("model name")[1].split(":")[1].splitlines()[0].strip()
    flags = [flag for flag in open("/proc/cpuinfo").read().split() if flag in ("avx512_bf16", "amx_bf16")]
    print(f"{machine}; CPU flags {' '.join(sorted(set(flags))) or 'without bfloat16'}; DNNL_MAX_CPU_ISA="
          f"{os.environ.get('DNNL_MAX_CPU_ISA', 'unset')}; {cli.threads} threads, median of {cli.repeats}")
    for name, work in ((f"IMPALA CNN forward + backward, {len(frames)} frames", update),
                       ("IMPALA CNN acting, 64 frames", act),
                       ("64-64 MLP forward + backward, 64 samples", mlp_update)):
        float32 = bf16 = None
        for _ in range(2):  # alternately, twice: each takes the better of its two medians
            t32, t16 = seconds(lambda: work(False), cli.repeats), seconds(lambda: work(True), cli.repeats)
            float32, bf16 = min(float32 or t32, t32), min(bf16 or t16, t16)
        print(f"{name}: float32 {float32 * 1e3:.2f} ms, bfloat16 {bf16 * 1e3:.2f} ms: {float32 / bf16:.2f}x")


if __name__ == "__main__":
    main()
