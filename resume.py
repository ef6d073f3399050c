"""Continuing a run from its checkpoint (--resume), loaded only then. checkpoints.py reads the file and checks each
value against the rebuilt run's (restored()); this module decides what a resumed run takes from it (its flags, its
directory) and puts every part back: networks, optimizers, statistics, the env stack's state, the random state,
counters, the script's keys, each checked first and none applied until all fit. It imports checkpoints.py and none
other of the project's modules; harness.py hands it the Run and itself (the module), never imported.
"""
import dataclasses
import math
import os
import random
import re
import reprlib
import shlex
import stat
import sys
from collections import deque
from typing import Optional

import numpy as np
import torch

from checkpoints import KEYS, OPTIONAL_KEYS, SETTINGS, checked, checked_normalizers, copied, flag_names, given_flags, \
    read_run, refused, restored, restored_item, said, shown, worker_view

WALK_DEPTH = 8  # folders within a run directory: a run makes one (videos/)


def resumed(args, script, taken: tuple) -> tuple:
    """--resume PATH: (the checkpoint's Args with this command line's `taken` flags (output, tracking), the checkpoint,
    read). Of the flags this command line gives, only `taken`, --resume and --env-id may be. The run writes
    into the checkpoint's directory: one that holds a newer checkpoint, a finished run's model or a link is refused,
    and a finished run's checkpoint continues nothing."""
    given = given_flags(args, script)
    refused_flags = sorted(given - {"resume", "env_id", *taken})
    if refused_flags:
        raise SystemExit(f"--resume continues the run with the checkpoint's own flags; drop "
                         f"{flag_names(refused_flags)} (it takes {flag_names(taken)}, and --env-id as the checkpoint's "
                         f"own).")
    checkpoint, run_args = read_run(args, "--resume", script, given)
    path, source = args.resume, f"--resume {args.resume}"
    written_by, world_size = 1 + len(checkpoint.get("workers", [])), int(os.environ.get("WORLD_SIZE", 1))
    if written_by != world_size:  # it holds the envs, random state and statistics of as many workers as wrote it
        how = f"torchrun --nproc_per_node {written_by}" if written_by > 1 else "python, in one process"
        raise SystemExit(f"{source}: its checkpoint holds the envs of {written_by} worker{'s' * (written_by > 1)}, "
                         f"not {world_size}: resume it with {how}.")
    run_id = checkpoint.get("wandb_run_id")  # continued only where this command line asks for --track
    if run_id is not None and not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", run_id):
        raise SystemExit(f"{source}: its wandb_run_id {reprlib.repr(run_id)} is not a W&B run id.")
    run_dir = os.path.dirname(path) or "."
    check_run_dir(run_dir, source)
    iteration, num_iterations = checkpoint["iteration"], checkpoint["num_iterations"]
    if iteration > num_iterations:
        raise SystemExit(f"{source}: its iteration {iteration:,} is beyond its run's {num_iterations:,}: it is not a "
                         f"checkpoint a run wrote.")
    newest, model = (os.path.join(run_dir, name) for name in ("checkpoint.safetensors", "model.safetensors"))
    if iteration == num_iterations:
        print(f"{source}: that run already finished all {iteration:,} iterations; " + (
            f"its model is {model}." if os.path.exists(model) else
            f"play it: python {script.name} --eval-checkpoint {shlex.quote(path)}"))
        raise SystemExit(0)
    kept = model if os.path.exists(model) else newest if os.path.exists(newest) and not os.path.samefile(
        newest, path) else None
    if kept:
        raise SystemExit(f"{source}: its directory holds {kept}, which the resumed run would overwrite; to branch "
                         f"from this checkpoint, copy it into a directory of its own and resume the copy.")
    return dataclasses.replace(run_args, resume=path, **{name: getattr(args, name) for name in taken}), checkpoint


# ------------------------------------------------------------------------------------------ the run directory
def check_run_dir(run_dir: str, source: str) -> None:
    """A run directory this project made holds folders at most WALK_DEPTH deep and regular files of one name each: one
    that is a link, holds a link, a hard link (a write into it lands outside too) or anything else, or cannot be
    walked or written, is refused in one sentence, every name in it escaped."""
    folders = [(run_dir, 0)]
    try:
        while folders:  # without recursion
            folder, depth = folders.pop()
            if not stat.S_ISDIR(os.lstat(folder).st_mode):
                raise SystemExit(f"{source}: {shown(folder)} is a link, not a directory: resume the checkpoint where "
                                 f"it lies.")
            with os.scandir(folder) as entries:
                for entry in entries:
                    info = entry.stat(follow_symlinks=False)
                    if stat.S_ISDIR(info.st_mode) and depth < WALK_DEPTH:
                        folders.append((entry.path, depth + 1))
                    elif not stat.S_ISREG(info.st_mode) or info.st_nlink > 1:
                        what = {stat.S_IFLNK: "a link", stat.S_IFREG: "a hard link", stat.S_IFDIR: "folders nested "
                                f"deeper than {WALK_DEPTH}"}.get(stat.S_IFMT(info.st_mode), "a special file")
                        raise SystemExit(f"{source}: its directory holds {what}, {shown(entry.path)}, which no run "
                                         f"makes: the resumed run would write through it; resume a copy of the "
                                         f"checkpoint in a directory of its own.")
    except OSError as error:
        raise SystemExit(f"{source}: its directory cannot be walked ({error.strerror}: "
                         f"{shown(str(error.filename))[:200]}).") from None
    for name, kind in (("model.safetensors", "a file"), ("checkpoint.safetensors", "a file"), ("run.lock", "a file"),
                       ("videos", "a directory")):  # what the run will write, in the way
        path = os.path.join(run_dir, name)
        if os.path.exists(path) and os.path.isdir(path) != (kind == "a directory"):
            raise SystemExit(f"{source}: its directory holds {shown(path)}, which the run writes as {kind}.")
    if not os.access(run_dir, os.W_OK):
        raise SystemExit(f"{source}: its directory {shown(run_dir)} is not writable.")


# ------------------------------------------------------------------------------------------ restoring a run
def restore(run, next_obs, next_done, batch_size: int, harness) -> tuple:
    """harness.Run.restore with --resume: this worker's part of the checkpoint (its envs, random state, statistics)
    put back into run.saved and the envs (restore_run); any worker's refusal stops all (run.refuse).
    Returns (global_step, first iteration, next_obs, next_done)."""
    refusal, part = None, worker_view(run.checkpoint, run.rank)
    try:
        global_step, first_iteration, next_obs, next_done, returns, run.keys = restore_run(
            part, run.saved, run.envs, next_obs, next_done, f"--resume {run.command_args.resume}", batch_size,
            run.num_iterations, harness)
        run.episode_returns.extend(returns)
    except SystemExit as error:
        refusal = str(error.code)
    run.refuse(None, refusal)
    return global_step, first_iteration, next_obs, next_done


def restore_run(checkpoint, saved, envs, next_obs, next_done, source: str, batch_size: int, num_iterations: int,
                harness) -> tuple:
    """The second pass: every part (networks, optimizers, normalizers, envs, random state, counters, the script's
    keys) checked against the rebuilt run, then applied: (global_step, first iteration, next_obs, next_done, returns,
    keys). Gymnasium envs continue exactly; envs whose state is not data (Procgen's) restart, keeping their
    statistics. saved: harness.Saved; harness: harness.py (env_layers, env_normalizers, rng_state)."""
    extra = sorted(set(checkpoint) - set(KEYS) - set(OPTIONAL_KEYS) - set(saved.keys) - {"kind"})
    if extra:  # a key of the script's that this run does not keep (e.g. --lstm's memory in a feed-forward run)
        raise SystemExit(f"{source}: it holds {extra[0]}, which a run with these flags does not: it is not this run's.")
    iteration, global_step = check_counters(checkpoint, source, batch_size, num_iterations)
    models = {name: checked(checkpoint["models"].get(name), model.state_dict(), name, source)
              for name, model in saved.models.items()}
    optimizers = {name: checked_optimizer(optimizer, checkpoint["optimizers"].get(name), name, source)
                  for name, optimizer in saved.optimizers.items()}
    normalizers = {name: checked(checkpoint["normalizers"][name], dict(vars(normalizer)), f"{name} statistics", source)
                   for name, normalizer in saved.normalizers.items() if name in checkpoint["normalizers"]}
    for name, values in normalizers.items():
        derived_fit(saved.normalizers[name], values, f"{name} statistics", source)
    env_normalizer_states = checked_normalizers(envs, checkpoint["normalizers"], source, harness)
    rng = checked_rng(checkpoint["rng"], source, harness.rng_state())
    returns = checked(checkpoint["episode_returns"], deque([0.0], maxlen=100), "episode_returns", source)
    keys = {key: checked(checkpoint.get(key), like, key, source) for key, like in saved.keys.items()}
    saved_env = checkpoint["env"]
    with refused("env stack", source):  # e.g. ppo_ewma.py's until bded84a: NormalizeObservation in each env
        env_updates, restarts = env_state_updates(harness.env_layers(envs), saved_env.get("state"))
        restarts = restarts or probe_env_state(envs, saved_env.get("state"), harness)
    if restarts is None:
        next_obs = checked(saved_env.get("next_obs"), next_obs, "next_obs", source)
        next_done = checked(saved_env.get("next_done"), next_done, "next_done", source)
    # every part fits: apply them
    for name, part in {**saved.models, **saved.optimizers}.items():  # (every script names them apart)
        with refused(name, source):
            part.load_state_dict(copied({**models, **optimizers}[name]))
    for name, normalizer in saved.normalizers.items():
        vars(normalizer).update(copied(normalizers.get(name, {})))
    if restarts is None:
        with refused("env state", source):
            apply_env_state(env_updates)
        next_obs, next_done = copied(next_obs, next_obs.device), copied(next_done, next_done.device)
    else:  # the freshly reset envs start new episodes (this also restarts the discounted returns of reward scaling)
        print(f"note: --resume: the envs restart with new episodes ({restarts}).")
        next_done = torch.ones_like(next_done)
    for name, (_, rms) in harness.env_normalizers(envs).items():  # statistics that go on updating
        if name in env_normalizer_states:
            state = env_normalizer_states[name]
            rms.mean, rms.var, rms.count = np.array(state["mean"]), np.array(state["var"]), state["count"]
    with refused("rng", source):
        set_rng_state(rng)
    return global_step, iteration + 1, next_obs, next_done, returns, copied(keys)


def set_rng_state(rng: dict) -> None:
    """Put back a random state of harness.rng_state()'s, once checked_rng passed it."""
    random.setstate(rng["python"])
    numpy_state = rng["numpy"]
    np.random.set_state((numpy_state[0], np.array(numpy_state[1], dtype=np.uint32), *numpy_state[2:]))
    torch.set_rng_state(rng["torch"].clone())
    if "cuda" in rng:
        torch.cuda.set_rng_state_all([state.clone() for state in rng["cuda"]])


def check_counters(checkpoint, source: str, batch_size: int, num_iterations: int) -> tuple:
    """A checkpoint's (iteration, global_step) once they fit the run: an iteration before its last, batch_size each."""
    with refused("iteration", source):
        iteration, global_step = checkpoint["iteration"], checkpoint["global_step"]
        if not 0 <= iteration < num_iterations:
            raise ValueError(f"{iteration} is not one of the run's {num_iterations:,} iterations")
        if global_step != iteration * batch_size:
            raise ValueError(f"{iteration} does not go with global_step {global_step} ({batch_size:,} steps each)")
    return iteration, global_step


def derived_fit(normalizer, values: dict, what: str, source: str) -> None:
    """Statistics whose derived values (the properties of their class: a mean, a std) cannot be computed or are not
    finite are refused: e.g. a sum of 1e30 over a weight of 1e-200, whose mean squared overflows. A value derived
    from no data yet (a division by a weight of 0) is left to the run, which never asks for it."""
    probe = object.__new__(type(normalizer))
    vars(probe).update(values)
    for name, member in vars(type(normalizer)).items():
        if isinstance(member, property):
            try:
                value = getattr(probe, name)
            except ZeroDivisionError:
                continue
            except (OverflowError, ValueError) as error:
                raise SystemExit(f"{source}: its {what}' {name} cannot be computed ({type(error).__name__}): it is "
                                 f"not this run's.") from None
            if not math.isfinite(value):
                raise SystemExit(f"{source}: its {what}' {name} is {value}: it is not this run's.")


def checked_optimizer(optimizer, state, name: str, source: str) -> dict:
    """An optimizer's saved state once it fits this run's: the same groups of the same parameters with these flags'
    settings (the step size may have moved: not negative), each parameter's Adam state (step count, moments of its
    shape, finite, the second not negative). How the step runs (foreach, fused: the same numbers) is this run's."""
    own = optimizer.state_dict()
    with refused(name, source):
        if not (isinstance(state, dict) and sorted(state, key=repr) == ["param_groups", "state"]
                and isinstance(state["param_groups"], list) and len(state["param_groups"]) == len(own["param_groups"])):
            raise ValueError("is not this run's optimizer state")
        how = ("foreach", "fused", "capturable", "differentiable")  # how the step runs: this run's own choice
        groups = []
        for index, own_group in enumerate(own["param_groups"]):
            group = state["param_groups"][index]
            try:
                group = restored_item({index: {key: value for key, value in group.items() if key not in how}
                                       if isinstance(group, dict) else group},
                                      {index: {key: value for key, value in own_group.items() if key not in how}},
                                      index)
            except ValueError as error:
                raise ValueError(f"['param_groups']{error}") from None
            for key, value in group.items():
                if key == "lr" and not (type(value) is float and value >= 0):
                    raise ValueError(f"['param_groups'][{index}]['lr'] is {reprlib.repr(value)}, not a step size")
                if key != "lr" and value != own_group[key]:
                    raise ValueError(f"['param_groups'][{index}][{key!r}] is {reprlib.repr(value)}, where these "
                                     f"flags set {own_group[key]!r}")
            groups.append({**group, **{key: own_group[key] for key in how if key in own_group}})
        shapes = dict(enumerate(param.shape for group in optimizer.param_groups for param in group["params"]))
        if not (isinstance(state["state"], dict) and set(state["state"]) <= set(shapes)):
            raise ValueError("holds the state of parameters it does not have")
        param_states = {}
        for index, param_state in state["state"].items():
            like = {"step": torch.zeros(()), "exp_avg": torch.zeros(shapes[index]),
                    "exp_avg_sq": torch.zeros(shapes[index])}
            try:
                param_states[index] = restored_item(state["state"], {index: like}, index)
            except ValueError as error:
                raise ValueError(f"['state']{error}") from None
            if bool((param_states[index]["exp_avg_sq"] < 0).any()) or param_states[index]["step"] < 0:
                raise ValueError(f"['state'][{index}] holds a negative step count or second moment")
        return {"state": param_states, "param_groups": groups}


def checked_rng(rng, source: str, own: dict) -> dict:
    """A saved random state (harness.rng_state()'s) once every part is one this process can take: each checked against
    this process's own, then tried on a generator of its own (a torch state of random bytes is refused here)."""
    with refused("rng", source):
        if not isinstance(rng, dict):
            raise ValueError("is not a random state")
        state = {key: restored_item(rng, own, key) for key in ("python", "numpy", "torch")}
        random.Random().setstate(state["python"])
        np.random.RandomState().set_state((state["numpy"][0], np.array(state["numpy"][1], dtype=np.uint32),
                                           *state["numpy"][2:]))
        torch.Generator().set_state(state["torch"].clone())
        torch_state = state["torch"].numpy().tobytes()  # mt19937's words left and next index: one moves as the other
        left = int.from_bytes(torch_state[8:12], "little", signed=True)
        index = int.from_bytes(torch_state[16:24], "little")
        if (left, index) != (1, 0) and not (1 <= left <= 624 and left + index == 625):  # else it reads out of bounds
            raise ValueError("['torch'] is not a state torch's generator reaches")
        if "cuda" in rng and "cuda" in own and isinstance(rng["cuda"], list) and len(rng["cuda"]) == len(own["cuda"]):
            state["cuda"] = restored_item(rng, own, "cuda")
        return state


def env_state_updates(layers, saved) -> tuple:
    """harness.env_state's data, each attribute restored() against the rebuilt stack's `layers` (harness.env_layers:
    [(layer, {attribute: value})], or why its state is not data), settings equal: ([(layer, attribute, value)], None),
    or ([], why the envs restart instead, in this module's words); other layers: ValueError."""
    if isinstance(layers, str):
        return [], layers
    if not (isinstance(saved, dict) and isinstance(saved.get("layers"), list)):
        return [], "the checkpoint holds no state of these envs"
    if [type(layer).__name__ for layer, _ in layers] != [
            saved_layer.get("class") if isinstance(saved_layer, dict) else None for saved_layer in saved["layers"]]:
        raise ValueError("has other layers than these flags build (another version of the script or of Gymnasium "
                         "wrote it: resume it with that version)")
    updates = []
    for (layer, keys), saved_layer in zip(layers, saved["layers"]):
        state, name = saved_layer.get("state"), type(layer).__name__
        if not (isinstance(state, dict) and set(state) == set(keys)):
            return [], f"the checkpoint's {name} has other attributes than the rebuilt one"
        for key, like in keys.items():
            try:
                if key in SETTINGS and not (type(state[key]) is type(like) and state[key] == like):
                    raise ValueError(f"is {reprlib.repr(state[key])}, where these flags set {like!r}")
                updates.append((layer, key, restored(state[key], like)))
            except ValueError as error:
                return [], f"the checkpoint's {said(f'{name}.{key}', error)}"
    return updates, None


def apply_env_state(updates) -> None:
    for layer, key, value in updates:
        current = getattr(layer, key)
        if type(current).__name__ == "MjData":  # the integration state, into the rebuilt simulator
            mujoco = sys.modules["mujoco"]
            mujoco.mj_setState(current.model, current, value.numpy().copy(), mujoco.mjtState.mjSTATE_INTEGRATION)
        else:
            setattr(layer, key, copied(value))


def probe_env_state(envs, saved, harness) -> Optional[str]:
    """Why a saved env state that passed every check still cannot run (an env told it was never reset, a screen it
    never opened), tried on a copy of the rebuilt stack that steps once and closes; None if it runs, or if the stack
    cannot be copied. The random state is put back after."""
    import copy

    rng = harness.rng_state()
    try:
        probe = copy.deepcopy(envs)
    except Exception:
        return None
    try:
        apply_env_state(env_state_updates(harness.env_layers(probe), saved)[0])
        space = probe.single_action_space
        action = np.zeros(space.shape, space.dtype)
        action = np.clip(action, space.low, space.high) if hasattr(space, "low") else action
        probe.step(np.stack([action] * probe.num_envs))
        probe.close()
    except Exception as error:
        return f"the checkpoint's env state cannot step ({type(error).__name__})"
    finally:
        set_rng_state(rng)
    return None
