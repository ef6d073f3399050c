"""What every run needs and no paper describes: the checks of its flags, device, run directory, progress,
TensorBoard, the writing of its checkpoint and model, and what several scripts build with (the Procgen adapter,
flattened observations, chunked passes). A script describes itself in a `Script` and calls, from train():

    flags, checkpoint = harness.run_flags(args, SCRIPT)          # the flags, checked; with --resume the checkpoint's
    run = harness.start(SCRIPT, args, checkpoint, num_iterations)  # checks, torchrun workers, seeds, device
    envs = run.open(make_env(run.args, run.render_mode))          # the script's envs; run dir, start-up block
    global_step, first_iteration, next_obs, next_done = run.restore(harness.Saved(...), next_obs, next_done)
    run.after_step(global_step, info)                 # every env step: finished episodes, progress
    run.end_rollout()                                 # the rollout's episodes to TensorBoard
    run.updating(f"epoch {epoch + 1}/{epochs}")       # what the progress line says during the update
    run.end_iteration(iteration, global_step, ...)    # SPS, evaluation, checkpoint, a requested stop
    return run.finish(iteration, global_step, ...)    # model.safetensors, closing line

What only some runs use is a module imported where a flag asks (service()) and handed this one: checkpoints.py
(reading), resume.py, evaluation.py (and video), workers.py (torchrun), tracking.py (W&B). It imports no script.
"""
import contextlib
import ctypes
import dataclasses
import difflib
import enum
import errno
import fcntl
import importlib
import json
import math
import os
import platform
import random
import re
import reprlib
import secrets
import shlex
import signal
import stat
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Optional

import gymnasium as gym
import numpy as np
import safetensors.torch
import torch
from torch.utils.tensorboard import SummaryWriter

CHECKPOINT_MINUTES = 30  # default cadence of checkpoint.safetensors: at most this much work is lost to a crash
PROGRESS_EVERY = 30  # seconds between progress lines when stdout is not a terminal (CI, a log file)
COMMON_FLAG_RANGES = {  # the flags every script has, with the interval each must lie in (threads: at most the cores)
    "seed": "[0, 4294967295]", "torch_threads": f"[0, {os.cpu_count()}]", "checkpoint_every": "[0, inf)",
    "eval_episodes": "[1, inf)", "eval_every": "[0, inf)", "total_timesteps": "[1, inf)", "num_envs": "[1, inf)",
    "num_steps": "[1, inf)", "num_minibatches": "[1, inf)", "update_epochs": "[1, inf)", "learning_rate": "(0, inf)",
    "adam_eps": "(0, inf)", "gamma": "[0, 1]", "gae_lambda": "[0, 1]"}
OUTPUT_FLAGS = ("cuda", "bf16", "save_model", "checkpoint_every", "capture_video")  # --resume: the command line's
TRACKING_FLAGS = ("track", "wandb_project_name", "wandb_entity")  # where data goes: the command line's, never a file's
NAME_LENGTH = 64  # characters of --exp-name; with the env id, seed and time a run directory's name stays under 255
ENV_BYTES = 4 * 2**20  # what one env is counted to hold: a MuJoCo env's 1.1-1.6 MiB, doubled for wrappers, buffers
LIVE_RUN = None  # this process's Run until it ends (release): one that died of an error is let go at the next start
WORKERS = None  # workers.py under torchrun; None in one process, where each collective below does nothing
ACCEPTED_ACTIONS = {"discrete": ((gym.spaces.Discrete,), "Discrete actions counted from 0"),  # Script.actions
                    "continuous": ((gym.spaces.Box,), "Box actions"),
                    "any": ((gym.spaces.Discrete, gym.spaces.Box), "Discrete actions counted from 0, or Box ones"),
                    "all": ((gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.Box),
                            "Discrete or 1-D MultiDiscrete actions counted from 0, or Box ones")}


@dataclass
class RunArgs:
    """The run flags every script's Args inherits: seeds, device, saving, resuming and evaluation."""

    seed: int = 1
    """seed of random, numpy, torch and the envs (Procgen's rand_seed)"""
    torch_deterministic: bool = True
    """set torch.backends.cudnn.deterministic"""
    cuda: bool = True
    """use the GPU (--no-cuda: the CPU); with no GPU present the run falls back to the CPU and says so"""
    bf16: bool = False
    """run the IMPALA CNN in bfloat16 under autocast; weights, losses and Adam in float32 (images: docs/speed.md)"""
    torch_threads: int = 0
    """torch's CPU threads; 0: 1 for the MLP of vector envs, one per core for the IMPALA CNN (fastest here)"""
    save_model: bool = True
    """write model.safetensors, the policy and what plays it, into the run directory at the end"""
    checkpoint_every: Optional[int] = None
    """write checkpoint.safetensors every this many iterations and at the last; default: every 30 minutes; 0: never"""
    resume: Optional[str] = None
    """continue the run of this checkpoint, in its directory, with its flags (of this command line only --cuda, --bf16,
    --save-model, --checkpoint-every, --capture-video and --track's)"""
    eval_checkpoint: Optional[str] = None
    """do not train: play the policy of this model file or checkpoint, normalization frozen; log its mean raw return"""
    eval_episodes: int = 10
    """episodes played by --eval-checkpoint, and at each --eval-every mark (one on each of as many envs)"""
    eval_every: int = 0
    """every this many env steps, play --eval-episodes episodes on envs of their own, log eval/mean_return; 0: never"""
    eval_deterministic: bool = False
    """evaluation and video act with the policy's mode (the argmax; the Gaussian's mean), not as in training"""
    capture_video: bool = False
    """record videos into the run directory's videos/: env 0's episodes 0, 1, 8, 27, ..., 729, then every 1000th; with
    --eval-checkpoint every episode (needs evaluation.py, moviepy, and pygame or a headless OpenGL: docs/running.md)"""
    track: bool = False
    """log the run to Weights & Biases (needs wandb, tracking.py); --resume continues its W&B run given --track"""
    wandb_project_name: str = "policy-optimization"
    """the W&B project of --track"""
    wandb_entity: Optional[str] = None
    """the W&B entity (team or user) of --track; default: your W&B default"""


def describe(args, num_iterations: int) -> str:
    """The start-up block's line on the run's size (args: the run's, num_envs the total over all workers)."""
    batch_size = args.num_envs * args.num_steps
    return (f"{num_iterations * batch_size:,} in {plural(num_iterations, 'iteration')} of {batch_size:,} "
            f"({plural(args.num_envs, 'env')} x {args.num_steps} steps)")


def worker_share(args, rank: int, world_size: int):
    """A torchrun worker's Args: num_envs / W envs and seed + rank * num_envs / W. A Gymnasium vector env seeds its
    env i with seed + i, so the W workers together step the very envs of a single process."""
    num_envs = args.num_envs // world_size
    return dataclasses.replace(args, num_envs=num_envs, seed=args.seed + rank * num_envs)


@dataclass(kw_only=True)
class Script:
    """What the harness needs to know of a script: everything that is the script's own."""

    file: str  # the script's __file__, for messages
    doc: str  # its docstring: the first paragraph names the algorithm, the `python ...` lines are its recipes
    args_type: type  # its Args dataclass
    make_env: Callable  # (args, render_mode=None) -> gymnasium VectorEnv
    acting_policy: Callable  # (args, envs, load, device) -> sample(obs, reward, done) -> action tensors, for evaluation
    # (reward, done: the last step's, for a recurrent policy); load(module, name) loads the weights `name`, checked
    flag_ranges: dict  # {flag: interval such as "(0, 1]"} for its own numeric flags
    check_args: Callable = lambda args, observation_space, action_space: None  # its own checks of the run's Args
    describe: Callable = describe  # (the run's args, num_iterations) -> the start-up block's "steps" line
    defaults: Callable = lambda args: args  # the flags -> with the defaults that depend on the env filled in
    worker_share: Optional[Callable] = None  # (args, rank, world_size) -> a torchrun worker's Args; None: 1 process
    run_name: Callable = lambda args: f"{portable(args.env_id)}__{args.exp_name}__{args.seed}"  # the run dir, less time
    procgen: bool = False  # whether it runs the Procgen games (64x64x3 uint8 images, 15 actions)
    actions: str = "discrete"  # the action spaces it accepts, one of ACCEPTED_ACTIONS: "discrete", "continuous", ...
    images: bool = True  # whether it accepts 64x64x3 image observations, besides vectors
    missing_flags: dict = dataclasses.field(default_factory=dict)  # flags added later, as older checkpoints trained
    checkpoint_keys: tuple = ()  # its own keys in checkpoints (the names of its Saved keys)
    policy: str = "agent"  # the network of Saved.models that acts: what the model file holds and evaluation plays

    @property
    def name(self) -> str:
        return os.path.basename(self.file)

    @property
    def procgen_games(self) -> tuple:
        return PROCGEN_GAMES if self.procgen else ()


# -------------------------------------------------------------------------- envs, a run's share of tensors
PROCGEN_GAMES = ("bigfish", "bossfight", "caveflyer", "chaser", "climber", "coinrun", "dodgeball", "fruitbot", "heist",
                 "jumper", "leaper", "maze", "miner", "ninja", "plunder", "starpilot")


class ProcgenVecEnv(gym.vector.VectorEnv):
    """The Procgen game --env-id as a Gymnasium VectorEnv: --num-envs envs of --distribution-mode, levels --start-level
    on (--num-levels, 0: all) seeded with --seed; uint8 HWC images, 15 actions; resets in `step` (SAME_STEP), never
    truncates."""

    metadata = {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP, "render_fps": 15}

    def __init__(self, args, render_mode=None):
        from procgen import ProcgenEnv  # imported here: only Procgen runs need the old gym stack

        self.venv = ProcgenEnv(num_envs=args.num_envs, env_name=args.env_id, num_levels=args.num_levels,
                               start_level=args.start_level, distribution_mode=args.distribution_mode,
                               rand_seed=args.seed)
        self.num_envs, self.render_mode = args.num_envs, render_mode
        self.single_observation_space = gym.spaces.Box(0, 255, (64, 64, 3), np.uint8)
        self.single_action_space = gym.spaces.Discrete(self.venv.action_space.n)
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, self.num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, self.num_envs)

    def reset(self, *, seed=None, options=None):
        return self.venv.reset()["rgb"], {}

    def step(self, actions):
        obs, rewards, dones, _ = self.venv.step(np.asarray(actions))
        return obs["rgb"], rewards.astype(np.float64), dones, np.zeros_like(dones), {}

    def render(self):  # the 64x64 frames the agent sees, one per env (for video)
        return list(self.venv.env.observe()[1]["rgb"])

    def close(self):
        self.venv.close()


def is_image(space) -> bool:
    """A 64x64x3 uint8 image, what the IMPALA CNN takes."""
    return isinstance(space, gym.spaces.Box) and space.shape == (64, 64, 3) and space.dtype == np.uint8


def vector_observations(env: gym.Env, images: bool = True) -> gym.Env:
    """The sub-env with observations an MLP takes: a Box of more dimensions, or a Dict (keys sorted) or Tuple of Boxes,
    flattened row-major by FlattenObservation, integers cast to float32; images kept where the script takes them."""
    space = env.observation_space
    if images and is_image(space):
        return env
    if not (isinstance(space, gym.spaces.Box) and len(space.shape) == 1):
        env = gym.wrappers.FlattenObservation(env)
    return env if env.observation_space.dtype.kind == "f" else gym.wrappers.DtypeObservation(env, np.float32)


def seen_observation_space(space, images: bool = True):
    """The observation space the networks see after vector_observations (space: the env's own)."""
    if images and is_image(space):
        return space
    flat = space if isinstance(space, gym.spaces.Box) and len(space.shape) == 1 else gym.spaces.flatten_space(space)
    return flat if flat.dtype.kind == "f" else gym.spaces.Box(flat.low, flat.high, flat.shape, np.float32)


def boxes_only(space) -> bool:
    """A Box, or a Dict or Tuple (nested or not) of Boxes: what vector_observations can flatten."""
    if isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple)):
        return all(map(boxes_only, space.spaces.values() if isinstance(space, gym.spaces.Dict) else space.spaces))
    return isinstance(space, gym.spaces.Box)


def portable(env_id: str) -> str:
    """An env id as part of a directory name: a `module:EnvId`'s ':' and a namespace's '/' become '-'."""
    return env_id.replace(":", "-").replace("/", "-")


def obs_dtype(envs) -> torch.dtype:
    """The dtype observations are kept in: uint8 for images (4x smaller than float), float32 otherwise."""
    return torch.uint8 if envs.single_observation_space.dtype == np.uint8 else torch.float32


@torch.no_grad()
def in_chunks(forward: Callable, obs, chunk_size: int):
    """forward(obs) without gradient, chunk_size rows at a time: one pass's numbers, its memory bounded, no slower."""
    return torch.cat([forward(obs[start:start + chunk_size]) for start in range(0, len(obs), chunk_size)])


# ------------------------------------------------------------------------------------- a run's life
def run_flags(args, script: Script) -> tuple:
    """(the flags a run starts from, each checked before any work: the command line's, or with --resume the checkpoint's
    with this command line's output and tracking flags; the checkpoint or None)."""
    let_go_of_stale_run()
    checkpoint = None
    if args.resume is not None:  # the checkpoint's flags, with this command line's output and tracking flags
        args, checkpoint = service("resume", "--resume").resumed(args, script, (*OUTPUT_FLAGS, *TRACKING_FLAGS))
    check_ranges(args, {**COMMON_FLAG_RANGES, **script.flag_ranges}, "" if checkpoint is None else
                 f"--resume {args.resume}: the checkpoint's flag ")
    name, directory = args.exp_name, script.run_name(args)
    if len(directory) > 240:  # + "__" and the time: the file system's 255 characters
        raise SystemExit(f"--env-id and --exp-name name the run directory {reprlib.repr(directory)}, "
                         f"{len(directory)} characters; at most 240 fit: shorten them.")
    if not name.isprintable() or "/" in name or "\\" in name or name in ("", ".", "..") or len(name) > NAME_LENGTH:
        raise SystemExit(f"--exp-name {reprlib.repr(name)} must be a plain name (no '/') of at most "
                         f"{NAME_LENGTH} characters: it names the run's directory in runs/.")
    return args, checkpoint


def start(script: Script, args, checkpoint, num_iterations: int, flags=None) -> "Run":
    """From the flags to the envs, which the script makes next (run.open): torchrun's workers, the checks of args (the
    hyperparameters; num_envs: all workers'), seeds, device. flags: run_flags' flags, which checkpoints keep."""
    global WORKERS
    flags = args if flags is None else flags
    rank, world_size = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))  # torchrun's
    torchrun = world_size > 1 or "LOCAL_RANK" in os.environ  # torchrun sets LOCAL_RANK; python does not
    if torchrun and script.worker_share is None:
        raise SystemExit(f"{script.name} runs in a single process; start it with python, not torchrun.")
    cuda, workers = torch.cuda.is_available() and args.cuda, service("workers", "torchrun") if torchrun else None
    if workers:  # this worker's GPU before anything touches CUDA (check_args does)
        workers.take_gpu(cuda)
    try:  # a bad flag is named as in a single process; one the script adjusted, with the value it was given
        check_args(args, script)
    except SystemExit as error:
        given = script.defaults(flags)
        adjusted = [f"--{name.replace('_', '-')} {getattr(given, name)} -> {getattr(args, name)}" for name in
                    vars(given) if getattr(given, name) != getattr(args, name)
                    and f"--{name.replace('_', '-')} {getattr(args, name)}" in str(error.code)]
        raise SystemExit(f"{error.code} (adjusted from the flags: {', '.join(adjusted)})" if adjusted else
                         error.code) from None
    if workers:  # each worker's share of the envs, checked as a run of its own, before the workers join
        workers.join(cuda, rank, world_size, flags.num_envs, args.num_envs, lambda rank: script.worker_share(
            args, rank, world_size), lambda share: script.check_args(share, *check_spaces(args.env_id, script)))
        WORKERS = workers  # the collectives below are workers.py's until the run ends
    run_args = script.worker_share(args, rank, world_size) if world_size > 1 else args  # its envs and seed
    seed_everything(run_args.seed)
    torch.backends.cudnn.deterministic = run_args.torch_deterministic
    device, device_note = choose_device(args.cuda)
    if args.bf16 and device.type == "cpu":  # docs/speed.md#--bf16-on-the-cpu
        print("note: --bf16 on the CPU: an iteration 1.60x as fast with AMX, 0.84-1.54x with avx512_bf16 alone; "
              "emulated, the CNN 12-13x slower; benchmark/bf16.py times it here")
    return Run(script, flags, args, run_args, checkpoint, rank, world_size, device, device_note, num_iterations)


def let_go_of_stale_run() -> None:
    """A run of this process that an error ended (LIVE_RUN) lets go of its signal handlers, lock, envs, writers."""
    if LIVE_RUN is not None:
        with contextlib.suppress(Exception):
            LIVE_RUN.release()


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def plural(count: int, noun: str) -> str:
    """ "1 iteration", "2 iterations"."""
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


def duration(seconds: float) -> str:
    """A duration as people read it: "42 s", "3.3 min", "3.2 h", "20.2 d"."""
    for size, unit in ((86400, "d"), (3600, "h"), (60, "min")):
        if round(seconds / size, 1) >= 1:  # 59.6 s: "1.0 min"
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.0f} s"


class Run:
    """A run in progress and the hooks train() calls. command_args: the flags (command line or --resume), which
    checkpoints keep; hyperparameters: the Args it trains with; args: this process's share (a torchrun worker's)."""

    def __init__(self, script, command_args, hyperparameters, args, checkpoint, rank, world_size, device, device_note,
                 num_iterations):
        self.script, self.command_args, self.args, self.checkpoint = script, command_args, args, checkpoint
        self.hyperparameters, self.num_iterations, self.device_note = hyperparameters, num_iterations, device_note
        self.rank, self.world_size, self.device = rank, world_size, device
        self.envs, self.run_dir, self.writer, self.lock, self.dir_fd = None, None, Writer(), None, None
        self.episode_returns = deque(maxlen=100)  # raw returns of the last 100 finished episodes
        self.episodes = []  # (step, return, length) of the episodes that ended in this rollout
        self.checkpoints = command_args.checkpoint_every != 0
        self.sps, self.stop_signal, self.old_handlers, self.eval_envs = 0, None, {}, None
        self.wandb_run_id, self.keys = None, {}  # --track: the W&B run's id; the script's restored checkpoint keys
        self.render_mode = "rgb_array" if args.capture_video else None  # make_env's: --capture-video films env 0
        self.origin = ("training made them so" if checkpoint is None else f"the run resumed from --resume "
                       f"{command_args.resume}, whose weights, statistics and env state it trained on")
        if threading.current_thread() is threading.main_thread():  # Ctrl-C and SIGTERM stop at the next safe point
            self.old_handlers = {sig: signal.signal(sig, self.on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        global LIVE_RUN
        LIVE_RUN = self

    def open(self, envs):
        """The script's envs, made right after the seeding: then the run directory, opened once and locked, the
        start-up block. Returns the envs, with --capture-video recording env 0's episodes."""
        script, args, flags, checkpoint = self.script, self.args, self.command_args, self.checkpoint
        self.envs = envs
        tune_cpu(self.device, args.torch_threads, envs.single_observation_space.shape)
        if self.rank == 0:  # checkpoints and models go where the checks looked
            try:
                self.run_dir = make_run_dir(flags, script.run_name(args))
                self.dir_fd, self.lock = open_run_dir(self.run_dir)
            except SystemExit as error:  # runs/ unwritable, the directory in use: the run let go of, envs included
                stop_run(error.code)
        every, saves = flags.checkpoint_every, ", model.safetensors at the end" if flags.save_model else ""
        lines = {"steps": script.describe(self.hyperparameters, self.num_iterations),
                 "saves": ("no checkpoint.safetensors" if every == 0 else "checkpoint.safetensors every " + (
                     plural(every, "iteration") if every else f"{CHECKPOINT_MINUTES} minutes") + " and at the end")
                 + saves}
        if checkpoint is not None:
            lines["resuming"] = (f"after iteration {checkpoint['iteration']:,} (step {checkpoint['global_step']:,}) "
                                 f"from {flags.resume}")
        if WORKERS:
            lines["workers"] = WORKERS.described(self.world_size, args)
        if args.eval_every or args.capture_video:  # check_args imported evaluation.py
            lines.update(sys.modules["evaluation"].described(args, self.run_dir))
        print_startup(script, args.env_id, self.device_note, self.run_dir, lines)
        before, after = script.defaults(flags), self.hyperparameters  # what the script adjusted, said once
        self.adjusted = "\n".join(f"  {name}: {getattr(before, name)} -> {getattr(after, name)}" for name in
                                  vars(before) if getattr(before, name) != getattr(after, name))
        if self.adjusted:
            print(f"adjusted from the flags:\n{self.adjusted}")
        if args.capture_video and self.rank == 0:
            self.envs = sys.modules["evaluation"].film(envs, self.run_dir, resumed_at=(checkpoint or {}).get(
                "global_step", 0))  # a resumed run's videos named apart from its first life's
        return self.envs

    def restore(self, saved, next_obs, next_done) -> tuple:
        """Keep what a checkpoint holds (saved); with --resume load it, each part checked first (resume.py); then open
        the logs, which a refused resume never touches. Returns (global_step, first iteration, next_obs, next_done)."""
        assert set(saved.keys) <= set(self.script.checkpoint_keys), "Saved.keys are some of the Script's"
        self.saved, global_step, first_iteration = saved, 0, 1
        batch_size = self.world_size * self.args.num_envs * self.args.num_steps
        if self.checkpoint is not None:  # each worker checks its own part as rank 0 checks its own (resume.py)
            global_step, first_iteration, next_obs, next_done = sys.modules["resume"].restore(
                self, next_obs, next_done, batch_size, sys.modules[__name__])
        if self.rank == 0:  # torchrun: rank 0 alone logs
            if self.args.track:  # before the writer, whose scalars it syncs (tracking.py)
                self.wandb_run_id = service("tracking", "--track").start(self.command_args, self.run_dir, (
                    self.checkpoint or {}).get("wandb_run_id"))
            # a resumed run hides what its first life logged after the checkpoint (purge_step)
            self.writer.summary = SummaryWriter(self.run_dir, purge_step=global_step + 1 if self.checkpoint else None)
            if self.checkpoint is None:
                table = "\n".join(f"|{k}|{v}|" for k, v in vars(self.hyperparameters).items())  # all workers'
                self.writer.add_text("hyperparameters", f"|param|value|\n|-|-|\n{table}")
                if self.adjusted:
                    self.writer.add_text("adjusted", self.adjusted.replace("\n", "  \n"))
        self.last_safe_iteration, self.last_checkpoint_time = first_iteration - 1, time.monotonic()
        self.last_eval_step, self.start_step, self.start_time = global_step, global_step, time.time()
        self.progress = Progress(self.num_iterations * batch_size, global_step)
        self.last_returns = list(self.episode_returns)  # the progress line's
        return global_step, first_iteration, next_obs, next_done

    def restored(self, key: str, valid=lambda value: True, meaning: str = ""):
        """A script's own value (one of Saved.keys): the run's start value, or in a resumed run the checkpoint's,
        checked against it and by valid(value) (what no run holds, e.g. an EWMA weight below 1, is `meaning`)."""
        value = self.keys.get(key, self.saved.keys[key])
        self.refuse(f"its {key} {meaning}, which no run's does" if key in self.keys and not valid(value) else None)
        return value

    def refuse(self, reason: Optional[str], sentence: Optional[str] = None) -> None:
        """Stop every worker, before any training, where any refused a resume (torchrun: agreed in one collective):
        with the first one's `sentence`, or "--resume PATH: {reason}: it is not this run's."; both None: go on."""
        refusal = sentence or reason and f"--resume {self.command_args.resume}: {reason}: it is not this run's."
        if WORKERS:  # the first refusal of any worker, in rank order
            refusal = next((refusal for refusal in WORKERS.every_workers(refusal) if refusal is not None), None)
        if refusal is not None:
            stop_run(refusal)

    def check_policy(self, pi) -> None:
        """Stop in one sentence where the policy's outputs (pi) are not finite: every worker, where any worker's are."""
        check_policy(pi, f" in iteration {self.last_safe_iteration + 1:,}: {self.origin}", any_worker)

    def after_step(self, global_step: int, info: dict) -> None:
        """After each vector env step: note the episodes that ended (their raw score), update the progress line."""
        if "episode" in info:  # the last 100 returns change only where an episode ends
            for i in np.flatnonzero(info["_episode"]):
                self.episodes.append((global_step, float(info["episode"]["r"][i]), int(info["episode"]["l"][i])))
            recent = [episode_return for _, episode_return, _ in self.episodes[-100:]]  # this worker's, as they end
            self.last_returns = (list(self.episode_returns) + recent)[-100:]
        self.progress.update(global_step, self.last_returns)

    def end_rollout(self) -> None:
        """Log the rollout's finished episodes (torchrun: every worker's, in step order)."""
        for step, episode_return, length in gather_episodes(self.episodes):
            self.episode_returns.append(episode_return)
            self.writer.add_scalar("charts/episodic_return", episode_return, step)
            self.writer.add_scalar("charts/episodic_length", length, step)
        self.episodes = []

    def updating(self, what: str) -> None:
        """The progress line says what the update is doing, e.g. "epoch 2/3"."""
        self.progress.set_status(f"updating: {what}")

    def end_iteration(self, iteration, global_step, next_obs, next_done, can_checkpoint=True, **extra) -> None:
        """After each iteration: log SPS, evaluate when due; at a safe point (can_checkpoint) write the checkpoint if
        due (the last iteration, --checkpoint-every, CHECKPOINT_MINUTES, a signal: then stop). extra: its keys."""
        self.sps = int((global_step - self.start_step) / (time.time() - self.start_time))
        self.writer.add_scalar("charts/SPS", self.sps, global_step)
        eval_every = self.command_args.eval_every
        if eval_every and self.rank == 0 and global_step // eval_every > self.last_eval_step // eval_every:
            self.progress.set_status("evaluating")  # check_args imported evaluation.py
            sys.modules["evaluation"].play_during_training(self, global_step, sys.modules[__name__])
        self.progress.iteration_done(global_step)
        if WORKERS:  # any worker's signal, so that all stop at the same iteration
            self.stop_signal = WORKERS.largest(self.stop_signal or 0, self.device) or None
        stop = self.stop_signal is not None
        if not can_checkpoint and not (stop and not self.checkpoints):  # not a safe point: wait for one, unless a
            return  # stop has no checkpoint to write
        every, last = self.command_args.checkpoint_every, self.last_safe_iteration
        due = any_worker(iteration == self.num_iterations or stop or (  # torchrun: all write it together
            iteration // every > last // every if every else
            time.monotonic() - self.last_checkpoint_time >= 60 * CHECKPOINT_MINUTES))
        if self.checkpoints and due:
            self.save("checkpoint.safetensors", iteration, global_step, next_obs, next_done, **extra)
            self.last_checkpoint_time = time.monotonic()
        self.last_safe_iteration = iteration
        if stop:
            self.stop(iteration, global_step)

    def save(self, file_name, iteration, global_step, next_obs, next_done, **extra) -> None:
        """Write a checkpoint into the run directory; torchrun: rank 0 writes every worker's part ("workers": 1 on)."""
        self.writer.flush()  # the logs up to the checkpoint are on disk before it is
        checkpoint = make_checkpoint(
            self.command_args, self.saved, self.envs, next_obs, next_done, global_step=global_step,
            iteration=iteration, num_iterations=self.num_iterations, episode_returns=list(self.episode_returns),
            script=self.script.name, **({"wandb_run_id": self.wandb_run_id} if self.wandb_run_id else {}), **extra)
        if WORKERS:  # every worker's part, at rank 0
            parts = WORKERS.parts_at_rank_0(checkpoint)
            if self.rank != 0:
                return
            checkpoint["workers"] = parts[1:]
        save_checkpoint(os.path.join(self.run_dir, file_name), checkpoint, self.dir_fd)

    def finish(self, iteration, global_step, next_obs, next_done, **extra) -> dict:
        """After the last iteration: model.safetensors (unless --no-save-model), the closing line; train()'s result."""
        path = os.path.join(self.run_dir or ".", "model.safetensors")
        if self.command_args.save_model and self.rank == 0:  # the policy and what plays it (model_bytes)
            policy = self.script.policy
            model = {"script": self.script.name, "args": dataclasses.asdict(self.command_args),
                     "global_step": global_step, "normalizers": normalizer_states(self.envs),
                     "models": {policy: self.saved.models[policy].state_dict()}}
            write_file(path, model_bytes(model, policy), self.dir_fd)
        self.progress.close(global_step, self.episode_returns)
        self.release()
        if self.command_args.save_model and self.rank == 0:
            print(f"saved {path}; play it: python {self.script.name} --eval-checkpoint {shlex.quote(path)}")
        mean_return = float(np.mean(self.episode_returns)) if self.episode_returns else float("nan")
        return {"global_step": global_step, "sps": self.sps, "mean_return": mean_return, "run_dir": self.run_dir}

    def release(self) -> None:
        """Put the signal handlers back, let go of the lock, close the envs, writers and group of workers (once)."""
        global WORKERS, LIVE_RUN
        if LIVE_RUN is not self:
            return
        LIVE_RUN, workers, WORKERS = None, WORKERS, None
        for sig, handler in self.old_handlers.items():
            signal.signal(sig, handler)
        for part in (self.lock, self.dir_fd, self.envs, self.eval_envs):  # fds (the lock goes with its file), envs
            if part is not None:
                os.close(part) if isinstance(part, int) else part.close()
        self.writer.close()
        if self.wandb_run_id is not None:
            sys.modules["tracking"].finish()
        if workers:  # leave the group of workers
            workers.leave()

    def on_signal(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.stop_signal is not None:
            print(f"\n{name} again: stopping now, without a checkpoint.", flush=True)
            os._exit(128 + signum)
        self.stop_signal = signum
        where = "at the next iteration end" + (" that can be checkpointed" if self.checkpoints else "")
        print(f"\n{name}: stopping {where}; {name} again stops at once.", flush=True)

    def stop(self, iteration, global_step) -> None:
        """Close the run after a signal: say where it stopped and how to resume; exit with 128 + the signal."""
        signum, path = self.stop_signal, f"{self.run_dir}/checkpoint.safetensors"
        self.progress.close(global_step, self.episode_returns)
        self.release()
        print(f"stopped by {signal.Signals(signum).name} after iteration {iteration:,} of {self.num_iterations:,} "
              f"(step {global_step:,})" + (f"; checkpoint {path}" if self.checkpoints else ""))
        print(f"resume: {resume_command(self.script, self.command_args, path, self.world_size)}" if self.checkpoints
              else "no checkpoint was written (--checkpoint-every 0), so this run cannot be resumed")
        raise SystemExit(128 + signum)


def resume_command(script: Script, args, path: str, world_size: int = 1) -> str:
    """The command that continues a run from `path` with the same output flags (and as many torchrun workers)."""
    defaults, flags = script.args_type(), [f"--resume {shlex.quote(path)}"]
    for name in OUTPUT_FLAGS:
        value = getattr(args, name)
        if value != getattr(defaults, name):
            dashed = name.replace("_", "-")
            flags.append(f"--{'' if value else 'no-'}{dashed}" if isinstance(value, bool) else f"--{dashed} {value}")
    return (f"torchrun --nproc_per_node {world_size}" if world_size > 1 else "python") + f" {script.name} " + \
        " ".join(flags)


def evaluate(args, script: Script) -> dict:
    """--eval-checkpoint: evaluation.py plays the policy of a model file or checkpoint, with this module's checks."""
    return service("evaluation", "--eval-checkpoint").evaluate(args, script, sys.modules[__name__])


def service(module: str, flag: str):
    """A service's module, imported where a run asks (flag); a file it needs absent, one sentence naming them all."""
    needs = dict.fromkeys([module, *(["checkpoints"] if flag in ("--resume", "--eval-checkpoint") else [])])
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as error:
        if error.name not in needs:
            raise
        raise SystemExit(f"{flag} needs {' and '.join(name + '.py' for name in needs)} beside the script, and "
                         f"{error.name}.py is not there: copy it from this project.") from None


def open_run_dir(run_dir: str) -> tuple:
    """(run_dir opened once, never through a link; its run.lock, locked while the run lives): one writer at a time."""
    opened = []
    try:
        opened.append(os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW))
        opened.append(os.open("run.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o666, dir_fd=opened[0]))
        fcntl.flock(opened[1], fcntl.LOCK_EX | fcntl.LOCK_NB)
        return tuple(opened)
    except OSError as error:
        for fd in opened:
            os.close(fd)
        raise SystemExit(f"{shown(run_dir)} is in use by another run: one run writes a run directory at a time."
                         if isinstance(error, BlockingIOError) else
                         f"{shown(run_dir)} and its run.lock cannot be opened ({error.strerror}).") from None


# ------------------------------------------------------------------------------ checkpoints: what a run writes
# Every file a run writes is a safetensors file (checkpoints.py reads them): the tensors in its body, all else as JSON
# in its metadata, under "checkpoint" or "model". JSON lacks tuples, int keys and inf: they are tagged (encoded()).
@dataclass
class Saved:
    """The script's objects a checkpoint holds, {name: object} (None left out); keys: its own values (run.restored)."""

    models: dict  # modules (their state dicts)
    optimizers: dict  # optimizers (their state dicts)
    normalizers: dict = dataclasses.field(default_factory=dict)  # running statistics kept outside the env stack
    keys: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        self.models = {name: model for name, model in self.models.items() if model is not None}
        self.normalizers = {name: normalizer for name, normalizer in self.normalizers.items() if normalizer is not None}


def make_checkpoint(args, saved: Saved, envs, next_obs, next_done, **keys) -> dict:
    """Tensors and plain data: Args, `saved`'s states, the envs' statistics and state, the random state, `keys`."""
    return {"args": dataclasses.asdict(args),
            "models": {name: model.state_dict() for name, model in saved.models.items()},
            "optimizers": {name: optimizer.state_dict() for name, optimizer in saved.optimizers.items()},
            "normalizers": {**normalizer_states(envs), **{name: dict(vars(normalizer))
                                                          for name, normalizer in saved.normalizers.items()}},
            "rng": rng_state(), "env": {"state": env_state(envs), "next_obs": next_obs, "next_done": next_done}, **keys}


def encoded(value, tensors: dict, path: str = ""):
    """A checkpoint's value as JSON, each tensor moved into `tensors` under its path ("models/agent/actor.weight"):
    {"$tensor": path}; a tuple {"$tuple": [...]}, int keys {"$int_keys": [[key, value]]}, inf {"$float": "inf"}."""
    if isinstance(value, torch.Tensor):  # contiguous, on the CPU (safetensors copies it into the file's bytes)
        assert path not in tensors, path
        tensors[path] = value.detach().cpu().contiguous()
        return {"$tensor": path}
    if isinstance(value, float) and not math.isfinite(value):
        return {"$float": str(value)}
    if isinstance(value, (list, tuple)):
        items = [encoded(item, tensors, f"{path}/{index}".lstrip("/")) for index, item in enumerate(value)]
        return {"$tuple": items} if isinstance(value, tuple) else items
    if isinstance(value, dict):
        items = {key: encoded(item, tensors, f"{path}/{key}".lstrip("/")) for key, item in value.items()}
        if all(isinstance(key, str) and not key.startswith("$") for key in items):
            return items
        assert all(type(key) is int for key in items), path
        return {"$int_keys": [[key, item] for key, item in items.items()]}
    assert value is None or isinstance(value, (bool, int, float, str)), f"{path} holds a {type(value).__name__}"
    return value


def checkpoint_bytes(checkpoint: dict) -> bytes:
    """The checkpoint's file: its tensors, each met in it again (a view, one object in two places) as a copy."""
    tensors, storages = {}, set()
    text = json.dumps(encoded(checkpoint, tensors), allow_nan=False, separators=(",", ":"))
    for name, tensor in tensors.items():
        if tensor.numel() and tensor.untyped_storage().data_ptr() in storages:
            tensors[name] = tensor.clone()
        storages.add(tensors[name].untyped_storage().data_ptr())
    return safetensors.torch.save(tensors, metadata={"checkpoint": text})


def model_bytes(checkpoint: dict, policy: str) -> bytes:
    """The model file: the policy's weights under their state_dict names (safetensors.torch.load_file loads them), and
    in its metadata what --eval-checkpoint plays it with: script, flags, step, env 0's statistics ({"$array": ...})."""
    model = encoded({key: checkpoint[key] for key in ("script", "args", "global_step")}, {})
    model["normalizers"] = {name: {key: {"$array": {"dtype": str(value.dtype)[6:], "shape": list(value.shape),
                                                    "data": value.reshape(-1).tolist()}} if torch.is_tensor(value)
                                   else value for key, value in state.items()}
                            for name, state in checkpoint["normalizers"].items() if name == "obs_0"}
    text = json.dumps(model, allow_nan=False, separators=(",", ":"))
    weights = {name: value.detach().cpu().contiguous() for name, value in checkpoint["models"][policy].items()}
    return safetensors.torch.save(weights, metadata={"model": text})


def write_file(path: str, data: bytes, dir_fd: Optional[int] = None) -> None:
    """`data` into a new file under a random name in path's directory (dir_fd: the run's, opened once), synced, renamed
    onto path: never a torn file, a link replaced, not followed; a full disk one sentence; a killed write's removed."""
    directory, name = os.path.split(path)
    temporary = f".{name}.{secrets.token_hex(8)}.tmp"  # 64 random bits: never planted
    try:
        folder = os.open(directory or ".", os.O_RDONLY | os.O_DIRECTORY) if dir_fd is None else dir_fd
    except OSError as error:
        raise SystemExit(f"{shown(path)} cannot be written: {error.strerror}.") from None
    try:
        try:
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666, dir_fd=folder)
        except OSError as error:
            raise SystemExit(f"{shown(path)} cannot be written: {error.strerror}.") from None
        try:
            with os.fdopen(fd, "wb") as file:
                file.write(data)
                file.flush()
                os.fsync(file.fileno())
            os.replace(temporary, name, src_dir_fd=folder, dst_dir_fd=folder)
        except OSError as error:
            os.remove(temporary, dir_fd=folder)
            reason = "the disk is full" if error.errno == errno.ENOSPC else error.strerror or type(error).__name__
            kept = "; the one before is kept" if name in os.listdir(folder) and stat.S_ISREG(
                os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode) else ""
            raise SystemExit(f"{shown(path)} could not be written ({reason}){kept}.") from None
        except BaseException:
            os.remove(temporary, dir_fd=folder)
            raise
        for stale in os.listdir(folder):
            if re.fullmatch(re.escape(f".{name}.") + r"[0-9a-f]{16}\.tmp", stale) and stat.S_ISREG(
                    os.stat(stale, dir_fd=folder, follow_symlinks=False).st_mode):
                os.remove(stale, dir_fd=folder)
    finally:
        if dir_fd is None:
            os.close(folder)


def save_checkpoint(path: str, checkpoint: dict, dir_fd: Optional[int] = None) -> None:
    write_file(path, checkpoint_bytes(checkpoint), dir_fd)


def shown(name: str) -> str:
    """A name read from the disk (a file's, a folder's), printable: each character that does not print escaped."""
    return "".join(char if char.isprintable() else ascii(char)[1:-1] for char in name)


def rng_state() -> dict:
    numpy_state = np.random.get_state()
    return {"python": random.getstate(), "numpy": (numpy_state[0], numpy_state[1].tolist(), *numpy_state[2:]),
            "torch": torch.get_rng_state(),
            **({"cuda": torch.cuda.get_rng_state_all()} if torch.cuda.is_available() else {})}


def env_normalizers(envs) -> dict:
    """A vector env stack's running statistics, {name: (wrapper, RunningMeanStd)}: "reward" (vector NormalizeReward),
    "obs_{i}" (sub-env i's NormalizeObservation, or a vector wrapper's obs_rms[i])."""
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


# The env stack's state, written as plain data, layer by layer: each wrapper, the vector env, and each sub-env's
# wrappers and env. An attribute named here, or holding a space, an enum, a function, running statistics (the
# checkpoint's normalizers) or MuJoCo's model or renderer, is the same in a rebuilt stack and is left out.
NOT_ENV_STATE = {"env", "envs", "env_fns", "spec", "metadata", "_metadata", "_cached_spec", "_saved_kwargs",
                 "_ezpickle_args", "_ezpickle_kwargs", "wrapper",  # walked, or constant (wrapper: a reward transform)
                 "_previous_data", "obs_rms"}  # the env checker's last (obs, info), for a warning; statistics
NOT_SAVED_LAYERS = (gym.wrappers.vector.RecordVideo,)  # the run's own recording of env 0, not the envs' state


def to_data(value):
    """value as a checkpoint's data: numbers, strings, None; NumPy arrays and scalars as tensors, tuples and deques as
    lists, dicts, a NumPy Generator as its state dict, a MuJoCo MjData as its integration state; else TypeError."""
    if isinstance(value, (np.ndarray, np.generic)) and value.dtype.kind in "biuf":  # first: np.float64 is a float
        return torch.from_numpy(np.array(value))  # a copy
    if value is None or isinstance(value, (bool, int, float, str, torch.Tensor)):
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


def env_layers(envs):
    """Every layer of a vector env stack (vector wrappers, vector env, each sub-env's layers) with the attributes of its
    state (NOT_ENV_STATE): [(layer, {attribute: value})]; or why it is not data (envs not a SyncVectorEnv's)."""
    if not isinstance(envs.unwrapped, gym.vector.SyncVectorEnv):
        return f"{type(envs.unwrapped).__name__}'s envs cannot be saved as data"
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
    return [(layer, {key: to_data(value) if type(value).__name__ == "MjData" else value
                     for key, value in vars(layer).items() if key not in NOT_ENV_STATE and not (
                         callable(value) or isinstance(value, constant) or type(value).__module__.startswith(mujoco)
                         and type(value).__name__ != "MjData")}) for layer in layers]


def env_state(envs) -> dict:
    """The env stack's state as data, {"layers": [{"class": name, "state": {attribute: data}}]}; or {"restarts": why}"""
    layers = env_layers(envs)
    if isinstance(layers, str):
        return {"restarts": layers}
    try:
        return {"layers": [{"class": type(layer).__name__, "state": {key: to_data(value) for key, value in
                                                                       keys.items()}} for layer, keys in layers]}
    except TypeError as error:
        return {"restarts": f"an env layer holds {error}, which cannot be saved as data"}


# ------------------------------------------------------------------------------------------ checks
def check_args(args, script: Script) -> None:
    """Stop in one sentence naming the flag before any work and any run directory (args: the run's hyperparameters)."""
    observation_space, action_space = check_spaces(args.env_id, script)
    if args.bf16 and not is_image(observation_space):
        raise SystemExit(f"--bf16 runs the IMPALA CNN of image observations in bfloat16; --env-id {args.env_id} has "
                         f"vector ones, whose MLP it would not speed up (docs/speed.md).")
    script.check_args(args, observation_space, action_space)  # its own flags, and its buffers against the memory
    eval_envs = args.eval_episodes if args.eval_every else 0  # one env an episode, kept between marks
    check_memory((args.num_envs + eval_envs) * ENV_BYTES, False,
                 f"The {plural(args.num_envs, 'env')}" + (f" and {eval_envs:,} evaluation envs" if eval_envs else ""),
                 "--num-envs" + (" or --eval-episodes" if eval_envs else ""))
    iteration = args.num_envs * args.num_steps
    if args.total_timesteps < iteration:
        raise SystemExit(f"--total-timesteps {args.total_timesteps:,} is less than one iteration of {iteration:,} "
                         f"steps (--num-envs {args.num_envs} x --num-steps {args.num_steps}).")
    if args.track:  # W&B installed, and tracking.py beside the script
        service("tracking", "--track").check()
    if args.capture_video:  # moviepy installed, frames rendered
        service("evaluation", "--capture-video").check_video(args.env_id, script.procgen_games)
    if args.eval_every:  # imported now, evaluation.py beside the script, for Run.end_iteration
        service("evaluation", "--eval-every")


def check_ranges(args, ranges: dict, prefix: str = "") -> None:
    """Each flag in `ranges` (name -> interval such as "(0, 1]") lies in its interval; unset (None) passes. prefix:
    where the flags come from, when not from the command line."""
    for name, interval in ranges.items():
        value, (low, high) = getattr(args, name), (float(bound) for bound in interval[1:-1].split(","))
        if value is not None and not ((low <= value if interval[0] == "[" else low < value)
                                      and (value <= high if interval[-1] == "]" else value < high)):
            raise SystemExit(f"{prefix}--{name.replace('_', '-')} must be in {interval}, got {reprlib.repr(value)}.")
        if type(value) is int and abs(value) > 2**53:  # where float arithmetic rounds it, and tensors overflow
            raise SystemExit(f"{prefix}--{name.replace('_', '-')} must be at most 2**53, got {reprlib.repr(value)}.")


def check_spaces(env_id: str, script: Script) -> tuple:
    """(observation space, action space) of --env-id, once the script is known to accept both."""
    observation_space, action_space = env_spaces(env_id, script.procgen_games)
    types, needed = ACCEPTED_ACTIONS[script.actions]
    if not isinstance(action_space, types) or np.ndim(getattr(action_space, "nvec", [0])) != 1 or np.any(
            getattr(action_space, "start", 0) != 0):
        raise SystemExit(f"--env-id {env_id} has {action_space} actions; {script.name} needs {needed}.")
    if not boxes_only(observation_space):
        raise SystemExit(f"--env-id {env_id} has {observation_space} observations; {script.name} needs a Box, or a "
                         f"Dict or Tuple of Boxes (flattened into one vector).")
    return seen_observation_space(observation_space, script.images), action_space


def env_spaces(env_id: str, procgen_games=()) -> tuple:
    """(observation space, action space) of one env, without building the vector env."""
    if env_id in procgen_games:
        if importlib.util.find_spec("procgen") is None:
            raise SystemExit(f"--env-id {env_id} needs the procgen package: pip install -r requirements.txt.")
        return gym.spaces.Box(0, 255, (64, 64, 3), np.uint8), gym.spaces.Discrete(15)
    try:
        env = gym.make(env_id)
    except gym.error.UnregisteredEnv:
        close = difflib.get_close_matches(env_id, [*procgen_games, *gym.registry], n=1)
        raise SystemExit(f"--env-id {env_id!r} is neither a Procgen game nor a registered Gymnasium env"
                         + (f"; did you mean {close[0]}?" if close else ".")) from None
    except Exception as error:  # gym.error.Error, a `module:EnvId`'s import, or an env moved out of Gymnasium
        raise SystemExit(f"--env-id {reprlib.repr(env_id)} cannot be made: {type(error).__name__}: "
                         f"{str(error).splitlines()[0] if str(error) else ''}") from None
    env.close()
    return env.observation_space, env.action_space


def check_minibatches(num_steps, num_envs, num_minibatches, shuffle_samples) -> None:
    """Stop unless the minibatches split the batch evenly: by whole env trajectories, or by samples."""
    t, n, m = num_steps, num_envs, num_minibatches
    if shuffle_samples:
        if not 1 <= m <= n * t or (n * t) % m != 0:
            raise SystemExit(f"--num-minibatches {m} must divide the batch of {n * t} samples (--num-envs {n} x "
                             f"--num-steps {t}).")
    elif m < 1 or (n % m != 0 if m <= n else m % n != 0 or t % (m // n) != 0):
        raise SystemExit(f"--num-minibatches {m} must divide --num-envs {n} (whole trajectories per minibatch), or "
                         f"be a multiple of it that cuts --num-steps {t} into equal time chunks (or pass "
                         f"--shuffle-samples).")


def check_memory(num_bytes: int, cuda: bool, what: str, flags: str) -> None:
    """Stop before allocating `num_bytes` that the free memory (MemAvailable, and the GPU's with cuda) cannot hold."""
    for kind, free in available_memory(cuda).items():
        if num_bytes > free:
            raise SystemExit(f"{what} need {num_bytes / 2**30:.1f} GiB but only {free / 2**30:.1f} GiB of {kind} "
                             f"is available; lower {flags}.")


def available_memory(cuda: bool) -> dict:
    """Free memory now, {kind: bytes}: MemAvailable (Linux only) and, with cuda, the GPU's."""
    available = {"GPU memory": torch.cuda.mem_get_info()[0]} if cuda and torch.cuda.is_available() else {}
    if os.path.exists("/proc/meminfo"):
        with open("/proc/meminfo") as meminfo:
            lines = [line.split() for line in meminfo if line.startswith("MemAvailable:")]
        available.update({"memory": int(lines[0][1]) * 1024} if lines else {})
    return available


# ---------------------------------------------------------------------------- device, CPU, run directory
def choose_device(cuda: bool) -> tuple:
    """(device, a note saying which one and why)."""
    if cuda and torch.cuda.is_available():
        return torch.device("cuda"), f"cuda ({torch.cuda.get_device_name()})"
    return torch.device("cpu"), "cpu (no GPU is available: --cuda falls back to the CPU)" if cuda else "cpu (--no-cuda)"


def tune_cpu(device, torch_threads: int, obs_shape) -> None:
    """On the CPU: keep freed memory, and use --torch-threads threads, or by default 1 for the MLP of vector
    observations and PyTorch's one per core for the IMPALA CNN (each the faster here: docs/speed.md)."""
    if device.type != "cpu":
        return
    if platform.libc_ver()[0] == "glibc":  # glibc hands each freed block over 32 MiB back to the OS by default,
        libc = ctypes.CDLL("libc.so.6")  # so every big activation or gradient buffer is page-faulted in again
        libc.mallopt(-4, 0)  # M_MMAP_MAX = 0: serve big blocks from the heap, not from their own mmap
        libc.mallopt(-1, 2**31 - 1)  # M_TRIM_THRESHOLD: give the heap's free top back only beyond 2 GiB
    if torch_threads or len(obs_shape) != 3:
        torch.set_num_threads(torch_threads or 1)


def make_run_dir(args, name: str) -> str:
    """runs/{name}__{time} (__{time}_1: a second run that second), made once every check passed; a resumed run's own"""
    if args.resume is not None:
        return os.path.dirname(args.resume) or "."
    base, suffix = os.path.join("runs", f"{name}__{int(time.time())}"), 0
    try:
        os.makedirs("runs", exist_ok=True)
        while True:
            run_dir = base + (f"_{suffix}" if suffix else "")
            try:
                os.mkdir(run_dir)  # atomic: it fails where another run made this directory first
                return run_dir
            except FileExistsError:
                suffix += 1
    except OSError as error:  # runs is a file, or not writable
        raise SystemExit(f"{os.path.abspath('runs')} cannot hold a run directory ({error.strerror}): move it, or "
                         f"run from a directory you can write to.") from None


def print_startup(script: Script, env_id: str, device_note: str, run_dir: str, lines: dict) -> None:
    """The start-up block: algorithm and paper (the docstring's first paragraph), env, device, run dir, `lines`."""
    print(" ".join(script.doc.split("\n\n")[0].split()))
    for label, text in {"env": env_id, "device": device_note, "run dir": run_dir, **lines}.items():
        print(f"  {label:<10} {text}")


class Writer:
    """TensorBoard's writer (summary) once the logs open (Run.restore); before, and on other torchrun ranks, nothing"""
    summary = None

    def __getattr__(self, name):  # a name SummaryWriter lacks fails on every rank
        method = getattr(SummaryWriter if self.summary is None else self.summary, name)
        return method if self.summary is not None else lambda *args, **kwargs: None


class Progress:
    """A line every PROGRESS_EVERY s (10 on a terminal): steps, the last 100 episodes' mean return, status, SPS, ETA."""

    def __init__(self, total_steps: int, start_step: int):
        self.total, self.start_step, self.start_time = total_steps, start_step, time.monotonic()
        self.last_line, self.done, self.status = self.start_time, None, ""  # done: (step, time) of the last iteration
        self.step, self.episode_returns, self.every = start_step, [], 10 if sys.stdout.isatty() else PROGRESS_EVERY

    def update(self, step: int, episode_returns, force: bool = False) -> None:
        self.step, self.episode_returns, now = step, episode_returns, time.monotonic()
        if force or now - self.last_line >= self.every:
            self.last_line = now
            text = "mean_return " + (f"{float(np.mean(episode_returns)):.2f}" if episode_returns else "-") + "  "
            sps = self.done and (self.done[0] - self.start_step) / max(self.done[1] - self.start_time, 1e-9)
            text += f"SPS {sps:,.0f}  ETA {duration((self.total - step) / max(sps, 1e-9))}" if self.done else \
                "in the first iteration"
            print(f"step {step:,}/{self.total:,} ({100 * step / self.total:.0f}%)  {text}"
                  f"{'  ' + self.status if self.status else ''}  elapsed {duration(now - self.start_time)}", flush=True)

    def set_status(self, status: str) -> None:  # what the update is doing, e.g. "updating: epoch 2/3"
        self.status = status
        self.update(self.step, self.episode_returns)

    def iteration_done(self, step: int) -> None:
        self.done, self.status = (step, time.monotonic()), ""

    def close(self, step: int, episode_returns) -> None:
        self.status = ""
        self.update(step, episode_returns, force=True)


# ------------------------------------------------------ collectives: workers.py's under torchrun, here one process's
def broadcast_weights(*modules) -> None:
    """torchrun: every worker starts from rank 0's weights (their seeds, and so their initializations, differ)."""
    if WORKERS:
        WORKERS.broadcast_weights(*modules)


def average_gradients(*modules) -> None:
    """torchrun: every gradient replaced by its mean over the workers, the gradient of the whole minibatch."""
    if WORKERS:
        WORKERS.average_gradients(*modules)


def global_batch(x):
    """x [B] of every worker, concatenated in rank order: [W * B], the same on every worker. One process: x."""
    return WORKERS.global_batch(x) if WORKERS else x


def own_part(x):
    """This worker's rows of a global_batch(): x [W * B] -> [B]. One process: x."""
    return WORKERS.own_part(x) if WORKERS else x


def mean_over_workers(x):
    """x averaged over the workers, so that all take the same decision (--target-kl). One process: x."""
    return WORKERS.mean_over_workers(x) if WORKERS else x


def any_worker(flag: bool) -> bool:
    """Whether flag holds on any worker, so that all take the same decision. One process: flag."""
    return bool(WORKERS.largest(int(flag), "cuda")) if WORKERS else flag


def gather_episodes(episodes):
    """Every worker's (step, return, length) in step order, as TensorBoard keeps them. One process: episodes."""
    if not WORKERS:
        return episodes
    return sorted((episode for worker in WORKERS.every_workers(episodes) for episode in worker), key=lambda e: e[0])


def check_policy(pi, origin: str = "", agreed_by: Callable = lambda flag: flag) -> None:
    """Stop in one sentence where the policy's outputs pi (logits, or a Gaussian's mean and log-std) are not finite,
    before an action is sampled from them; origin: where the numbers came from; agreed_by: any_worker in training."""
    if agreed_by(not bool(torch.isfinite(pi).all())):
        stop_run(f"The policy's outputs are not finite{origin}: no action can be sampled from them.")


def check_finite(iteration: int, **losses) -> None:
    """Stop the run in one sentence naming the first of `losses` (name=scalar tensor) that is nan or inf, before its
    step: the last checkpoint stays the last good one. torchrun: all workers stop at the same step, alike."""
    values = mean_over_workers(torch.stack([loss.detach() for loss in losses.values()]))
    if not torch.isfinite(values).all():
        name = next(name for name, value in zip(losses, values) if not torch.isfinite(value))
        stop_run(f"{name} is not finite at iteration {iteration}: the run stops before this step; its last "
                 f"checkpoint, if one was written, is the last good one.")


def stop_run(sentence: str) -> None:
    """Stop in one sentence, this process's run (if any) let go first: a notebook or a sweep goes on without it."""
    if LIVE_RUN is not None:
        LIVE_RUN.release()
    raise SystemExit(sentence)
