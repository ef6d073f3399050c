"""The run harness (harness.py): what every run needs, and proof that moving it out of the scripts changed nothing
they learn.

tests/recorded_scalars.json holds every scalar that a seeded tiny run of each script logs (one thread), and how far
those scalars spread across the ATEN_CPU_CAPABILITY levels of the CPU that recorded them: other CPUs run other
kernels, which round differently in the last bits (TOLERANCE below says how far a value may differ, and why).
tests/intel_xeon_scalars.json holds what a second CPU logged. `python tests/test_harness.py --record` writes the
first. The scalars
were first recorded at commit f363de8, the last commit before harness.py existed, and the commits that moved the
run plumbing into harness.py logged exactly those numbers.
"""
import dataclasses
import glob
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import gymnasium as gym
import numpy as np
import pytest
import torch
import tyro
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # as conftest.py, for --record
import harness  # noqa: E402
from saved_files import read_back  # noqa: E402

FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "recorded_scalars.json")
WALL_CLOCK_TAGS = {"charts/SPS", "charts/policy_phase_time", "charts/aux_phase_time"}
CARTPOLE = dict(env_id="CartPole-v1", num_envs=4, num_steps=32, num_minibatches=2, gamma=0.99, cuda=False)
PENDULUM = dict(env_id="Pendulum-v1", num_envs=2, num_steps=64, num_minibatches=4, cuda=False)
RUNS = {  # name: (script, Args fields); each a few iterations, every code path of its script's loop
    "ppo_ewma": ("ppo_ewma", dict(CARTPOLE, update_epochs=2, total_timesteps=512)),
    "ppo_ewma_divisor_kl": ("ppo_ewma", dict(CARTPOLE, num_envs=8, batch_divisor=2, objective="kl",
                                             total_timesteps=512)),
    "ppg_ewma": ("ppg_ewma", dict(CARTPOLE, n_pi=2, aux_minibatch_size=64, aux_epochs=2, total_timesteps=512)),
    # c = 2: 4 envs, N_pi 4, the aux minibatch 64 / 2 and its step size / sqrt(2) (Appendix B); one phase
    "ppg_ewma_divisor": ("ppg_ewma", dict(CARTPOLE, num_envs=8, batch_divisor=2, n_pi=2, aux_minibatch_size=64,
                                          aux_epochs=2, total_timesteps=512)),
    "ppo_staleness": ("ppo_staleness", dict(CARTPOLE, staleness=2, update_epochs=2, total_timesteps=512)),
    "vmpo_cartpole": ("vmpo", dict(CARTPOLE, total_timesteps=512)),
    "vmpo_pendulum": ("vmpo", dict(PENDULUM, total_timesteps=512)),
    "ppo_er": ("ppo_er", dict(PENDULUM, update_epochs=2, replay_batches=2, total_timesteps=512)),
    # recorded on an Intel Xeon (avx512_bf16): ppo_ewma's Box-action path (the lean MuJoCo step to come keeps it),
    # and vmpo's recurrent core before it is generalized to three cells
    "ppo_ewma_pendulum": ("ppo_ewma", dict(PENDULUM, update_epochs=2, total_timesteps=512)),
    "vmpo_lstm": ("vmpo", dict(CARTPOLE, lstm=True, total_timesteps=512)),
    # recorded with ppo_ewma.py --rnn, before the recurrent policy moved into ppo_ewma_rnn.py (which logs them bit for
    # bit): an LSTM with the value preprocessor, discrete actions; a GRU with Box actions and PPO's proximal policy
    "ppo_ewma_rnn": ("ppo_ewma_rnn", dict(CARTPOLE, rnn="lstm", norm_value=True, update_epochs=2,
                                          total_timesteps=512)),
    "ppo_ewma_rnn_pendulum": ("ppo_ewma_rnn", dict(PENDULUM, rnn="gru", num_minibatches=2, ewma=False,
                                                    update_epochs=2, total_timesteps=512)),
}
CAPABILITIES = ("default", "avx2", "avx512")  # x86-64's ATEN_CPU_CAPABILITY levels, lowest first
# A logged value may differ from the recorded one by TOLERANCE x its tag's spread + its tag's float32 floor.
# - The spread: the largest difference between the recording CPU's levels at one step, i.e. how far these few
#   iterations carry a last-bit difference forward. 30 x it, since other CPUs round other operations.
# - The floor: what rounding alone allows, whatever the spread. Every tag is computed in float32 from inputs of
#   magnitude about 1 or more (log-probabilities, advantages normalized to unit std, values, the tag's own value), so
#   it cannot be compared more finely than those inputs' rounding: two CPUs' log, exp and sum kernels differ by up
#   to 1.5 ulp each (SLEEF's 1-ulp vector kernels against glibc's 0.5), a KL or a k3 estimate subtracts two such
#   log-probabilities (3 ulp) and weighs and sums the terms (1 more): 4 ulp = 4 x eps, doubled for margin:
#   floor = 8 x eps x max(1, max |recorded value|) = 9.5e-7 for a tag near 0 (eps = 2^-23 = 1.19e-7).
# A KL between nearly equal policies (1e-7 here) is rounding noise, so its floor makes it blind to small changes of
# what is learned: the values, returns and advantages carry the check (test_the_tolerance_catches_a_one_percent_change).
# Checked against two CPUs: the recording AMD EPYC's levels (the spread) and an Intel Xeon's (CPU_LOGS), every
# value within a quarter of its tolerance.
TOLERANCE = 30
FLOAT32_FLOOR = 8 * np.finfo(np.float32).eps
CPU_LOGS = os.path.join(os.path.dirname(FIXTURE), "intel_xeon_scalars.json")  # every run, logged at each level
RECORDED_ON_XEON = {"ppo_ewma_pendulum", "vmpo_lstm"}  # recorded on that Xeon itself: its levels give their spread
NOT_ON_XEON = {"ppo_ewma_rnn", "ppo_ewma_rnn_pendulum"}  # recorded since, on an AMD EPYC (its levels: default, avx2)


def logged_scalars(script, config, exp_name):
    """{tag: [[step, value], ...]} of one seeded run, wall-clock tags left out."""
    module = __import__(script)
    result = module.train(module.Args(exp_name=exp_name, **config))
    events = EventAccumulator(result["run_dir"], size_guidance={"scalars": 0})
    events.Reload()
    return {tag: [[s.step, s.value] for s in events.Scalars(tag)]
            for tag in sorted(events.Tags()["scalars"]) if tag not in WALL_CLOCK_TAGS}


def cpu_capabilities():
    """The ATEN_CPU_CAPABILITY levels that this CPU runs."""
    native = torch.backends.cpu.get_cpu_capability().lower()
    return CAPABILITIES[:CAPABILITIES.index(native) + 1] if native in CAPABILITIES else (native,)


def log_every_run(capabilities, directory):
    """{level: {run name: logged scalars}} of every run of RUNS, in a process of its own for each ATEN_CPU_CAPABILITY
    level, the processes side by side (one thread each)."""
    paths = {capability: os.path.join(directory, f"logged_{capability}.json") for capability in capabilities}
    processes = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--log", path], cwd=directory,
                                  env=dict(os.environ, ATEN_CPU_CAPABILITY=capability), stdout=subprocess.DEVNULL)
                 for capability, path in paths.items()]
    assert [process.wait() for process in processes] == [0] * len(processes)
    logged = {}
    for capability, path in paths.items():
        with open(path) as file:
            logged[capability] = json.load(file)
    return logged


def tags_beyond_tolerance(logged, recorded, spread):
    """The tags of one run whose logged points are not the recorded ones: other tags or steps, or a value further off
    than TOLERANCE x the tag's spread + its float32 floor."""
    if sorted(logged) != sorted(recorded):
        return sorted(set(logged) ^ set(recorded))
    wrong = []
    for tag, points in recorded.items():
        expected, values = np.array(points), np.array(logged[tag])
        tolerance = TOLERANCE * spread[tag] + FLOAT32_FLOOR * max(1.0, np.abs(expected[:, 1]).max())
        if len(values) != len(expected) or not (np.array_equal(values[:, 0], expected[:, 0]) and np.allclose(
                values[:, 1], expected[:, 1], rtol=0, atol=tolerance, equal_nan=True)):
            wrong.append(tag)
    return wrong


def test_every_scalar_is_the_recorded_one_on_every_cpu(tmp_path):
    with open(FIXTURE) as file:
        fixture = json.load(file)
    for capability, runs in log_every_run(cpu_capabilities(), tmp_path).items():
        for name, logged in runs.items():
            wrong = tags_beyond_tolerance(logged, fixture["scalars"][name], fixture["spread"][name])
            assert not wrong, f"{name}, ATEN_CPU_CAPABILITY={capability}: {', '.join(wrong)} differ from the recorded run"


def test_another_cpus_logs_of_every_run_are_within_the_tolerance():
    with open(FIXTURE) as file, open(CPU_LOGS) as logs_file:
        fixture, logs = json.load(file), json.load(logs_file)
    assert sorted(logs["logged"]) == sorted(CAPABILITIES) and all(
        sorted(runs) == sorted(set(RUNS) - RECORDED_ON_XEON - NOT_ON_XEON) for runs in logs["logged"].values())
    for capability, runs in logs["logged"].items():
        for name, logged in runs.items():
            wrong = tags_beyond_tolerance(logged, fixture["scalars"][name], fixture["spread"][name])
            assert not wrong, f"{logs['cpu']}, {name}, ATEN_CPU_CAPABILITY={capability}: {', '.join(wrong)} differ"


def test_the_tolerance_catches_a_one_percent_change(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with open(FIXTURE) as file:
        fixture = json.load(file)
    for name, (script, config) in RUNS.items():  # a 1% larger step size: what the run learns is off in every run
        step_size = config.get("learning_rate", __import__(script).Args().learning_rate)
        logged = logged_scalars(script, dict(config, learning_rate=1.01 * step_size), name + "_lr")
        wrong = tags_beyond_tolerance(logged, fixture["scalars"][name], fixture["spread"][name])
        assert set(wrong) - {"charts/learning_rate", "charts/aux_learning_rate"}, name  # not only the logged step size
    import ppo_ewma

    def swapped(args, real=ppo_ewma.epoch_minibatches):  # the same samples, the first two minibatches in turn
        first, second, *rest = real(args)
        return [second, first, *rest]
    monkeypatch.setattr(ppo_ewma, "epoch_minibatches", swapped)
    logged = logged_scalars(*RUNS["ppo_ewma"], exp_name="ppo_ewma_swapped")
    assert tags_beyond_tolerance(logged, fixture["scalars"]["ppo_ewma"], fixture["spread"]["ppo_ewma"])


# ------------------------------------------------------------------------------------ progress, CPU
def test_progress_line_counts_whole_iterations_and_says_what_the_update_is_doing(monkeypatch, capsys):
    clock = [1000.0]
    monkeypatch.setattr(harness.time, "monotonic", lambda: clock[0])
    progress = harness.Progress(total_steps=1000, start_step=0)
    for step in range(1, 21):  # the first rollout: 10 steps a second for 20 s, two episodes ended
        clock[0] += 1.0
        progress.update(10 * step, [1.0, 3.0])
    progress.set_status("updating: epoch 1/2")  # 20 s in: no line yet
    clock[0] += 20.0
    progress.set_status("updating: epoch 2/2")  # 40 s in: the first line, while the first iteration is not over
    clock[0] += 20.0
    progress.iteration_done(200)  # 200 steps in 60 s, update included: 3.33 steps a second
    for step in range(1, 21):  # the second rollout; a line 30 s after the last one, at 70 s and step 300
        clock[0] += 1.0
        progress.update(200 + 10 * step, [1.0, 3.0, 5.0])
    progress.close(400, [1.0, 3.0, 5.0])
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        "step 200/1,000 (20%)  mean_return 2.00  in the first iteration  updating: epoch 2/2  elapsed 40 s",
        # ETA = (1000 - 300) steps / (200 / 60 steps a second) = 210 s = 3.5 min; elapsed 70 s = 1.2 min
        "step 300/1,000 (30%)  mean_return 3.00  SPS 3  ETA 3.5 min  elapsed 1.2 min",
        "step 400/1,000 (40%)  mean_return 3.00  SPS 3  ETA 3.0 min  elapsed 1.3 min",
    ]


def test_a_terminal_gets_a_line_every_10_seconds(monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self):
            return True
    monkeypatch.setattr(sys, "stdout", Terminal())
    clock = [1000.0]
    monkeypatch.setattr(harness.time, "monotonic", lambda: clock[0])
    progress = harness.Progress(total_steps=100_000_000, start_step=0)
    for step in range(1, 26):  # 1 s and 8,192 steps apart: lines at 10 s and 20 s
        clock[0] += 1.0
        progress.update(8_192 * step, [-1234.56] * 3)
    assert sys.stdout.getvalue().splitlines() == [
        "step 81,920/100,000,000 (0%)  mean_return -1234.56  in the first iteration  elapsed 10 s",
        "step 163,840/100,000,000 (0%)  mean_return -1234.56  in the first iteration  elapsed 20 s"]


def test_a_writer_that_does_not_log_yet_still_refuses_a_misspelt_call():
    writer = harness.Writer()  # before the logs open, and on torchrun's ranks other than 0
    assert writer.add_scalar("charts/SPS", 1, 0) is None
    with pytest.raises(AttributeError, match="add_scalr"):
        writer.add_scalr("charts/SPS", 1, 0)


def test_durations_read_as_people_read_them():
    # the main job's ETA on a CPU, 1,747,442 s / 86,400 = 20.2 days; 200 s / 60 = 3.3 min; 11,520 s / 3,600 = 3.2 h
    assert [harness.duration(s) for s in (42, 200, 11_520, 1_747_442)] == ["42 s", "3.3 min", "3.2 h", "20.2 d"]
    assert [harness.duration(s) for s in (59.6, 3599.6, 86_399)] == ["1.0 min", "1.0 h", "1.0 d"]  # rounded up


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


def test_bf16_on_the_cpu_says_where_it_pays(capsys, tmp_path, monkeypatch):
    import ppo_ewma  # a CPU run with --bf16 says at its start what bfloat16 measured (docs/speed.md); one without, nothing

    monkeypatch.chdir(tmp_path)  # start() checks that runs/ could be made here
    for bf16 in (True, False):
        args = ppo_ewma.Args(env_id="starpilot", bf16=bf16, cuda=False, num_envs=4, num_steps=16, num_minibatches=2)
        run = harness.start(ppo_ewma.SCRIPT, args, None, num_iterations=1)
        for sig, handler in run.old_handlers.items():  # the run never opens, so give Ctrl-C back to pytest here
            signal.signal(sig, handler)
        note = ("note: --bf16 on the CPU: an iteration 1.60x as fast with AMX, 0.84-1.54x with avx512_bf16 alone; "
                "emulated, the CNN 12-13x slower; benchmark/bf16.py times it here\n")
        assert (note in capsys.readouterr().out) == bf16


# ----------------------------------------------------------------------- runs that never lose work
TINY = dict(env_id="CartPole-v1", num_envs=2, num_steps=32, num_minibatches=2, gamma=0.99, cuda=False)
SCRIPT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def start_script(tmp_path, *flags):
    """`python ppo_ewma.py` with the TINY flags in its own process; returns it once its start-up block is out."""
    command = [sys.executable, os.path.join(SCRIPT_DIR, "ppo_ewma.py")] + [
        f"--{k.replace('_', '-')}" + ("" if v is False else f" {v}") for k, v in TINY.items() if k != "cuda"]
    command = " ".join(command).split() + ["--no-cuda", *flags]
    process = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env=dict(os.environ, OMP_NUM_THREADS="1"))
    for line in process.stdout:
        if line.startswith("  saves"):
            return process
    raise AssertionError("the script ended before its start-up block")


def test_ctrl_c_stops_at_an_iteration_end_with_a_checkpoint_and_says_how_to_resume(tmp_path, monkeypatch):
    process = start_script(tmp_path, "--total-timesteps", "3200")  # 50 iterations of 64 steps, a few seconds
    process.send_signal(signal.SIGINT)  # at once: Ctrl-C is handled from the start-up block on, not a traceback
    out, _ = process.communicate(timeout=60)
    assert process.returncode == 130, out  # 128 + SIGINT, the shell's convention
    assert "Traceback" not in out
    assert "SIGINT: stopping at the next iteration end that can be checkpointed" in out
    stopped, resume = out.splitlines()[-2:]
    match = re.fullmatch(r"stopped by SIGINT after iteration (\d+) of 50 \(step ([\d,]+)\); checkpoint (\S+)", stopped)
    assert match, stopped
    iteration, path = int(match.group(1)), match.group(3)
    assert resume == f"resume: python ppo_ewma.py --resume {path} --no-cuda"
    checkpoint = read_back(tmp_path / path)
    assert checkpoint["iteration"] == iteration < 50 and checkpoint["global_step"] == 64 * iteration
    monkeypatch.chdir(tmp_path)  # the printed command continues the run to its end
    import ppo_ewma

    result = ppo_ewma.train(tyro.cli(ppo_ewma.Args, args=resume.split()[3:]))
    assert result["global_step"] == 3200 and os.path.exists(tmp_path / os.path.dirname(path) / "model.safetensors")


def test_a_second_ctrl_c_stops_at_once_without_a_checkpoint(tmp_path):
    process = start_script(tmp_path, "--update-epochs", "5000")  # the first iteration's update takes many seconds
    process.send_signal(signal.SIGINT)
    for line in process.stdout:  # the second only once the first was handled: two pending SIGINTs run one handler
        if line.startswith("SIGINT: stopping"):
            break
    sent = time.monotonic()
    process.send_signal(signal.SIGINT)
    out, _ = process.communicate(timeout=60)
    assert time.monotonic() - sent < 5 and process.returncode == 130, out
    assert out.splitlines()[-1] == "SIGINT again: stopping now, without a checkpoint." and "Traceback" not in out
    assert not glob.glob(str(tmp_path / "runs" / "*" / "*.safetensors"))


def test_the_progress_mean_return_counts_episodes_as_they_end(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    import ppo_ewma

    seen = []
    monkeypatch.setattr(harness.Progress, "update", lambda self, step, returns, force=False: seen.append(
        (step, len(returns))))
    ppo_ewma.train(ppo_ewma.Args(**dict(TINY, num_steps=128), total_timesteps=256))
    # CartPole episodes last 10-40 steps under the random first policy: many end within the one rollout (2 x 128)
    during = [count for step, count in seen[:128]]  # after each of the rollout's 128 vector steps
    assert during[0] == 0 and during[-1] >= 6


@pytest.mark.parametrize("script, config", [
    ("ppo_ewma", TINY),
    ("vmpo", dict(TINY, env_id="Pendulum-v1", num_envs=1, num_steps=64)),  # frozen observation statistics
])
def test_eval_every_logs_the_eval_return_at_each_mark_and_changes_nothing_learned(tmp_path, monkeypatch, script,
                                                                                 config):
    monkeypatch.chdir(tmp_path)
    module = __import__(script)
    plain = logged_scalars(script, dict(config, total_timesteps=4 * 64), "plain")
    # marks every 100 steps: evaluated at the iteration ends past 100 and 200, i.e. steps 128 and 256
    evaluated = logged_scalars(script, dict(config, total_timesteps=4 * 64, eval_every=100, eval_episodes=3), "eval")
    eval_returns = evaluated.pop("eval/mean_return")
    assert [step for step, _ in eval_returns] == [128, 256] and [s for s, _ in evaluated.pop("eval/std_return")] == [
        128, 256]
    assert all(np.isfinite(value) for _, value in eval_returns)
    assert evaluated == plain  # the run's random state is put back after each evaluation
    assert module.Args().eval_every == 0


def test_the_last_iteration_always_writes_its_checkpoint_and_the_final_model(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    import ppo_ewma

    saved = []
    real_save = harness.save_checkpoint
    monkeypatch.setattr(harness, "save_checkpoint", lambda path, checkpoint, dir_fd: (
        saved.append((os.path.basename(path), checkpoint["iteration"])), real_save(path, checkpoint, dir_fd)))
    result = ppo_ewma.train(ppo_ewma.Args(**TINY, total_timesteps=3 * 64, checkpoint_every=50))
    assert saved == [("checkpoint.safetensors", 3)]  # 50 is never reached; the last iteration is 3
    model = os.path.join(result["run_dir"], "model.safetensors")  # the run's last line says where it went
    assert capsys.readouterr().out.splitlines()[-1] == (f"saved {model}; play it: python ppo_ewma.py "
                                                        f"--eval-checkpoint {model}")
    assert read_back(model)["global_step"] == 3 * 64
    saved.clear()
    ppo_ewma.train(ppo_ewma.Args(**TINY, total_timesteps=3 * 64, checkpoint_every=0, save_model=False))
    assert saved == []
    # --resume of the finished run: nothing to train; it says where its model is, or how to play its checkpoint
    checkpoint = os.path.join(result["run_dir"], "checkpoint.safetensors")
    for message in (f"that run already finished all 3 iterations; its model is {model}.",
                    f"that run already finished all 3 iterations; play it: python ppo_ewma.py --eval-checkpoint "
                    f"{checkpoint}"):
        with pytest.raises(SystemExit) as stop:
            ppo_ewma.train(ppo_ewma.Args(resume=checkpoint))
        assert stop.value.code == 0 and capsys.readouterr().out.splitlines()[-1] == f"--resume {checkpoint}: {message}"
        if os.path.exists(model):
            os.remove(model)


@pytest.mark.parametrize("script", ["ppo_ewma", "ppg_ewma", "ppo_staleness", "vmpo", "ppo_er"])
def test_checkpoints_of_an_earlier_version_are_refused_naming_the_commit_that_reads_them(tmp_path, monkeypatch,
                                                                                          script):
    # tests/old_checkpoints/{script}.pt: iteration 3 of 4 of a tiny run (CartPole; Pendulum for ppo_er) written by
    # the scripts at commit f363de8, torch.save's zip of a pickle; 18fb459 is the last commit whose code reads them
    monkeypatch.chdir(tmp_path)
    module = __import__(script)
    os.makedirs("runs/old")
    shutil.copy(os.path.join(SCRIPT_DIR, "tests", "old_checkpoints", f"{script}.pt"), "runs/old/checkpoint.pt")
    for args in (module.Args(eval_checkpoint="runs/old/checkpoint.pt"), module.Args(resume="runs/old/checkpoint.pt")):
        with pytest.raises(SystemExit, match=r"^--(eval-checkpoint|resume) runs/old/checkpoint\.pt is a \.pt file of an "
                                             r"earlier version of this project \(torch\.save's zip\), which this "
                                             r"version does not read: run it with that version \(git checkout "
                                             r"18fb459\)\.$"):
            module.train(args)
    assert os.listdir("runs/old") == ["checkpoint.pt"]


class WritesAFile:
    """A pickle that, when loaded, creates the file at `path`: any code could run in its place."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return open, (self.path, "w")


def test_a_pickle_given_as_a_checkpoint_runs_none_of_its_code(tmp_path, monkeypatch):
    import pickle

    import ppo_ewma

    monkeypatch.chdir(tmp_path)
    os.makedirs("runs/x")
    for data in (pickle.dumps(WritesAFile(str(tmp_path / "marker"))), b""):  # a pickle, and an empty file
        with open("runs/x/checkpoint.safetensors", "wb") as file:
            file.write(data)
        for args in (ppo_ewma.Args(resume="runs/x/checkpoint.safetensors"),
                     ppo_ewma.Args(eval_checkpoint="runs/x/checkpoint.safetensors")):
            with pytest.raises(SystemExit, match=r"checkpoint\.safetensors is not a file a run writes: a safetensors "
                                                 r"file whose header is at most 16 MiB \(its first 8 bytes give "):
                ppo_ewma.train(args)
    assert not os.path.exists(tmp_path / "marker")


def test_a_checkpoint_of_another_script_is_refused_in_one_sentence(tmp_path, monkeypatch):
    import ppg_ewma
    import ppo_ewma

    monkeypatch.chdir(tmp_path)
    result = ppo_ewma.train(ppo_ewma.Args(**TINY, total_timesteps=64))  # a file names its script
    with pytest.raises(SystemExit, match=r"checkpoint\.safetensors is a ppo_ewma\.py checkpoint, not a ppg_ewma\.py "
                                         r"one: run ppo_ewma\.py\.$"):
        ppg_ewma.train(ppg_ewma.Args(resume=os.path.join(result["run_dir"], "checkpoint.safetensors")))
    import vmpo

    with pytest.raises(SystemExit, match=r"model\.safetensors is a ppo_ewma\.py model, not a vmpo\.py one"):
        vmpo.train(vmpo.Args(eval_checkpoint=os.path.join(result["run_dir"], "model.safetensors")))
    with pytest.raises(SystemExit, match=r"model\.safetensors is a model file, the policy alone: --resume takes a "
                                         r"run's checkpoint\.safetensors\.$"):
        ppo_ewma.train(ppo_ewma.Args(resume=os.path.join(result["run_dir"], "model.safetensors")))


def test_resume_command_repeats_the_output_flags_that_differ_from_the_defaults():
    import ppo_ewma

    args = ppo_ewma.Args(cuda=False, save_model=False, checkpoint_every=5)
    assert harness.resume_command(ppo_ewma.SCRIPT, args, "runs/a b/checkpoint.safetensors") == (
        "python ppo_ewma.py --resume 'runs/a b/checkpoint.safetensors' --no-cuda --no-save-model --checkpoint-every 5")


def test_fewer_steps_than_one_iteration_are_refused_before_any_work(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    import ppo_ewma

    with pytest.raises(SystemExit, match=r"^--total-timesteps 50 is less than one iteration of 64 steps \(--num-envs 2 "
                                         r"x --num-steps 32\)\.$"):
        ppo_ewma.train(ppo_ewma.Args(**TINY, total_timesteps=50))
    with pytest.raises(SystemExit, match=r"one iteration of 65,536 steps \(--num-envs 256 x --num-steps 256\)"):
        harness.check_args(ppo_ewma.Args(env_id="CartPole-v1", total_timesteps=100), ppo_ewma.SCRIPT)
    assert not os.path.exists("runs")


def test_a_flag_the_script_adjusted_is_named_with_the_value_it_was_given(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    import ppo_ewma

    # --batch-divisor 2 halves --num-envs 8 to 4; 1 step x 4 envs cannot make 8 minibatches
    args = ppo_ewma.Args(**dict(TINY, num_envs=8, num_steps=1, num_minibatches=8, batch_divisor=2))
    with pytest.raises(SystemExit, match=r"must divide --num-envs 4 .* \(adjusted from the flags: --num-envs 8 -> 4\)$"):
        ppo_ewma.train(args)
    with pytest.raises(SystemExit, match=r"must divide --num-envs 8 .*--num-steps 1 into equal time chunks "
                                         r"\(or pass --shuffle-samples\)\.$"):  # nothing adjusted: nothing added
        ppo_ewma.train(dataclasses.replace(args, num_envs=8, num_minibatches=16, batch_divisor=1))
    assert not os.path.exists("runs")


def test_an_unknown_env_id_is_refused_with_the_closest_name(tmp_path, monkeypatch):
    import ppo_ewma

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit, match=r"^--env-id 'starpilott' is neither a Procgen game nor a registered "
                                         r"Gymnasium env; did you mean starpilot\?$"):
        ppo_ewma.train(ppo_ewma.Args(env_id="starpilott"))
    with pytest.raises(SystemExit, match=r"; did you mean HalfCheetah-v5\?$"):
        harness.env_spaces("Halfcheetah-v5")
    with pytest.raises(SystemExit, match=r"registered Gymnasium env\.$"):  # nothing close: no guess
        harness.env_spaces("xyzzy", harness.PROCGEN_GAMES)
    assert not os.path.exists("runs")


# ------------------------------------------------ your own env and its spaces, deterministic evaluation, W&B
class TupleEnv(gym.Env):
    """Tuple observations of a 2-vector and a 2x2 uint8 grid, always the same."""
    observation_space = gym.spaces.Tuple((gym.spaces.Box(0, 9, (2,), np.float32),
                                          gym.spaces.Box(0, 9, (2, 2), np.uint8)))
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        return (np.array([1, 2], np.float32), np.array([[3, 4], [5, 6]], np.uint8)), {}


def test_observations_are_flattened_in_a_fixed_order_and_images_are_kept():
    import user_envs  # noqa: F401  (registers the envs)

    raw, flat = gym.make("DictMultiDiscrete-v0"), harness.vector_observations(gym.make("DictMultiDiscrete-v0"))
    obs, flat_obs = raw.reset(seed=0)[0], flat.reset(seed=0)[0]
    # a Dict's keys in sorted order, as gym.spaces.Dict keeps them: "position" (2) before "velocity" (3)
    assert np.array_equal(flat_obs, np.concatenate([obs["position"], obs["velocity"]]))
    # a Tuple in order, each Box row-major, integers cast to float32: (1, 2), [[3, 4], [5, 6]] -> 1 ... 6
    tuple_obs = harness.vector_observations(TupleEnv()).reset()[0]
    assert tuple_obs.dtype == np.float32 and np.array_equal(tuple_obs, [1, 2, 3, 4, 5, 6])
    assert harness.seen_observation_space(TupleEnv.observation_space) == gym.spaces.Box(0, 9, (6,), np.float32)
    image = gym.spaces.Box(0, 255, (64, 64, 3), np.uint8)  # the IMPALA CNN's, where the script takes images
    assert harness.seen_observation_space(image) == image
    assert harness.seen_observation_space(image, images=False).shape == (64 * 64 * 3,)
    cartpole = gym.make("CartPole-v1")
    assert harness.vector_observations(cartpole) is cartpole  # a 1-D float Box gets no wrapper: runs are unchanged


def test_spaces_that_cannot_be_taken_are_refused_in_one_sentence(tmp_path, monkeypatch):
    import ppo_er
    import ppo_ewma
    import vmpo

    monkeypatch.chdir(tmp_path)
    cases = [
        (ppo_ewma, "FrozenLake-v1", r"^--env-id FrozenLake-v1 has Discrete\(16\) observations; ppo_ewma\.py needs a "
                                    r"Box, or a Dict or Tuple of Boxes \(flattened into one vector\)\.$"),
        (vmpo, "user_envs:DictMultiDiscrete-v0", r"has MultiDiscrete\(\[2 3\]\) actions; vmpo\.py needs Discrete "
                                                 r"actions counted from 0, or Box ones\.$"),
        (ppo_er, "user_envs:Grid2D-v0", r"has Discrete\(2\) actions; ppo_er\.py needs Box actions\.$"),
        (ppo_ewma, "no_such_module:Env-v0", r"^--env-id 'no_such_module:Env-v0' cannot be made: ModuleNotFoundError: "
                                            r"No module named 'no_such_module'\. [^\n]*$"),
    ]
    for module, env_id, message in cases:
        with pytest.raises(SystemExit, match=message):
            module.train(module.Args(env_id=env_id, num_envs=2, num_steps=32, num_minibatches=2, cuda=False))
    monkeypatch.setattr(harness.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(SystemExit, match=r"^--track needs the wandb package, which is not installed: pip install "):
        ppo_ewma.train(ppo_ewma.Args(**TINY, track=True))
    assert not os.path.exists("runs")


def test_integer_actions_counted_from_elsewhere_or_a_multidiscrete_of_more_dimensions_are_refused(monkeypatch):
    import ppo_ewma

    box = gym.spaces.Box(-1, 1, (3,))
    for actions in (gym.spaces.Discrete(3, start=1), gym.spaces.MultiDiscrete([2, 2], start=[0, 1]),
                    gym.spaces.MultiDiscrete([[2, 2], [2, 2]]), gym.spaces.MultiDiscrete(3)):
        monkeypatch.setattr(harness, "env_spaces", lambda env_id, games: (box, actions))
        with pytest.raises(SystemExit, match=r"actions; ppo_ewma\.py needs Discrete or 1-D MultiDiscrete actions "
                                             r"counted from 0, or Box ones\.$"):
            harness.check_spaces("X-v0", ppo_ewma.SCRIPT)
    for actions in (gym.spaces.Discrete(3), gym.spaces.MultiDiscrete([2, 3]), box):  # counted from 0, 1-D: taken
        monkeypatch.setattr(harness, "env_spaces", lambda env_id, games: (box, actions))
        assert harness.check_spaces("X-v0", ppo_ewma.SCRIPT) == (box, actions)


@pytest.mark.parametrize("script, env_id", [("ppo_ewma", "user_envs:DictMultiDiscrete-v0"),
                                            ("ppo_ewma", "user_envs:Grid2D-v0"), ("vmpo", "user_envs:Grid2D-v0")])
def test_your_own_env_is_reached_as_module_colon_id(tmp_path, monkeypatch, script, env_id):
    module = __import__(script)
    monkeypatch.chdir(tmp_path)
    steps = 16 * 128 if "Dict" in env_id else 4 * 128
    result = module.train(module.Args(env_id=env_id, num_envs=4, num_steps=32, num_minibatches=2, gamma=0.9,
                                      learning_rate=3e-3, total_timesteps=steps, cuda=False))
    assert os.path.basename(result["run_dir"]).startswith(env_id.replace(":", "-") + f"__{script}__1__")
    losses = EventAccumulator(result["run_dir"]).Reload().Scalars("losses/policy_loss")
    assert len(losses) == steps // 128 and all(np.isfinite(point.value) for point in losses)
    if "Dict" in env_id:  # reward 1 for (1, 2) of the 2 x 3 joint actions: random play scores 16 / 6 = 2.7
        assert result["mean_return"] > 2 * 16 / 6


def mode_of(script, models, envs, obs):
    """The action each script's policy finds most likely (CartPole's argmax; ppo_er's Pendulum: the mean, clipped)."""
    module = __import__(script)
    if script == "ppg_ewma":
        network, name = module.PolicyNetwork(envs), "policy"
    else:
        network, name = module.Agent(envs), "target_agent" if script == "vmpo" else "agent"
    network.load_state_dict(models[name])
    pi = network.get_pi(obs)
    return pi.chunk(2, -1)[0].clamp(-2.0, 2.0) if script == "ppo_er" else pi.argmax(-1)


@pytest.mark.parametrize("script", ["ppo_ewma", "ppg_ewma", "ppo_staleness", "vmpo", "ppo_er"])
def test_eval_deterministic_plays_the_policy_mode(tmp_path, monkeypatch, capsys, script):
    module = __import__(script)
    monkeypatch.chdir(tmp_path)
    config = dict(TINY, env_id="Pendulum-v1", num_steps=64) if script == "ppo_er" else dict(TINY)
    if script == "ppg_ewma":
        config.update(n_pi=1, aux_minibatch_size=64)
    trained = module.train(module.Args(**config, total_timesteps=2 * 64))
    played = []  # (obs, actions) of every step the evaluation takes
    import evaluation

    real_play = evaluation.play

    def recording_play(envs, act, num_episodes, seed, **stopping):
        def recording_act(obs, *previous):  # previous: the last step's reward and done
            played.append((obs, act(obs, *previous)))
            return played[-1][1]
        return real_play(envs, recording_act, num_episodes, seed, **stopping)

    monkeypatch.setattr(evaluation, "play", recording_play)
    capsys.readouterr()
    module.train(module.Args(eval_checkpoint=f"{trained['run_dir']}/model.safetensors", eval_episodes=2, cuda=False,
                             eval_deterministic=True))
    assert "(actions the policy's mode (--eval-deterministic))" in capsys.readouterr().out
    models = {module.SCRIPT.policy: read_back(f"{trained['run_dir']}/model.safetensors")["weights"]}
    envs = module.make_env(module.SCRIPT.defaults(module.Args(**{**config, "num_envs": 1})))
    with torch.no_grad():
        for obs, actions in played:
            assert np.allclose(actions, mode_of(script, models, envs, torch.as_tensor(obs)).numpy())
    envs.close()


def test_track_logs_to_an_offline_wandb_run_that_resume_with_track_continues(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb", reason="--track needs wandb, which the GPU kit does not carry")
    import ppo_ewma

    wandb.teardown()  # W&B's process-wide state keeps the directory of its first run: this test starts its own
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")  # no account, no network
    monkeypatch.setenv("WANDB_SILENT", "true")
    real_after_step = harness.Run.after_step

    def ctrl_c_in_iteration_2(run, global_step, info):  # stops at its end, with a checkpoint, as Ctrl-C does
        real_after_step(run, global_step, info)
        if global_step == 2 * 64:
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(harness.Run, "after_step", ctrl_c_in_iteration_2)
    with pytest.raises(SystemExit) as stopped:
        ppo_ewma.train(ppo_ewma.Args(**TINY, total_timesteps=3 * 64, track=True, exp_name="tracked"))
    assert stopped.value.code == 130
    monkeypatch.setattr(harness.Run, "after_step", real_after_step)
    (run_dir,) = glob.glob("runs/*__tracked__*")
    run_id = read_back(f"{run_dir}/checkpoint.safetensors")["wandb_run_id"]
    time.sleep(1 - time.time() % 1)  # to the next second: W&B names an offline run's folder by the second it starts in
    ppo_ewma.train(ppo_ewma.Args(resume=f"{run_dir}/checkpoint.safetensors", cuda=False, track=True))  # asked for again
    first, resumed = sorted(glob.glob(f"wandb/offline-run-*-{run_id}"))  # the same W&B run, continued
    for offline_run, needles in ((first, [b"losses/policy_loss", b"global_step", b"CartPole-v1"]),  # flags: config
                                 (resumed, [b"losses/policy_loss", b"global_step"])):  # the scalars, synced
        log, deadline = f"{offline_run}/run-{run_id}.wandb", time.time() + 60
        while not all(needle in open(log, "rb").read() for needle in needles):  # W&B's service writes it a little
            assert time.time() < deadline, f"{log} lacks some of {needles}"  # after wandb.finish() returns
            time.sleep(0.5)


if __name__ == "__main__":  # --log PATH: every run's scalars into PATH; --record: the fixture, on every CPU level
    import tempfile

    if sys.argv[1] == "--log":
        torch.set_num_threads(1)
        with open(sys.argv[2], "w") as file:
            json.dump({name: logged_scalars(script, config, name) for name, (script, config) in RUNS.items()}, file)
    elif sys.argv[1] == "--record":  # [NAME ...]: only these runs, every other one kept as it was recorded
        names = sys.argv[2:] or list(RUNS)
        with tempfile.TemporaryDirectory() as tmp:
            levels = log_every_run(cpu_capabilities(), tmp)
        scalars = levels[cpu_capabilities()[-1]]  # the native level's
        def spread(name, tag):  # the largest difference between two levels at one step
            values = np.array([np.array(level[name][tag])[:, 1] for level in levels.values()])
            return float(np.nan_to_num(np.ptp(values, axis=0)).max())
        fixture = {"levels": list(levels), "scalars": {}, "spread": {}}
        if names != list(RUNS):
            with open(FIXTURE) as file:
                fixture = json.load(file)
        fixture["scalars"].update({name: scalars[name] for name in names})
        fixture["spread"].update({name: {tag: spread(name, tag) for tag in scalars[name]} for name in names})
        with open(FIXTURE, "w") as file:
            json.dump(fixture, file, indent=0, sort_keys=True)
        print(f"wrote {', '.join(names)} into {FIXTURE}: levels {', '.join(levels)}")


def test_capture_video_films_env_0_in_training_and_every_episode_of_an_evaluation(tmp_path, monkeypatch):
    import ppo_ewma

    monkeypatch.chdir(tmp_path)
    result = ppo_ewma.train(ppo_ewma.Args(**CARTPOLE, total_timesteps=256, capture_video=True, exp_name="filmed"))
    # env 0's episodes 0 and 1 in its 64 steps (k^3: the next one filmed would be its 8th)
    assert sorted(os.listdir(f"{result['run_dir']}/videos")) == [f"rl-video-episode-{k}.mp4" for k in (0, 1)]
    assert read_back(f"{result['run_dir']}/checkpoint.safetensors")["iteration"] == 2  # the video is not state
    evaluated = ppo_ewma.train(ppo_ewma.Args(eval_checkpoint=f"{result['run_dir']}/model.safetensors", eval_episodes=2,
                                             capture_video=True))
    assert sorted(os.listdir(f"{evaluated['run_dir']}/videos")) == ["rl-video-episode-0.mp4", "rl-video-episode-1.mp4"]
    assert all(os.path.getsize(path) > 1000 for path in glob.glob(f"{evaluated['run_dir']}/videos/*.mp4"))
    real_end = harness.Run.end_iteration  # a run stopped by Ctrl-C after iteration 1 of 2, resumed: its videos apart

    def ctrl_c_in_iteration_1(run, iteration, *args, **kwargs):
        if iteration == 1:
            run.on_signal(signal.SIGINT, None)
        real_end(run, iteration, *args, **kwargs)
    monkeypatch.setattr(harness.Run, "end_iteration", ctrl_c_in_iteration_1)
    with pytest.raises(SystemExit):
        ppo_ewma.train(ppo_ewma.Args(**CARTPOLE, total_timesteps=256, capture_video=True, exp_name="resumed"))
    monkeypatch.setattr(harness.Run, "end_iteration", real_end)
    path = glob.glob("runs/CartPole-v1__resumed__*/checkpoint.safetensors")[0]
    ppo_ewma.train(ppo_ewma.Args(resume=path, capture_video=True))
    assert sorted(os.listdir(os.path.join(os.path.dirname(path), "videos"))) == [
        "rl-video-episode-0.mp4", "rl-video-episode-1.mp4",  # its first life's, kept
        "rl-video-resumed-at-128-episode-0.mp4", "rl-video-resumed-at-128-episode-1.mp4"]


# ----------------------------------------------------------------------- a plain run: the script and harness.py
PLAIN = {  # a tiny run of each script
    "ppo_ewma": TINY, "ppo_ewma_rnn": TINY, "ppg_ewma": dict(TINY, n_pi=1, aux_minibatch_size=64),
    "ppo_staleness": dict(TINY, staleness=1), "vmpo": TINY, "ppo_er": dict(TINY, env_id="Pendulum-v1", num_steps=64),
}


def test_a_plain_run_of_each_script_needs_it_and_harness_alone(tmp_path):
    # each script and harness.py copied into an empty folder, no other module of the project's beside them or on
    # sys.path: a tiny run of each trains, logs to TensorBoard, writes its checkpoint and model; the models play
    for name in (*PLAIN, "harness"):
        shutil.copy(os.path.join(SCRIPT_DIR, f"{name}.py"), tmp_path)
    code = "\n".join(
        ["import sys", "assert not [path for path in sys.path if path.rstrip('/') == %r]" % SCRIPT_DIR] +
        [f"import {name}; result = {name}.train({name}.Args(**{config!r}, total_timesteps=2 * {config['num_envs']} * "
         f"{config['num_steps']})); print(result['run_dir'], result['global_step'])" for name, config in PLAIN.items()] +
        ["print(sorted(name for name in sys.modules if name in ('checkpoints', 'resume', 'evaluation', 'workers', "
         "'tracking')))"])
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, env=env,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    *run_dirs, imported = [line for line in result.stdout.splitlines() if line.startswith(("runs/", "["))]
    assert imported == "[]" and len(run_dirs) == len(PLAIN)  # no service was even imported
    for name, (run_dir, global_step) in zip(PLAIN, map(str.split, run_dirs)):
        files = os.listdir(tmp_path / run_dir)
        assert {"checkpoint.safetensors", "model.safetensors"} <= set(files) and any(
            file.startswith("events.out.tfevents") for file in files), (name, files)
        module = __import__(name)  # the model, played by this project's whole copy, checkpoints.py and all
        played = module.train(module.Args(eval_checkpoint=str(tmp_path / run_dir / "model.safetensors"),
                                          eval_episodes=1, cuda=False))
        assert len(played["returns"]) == 1 and played["global_step"] == int(global_step)


@pytest.mark.parametrize("flags, module, flag, files", [  # files: every file the flag needs, named at once
    (dict(resume="runs/x/checkpoint.safetensors"), "resume", "--resume", "resume.py and checkpoints.py"),
    (dict(resume="runs/x/checkpoint.safetensors"), "checkpoints", "--resume", "resume.py and checkpoints.py"),
    (dict(eval_checkpoint="model.safetensors"), "evaluation", "--eval-checkpoint", "evaluation.py and checkpoints.py"),
    (dict(eval_checkpoint="model.safetensors"), "checkpoints", "--eval-checkpoint", "checkpoints.py"),
    (dict(TINY, track=True), "tracking", "--track", "tracking.py"),
    (dict(TINY, capture_video=True), "evaluation", "--capture-video", "evaluation.py"),
    (dict(TINY, eval_every=64), "evaluation", "--eval-every", "evaluation.py"),
])
def test_a_service_asked_for_without_its_file_is_one_sentence_before_any_work(tmp_path, monkeypatch, flags, module,
                                                                              flag, files):
    import ppo_ewma

    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "resume", raising=False)  # imported afresh, as in a new process
    monkeypatch.setitem(sys.modules, module, None)  # as if its file were not beside the script
    with pytest.raises(SystemExit, match=rf"^{flag} needs {files} beside the script, and {module}\.py is not there: "
                                         rf"copy it from this project\.$"):
        ppo_ewma.train(ppo_ewma.Args(**flags))
    monkeypatch.setenv("LOCAL_RANK", "0")  # torchrun's, with one worker
    monkeypatch.setitem(sys.modules, "workers", None)
    with pytest.raises(SystemExit, match=r"^torchrun needs workers\.py beside the script, and workers\.py is not "):
        ppo_ewma.train(ppo_ewma.Args(**TINY))
    assert not os.path.exists("runs")
