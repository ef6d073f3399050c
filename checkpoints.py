"""Reading a run's files for --eval-checkpoint and --resume (resume.py), small enough to audit alone; harness.py writes.

Every file a run writes is a safetensors file: tensors in its body, all else as JSON in its metadata (harness.py's
encoded(); FORMAT below). What holds for one from someone else:
- One reader, which runs no code: safetensors' own, once the header's length (its first 8 bytes) is within HEADER_LIMIT.
  The metadata's JSON is bounded (nesting, values, digits) before it is built; it names each tensor exactly once.
- Two passes. read() checks the file's keys and flags (fits()) against what the script writes. Once the run is
  rebuilt from its flags, restored() checks every value against the rebuilt run's own (keys, types, dtypes, shapes,
  settings, bounds), reading a tensor only once its dtype and shape are the run's; only then is anything applied.
- Any error is one sentence naming the file and the key (refused()); a name read from the disk is printed escaped.
It imports nothing of the project: harness.py hands itself (the module) to what walks an env stack.
"""
import dataclasses
import json
import math
import os
import re
import reprlib
import shlex
import stat
import sys
import typing
from collections import deque
from contextlib import contextmanager
from itertools import accumulate

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
STRING = re.compile(r'"[^"]*"')  # a JSON string, once its escaped backslashes and quotes are dropped


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


def given_flags(args, script) -> set:
    """The flags this command line gives: those on sys.argv where this process runs the script itself (python
    ppo_ewma.py ..., torchrun; at their defaults too), else (train(Args(...)) from Python) those off their defaults."""
    names = {field.name for field in dataclasses.fields(args)}
    if os.path.abspath(sys.argv[0]) != os.path.abspath(script.file):
        defaults = script.args_type()
        return {name for name in names if getattr(args, name) != getattr(defaults, name)}
    words = [word[2:].split("=")[0].replace("-", "_") for word in sys.argv[1:] if word.startswith("--")]
    return {word[3:] if word.startswith("no_") and word[3:] in names else word for word in words} & names


def flag_names(names) -> str:  # "--a, --b-c" of the fields a, b_c
    return ", ".join("--" + name.replace("_", "-") for name in names)


# ------------------------------------------------------------------------------------------ a run's file
def read_run(args, flag: str, script, given: set) -> tuple:
    """The file of `flag` (--resume, --eval-checkpoint), read (the first pass): (the file, the Args its run trained
    with). Its env id must be the one this command line gives, if any (given: its flags); a `module:EnvId` one, which
    imports (runs) that module, is used only where the command line names it too."""
    path = getattr(args, flag[2:].replace("-", "_"))
    source = f"{flag} {path}"
    checkpoint = read(path, flag, script, kinds=("checkpoint",) if flag == "--resume" else ("checkpoint", "model"))
    run_args = checkpoint_args(checkpoint, script, source)
    if "env_id" in given and args.env_id != run_args.env_id:
        raise SystemExit(f"--env-id {args.env_id} is not the checkpoint's env id {run_args.env_id!r}: {flag} runs on "
                         f"the checkpoint's own env (drop --env-id).")
    if ":" in run_args.env_id and "env_id" not in given:
        raise SystemExit(f"{source}: its env id {run_args.env_id!r} imports a module of its own, which runs its code; "
                         f"pass --env-id {shlex.quote(run_args.env_id)} as well if you trust that module.")
    return checkpoint, run_args


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
                             f"{shown(str(error))[:200]}).") from None
    finally:
        os.close(fd)
    kind = next((kind for kind in ("checkpoint", "model") if set(metadata) == {kind}), None)
    if kind is None:
        raise SystemExit(f"{source} is not a file a run writes: its metadata holds neither a checkpoint nor a model.")
    arrays = metadata[kind].count('"$array"')
    if arrays > (2 if kind == "model" else 0):  # a model's observation statistics, a mean and a var; none elsewhere
        raise SystemExit(f"{source} is not a {kind} a run writes: its metadata holds {arrays:,} arrays.")
    try:
        used = set()
        tree = decoded(parsed(metadata[kind]), file, names if kind == "checkpoint" else set(), used)
        if used != (names if kind == "checkpoint" else set()):
            raise ValueError(f"its metadata does not name the tensor {reprlib.repr(min(names - used))}")
    except (ValueError, TypeError, OverflowError, RecursionError) as error:
        raise SystemExit(f"{source} is not a {kind} a run writes: {error}.") from None
    if kind not in kinds:
        raise SystemExit(f"{source} is a model file, the policy alone: {flag} takes a run's checkpoint.safetensors.")
    written_by = tree.get("script") if isinstance(tree, dict) else None
    if written_by != script.name:
        if not (isinstance(written_by, str) and written_by.endswith(".py") and written_by[:-3].isidentifier()):
            raise SystemExit(f"{source} is not a {kind} a run writes: its metadata names no script (its script is "
                             f"{reprlib.repr(written_by)}).")
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
    wrong = next((key for key in {**keys, **tree} if not (isinstance(tree.get(key), known.get(key, object)) and (
        known.get(key) is not int or type(tree[key]) is int and 0 <= tree[key] <= 2**53))), None)
    if wrong is not None:
        raise SystemExit(f"{source} is not a {script.name} {kind}: its {reprlib.repr(wrong)} is "
                         f"{'missing' if wrong not in tree else reprlib.repr(tree[wrong])}.")
    flags = sorted(set(tree["args"]) - {field.name for field in dataclasses.fields(script.args_type)})
    if flags:  # e.g. one that a later version removed, or moved into a script of its own
        raise SystemExit(f"{source} is not a {script.name} {kind}: its flag {reprlib.repr(flags[0])} is not one of "
                         f"{script.name}'s.")
    unknown = sorted(set(tree) - set(known), key=repr)
    if unknown:
        raise SystemExit(f"{source} holds {reprlib.repr(unknown[0])}, which no {script.name} {kind} holds.")


def parsed(text: str):
    """The metadata's JSON as Python values, once bounded before anything is built: nesting at most JSON_DEPTH, fewer
    than JSON_VALUES values, ints of at most INT_DIGITS digits, finite floats, no key twice in one object; else
    ValueError (json's own included)."""
    # its strings emptied, in linear time (escaped backslashes, then escaped quotes dropped): its structure and numbers
    skeleton = STRING.sub('""', text.replace("\\\\", "").replace('\\"', ""))
    if sum(map(skeleton.count, ",:[{")) >= JSON_VALUES:  # each value but the first follows one of these
        raise ValueError(f"its metadata holds more than {JSON_VALUES:,} values")
    if max(accumulate(1 if bracket in "[{" else -1 for bracket in re.sub(r"[^\[\]{}]", "", skeleton)),
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
    if tag == "$tensor" and isinstance(inner, str) and inner in names and inner not in used:
        used.add(inner)
        return Stored(file, inner)
    if tag == "$tuple" and isinstance(inner, list):
        return tuple(decoded(inner, file, names, used))
    if tag == "$float" and inner in ("inf", "-inf", "nan"):
        return float(inner)
    if tag == "$int_keys" and isinstance(inner, list) and all(
            isinstance(pair, list) and len(pair) == 2 and type(pair[0]) is int and 0 <= pair[0] < JSON_VALUES
            for pair in inner):  # small keys (a run's are parameter indices): no two of them hash alike
        items = {key: decoded(item, file, names, used) for key, item in inner}
        if len(items) == len(inner):
            return items
    if tag == "$array" and isinstance(inner, dict) and sorted(inner) == ["data", "dtype", "shape"]:
        dtype, shape, data = {"float32": torch.float32, "float64": torch.float64}.get(inner["dtype"]), \
            inner["shape"], inner["data"]
        sizes = isinstance(shape, list) and all(type(size) is int and 0 <= size < JSON_VALUES for size in shape)
        if dtype and sizes and isinstance(data, list) and len(data) == math.prod(shape) and all(
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
        bound = min(FLOAT_BOUND, math.sqrt(torch.finfo(data.dtype).max) / 10) if data.is_floating_point() else 0
        if bound and not (data.abs() <= bound).all() and (like.abs() <= bound).all():  # squares stay finite
            raise ValueError(f"holds nan or inf, or values beyond {bound:.1e}")
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
        return data if like is None else type(like)(data)  # as the run holds it: no NumPy scalar where it has none
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


def load_weights(module, models, name: str, source: str = "The checkpoint") -> None:
    """Load a file's models[name] into `module` once restored() passes it; one sentence otherwise."""
    state = checked(models.get(name) if isinstance(models, dict) else None, module.state_dict(), name, source)
    module.load_state_dict(copied(state))


# ------------------------------------------------------------------------------------------- the env stack's state
def checked_normalizers(envs, states, source: str, harness) -> dict:
    """The env stack's saved statistics, each restored() against the rebuilt one's (a mean: float32, 64 once used)."""
    found = {}
    for name, (_, rms) in harness.env_normalizers(envs).items():
        if name in states:
            saved = states[name].get("mean") if isinstance(states[name], dict) else None
            dtype = saved.dtype if getattr(saved, "dtype", None) in (torch.float32, torch.float64) else None
            own = {"mean": torch.as_tensor(rms.mean, dtype=dtype), "var": torch.as_tensor(rms.var, dtype=dtype),
                   "count": float(rms.count)}
            found[name] = checked(states[name], own, f"{name} statistics", source)
    return found


def load_normalizers(envs, states, harness, source: str = "The checkpoint") -> None:
    """A file's statistics into an evaluation's env stack, checked, then frozen."""
    fitting = checked_normalizers(envs, states if isinstance(states, dict) else {}, source, harness)
    for name, (wrapper, rms) in harness.env_normalizers(envs).items():
        state = fitting.get(name, {})
        vars(rms).update({key: value if key == "count" else np.array(value) for key, value in state.items()})
        wrapper.update_running_mean = False
