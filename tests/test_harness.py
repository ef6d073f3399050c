"""The run harness (harness.py): the move of the run plumbing out of the scripts changed nothing they learn.

tests/scalars_before_harness.json holds every scalar that a seeded tiny run of each script logged at commit
f363de8, the last commit before harness.py existed. It was written by `python tests/test_harness.py --record`
run at that commit, on this repository's 2-core CPU machine (torch 2.13.0, one thread).
"""
import json
import os
import sys

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import harness

FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scalars_before_harness.json")
WALL_CLOCK_TAGS = {"charts/SPS", "charts/policy_phase_time", "charts/aux_phase_time"}
CARTPOLE = dict(env_id="CartPole-v1", num_envs=4, num_steps=32, num_minibatches=2, gamma=0.99, cuda=False)
PENDULUM = dict(env_id="Pendulum-v1", num_envs=2, num_steps=64, num_minibatches=4, cuda=False)
RUNS = {  # name: (script, Args fields); each a few iterations, every code path of its script's loop
    "ppo_ewma": ("ppo_ewma", dict(CARTPOLE, update_epochs=2, total_timesteps=512)),
    "ppo_ewma_divisor_kl": ("ppo_ewma", dict(CARTPOLE, num_envs=8, batch_divisor=2, objective="kl",
                                             total_timesteps=512)),
    "ppg_ewma": ("ppg_ewma", dict(CARTPOLE, n_pi=2, aux_minibatch_size=64, aux_epochs=2, total_timesteps=512)),
    "ppo_staleness": ("ppo_staleness", dict(CARTPOLE, staleness=2, update_epochs=2, total_timesteps=512)),
    "vmpo_cartpole": ("vmpo", dict(CARTPOLE, total_timesteps=512)),
    "vmpo_pendulum": ("vmpo", dict(PENDULUM, total_timesteps=512)),
    "ppo_er": ("ppo_er", dict(PENDULUM, update_epochs=2, replay_batches=2, total_timesteps=512)),
}


def logged_scalars(script, config, exp_name):
    """{tag: [[step, value], ...]} of one seeded run, wall-clock tags left out."""
    module = __import__(script)
    result = module.train(module.Args(exp_name=exp_name, **config))
    events = EventAccumulator(result["run_dir"], size_guidance={"scalars": 0})
    events.Reload()
    return {tag: [[s.step, s.value] for s in events.Scalars(tag)]
            for tag in sorted(events.Tags()["scalars"]) if tag not in WALL_CLOCK_TAGS}


@pytest.mark.parametrize("name", sorted(RUNS))
def test_every_scalar_is_the_one_logged_before_the_harness(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with open(FIXTURE) as file:
        expected = json.load(file)[name]
    logged = logged_scalars(*RUNS[name], exp_name=name)
    for tag, points in expected.items():
        assert logged.get(tag) == points, f"{name}: {tag} differs from the recorded run"


# ------------------------------------------------------------------------------------ progress, CPU
def test_progress_prints_a_plain_line_every_30_seconds_when_not_a_terminal(monkeypatch, capsys):
    clock = [1000.0]
    monkeypatch.setattr(harness.time, "monotonic", lambda: clock[0])
    progress = harness.Progress(total_steps=1000, start_step=0)
    for step in range(1, 101):  # one update per second for 100 s, an episode finishing at every one
        clock[0] += 1.0
        progress.update(10 * step, [float(step)])
    progress.close(1000, [100.0])
    lines = capsys.readouterr().out.splitlines()
    # at 30, 60 and 90 s, then the final line: step 300 of 1000 after 30 s at 10 steps/s, ETA (700 / 300) * 30 = 70 s
    assert len(lines) == 4
    assert lines[0] == "step 300/1,000 (30%)  mean_return 30.00  SPS 10  elapsed 30 s  ETA 70 s"
    assert lines[-1].startswith("step 1,000/1,000 (100%)  mean_return 100.00")


def test_tune_cpu_picks_threads_by_torso():
    # measured here (docs/speed.md): the MLP is fastest on 1 thread, the IMPALA CNN on one per core
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        harness.tune_cpu(torch.device("cpu"), 0, (4,))  # CartPole's vector observation: 1 thread
        assert torch.get_num_threads() == 1
        torch.set_num_threads(2)
        harness.tune_cpu(torch.device("cpu"), 0, (64, 64, 3))  # images: PyTorch's default is kept
        assert torch.get_num_threads() == 2
        harness.tune_cpu(torch.device("cpu"), 3, (4,))  # --torch-threads 3 wins
        assert torch.get_num_threads() == 3
        harness.tune_cpu(torch.device("cuda"), 1, (4,))  # on the GPU nothing changes
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)


if __name__ == "__main__" and sys.argv[1:] == ["--record"]:
    import tempfile

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import torch

    torch.set_num_threads(1)
    recorded = {}
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        for name, (script, config) in RUNS.items():
            recorded[name] = logged_scalars(script, config, name)
    with open(FIXTURE, "w") as file:
        json.dump(recorded, file, indent=0, sort_keys=True)
    print(f"wrote {FIXTURE}: {sum(len(v) for r in recorded.values() for v in r.values())} points")
