"""Reading a run's files for --resume and --eval-checkpoint, small enough to audit alone (harness.py writes them).

Every file a run writes is a safetensors file: tensors in its body, all else as JSON in its metadata (harness.py's
encoded(); FORMAT below). What holds for one from someone else:
- One reader, which runs no code: safetensors' own, once the header's length (the file's first 8 bytes) is at most
  HEADER_LIMIT. The metadata's JSON is bounded (nesting, number of values, digits of a number) before Python builds
  anything of it; each of the file's tensors is named in it exactly once.
- Two passes. read() checks what the file holds against what the script writes: its keys, its flags (fits()). Once
  the run is rebuilt from the file's flags, restore_run() checks every value against the rebuilt run's own (keys,
  types, dtypes, shapes, settings, bounds, the arithmetic done with it), and reads a tensor only once its dtype and
  shape are the run's: nothing allocates beyond the run. Only then is anything applied.
- Any error while a file is read or applied is one sentence naming the file and the key (refused()); a name read
  from the disk is printed escaped (shown()).
It imports no module of the project: harness.py hands it the run's parts (Saved), and the walk of its env stack.
"""
import dataclasses
import json
import math
import os
import random
import re
import reprlib
import stat
import sys
import typing
from collections import deque
from contextlib import contextmanager
from itertools import accumulate
from typing import Optional

import numpy as np
import safetensors
import torch

# What a run writes, measured (benchmark/checkpoint_cost.py --header-envs 1000): vmpo.py's Hopper-v5 run of 1,000 envs
# (MuJoCo's state: the most a Gymnasium env stack holds here) has a header of 2.5 MiB, its metadata nested 8 deep with
# 162,640 values. These bounds admit some 6,000 such envs; crafted JSON at them builds at most about 80 MB.
HEADER_LIMIT = 16 * 2**20  # bytes of a file's header, read before safetensors parses it
JSON_DEPTH, JSON_VALUES = 32, 2**20  # nesting and values of the metadata's JSON, counted before json builds it
INT_DIGITS = 39  # digits of the largest int a run writes: PCG64's 128-bit state
STRING_LIMIT = 4096  # characters of a string flag: a path's longest on Linux
FLOAT_BOUND = 1e30  # a finite number read from a file, beyond which a run's arithmetic overflows
WALK_DEPTH = 8  # folders within a run directory: a run makes one (videos/)
OLD_FORMAT = "18fb459"  # the last commit whose code reads torch.save's .pt checkpoints
FORMAT = {"$tensor": "a tensor of the body, by name", "$tuple": "a list that was a tuple",
          "$int_keys": "a dict of int keys, as [key, value] pairs", "$float": "'inf', '-inf' or 'nan'",
          "$array": "a small tensor in the JSON itself, {'dtype', 'shape', 'data'} (a model's statistics)"}
KEYS = {"args": dict, "models": dict, "optimizers": dict, "normalizers": dict, "rng": dict, "env": dict,
        "global_step": int, "iteration": int, "num_iterations": int, "episode_returns": list}  # every checkpoint's
OPTIONAL_KEYS = {"script": str, "wandb_run_id": str, "workers": list}  # W&B runs; torchrun: workers 1 to W - 1's
MODEL_KEYS = {"script": str, "args": dict, "global_step": int, "normalizers": dict}  # a model file's JSON
SHARED_KEYS = ("args", "models", "optimizers", "global_step", "iteration", "num_iterations", "episode_returns",
               "script", "wandb_run_id")  # the same on every torchrun worker: the rest is each worker's own
# Values the flags set (a discount, a clip, a time limit, the number of envs): restored only where they equal the
# rebuilt run's own
SETTINGS = {"gamma", "clip", "decay", "epsilon", "_max_episode_steps", "num_envs", "copy", "observation_mode",
            "render_mode", "frame_skip", "buffer_length", "_stats_key", "_disable_render_order_enforcing",
            "_update_running_mean", "update_running_mean"}
NONNEGATIVE = {"count", "var", "weight", "sum_sq"}  # running statistics that a division or a square root takes
DTYPES = {"BOOL": torch.bool, "U8": torch.uint8, "I8": torch.int8, "I16": torch.int16, "I32": torch.int32,
          "I64": torch.int64, "F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32, "F64": torch.float64}
NUMPY_DTYPES = tuple(DTYPES.values())[:6] + (torch.float32, torch.float64)  # what a NumPy scalar of to_data can be
STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')  # a JSON string


def shown(name: str) -> str:
    """A name read from the disk (a file's, a folder's), printable: each character that does not print escaped."""
    return "".join(char if char.isprintable() else ascii(char)[1:-1] for char in name)


class Stored:
    """A tensor of a file, not read yet: its dtype and shape, from the header, are checked before read() copies it."""

    def __init__(self, file, name: str):
        info = file.get_slice(name)
        self.file, self.name, self.kind = file, name, info.get_dtype()
        self.dtype, self.shape = DTYPES.get(self.kind), torch.Size(info.get_shape())

    def read(self) -> torch.Tensor:
        return self.file.get_tensor(self.name)  # a view of the file's mapping, which copied() copies out

    def __repr__(self):
        return f"a {self.dtype or self.kind} tensor of shape {list(self.shape)}"


# ------------------------------------------------------------------------------------------ the first pass
def read(path: str, flag: str, script, kinds=("checkpoint", "model")) -> dict:
    """The first pass: the file at path as a dict whose tensors are Stored, not read, with "kind" "checkpoint" or
    "model" (a model's tensors are its models[script.policy]). Refused in one sentence naming `flag` and path: anything
    but a regular safetensors file with a header within HEADER_LIMIT and bounded JSON, a .pt file of an earlier
    version, another script's file, a kind not in `kinds`, a key or torchrun worker's part that no run writes, a flag
    that Args lacks."""
    source = f"{flag} {path}"
    if not path.isprintable():  # it is printed, and names the run directory of --eval-checkpoint
        raise SystemExit(f"{flag} {shown(path)} holds characters that do not print: rename it.")
    try:  # never blocks (a FIFO); safetensors reads the very file checked here, not one put in its place since
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as error:
        raise SystemExit(f"{source}: {'no such file' if error.errno == 2 else error.strerror}.") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise SystemExit(f"{source} is not a file.")
        head = os.pread(fd, 8, 0)
        if head[:4] == b"PK\x03\x04":
            raise SystemExit(f"{source} is a .pt file of an earlier version of this project (torch.save's zip), which "
                             f"this version does not read: run it with that version (git checkout {OLD_FORMAT}).")
        length = int.from_bytes(head, "little") if len(head) == 8 else 0
        if not 0 < length <= min(HEADER_LIMIT, info.st_size - 8):
            raise SystemExit(f"{source} is not a file a run writes: a safetensors file whose header is at most "
                             f"{HEADER_LIMIT // 2**20} MiB (its first 8 bytes give {length:,} bytes, of "
                             f"{info.st_size:,}).")
        try:
            file = safetensors.safe_open(f"/proc/self/fd/{fd}" if os.path.isdir("/proc/self/fd") else path, "pt")
            metadata, names = file.metadata() or {}, set(file.keys())
        except Exception as error:
            raise SystemExit(f"{source} cannot be read as a safetensors file ({type(error).__name__}: "
                             f"{reprlib.repr(str(error))[1:-1]}).") from None
    finally:
        os.close(fd)
    kind = next((kind for kind in ("checkpoint", "model") if set(metadata) == {kind}), None)
    if kind is None:
        raise SystemExit(f"{source} is not a file a run writes: its metadata holds neither a checkpoint nor a model.")
    try:
        used = set()
        tree = decoded(parsed(metadata[kind]), file, names if kind == "checkpoint" else set(), used)
        if used != (names if kind == "checkpoint" else set()):
            raise ValueError(f"its metadata does not name the tensor {reprlib.repr(min(names - used))}")
    except (ValueError, RecursionError) as error:
        raise SystemExit(f"{source} is not a {kind} a run writes: {error}.") from None
    if kind not in kinds:
        raise SystemExit(f"{source} is a model file, the policy alone: {flag} takes a run's checkpoint.safetensors.")
    written_by = tree.get("script") if isinstance(tree, dict) else None
    if written_by != script.name:  # other text than a script's name is quoted
        named = isinstance(written_by, str) and written_by.endswith(".py") and written_by[:-3].isidentifier()
        written_by = written_by if named else reprlib.repr(written_by)
        raise SystemExit(f"{source} is a {written_by} {kind}, not a {script.name} one: run {written_by}.")
    if kind == "model":
        tree["models"] = {script.policy: {name: Stored(file, name) for name in sorted(names)}}
    check_keys(tree, kind, script, source)
    for rank, part in enumerate(tree.get("workers", []), 1):  # torchrun: every worker's view, as rank 0's
        if not (isinstance(part, dict) and not set(part) & set(SHARED_KEYS)):
            raise SystemExit(f"{source}: its part of worker {rank} is not one a run writes.")
        check_keys(worker_view(tree, rank), kind, script, f"{source}: its part of worker {rank}")
    return dict(tree, kind=kind)


def check_keys(tree: dict, kind: str, script, source: str) -> None:
    """A checkpoint's or model's keys (a torchrun worker's view: the shared keys and its part), each of the type every
    run writes, the counters within 2**53, the flags Args's own."""
    keys = KEYS if kind == "checkpoint" else MODEL_KEYS
    known = {**keys, **({**OPTIONAL_KEYS, **dict.fromkeys(script.checkpoint_keys, object)} if kind == "checkpoint"
                        else {"models": dict})}
    field_names = {field.name for field in dataclasses.fields(script.args_type)}
    if not (all(isinstance(tree.get(key), type_) for key, type_ in keys.items())
            and all(isinstance(tree[key], known[key]) for key in tree if key in known)
            and all(type(tree[key]) is int and 0 <= tree[key] <= 2**53 for key in keys if keys[key] is int)
            and set(tree["args"]) <= field_names):
        raise SystemExit(f"{source} is not a {script.name} {kind}.")
    unknown = sorted(set(tree) - set(known), key=repr)
    if unknown:
        raise SystemExit(f"{source} holds {reprlib.repr(unknown[0])}, which no {script.name} {kind} holds.")


def parsed(text: str):
    """The metadata's JSON as Python values, once bounded before anything is built: nesting at most JSON_DEPTH, fewer
    than JSON_VALUES values, ints of at most INT_DIGITS digits, finite floats, no key twice in one object; else
    ValueError (json's own included)."""
    skeleton = STRING.sub('""', text)  # its strings emptied: what is left is its structure and numbers
    if sum(map(skeleton.count, ",:[{")) >= JSON_VALUES:  # each value but the first follows one of these
        raise ValueError(f"its metadata holds more than {JSON_VALUES:,} values")
    if max(accumulate(1 if bracket in "[{" else -1 for bracket in re.findall(r"[\[\]{}]", skeleton)),
           default=0) > JSON_DEPTH:
        raise ValueError(f"its metadata nests deeper than {JSON_DEPTH}")
    return json.loads(text, parse_int=bounded_int, parse_float=finite_float, parse_constant=no_constant,
                      object_pairs_hook=unique_keys)


def bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > INT_DIGITS:
        raise ValueError(f"it holds an int of more than {INT_DIGITS} digits")
    return int(text)


def finite_float(text: str) -> float:
    value = float(text) if len(text) <= 32 else math.inf  # repr() writes at most 24 characters
    if not math.isfinite(value):
        raise ValueError(f"it holds the number {reprlib.repr(text)}, which a run writes as a $float")
    return value


def no_constant(text: str):
    raise ValueError(f"it holds {text}, which JSON does not have (a run writes a $float)")


def unique_keys(pairs) -> dict:
    if len({key for key, _ in pairs}) < len(pairs):
        raise ValueError("an object of its metadata holds a key twice")
    return dict(pairs)


def decoded(value, file, names: set, used: set):
    """parsed()'s values with FORMAT's tags undone; a $tensor becomes a Stored of `file`, each of `names` once."""
    if isinstance(value, list):
        return [decoded(item, file, names, used) for item in value]
    if not (isinstance(value, dict) and any(key.startswith("$") for key in value)):
        return {key: decoded(item, file, names, used) for key, item in value.items()} if isinstance(value, dict) \
            else value
    (tag, inner), = value.items() if len(value) == 1 else [(None, None)]
    if tag == "$tensor" and isinstance(inner, str) and inner in names - used:
        used.add(inner)
        return Stored(file, inner)
    if tag == "$tuple" and isinstance(inner, list):
        return tuple(decoded(inner, file, names, used))
    if tag == "$float" and inner in ("inf", "-inf", "nan"):
        return float(inner)
    if tag == "$int_keys" and isinstance(inner, list) and all(
            isinstance(pair, list) and len(pair) == 2 and type(pair[0]) is int for pair in inner):
        items = {key: decoded(item, file, names, used) for key, item in inner}
        if len(items) == len(inner):
            return items
    if tag == "$array" and isinstance(inner, dict) and sorted(inner) == ["data", "dtype", "shape"]:
        dtype, shape, data = {"float32": torch.float32, "float64": torch.float64}.get(inner["dtype"]), \
            inner["shape"], inner["data"]
        if dtype and isinstance(shape, list) and all(type(size) is int and size >= 0 for size in shape) and \
                isinstance(data, list) and len(data) == math.prod(shape) and all(
                    type(number) in (int, float) for number in data):
            return torch.tensor(data, dtype=dtype).reshape(shape)
    raise ValueError(f"it holds {reprlib.repr(value)}, which is none of the format's tags (or names a tensor that "
                     f"is not in the body, or twice)")


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
    """The Args a file's run trained with, each fits() its flag (the caller checks the ranges); a flag added since
    takes the script's missing_flags value (what runs did before it existed), else its default."""
    args_type = script.args_type
    values, hints = {**script.missing_flags, **checkpoint["args"]}, typing.get_type_hints(args_type)
    for name, value in values.items():
        if not fits(value, hints[name]):
            raise SystemExit(f"{source}: its flag {name} is {reprlib.repr(value)}, which --{name.replace('_', '-')} "
                             f"cannot be ({hints[name]}).")
    return args_type(**values)


def worker_view(checkpoint: dict, rank: int) -> dict:
    """The checkpoint as torchrun worker `rank` resumes it: the shared keys and its own part (read() checked both)."""
    if rank == 0:
        return {key: value for key, value in checkpoint.items() if key != "workers"}
    return {**{key: checkpoint[key] for key in SHARED_KEYS if key in checkpoint}, **checkpoint["workers"][rank - 1]}


# ------------------------------------------------------------------------------------------ the second pass
def restored(data, like):
    """`data` read from a file, checked to hold what the rebuilt run holds in its place, `like`: a tensor of like's
    dtype and shape, read only then, finite where like is (an array: as a tensor); a number of like's type (None: any
    number, or None), within FLOAT_BOUND where like is finite; a str equal to like's; a list or tuple of like's
    length and a dict of like's keys, item by item, its SETTINGS equal to like's, its NONNEGATIVE not negative; a
    deque as a list of at most its maxlen items, each like its first. Nothing is walked deeper than like. ValueError
    says what does not fit."""
    if isinstance(like, np.random.Generator):  # its bit generator's state dict; NumPy checks the values
        generator = np.random.Generator(type(like.bit_generator)())
        try:
            generator.bit_generator.state = restored(data, like.bit_generator.state)
        except (TypeError, OverflowError, ValueError) as error:
            raise ValueError(f"is not a {type(like.bit_generator).__name__} state ({type(error).__name__})") from None
        return generator
    if isinstance(like, (np.ndarray, np.generic)) and like.dtype.kind in "biuf":
        value = restored(data, torch.from_numpy(np.array(like)))
        return value.numpy() if isinstance(like, np.ndarray) else value.numpy()[()]
    if isinstance(like, torch.Tensor):
        if not (isinstance(data, (Stored, torch.Tensor)) and data.dtype == like.dtype and data.shape == like.shape):
            raise ValueError(f"is {described(data)}, not a {like.dtype} tensor of shape {list(like.shape)}")
        data = data.read() if isinstance(data, Stored) else data
        if data.is_floating_point() and not torch.isfinite(data).all() and torch.isfinite(like).all():
            raise ValueError("holds nan or inf")
        return data
    if like is None and data is None:
        return data
    if like is None or type(like) in (bool, int, float):  # a Python number, or a NumPy scalar as to_data wrote it (a
        kind = {bool: "b", int: "iu", float: "fiu", type(None): "biuf"}[type(like)]  # 0-dim tensor); None: any one
        if isinstance(data, Stored) and data.shape == () and data.dtype in NUMPY_DTYPES:
            data = data.read().numpy()[()]
        python = {bool: (bool,), int: (int,), float: (float, int), type(None): (bool, int, float)}[type(like)]
        if not (type(data) in python or isinstance(data, np.generic) and data.dtype.kind in kind):
            raise ValueError(f"is {described(data)}, not {'a number' if like is None else described(like)}")
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


def described(value) -> str:
    """ "a torch.float32 tensor of shape [2, 4]", "a list"."""
    if isinstance(value, (Stored, torch.Tensor)):
        return f"a {value.dtype or value.kind} tensor of shape {list(value.shape)}"
    return f"a {type(value).__name__}"


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
    """The one boundary: any error while a file's `what` is checked or applied becomes one sentence naming the file
    (source, e.g. "--resume runs/x/checkpoint.safetensors") and `what`, the key."""
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
    """restored()'s value with every tensor copied (to device) and arrays as NumPy's own."""
    if isinstance(value, torch.Tensor):
        return value.detach().to(device, copy=True)
    if isinstance(value, np.ndarray):
        return np.array(value)
    if isinstance(value, (list, tuple, deque)):
        items = [copied(item, device) for item in value]
        return deque(items, value.maxlen) if isinstance(value, deque) else type(value)(items)
    if isinstance(value, dict):
        return {key: copied(item, device) for key, item in value.items()}
    return value


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


# ------------------------------------------------------------------------------------------ restoring a run
def restore_run(checkpoint, saved, envs, next_obs, next_done, source: str, batch_size: int, num_iterations: int,
                walk) -> tuple:
    """The second pass: every part (networks, optimizers, normalizers, envs, random state, counters, the script's
    keys) checked against the rebuilt run, then applied: (global_step, first iteration, next_obs, next_done, returns,
    keys). Gymnasium envs continue exactly; envs whose state is not data (Procgen's) restart, keeping their
    statistics. saved: harness.Saved; walk: harness.py's walk of an env stack (layers, normalizers, rng_state)."""
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
    env_normalizer_states = checked_normalizers(envs, checkpoint["normalizers"], source, walk)
    rng = checked_rng(checkpoint["rng"], source, walk.rng_state())
    returns = checked(checkpoint["episode_returns"], deque([0.0], maxlen=100), "episode_returns", source)
    keys = {key: checked(checkpoint.get(key), like, key, source) for key, like in saved.keys.items()}
    saved_env = checkpoint["env"]
    with refused("env stack", source):  # e.g. ppo_ewma.py's until bded84a: NormalizeObservation in each env
        env_updates, restarts = env_state_updates(walk.layers(envs), saved_env.get("state"))
        restarts = restarts or probe_env_state(envs, saved_env.get("state"), walk)
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
    walk.apply_normalizers(walk.normalizers(envs), env_normalizer_states)
    with refused("rng", source):
        walk.set_rng_state(rng)
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
    """Load a file's models[name] into `module` once restored() passes it; one sentence otherwise."""
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
        if "cuda" in rng and "cuda" in own and isinstance(rng["cuda"], list) and len(rng["cuda"]) == len(own["cuda"]):
            state["cuda"] = restored_item(rng, own, "cuda")
        return state


# ------------------------------------------------------------------------------------------- the env stack's state
def checked_normalizers(envs, states, source: str, walk) -> dict:
    """The env stack's saved statistics, each restored() against the rebuilt one's (a mean: float32, 64 once used)."""
    found = {}
    for name, (_, rms) in walk.normalizers(envs).items():
        if name in states:
            saved = states[name].get("mean") if isinstance(states[name], dict) else None
            dtype = saved.dtype if getattr(saved, "dtype", None) in (torch.float32, torch.float64) else None
            own = {"mean": torch.as_tensor(rms.mean, dtype=dtype), "var": torch.as_tensor(rms.var, dtype=dtype),
                   "count": float(rms.count)}
            found[name] = checked(states[name], own, f"{name} statistics", source)
    return found


def load_normalizers(envs, states, walk, source: str = "The checkpoint") -> None:
    """A file's statistics into an evaluation's env stack, checked, then frozen."""
    states = states if isinstance(states, dict) else {}
    walk.apply_normalizers(walk.normalizers(envs), checked_normalizers(envs, states, source, walk), freeze=True)


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


def probe_env_state(envs, saved, walk) -> Optional[str]:
    """Why a saved env state that passed every check still cannot run (an env told it was never reset, a screen it
    never opened), tried on a copy of the rebuilt stack that steps once and closes; None if it runs, or if the stack
    cannot be copied. The random state is put back after."""
    import copy

    rng = walk.rng_state()
    try:
        probe = copy.deepcopy(envs)
    except Exception:
        return None
    try:
        apply_env_state(env_state_updates(walk.layers(probe), saved)[0])
        space = probe.single_action_space
        action = np.zeros(space.shape, space.dtype)
        action = np.clip(action, space.low, space.high) if hasattr(space, "low") else action
        probe.step(np.stack([action] * probe.num_envs))
        probe.close()
    except Exception as error:
        return f"the checkpoint's env state cannot step ({type(error).__name__})"
    finally:
        walk.set_rng_state(rng)
    return None


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
