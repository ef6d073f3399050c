"""What bfloat16 gives on this machine (docs/speed.md): the IMPALA CNN's forward and backward on 512 Procgen frames
(an update minibatch's share on the CPU; --frames 2048: the main job's minibatch), its no-grad forward on 64 frames
(one acting step of the main job), the rest of a PPO-EWMA minibatch step (the EWMA network's no-grad pass over the
frames, 64 at a time, and Adam's step with the EWMA update), and a 64-64 tanh MLP's forward and backward on 64
samples (a MuJoCo minibatch), each in float32 and in bfloat16, alternately; prints the medians and
float32 / bfloat16, and the load average at the start and the end. The CNN runs as --bf16 runs it: ppo_ewma.Agent(bf16=True), whose ImpalaCNN opens its own autocast
(an outer autocast would not reach inside it), with freed memory kept as a run keeps it (harness.tune_cpu). Time
nothing else meanwhile.

    python benchmark/bf16.py                          # this CPU as it is
    DNNL_MAX_CPU_ISA=AVX512_CORE python benchmark/bf16.py  # as an AVX-512 CPU without bfloat16 instructions
    DNNL_MAX_CPU_ISA=AVX2 python benchmark/bf16.py    # as an AVX2 CPU
    python benchmark/bf16.py --device cuda            # the GPU
    python benchmark/bf16.py --only MLP --repeats 101  # one pass alone (the MLP's takes a fraction of a millisecond)
"""
import argparse
import copy
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import harness  # noqa: E402
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


def workloads(device, num_frames):
    """{name: work(bf16)}: each runs its pass in float32 or bfloat16 as the scripts do. The two CNNs share their
    weights, so both columns compute the same network."""
    torch.manual_seed(0)
    cnns = {bf16: ppo_ewma.Agent(ProcgenLike(), bf16=bf16).to(device) for bf16 in (False, True)}
    cnns[True].load_state_dict(cnns[False].state_dict())
    frames = torch.randint(0, 256, (num_frames, 64, 64, 3), dtype=torch.uint8, device=device)
    mlp = ppo_ewma.mlp(11, 1, out_std=1.0).to(device)
    samples = torch.randn(64, 11, device=device)
    sync = torch.cuda.synchronize if device.type == "cuda" else lambda: None

    def update(bf16):
        pi, value = cnns[bf16](frames)
        (pi.logsumexp(-1).mean() + value.square().mean()).backward()
        sync()

    def act(bf16):
        with torch.no_grad():
            cnns[bf16](frames[:64])
        sync()

    ewmas = {bf16: copy.deepcopy(cnn).requires_grad_(False) for bf16, cnn in cnns.items()}  # theta_prox
    optimizers = {bf16: torch.optim.Adam(cnn.parameters(), lr=5e-4, fused=True) for bf16, cnn in cnns.items()}

    def ewma_pass(bf16):  # pi_prox of the minibatch: the EWMA network's no-grad pass, 64 frames at a time on the CPU
        harness.in_chunks(ewmas[bf16].get_pi, frames, 64 if device.type == "cpu" else num_frames)
        sync()

    def step(bf16):  # after the backward (update() left the gradients): Adam on theta, then theta_prox's EWMA
        optimizers[bf16].step()
        ppo_ewma.update_ewma(ewmas[bf16], cnns[bf16], 10.0, 0.889)
        sync()

    def mlp_update(bf16):  # the MLP has no autocast of its own (--bf16 is refused for it): this one's is outer
        with torch.autocast(device.type, torch.bfloat16, enabled=bf16):
            out = mlp(samples).float()
        out.square().mean().backward()
        sync()
    return {f"IMPALA CNN forward + backward, {num_frames} frames": update,
            f"EWMA network's pass (pi_prox), {num_frames} frames": ewma_pass,
            "Adam's step and the EWMA update": step, "IMPALA CNN acting, 64 frames": act,
            "64-64 MLP forward + backward, 64 samples": mlp_update}, cnns


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--frames", type=int, help="the CNN update's frames (default: 512 on the CPU, 2048 on a GPU)")
    parser.add_argument("--only", default="", help="time only the passes whose name holds this text (e.g. MLP)")
    cli = parser.parse_args()
    device = torch.device(cli.device)
    harness.tune_cpu(device, cli.threads, ProcgenLike.single_observation_space.shape)  # as a run: malloc kept
    works, _ = workloads(device, cli.frames or (512 if device.type == "cpu" else 2048))
    machine = torch.cuda.get_device_name() if device.type == "cuda" else \
        open("/proc/cpuinfo").read().split("model name")[1].split(":")[1].splitlines()[0].strip()
    flags = [flag for flag in open("/proc/cpuinfo").read().split() if flag in ("avx512_bf16", "amx_bf16")]
    print(f"{machine}; CPU flags {' '.join(sorted(set(flags))) or 'without bfloat16'}; DNNL_MAX_CPU_ISA="
          f"{os.environ.get('DNNL_MAX_CPU_ISA', 'unset')}; {cli.threads} threads, median of {cli.repeats}; "
          f"load average (1, 5, 15 min) {os.getloadavg()}")
    for name, work in works.items():
        if cli.only not in name:
            continue
        float32 = bf16 = None
        for _ in range(2):  # alternately, twice: each takes the better of its two medians
            t32, t16 = seconds(lambda: work(False), cli.repeats), seconds(lambda: work(True), cli.repeats)
            float32, bf16 = min(float32 or t32, t32), min(bf16 or t16, t16)
        print(f"{name}: float32 {float32 * 1e3:.2f} ms, bfloat16 {bf16 * 1e3:.2f} ms: {float32 / bf16:.2f}x")
    print(f"load average at the end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
