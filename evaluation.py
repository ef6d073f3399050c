"""Evaluation and video, loaded only when a flag asks: --eval-checkpoint (play a saved policy), --eval-every (play the
acting policy during training) and --capture-video. checkpoints.py reads the file; this module, with harness.py's
checks, builds the envs, acts, plays, films and logs. It imports none of the project's modules but tracking.py,
with --track; harness.py hands it the run and itself (the module), never imported.
"""
import copy
import dataclasses
import importlib.util
import os
import random
import re
import signal
import threading

import gymnasium as gym
import numpy as np
import torch
from torch.utils.tensorboard import SummaryWriter

VIDEO_EPISODES = (0, 1, 8, 27)  # --capture-video in training: env 0's episodes k^3 up to 729, then every 1000th
EVAL_FLAGS = ("eval_checkpoint", "eval_episodes", "eval_deterministic", "seed", "cuda", "capture_video", "track",
              "wandb_project_name", "wandb_entity")  # what --eval-checkpoint takes: the rest are the file's
EVAL_SEED_OFFSET = 1_000_000  # --eval-every's envs are seeded args.seed + this, apart from every training env


def check_video(env_id, procgen_games=()) -> None:
    """--capture-video needs moviepy (Gymnasium's RecordVideo writes with it) and an env that renders frames: pygame
    for classic control, a headless OpenGL for MuJoCo (MUJOCO_GL=egl where no display is set); env_id None: moviepy."""
    if importlib.util.find_spec("moviepy") is None:
        raise SystemExit("--capture-video needs the moviepy package, which is not installed: "
                         "pip install -r requirements.txt.")
    if env_id is None or env_id in procgen_games:  # Procgen's frames are its observations
        return
    if "DISPLAY" not in os.environ:
        os.environ.setdefault("MUJOCO_GL", "egl")
    try:
        env = gym.make(env_id, render_mode="rgb_array")
        env.reset(seed=0)
        env.render()
        env.close()
    except Exception as error:
        mujoco = "mujoco" in str(gym.spec(env_id.split(":")[-1]).entry_point)
        why = ("MuJoCo's frames need a headless OpenGL: Debian's libegl1 (MUJOCO_GL=egl) or libosmesa6 "
               "(MUJOCO_GL=osmesa)" if mujoco else f"{type(error).__name__}: {error}")
        raise SystemExit(f"--capture-video: {env_id} cannot render frames here ({why}).") from None


def film(envs, run_dir: str, episodes=None, resumed_at=0):
    """envs recording videos into run_dir/videos with Gymnasium's RecordVideo: in training (episodes None) env 0's
    episodes k^3 below 1000, then every 1000th (capped cubic, CleanRL's), counted from 0 again in a run resumed at
    step resumed_at, whose files' names say so; in an evaluation its first `episodes`."""
    if episodes is None:
        return gym.wrappers.vector.RecordVideo(envs, os.path.join(run_dir, "videos"), record_first_only=True,
                                               episode_trigger=lambda k: round(k ** (1 / 3)) ** 3 == k if k < 1000
                                               else k % 1000 == 0, name_prefix="rl-video" + (
                                                   f"-resumed-at-{resumed_at}" if resumed_at else ""))
    return gym.wrappers.vector.RecordVideo(envs, os.path.join(run_dir, "videos"),
                                           episode_trigger=lambda k: k < episodes)


def described(args, run_dir: str) -> dict:
    """The start-up block's lines on --eval-every and --capture-video in training."""
    lines = {}
    if args.eval_every:
        lines["evaluates"] = f"every {args.eval_every:,} steps, {args.eval_episodes} episodes, {acting(args)}"
    if args.capture_video:
        lines["films"] = f"env 0's episodes {', '.join(map(str, VIDEO_EPISODES))}, ... into {run_dir}/videos"
    return lines


def acting(args) -> str:
    """How evaluation acts, in words."""
    return "actions the policy's mode (--eval-deterministic)" if args.eval_deterministic else \
        "actions sampled as in training"


def actor(sample, envs, device, source: str = ""):
    """act(obs, the last step's reward and done) (NumPy) -> env actions: the script's acting policy, sample(obs, reward,
    done) (float32 tensors; harness.Script.acting_policy), without gradient, Box actions clipped to their bounds as in
    training. A policy whose outputs are not finite stops with source's sentence (a file's)."""
    space = envs.single_action_space
    dtype = torch.uint8 if envs.single_observation_space.dtype == np.uint8 else torch.float32

    @torch.no_grad()
    def act(obs, reward, done):
        obs = torch.as_tensor(obs, dtype=dtype, device=device)
        try:
            action = sample(obs, *(torch.as_tensor(x, dtype=torch.float32, device=device) for x in (reward, done)))
        except SystemExit as error:  # harness.check_policy's
            raise SystemExit(f"{source}: {error.code[0].lower()}{error.code[1:-1]} (its weights and statistics made "
                             f"them so: it is not a trained run's).") if source else error from None
        action = action.cpu().numpy()
        return np.clip(action, space.low, space.high) if isinstance(space, gym.spaces.Box) else action
    return act


def play_during_training(run, global_step: int, harness) -> None:
    """--eval-every: one episode on each of --eval-episodes envs of their own (seeded alike at every mark), with the
    training envs' observation statistics frozen and the run's weights, the random state put back after; their mean
    and std raw return logged at global_step, unless a signal stopped it."""
    args, rng = run.args, (random.getstate(), np.random.get_state(), torch.get_rng_state(),
                           torch.cuda.get_rng_state_all())
    num_episodes, seed = args.eval_episodes, args.seed + EVAL_SEED_OFFSET
    if run.eval_envs is None:
        run.eval_envs = run.script.make_env(dataclasses.replace(args, num_envs=num_episodes, seed=seed))
    training = harness.env_normalizers(run.envs)
    num_obs = sum(name.startswith("obs_") for name in training)  # the training envs' obs_0 ... obs_{n-1}
    for name, (wrapper, rms) in harness.env_normalizers(run.eval_envs).items():  # theirs, frozen
        if name.startswith("obs_") and num_obs:
            vars(rms).update(copy.deepcopy(vars(training[f"obs_{int(name[4:]) % num_obs}"][1])))
        wrapper.update_running_mean = False
    weights = {name: model.state_dict() for name, model in run.saved.models.items()}
    load = lambda module, name: module.load_state_dict(weights[name])  # noqa: E731  (the run's own weights)
    act = actor(run.script.acting_policy(args, run.eval_envs, load, run.device), run.eval_envs, run.device)
    returns = play(run.eval_envs, act, num_episodes, seed, stopping=lambda: run.stop_signal is not None)
    random.setstate(rng[0])  # the random state as before: training goes on as without this evaluation
    np.random.set_state(rng[1])
    torch.set_rng_state(rng[2])
    torch.cuda.set_rng_state_all(rng[3])
    if returns is not None:  # None: a signal stopped it
        run.writer.add_scalar("eval/mean_return", np.mean(returns), global_step)
        run.writer.add_scalar("eval/std_return", np.std(returns), global_step)
        run.last_eval_step = global_step


def play(envs, act, num_episodes: int, seed: int, stopping=lambda: False):
    """The raw returns of the first num_episodes / num_envs episodes of each env, reset with `seed`, played by
    act(obs, reward, done) -> actions (the last step's reward and done, 0 and 1 at the reset); None on stopping()."""
    per_env, (obs, _) = num_episodes // envs.num_envs, envs.reset(seed=seed)
    reward, done = np.zeros(envs.num_envs), np.ones(envs.num_envs, dtype=bool)
    returns = [[] for _ in range(envs.num_envs)]
    while any(len(env_returns) < per_env for env_returns in returns):
        if stopping():
            return None
        obs, reward, terminated, truncated, info = envs.step(act(obs, reward, done))
        done = terminated | truncated
        for i in np.flatnonzero(info.get("_episode", ())):
            returns[i].append(float(info["episode"]["r"][i]))
    return [episode_return for env_returns in returns for episode_return in env_returns[:per_env]]


def evaluate(args, script, harness) -> dict:
    """--eval-checkpoint: play the policy of a model file or checkpoint (checkpoints.py reads it) on one env, its
    normalization frozen: args.eval_episodes episodes (filmed with --capture-video), a signal stopping it after the
    step; print and log the raw return (eval/mean_return, eval/std_return at the file's global_step; --track: to W&B
    too). harness: harness.py, whose checks it runs."""
    harness.let_go_of_stale_run()
    envs = None
    try:
        checkpoints = harness.service("checkpoints", "--eval-checkpoint")
        ranges, given, source = {**harness.COMMON_FLAG_RANGES, **script.flag_ranges}, \
            checkpoints.given_flags(args, script), f"--eval-checkpoint {args.eval_checkpoint}"
        harness.check_ranges(args, ranges)
        refused = sorted(given - {"env_id", *EVAL_FLAGS}) or (["resume"] if args.resume is not None else [])
        if refused:
            raise SystemExit(f"--eval-checkpoint plays the checkpoint's policy on its own env and flags; drop "
                             f"{checkpoints.flag_names(refused)} (it takes {checkpoints.flag_names(EVAL_FLAGS[1:])}, "
                             f"and --env-id as the checkpoint's own).")
        if args.track:
            harness.service("tracking", "--track").check()
        if args.capture_video:  # before the file is read; its env, once it is
            check_video(None)
        checkpoint, run_args = checkpoints.read_run(args, "--eval-checkpoint", script, given)
        harness.check_ranges(run_args, ranges, f"{source}: the checkpoint's flag ")
        harness.check_spaces(run_args.env_id, script)  # as the run trained, acting as told here:
        run_args = dataclasses.replace(script.defaults(run_args), eval_deterministic=args.eval_deterministic)
        if args.capture_video:
            check_video(run_args.env_id, script.procgen_games)
        device, device_note = harness.choose_device(args.cuda)
        envs = script.make_env(dataclasses.replace(run_args, num_envs=1, seed=args.seed),
                               render_mode="rgb_array" if args.capture_video else None)
        checkpoints.load_normalizers(envs, checkpoint["normalizers"], harness, source)
        act = actor(script.acting_policy(run_args, envs, lambda module, name: checkpoints.load_weights(
            module, checkpoint["models"], name, source), device), envs, device, source)  # the weights checked first
        checkpoint_dir = re.sub(r"[^\w.=-]", "-", os.path.basename(os.path.dirname(os.path.abspath(
            args.eval_checkpoint))), flags=re.ASCII)  # printable, whatever the working directory's name
        run_dir = harness.make_run_dir(dataclasses.replace(run_args, resume=None),  # named after its run's, cut to
                                       f"{checkpoint_dir[:2 * harness.NAME_LENGTH]}__eval")  # 2 x NAME_LENGTH
        global_step = checkpoint["global_step"]
        harness.print_startup(script, run_args.env_id, device_note, run_dir, {
            "checkpoint": f"{args.eval_checkpoint} (step {global_step:,})",
            "episodes": f"{args.eval_episodes}, seed {args.seed}, {acting(args)}, normalization frozen"})
        harness.seed_everything(args.seed)
    except BaseException:  # a refused file: the env closed
        if envs is not None:
            envs.close()
        raise
    if args.capture_video:
        envs = film(envs, run_dir, args.eval_episodes)
    stop = []
    handlers = {sig: signal.signal(sig, lambda signum, frame: stop.append(signum))
                for sig in (signal.SIGINT, signal.SIGTERM)} if threading.current_thread() is threading.main_thread() \
        else {}
    try:
        returns = play(envs, act, args.eval_episodes, args.seed, stopping=lambda: bool(stop))
    finally:
        envs.close()
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    if returns is None:
        print(f"stopped by {signal.Signals(stop[0]).name} before {args.eval_episodes} episodes were played")
        raise SystemExit(128 + stop[0])
    mean_return, std_return = float(np.mean(returns)), float(np.std(returns))
    if args.track:  # before the writer, whose scalars it syncs
        import tracking

        tracking.start(dataclasses.replace(args, env_id=run_args.env_id), run_dir)
    writer = SummaryWriter(run_dir)
    writer.add_text("eval", f"checkpoint {args.eval_checkpoint}, {len(returns)} episodes, {acting(args)}, returns "
                            f"{returns}")
    writer.add_scalar("eval/mean_return", mean_return, global_step)
    writer.add_scalar("eval/std_return", std_return, global_step)
    writer.close()
    if args.track:
        tracking.finish()
    print(f"eval: mean return {mean_return:.2f}, std {std_return:.2f} over {len(returns)} episodes ({acting(args)})")
    return {"mean_return": mean_return, "std_return": std_return, "returns": returns, "run_dir": run_dir,
            "global_step": global_step}
