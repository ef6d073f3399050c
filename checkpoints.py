"""Checkpoints: the one format every script writes and reads, small enough to audit alone.

A checkpoint is torch.save's zip of tensors and plain data: the run's flags, networks, optimizers and statistics,
the random state, the env stack's state and the counters. What holds for one from someone else:
- Loading it runs no code: torch.load(weights_only=True) builds tensors and plain data only.
- It is read in two passes. The first (load_checkpoint) walks the pickle without building it (pickle_size: torch.save's
  opcodes and globals only, at most PICKLE_LIMIT bytes of objects), then maps the tensors, unread (mmap). The second
  (restore_run, once the run is rebuilt from the file's flags) checks every key, type, dtype, shape, device and layout
  against the rebuilt run's own values, then the values, and only then copies: nothing allocates beyond the run.
- Any error while it is read or applied is one sentence naming the file and the key (refused()).
- Every file is written by write_file: made exclusively under a random name, never through a link, then renamed.
"""
import copy
import dataclasses
import enum
import errno
import glob
import math
import os
import pickletools
import random
import re
import reprlib
import secrets
import stat
import sys
import typing
import zipfile
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Optional
import gymnasium as gym
import numpy as np
import torch

PICKLE_LIMIT = 64 * 2**20  # bytes of Python objects a checkpoint's pickle may build: some 1,000 envs' state
PICKLE_OBJECT_BYTES = 256  # the most one pickle opcode builds (a dict, a list, a number), besides its payload
PICKLE_DEPTH, PICKLE_DICT_ITEMS = 64, 10_000  # a checkpoint's nesting and largest dict hold far less
PICKLE_OPCODES = set("PROTO STOP MARK EMPTY_DICT EMPTY_LIST EMPTY_TUPLE TUPLE TUPLE1 TUPLE2 TUPLE3 APPEND APPENDS "
                     "SETITEM SETITEMS BUILD REDUCE GLOBAL BINPERSID BINGET LONG_BINGET BINPUT LONG_BINPUT BINFLOAT "
                     "BININT BININT1 BININT2 LONG1 NONE NEWTRUE NEWFALSE BINUNICODE SHORT_BINSTRING BINSTRING".split())
PICKLE_GLOBALS = re.compile(r"(collections OrderedDict|_codecs encode|torch \w+Storage|torch\._utils "
                            r"_rebuild_tensor_v2)$")
STRING_LIMIT = 4096  # characters of a string flag: a path's longest on Linux
FLOAT_BOUND = 1e30  # a finite number read from a file, beyond which a run's arithmetic overflows
KEYS = {"args": dict, "models": dict, "optimizers": dict, "normalizers": dict, "rng": dict, "env": dict,
        "global_step": int, "iteration": int, "num_iterations": int, "episode_returns": list}  # every checkpoint's
OPTIONAL_KEYS = {"script": str, "wandb_run_id": str, "workers": list}  # older checkpoints lack "script"; W&B runs
# only; torchrun: workers 1 to W - 1's own parts (worker_part)
SHARED_KEYS = ("args", "models", "optimizers", "global_step", "iteration", "num_iterations", "episode_returns",
               "script", "wandb_run_id")  # the same on every torchrun worker: the rest is each worker's own
# Values the flags set (a discount, a clip, a time limit, the number of envs): restored only where they equal the
# rebuilt run's own
SETTINGS = {"gamma", "clip", "decay", "epsilon", "_max_episode_steps", "num_envs", "copy", "observation_mode",
            "render_mode", "frame_skip", "buffer_length", "_stats_key", "_disable_render_order_enforcing",
            "_update_running_mean", "update_running_mean"}
NONNEGATIVE = {"count", "var", "weight", "sum_sq"}  # running statistics that a division or a square root takes
NUMPY_DTYPES = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float32,
                torch.float64)  # the tensors a NumPy scalar of to_data's can be


@dataclass
class Saved:
    """The script's objects that a checkpoint holds, each {name: object}, None entries left out; keys: the script's own
    values, {name: this run's start value}, a resumed run's from the checkpoint (run.restored)."""

    models: dict  # modules (their state dicts)
    optimizers: dict  # optimizers (their state dicts)
    normalizers: dict = dataclasses.field(default_factory=dict)  # running statistics kept outside the env stack
    keys: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        self.models = {name: model for name, model in self.models.items() if model is not None}
        self.normalizers = {name: normalizer for name, normalizer in self.normalizers.items() if normalizer is not None}


# ------------------------------------------------------------------------------------------------------- writing
def write_file(path: str, write) -> None:
    """write(file) into a file made exclusively (O_CREAT | O_EXCL | O_NOFOLLOW) under a random name in path's own
    directory, synced, then renamed onto path: never a torn file, a link at path replaced, not followed, no name
    planted in advance. A full disk, or a directory in the way, is one sentence, path's file kept. A run directory has
    one writer (its lock), so the temporary files of a writer killed mid-write are removed."""
    directory, name = os.path.split(path)
    tmp_path = os.path.join(directory, f".{name}.{secrets.token_hex(8)}.tmp")  # 64 random bits: never planted
    try:
        fd = os.open(tmp_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o666)
    except OSError as error:
        raise SystemExit(f"{path} cannot be written: {error.strerror}.") from None
    try:
        with os.fdopen(fd, "wb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp_path, path)
    except (OSError, RuntimeError) as error:  # torch.save says a full disk as a RuntimeError
        os.remove(tmp_path)
        full = getattr(error, "errno", None) == errno.ENOSPC or "No space left" in str(error) or "failed writing" in \
            str(error)
        reason = "the disk is full" if full else getattr(error, "strerror", None) or str(error) or type(error).__name__
        kept = "; the one before is kept" if os.path.isfile(path) else ""
        raise SystemExit(f"{path} could not be written ({reason}){kept}.") from None
    except BaseException:
        os.remove(tmp_path)
        raise
    for stale in glob.glob(os.path.join(glob.escape(directory or "."), f".{glob.escape(name)}.*.tmp")):
        if stat.S_ISREG(os.lstat(stale).st_mode):
            os.remove(stale)


def save_checkpoint(path: str, checkpoint: dict) -> None:
    """torch.save(checkpoint) to path by write_file."""
    write_file(path, lambda file: torch.save(checkpoint, file))


def make_checkpoint(args, saved: Saved, envs, next_obs, next_done, **keys) -> dict:
    """The one format, tensors and plain data only: Args, `saved`'s states, the env stack's normalizers and state
    (env_state), the random state, and `keys` (global_step, iteration, ..., and a script's own)."""
    return {
        "args": dataclasses.asdict(args),
        "models": {name: model.state_dict() for name, model in saved.models.items()},
        "optimizers": {name: optimizer.state_dict() for name, optimizer in saved.optimizers.items()},
        "normalizers": {**normalizer_states(envs), **{name: dict(vars(normalizer))
                                                      for name, normalizer in saved.normalizers.items()}},
        "rng": rng_state(),
        "env": {"state": env_state(envs), "next_obs": next_obs, "next_done": next_done},
        **keys,
    }


def worker_part(checkpoint: dict) -> dict:
    """A torchrun worker's own part of a checkpoint (envs, random state, statistics, keys), which rank 0 keeps."""
    return {key: copied(value) for key, value in checkpoint.items() if key not in SHARED_KEYS}


def worker_view(checkpoint: dict, rank: int, source: str) -> dict:
    """The checkpoint as worker `rank` resumes it: the shared keys, and its own part."""
    if rank == 0:
        return {key: value for key, value in checkpoint.items() if key != "workers"}
    part = checkpoint["workers"][rank - 1]
    if not (isinstance(part, dict) and all(isinstance(key, str) and key not in SHARED_KEYS for key in part)):
        raise SystemExit(f"{source}: its part of worker {rank} is not one a run writes: it is not this run's.")
    return {**{key: checkpoint[key] for key in SHARED_KEYS if key in checkpoint}, **part}


# ------------------------------------------------------------------------------------------------------- reading
def load_checkpoint(path: str, flag: str, script) -> dict:
    """The first pass: the checkpoint at path as a dict whose tensors are mapped, not read. Refused in one sentence
    naming `flag` and path: anything but a regular zip of stored entries whose pickle pickle_size passes, another
    script's checkpoint, a key neither every checkpoint nor the script (.checkpoint_keys) has, a flag Args lacks."""
    source, script_name, args_type = f"{flag} {path}", script.name, script.args_type
    if not path.isprintable():  # it is printed, and names the run directory of --eval-checkpoint
        raise SystemExit(f"{flag} {reprlib.repr(path)} holds characters that do not print: rename it.")
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise SystemExit(f"{source}: no such file." if not os.path.exists(path) else f"{source} is not a file.")
    except OSError as error:
        raise SystemExit(f"{source}: {error.strerror}.") from None
    if not zipfile.is_zipfile(path):
        raise SystemExit(f"{source} is not a checkpoint (torch.save writes a zip file).")
    try:
        with zipfile.ZipFile(path) as archive:
            entries, size = archive.infolist(), os.path.getsize(path)
            if any(entry.compress_type != zipfile.ZIP_STORED or entry.flag_bits & 0x61 for entry in entries):
                raise SystemExit(f"{source} holds compressed or encrypted data, which torch.save never writes: it is "
                                 f"not a checkpoint.")
            if any(entry.header_offset + entry.file_size > size for entry in entries):
                raise SystemExit(f"{source} is truncated: its entries run past its end.")
            names = [entry.filename for entry in entries]  # torch finds its records without regard to case
            prefix = names[0].split("/")[0] if names else ""
            if f"{prefix}/data.pkl" not in names or len({name.lower() for name in names}) < len(names) or any(
                    not name.startswith(prefix + "/") for name in names):
                raise SystemExit(f"{source} is not a checkpoint (torch.save writes one data.pkl, under one folder).")
            with archive.open(f"{prefix}/data.pkl") as pickle:
                built = pickle_size(pickle)
    except SystemExit:
        raise
    except Exception as error:  # what pickle_size refused said in its words
        raise SystemExit(f"{source} cannot be read as a checkpoint ({type(error).__name__}: "
                         f"{repr(str(error)[:200])[1:-1]}).") from None
    if built > PICKLE_LIMIT:
        raise SystemExit(f"{source} would build more than {PICKLE_LIMIT // 2**20} MiB of Python objects as it is read "
                         f"(a run's checkpoint holds far less): it is not a checkpoint of this project.")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as error:
        raise SystemExit(f"{source} cannot be read as a checkpoint ({type(error).__name__}).") from None
    written_by = checkpoint.get("script", script_name) if isinstance(checkpoint, dict) else script_name
    if written_by != script_name:  # older checkpoints do not name their script; other text than a name is quoted
        named = isinstance(written_by, str) and written_by.endswith(".py") and written_by[:-3].isidentifier()
        written_by = written_by if named else reprlib.repr(written_by)
        raise SystemExit(f"{source} is a {written_by} checkpoint, not a {script_name} one: run {written_by}.")
    known = {**KEYS, **OPTIONAL_KEYS, **{key: object for key in script.checkpoint_keys}}
    field_names = {field.name for field in dataclasses.fields(args_type)}
    if not (isinstance(checkpoint, dict) and all(isinstance(checkpoint.get(key), kind) for key, kind in KEYS.items())
            and all(isinstance(checkpoint[key], known[key]) for key in checkpoint if key in known)
            and all(type(checkpoint[key]) is int and 0 <= checkpoint[key] <= 2**53
                    for key in ("global_step", "iteration", "num_iterations"))
            and all(isinstance(key, str) for key in checkpoint["args"]) and set(checkpoint["args"]) <= field_names):
        raise SystemExit(f"{source} is not a {script_name} checkpoint.")
    unknown = sorted(set(checkpoint) - set(known), key=repr)
    if unknown:
        raise SystemExit(f"{source} holds {reprlib.repr(unknown[0])}, which no {script_name} checkpoint holds.")
    return checkpoint


def pickle_size(file) -> int:
    """An upper bound on the bytes of objects that unpickling `file` builds, counted opcode by opcode, building none:
    each makes at most one, of PICKLE_OBJECT_BYTES plus its payload (a string's length), until PICKLE_LIMIT. ValueError
    for what torch.save never writes: other opcodes or globals, ints beyond 128 bits (PCG64's state), nesting deeper
    than PICKLE_DEPTH (its stack followed) or a dict of more than PICKLE_DICT_ITEMS items (a hash flood)."""
    total, stack, memo, mark = 0, [], {}, pickletools.markobject
    for op, arg, _ in pickletools.genops(file):
        total += PICKLE_OBJECT_BYTES + (len(arg) if isinstance(arg, (str, bytes, bytearray)) else 0)
        if total > PICKLE_LIMIT:
            break
        if op.name not in PICKLE_OPCODES or op.name == "GLOBAL" and not PICKLE_GLOBALS.match(arg) or \
                op.name == "LONG1" and arg.bit_length() > 128:
            raise ValueError(f"{op.name}, an int of {arg.bit_length()} bits" if isinstance(arg, int) else
                             f"{op.name} {arg!r:.100}")
        before, popped = list(op.stack_before), []
        if mark in before:  # down to the mark, then what lies under it
            while stack and stack[-1] is not mark:
                popped.append(stack.pop())
            stack.pop() if stack else None
            before = before[:before.index(mark)]
        popped += [stack.pop() if stack else (0, 0) for _ in before]  # (depth, items) of each object
        if op.name in ("APPEND", "APPENDS", "SETITEM", "SETITEMS", "BUILD"):  # into the bottom one, in place
            (depth, items), added = popped[-1], popped[:-1]
            entry = max(depth, 1 + max((d for d, _ in added), default=0)), items + len(added)
        else:
            entry = (1 + max(d for d, _ in popped), len(popped)) if popped else memo.get(arg, (0, 0)) if \
                op.name.endswith("GET") else (0, 0)
        if entry[0] > PICKLE_DEPTH or op.name.startswith("SETITEM") and entry[1] > 2 * PICKLE_DICT_ITEMS:
            raise ValueError("nesting or a dict beyond any checkpoint's")
        if op.name.endswith("PUT") and stack:
            memo[arg] = stack[-1]
        stack += [mark if kind is mark else entry for kind in op.stack_after]
    return total


def fits(value, annotation) -> bool:
    """Whether `value` has a type that a flag annotated `annotation` takes from a command line (no bool for an int),
    and a size one takes: an int within 2**53, a string of printable characters, at most STRING_LIMIT."""
    if typing.get_origin(annotation) is typing.Union:
        return any(fits(value, option) for option in typing.get_args(annotation))
    if typing.get_origin(annotation) is typing.Literal:
        return any(type(value) is type(option) and value == option for option in typing.get_args(annotation))
    if type(value) is int and annotation in (int, float) or type(value) is float is annotation:
        return abs(value) <= (2**53 if type(value) is int else math.inf)  # not nan: the ranges say where inf is
    return type(value) is annotation and (not isinstance(value, str) or len(value) <= STRING_LIMIT
                                          and value.isprintable())


def checkpoint_args(checkpoint, script, source: str):
    """The Args a checkpoint's run trained with, each fits() its flag (the caller checks the ranges); a flag added
    since takes the script's missing_flags value (what runs did before it existed), else its default."""
    args_type = script.args_type
    values, hints = {**script.missing_flags, **checkpoint["args"]}, typing.get_type_hints(args_type)
    for name, value in values.items():
        if not fits(value, hints[name]):
            raise SystemExit(f"{source}: its flag {name} is {reprlib.repr(value)}, which --{name.replace('_', '-')} "
                             f"cannot be ({hints[name]}).")
    return args_type(**values)


# ------------------------------------------------------------------------------------------------------ checking
def restored(data, like):
    """`data` read from a checkpoint, checked to hold what the rebuilt run holds in its place, `like`: a tensor (not a
    subclass) of like's dtype and shape, on the CPU, strided, finite where like is (an array: as a tensor); a number
    of like's type (None: any number, or None), within FLOAT_BOUND where like is finite; a str equal to like's; a list
    or tuple of like's length and a dict of like's keys, item by item, its SETTINGS equal to like's, its NONNEGATIVE
    not negative; a deque as a list of at most its maxlen items, each like its first. Tensors come back unread
    (copied() copies them); nothing is walked deeper than like. ValueError says what does not fit."""
    if isinstance(like, np.random.Generator):  # its bit generator's state dict; NumPy checks the values
        generator = np.random.Generator(type(like.bit_generator)())
        try:
            generator.bit_generator.state = restored(data, like.bit_generator.state)
        except (TypeError, OverflowError, ValueError) as error:
            raise ValueError(f"is not a {type(like.bit_generator).__name__} state ({type(error).__name__})") from None
        return generator
    if type(like).__name__ == "MjData":  # mj_getState's integration state, put back by restore_env_state
        return restored(data, to_data(like))
    if isinstance(like, (np.ndarray, np.generic)) and like.dtype.kind in "biuf":
        value = restored(data, torch.from_numpy(np.array(like)))
        return value.numpy() if isinstance(like, np.ndarray) else value.numpy()[()]
    if isinstance(like, torch.Tensor):
        if not (type(data) is torch.Tensor and data.dtype == like.dtype and data.shape == like.shape):
            described = f"a {data.dtype} tensor of shape {list(data.shape)}" if type(data) is torch.Tensor \
                else f"a {type(data).__name__}"
            raise ValueError(f"is {described}, not a {like.dtype} tensor of shape {list(like.shape)}")
        if data.device.type != "cpu" or data.layout != torch.strided:
            raise ValueError("is not a plain tensor (on the CPU, strided)")
        if data.is_floating_point() and not torch.isfinite(data).all() and torch.isfinite(like).all():
            raise ValueError("holds nan or inf")
        return data
    if like is None and data is None:
        return data
    if like is None or type(like) in (bool, int, float):  # a Python number, or a NumPy scalar as to_data wrote it (a
        kind = {bool: "b", int: "iu", float: "fiu", type(None): "biuf"}[type(like)]  # 0-dim tensor); None: any one
        if type(data) is torch.Tensor and data.dim() == 0 and data.dtype in NUMPY_DTYPES:
            data = restored(data, torch.zeros((), dtype=data.dtype)).numpy()[()]
        python = {bool: (bool,), int: (int,), float: (float, int), type(None): (bool, int, float)}[type(like)]
        if not (type(data) in python or isinstance(data, np.generic) and data.dtype.kind in kind):
            expected = "a number" if like is None else f"a {type(like).__name__}"
            raise ValueError(f"is a {type(data).__name__}, not {expected}")
        finite = like is None or type(like) is float and math.isfinite(like)  # where the run's own value is
        if finite and not abs(data) <= FLOAT_BOUND:  # nan and inf included
            raise ValueError(f"is {reprlib.repr(data)}, beyond any run's (nan, inf or over {FLOAT_BOUND:g})")
        return float(data) if type(like) is float else data
    if isinstance(like, str):
        if data != like:
            raise ValueError(f"is {reprlib.repr(data)}, not {like!r}")
        return data
    if isinstance(like, deque):  # its items as its first (floats where it is empty): a deque's length varies
        limit = len(like) if like.maxlen is None else like.maxlen
        if not (isinstance(data, (list, tuple)) and len(data) <= limit):
            raise ValueError(f"is not a list of at most {limit} items")
        return deque((restored_item(data, [like[0] if like else 0.0] * len(data), index)
                      for index in range(len(data))), like.maxlen)
    if isinstance(like, (list, tuple)):
        if not (isinstance(data, (list, tuple)) and len(data) == len(like)):
            raise ValueError(f"is not a list of {len(like)} items")
        return type(like)(restored_item(data, like, index) for index in range(len(like)))
    if isinstance(like, dict):
        if not (isinstance(data, dict) and sorted(data, key=repr) == sorted(like, key=repr)):
            raise ValueError(f"does not hold the keys {reprlib.repr(sorted(like, key=repr))}")
        values = {key: restored_item(data, like, key) for key in like}
        for key, value in values.items():
            if key in SETTINGS and not (torch.equal(value, like[key]) if torch.is_tensor(value) else
                                        value == like[key]):
                raise ValueError(f"[{key!r}] is {reprlib.repr(value)}, where these flags set {like[key]!r}")
            if key in NONNEGATIVE and bool((torch.as_tensor(value) < 0).any()):
                raise ValueError(f"[{key!r}] is negative")
        return values
    raise ValueError(f"holds a {type(like).__name__}, which a checkpoint does not set")


def restored_item(data, like, key):
    """restored(data[key], like[key]), its ValueError naming the key: "['returns'] is a ..."."""
    try:
        return restored(data[key], like[key])
    except ValueError as error:
        raise ValueError(f"[{key!r}]{said('', error)}") from None


def said(what: str, error: Exception) -> str:
    """What does not fit and why: "reward['returns'] is a ...", "next_obs is a ..."."""
    return f"{what}{'' if str(error).startswith('[') else ' '}{error}"


def checked(data, like, what: str, source: str = "The checkpoint"):
    """restored(data, like), or one sentence naming source and `what` (e.g. "reward statistics")."""
    with refused(what, source):
        return restored(data, like)


@contextmanager
def refused(what: str, source: str):
    """The one boundary: any error while a checkpoint's `what` is checked or applied becomes one sentence naming the
    file (source, e.g. "--resume runs/x/checkpoint.pt") and `what`, the key."""
    try:
        yield
    except SystemExit:
        raise
    except ValueError as error:
        raise SystemExit(f"{source}: its {said(what, error)}: it is not this run's.") from None
    except Exception as error:
        raise SystemExit(f"{source}: its {what} cannot be applied ({type(error).__name__}: "
                         f"{reprlib.repr(str(error))[1:-1]}).") from None


def copied(value, device="cpu"):
    """restored()'s value with every tensor copied out of the file (to device) and arrays as NumPy's own."""
    if isinstance(value, torch.Tensor):  # detached: a file's gradient flag is not data (older ones set it)
        return value.detach().to(device, copy=True)
    if isinstance(value, np.ndarray):
        return np.array(value)
    if isinstance(value, (list, tuple, deque)):
        items = [copied(item, device) for item in value]
        return deque(items, value.maxlen) if isinstance(value, deque) else type(value)(items)
    if isinstance(value, dict):
        return {key: copied(item, device) for key, item in value.items()}
    return value


# -------------------------------------------------------------------------------------------------- restoring
def restore_run(checkpoint, saved: Saved, envs, next_obs, next_done, source: str, batch_size: int,
                num_iterations: int) -> tuple:
    """The second pass: every part (networks, optimizers, normalizers, envs, random state, counters, the script's
    keys) checked against the rebuilt run, then applied: (global_step, first iteration, next_obs, next_done, keys).
    Gymnasium envs continue exactly; envs whose state is not data (Procgen's) restart, keeping their statistics."""
    extra = sorted(set(checkpoint) - set(KEYS) - set(OPTIONAL_KEYS) - set(saved.keys))
    if extra:  # a key of the script's that this run does not keep (e.g. --lstm's memory in a feed-forward run)
        raise SystemExit(f"{source}: it holds {extra[0]}, which a run with these flags does not: it is not this run's.")
    iteration, global_step = check_counters(checkpoint, source, batch_size, num_iterations)
    models = {name: checked(checkpoint["models"].get(name), model.state_dict(), name, source)
              for name, model in saved.models.items()}
    optimizers = {name: checked_optimizer(optimizer, checkpoint["optimizers"].get(name), name, source)
                  for name, optimizer in saved.optimizers.items()}
    normalizers = {name: checked(checkpoint["normalizers"][name], dict(vars(normalizer)), f"{name} statistics", source)
                   for name, normalizer in saved.normalizers.items() if name in checkpoint["normalizers"]}
    env_normalizer_states = checked_normalizers(envs, checkpoint["normalizers"], source)
    rng = checked_rng(checkpoint["rng"], source)
    returns = checked(checkpoint["episode_returns"], deque([0.0], maxlen=100), "episode_returns", source)
    keys = {key: checked(checkpoint.get(key), like, key, source) for key, like in saved.keys.items()}
    saved_env = checkpoint["env"]
    with refused("env stack", source):  # e.g. ppo_ewma.py's until bded84a: NormalizeObservation in each env
        env_updates, restarts = env_state_updates(envs, saved_env.get("state"))
        restarts = restarts or probe_env_state(envs, saved_env.get("state"))
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
    apply_normalizers(envs, env_normalizer_states)
    with refused("rng", source):
        set_rng_state(rng)
    return global_step, iteration + 1, next_obs, next_done, returns, copied(keys)


def check_counters(checkpoint, source: str, batch_size: int, num_iterations: int) -> tuple:
    """A checkpoint's (iteration, global_step) once they fit the run: an iteration before its last, batch_size each."""
    with refused("iteration", source):
        iteration, global_step = checkpoint["iteration"], checkpoint["global_step"]
        if not 0 <= iteration < num_iterations:
            raise ValueError(f"{iteration} is not one of the run's {num_iterations:,} iterations")
        if global_step != iteration * batch_size:
            raise ValueError(f"{iteration} does not go with global_step {global_step} ({batch_size:,} steps each)")
    return iteration, global_step


def load_weights(module, models, name: str, source: str = "The checkpoint") -> None:
    """Load a checkpoint's models[name] into `module` once restored() passes it; one sentence otherwise."""
    state = checked(models.get(name) if isinstance(models, dict) else None, module.state_dict(), name, source)
    module.load_state_dict(copied(state))


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


def rng_state() -> dict:
    numpy_state = np.random.get_state()
    return {"python": random.getstate(), "numpy": (numpy_state[0], numpy_state[1].tolist(), *numpy_state[2:]),
            "torch": torch.get_rng_state(),
            **({"cuda": torch.cuda.get_rng_state_all()} if torch.cuda.is_available() else {})}


def checked_rng(rng, source: str) -> dict:
    """rng_state()'s random state once every part is one this process can take: each checked against this process's
    own, then tried on a generator of its own (a torch state of random bytes is refused here, not when applied)."""
    with refused("rng", source):
        if not isinstance(rng, dict):
            raise ValueError("is not a random state")
        own = rng_state()
        state = {key: restored_item(rng, own, key) for key in ("python", "numpy", "torch")}
        random.Random().setstate(state["python"])
        np.random.RandomState().set_state((state["numpy"][0], np.array(state["numpy"][1], dtype=np.uint32),
                                           *state["numpy"][2:]))
        torch.Generator().set_state(state["torch"].clone())
        if "cuda" in rng and "cuda" in own and isinstance(rng["cuda"], list) and len(rng["cuda"]) == len(own["cuda"]):
            state["cuda"] = restored_item(rng, own, "cuda")
        return state


def set_rng_state(rng: dict) -> None:
    """Put back a random state that checked_rng passed."""
    random.setstate(rng["python"])
    numpy_state = rng["numpy"]
    np.random.set_state((numpy_state[0], np.array(numpy_state[1], dtype=np.uint32), *numpy_state[2:]))
    torch.set_rng_state(rng["torch"].clone())
    if "cuda" in rng:
        torch.cuda.set_rng_state_all([state.clone() for state in rng["cuda"]])


# ------------------------------------------------------------------------------------------- the env stack's state
def env_normalizers(envs) -> dict:
    """The running statistics in a vector env stack, {name: (wrapper, RunningMeanStd)}: "reward" (vector
    NormalizeReward) and "obs_{i}" (NormalizeObservation of sub-env i, or a vector wrapper's obs_rms[i])."""
    found, env = {}, envs
    while isinstance(env, gym.vector.VectorWrapper):
        if isinstance(env, gym.wrappers.vector.NormalizeReward):
            found["reward"] = (env, env.return_rms)
        if isinstance(vars(env).get("obs_rms"), list):  # each env's, in one vector wrapper (ppo_ewma.py's)
            found.update({f"obs_{i}": (env, rms) for i, rms in enumerate(env.obs_rms)})
        env = env.env
    for i, sub_env in enumerate(getattr(env, "envs", ())):
        while isinstance(sub_env, gym.Wrapper):
            if isinstance(sub_env, gym.wrappers.NormalizeObservation):
                found[f"obs_{i}"] = (sub_env, sub_env.obs_rms)
            sub_env = sub_env.env
    return found


def normalizer_states(envs) -> dict:
    """{name: {"mean", "var", "count"}} of the running statistics in a vector env stack (see env_normalizers)."""
    return {name: {"mean": torch.as_tensor(rms.mean), "var": torch.as_tensor(rms.var), "count": float(rms.count)}
            for name, (_, rms) in env_normalizers(envs).items()}


def checked_normalizers(envs, states, source: str) -> dict:
    """The env stack's saved statistics, each restored() against the rebuilt one's (a mean: float32, 64 once used)."""
    found = {}
    for name, (_, rms) in env_normalizers(envs).items():
        if name in states:
            saved = states[name].get("mean") if isinstance(states[name], dict) else None
            dtype = saved.dtype if getattr(saved, "dtype", None) in (torch.float32, torch.float64) else None
            own = {"mean": torch.as_tensor(rms.mean, dtype=dtype), "var": torch.as_tensor(rms.var, dtype=dtype),
                   "count": float(rms.count)}
            found[name] = checked(states[name], own, f"{name} statistics", source)
    return found


def apply_normalizers(envs, states: dict, freeze: bool = False) -> None:
    """Put checked statistics into the env stack's normalizers; `freeze` stops them from updating (evaluation)."""
    for name, (wrapper, rms) in env_normalizers(envs).items():
        if name in states:
            mean, var, count = states[name]["mean"], states[name]["var"], states[name]["count"]
            rms.mean, rms.var, rms.count = np.array(mean.numpy()), np.array(var.numpy()), count
        wrapper.update_running_mean = not freeze


def load_normalizers(envs, states, freeze: bool = False, source: str = "The checkpoint") -> None:
    """checked_normalizers, then apply_normalizers."""
    apply_normalizers(envs, checked_normalizers(envs, states if isinstance(states, dict) else {}, source), freeze)


# The env stack's state, written as plain data, layer by layer: each wrapper, the vector env, and each sub-env's
# wrappers and env. An attribute named here, or holding a space, an enum, a function, running statistics (the
# checkpoint's normalizers) or MuJoCo's model or renderer, is the same in a rebuilt stack and is left out.
NOT_ENV_STATE = {"env", "envs", "env_fns", "spec", "metadata", "_metadata", "_cached_spec", "_saved_kwargs",
                 "_ezpickle_args", "_ezpickle_kwargs", "wrapper",  # walked, or constant (wrapper: a reward transform)
                 "_previous_data", "obs_rms"}  # the env checker's last (obs, info), for a warning; statistics
NOT_SAVED_LAYERS = (gym.wrappers.vector.RecordVideo,)  # the run's own recording of env 0, not the envs' state


def to_data(value):
    """value as data that torch.load(weights_only=True) reads: numbers, strings and None as they are, NumPy arrays and
    scalars as tensors, tuples and deques as lists, dicts, a NumPy Generator as its bit generator's state dict, a
    MuJoCo MjData as its integration state (time, qpos, qvel, act, controls, forces, warm start); else TypeError."""
    if isinstance(value, (np.ndarray, np.generic)) and value.dtype.kind in "biuf":  # first: np.float64 is a float
        return torch.from_numpy(np.array(value))  # a copy
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple, deque)):
        return [to_data(item) for item in value]
    if isinstance(value, dict) and all(isinstance(key, str) for key in value):
        return {key: to_data(item) for key, item in value.items()}
    if isinstance(value, np.random.Generator):
        return value.bit_generator.state
    if type(value).__name__ == "MjData":
        mujoco = sys.modules["mujoco"]
        state = np.empty(mujoco.mj_stateSize(value.model, mujoco.mjtState.mjSTATE_INTEGRATION))
        mujoco.mj_getState(value.model, value, state, mujoco.mjtState.mjSTATE_INTEGRATION)
        return torch.from_numpy(state)
    raise TypeError(f"a {type(value).__name__}")


def env_layers(envs) -> list:
    """Every layer of a Gymnasium vector env stack: the vector wrappers, the vector env, then each sub-env's layers,
    each with the attributes that make up its state (see NOT_ENV_STATE)."""
    layers, env = [], envs
    while isinstance(env, gym.vector.VectorWrapper):
        layers, env = layers + ([] if isinstance(env, NOT_SAVED_LAYERS) else [env]), env.env
    layers.append(env)
    for sub_env in env.envs:
        while isinstance(sub_env, gym.Wrapper):
            layers.append(sub_env)
            sub_env = sub_env.env
        layers.append(sub_env)
    constant = (gym.Space, enum.Enum, gym.wrappers.utils.RunningMeanStd)
    mujoco = ("mujoco.", "gymnasium.envs.mujoco.")  # MjModel, MujocoRenderer: constant; MjData is not
    return [(layer, [key for key, value in vars(layer).items() if key not in NOT_ENV_STATE and not (
        callable(value) or isinstance(value, constant) or type(value).__module__.startswith(mujoco)
        and type(value).__name__ != "MjData")]) for layer in layers]


def env_state(envs) -> dict:
    """The env stack's state as data, {"layers": [{"class": name, "state": {attribute: data}}]}; or {"restarts": why}"""
    if not isinstance(envs.unwrapped, gym.vector.SyncVectorEnv):
        return {"restarts": f"{type(envs.unwrapped).__name__}'s envs cannot be saved as data"}
    try:
        return {"layers": [{"class": type(layer).__name__, "state": {key: to_data(getattr(layer, key)) for key in keys}}
                           for layer, keys in env_layers(envs)]}
    except TypeError as error:
        return {"restarts": f"an env layer holds {error}, which cannot be saved as data"}


def env_state_updates(envs, saved) -> tuple:
    """env_state's data, each attribute restored() against the rebuilt stack's (settings equal): ([(layer, attribute,
    value)], None), or ([], why the envs restart instead, in this module's words); other layers: ValueError."""
    if not isinstance(envs.unwrapped, gym.vector.SyncVectorEnv):
        return [], f"{type(envs.unwrapped).__name__}'s envs cannot be saved as data"
    if isinstance(saved, bytes):  # written before checkpoints held only data
        return [], "its env state is a pickle, which is not loaded: unpickling can run code"
    if not (isinstance(saved, dict) and isinstance(saved.get("layers"), list)):
        return [], "the checkpoint holds no state of these envs"
    layers = env_layers(envs)
    if [type(layer).__name__ for layer, _ in layers] != [
            saved_layer.get("class") if isinstance(saved_layer, dict) else None for saved_layer in saved["layers"]]:
        raise ValueError("has other layers than these flags build (another version of the script or of Gymnasium "
                         "wrote it: resume it with that version)")
    updates = []
    for (layer, keys), saved_layer in zip(layers, saved["layers"]):
        state, name = saved_layer.get("state"), type(layer).__name__
        if not (isinstance(state, dict) and set(keys) <= set(state) <= set(keys) | NOT_ENV_STATE):
            return [], f"the checkpoint's {name} has other attributes than the rebuilt one"
        for key in keys:
            value = getattr(layer, key)
            try:
                if key in SETTINGS and not (type(state[key]) is type(value) and state[key] == value):
                    raise ValueError(f"is {reprlib.repr(state[key])}, where these flags set {value!r}")
                updates.append((layer, key, restored(state[key], value)))
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


def probe_env_state(envs, saved) -> Optional[str]:
    """Why a saved env state that passed every check still cannot run (an env told it was never reset, a screen it
    never opened), tried on a copy of the rebuilt stack that steps once and closes; None if it runs, or if the stack
    cannot be copied. The random state is put back after."""
    rng = rng_state()
    try:
        probe = copy.deepcopy(envs)
    except Exception:
        return None
    try:
        apply_env_state(env_state_updates(probe, saved)[0])
        space = probe.single_action_space
        action = np.zeros(space.shape, space.dtype)
        action = np.clip(action, space.low, space.high) if isinstance(space, gym.spaces.Box) else action
        probe.step(np.stack([action] * probe.num_envs))
        probe.close()
    except Exception as error:
        return f"the checkpoint's env state cannot step ({type(error).__name__})"
    finally:
        set_rng_state(rng)
    return None
