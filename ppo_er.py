"""PPO with multi-batch experience replay (PPO-ER): Han & Sung, "Multi-Batch Experience Replay for Fast Convergence of Continuous Action Control".

Each iteration collects a batch of N samples from the current policy, computes GAE advantages and
TD(lambda) targets for it once, and stores it with the behaviour policy's mean and std in a replay
memory R of the last L batches (eq. 11). The update runs T epochs of minibatches drawn from all N*L
stored samples, each sample's importance ratio taken against the policy that generated it (eq. 12-13).
L = 1 is PPO, on the same code path.

    python ppo_er.py                                     # PPO-ER (L = 2) on HalfCheetah-v5, 1M steps
    python ppo_er.py --replay-batches 1                  # the paper's PPO baseline
    python ppo_er.py --num-envs 8 --num-steps 256        # K = 8 actors, each N/K = 256 steps
    python ppo_er.py --env-id Pendulum-v1 --total-timesteps 200000   # a few minutes on a laptop CPU
"""
import ctypes
import math
import os
import pickle
import platform
import random
import sys
import time
from collections import defaultdict, deque
from dataclasses import asdict, dataclass, fields, replace
from typing import Optional

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import tyro
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

PROCGEN_GAMES = (
    "bigfish", "bossfight", "caveflyer", "chaser", "climber", "coinrun", "dodgeball", "fruitbot",
    "heist", "jumper", "leaper", "maze", "miner", "ninja", "plunder", "starpilot",
)


@dataclass
class Args:
    exp_name: str = "ppo_er"
    """name of this experiment, part of the run directory's name"""
    seed: int = 1
    """seed of random, numpy, torch and the environment"""
    torch_deterministic: bool = True
    """set torch.backends.cudnn.deterministic"""
    cuda: bool = True
    """use the GPU (--no-cuda: the CPU); with no GPU present the run falls back to the CPU and says so"""
    torch_threads: int = 0
    """torch's CPU threads; 0: 1 for the MLP of vector envs, one per core for the IMPALA CNN (fastest here)"""
    save_model: bool = False
    """write the checkpoint model.pt into the run directory at the end"""
    checkpoint_every: int = 0
    """write the checkpoint checkpoint.pt into the run directory every this many iterations, atomically; 0: never"""
    resume: Optional[str] = None
    """continue the run of this checkpoint, in its run directory, with its flags (only --cuda/--no-cuda may be added)"""
    eval_checkpoint: Optional[str] = None
    """do not train: play the policy of this checkpoint, normalization frozen, and log its mean and std raw return"""
    eval_episodes: int = 10
    """episodes played by --eval-checkpoint"""
    capture_video: bool = False
    """with --eval-checkpoint: record every episode into the evaluation's run directory (needs moviepy)"""

    env_id: str = "HalfCheetah-v5"
    """a Gymnasium env with vector observations and continuous (Box) actions"""
    total_timesteps: int = 1_000_000
    """total environment steps"""
    num_envs: int = 1
    """actors K (Table II: 1 or 8)"""
    num_steps: int = 2048
    """steps of each actor per iteration, N/K: the batch of N = num_envs x num_steps samples that one policy
    collects (Table II: N = 2048)"""
    num_minibatches: int = 32
    """N/M: the minibatch size is M = N / num_minibatches, M/K samples from each actor (Table II: M = 64); one
    epoch over the L stored batches takes L x N/M minibatches"""
    update_epochs: int = 10
    """epochs T over the replay memory per iteration (Table II)"""
    replay_batches: int = 2
    """replay policy depth L: batches kept in memory (the paper: 2; 1 is PPO)"""

    learning_rate: float = 3e-4
    """Adam step size beta before annealing (Table II: 3e-4 alpha). Here alpha is the annealing factor (1 -> 0);
    vmpo.py's alpha is a KL multiplier, the batch-size-invariance paper's a step size"""
    adam_eps: float = 1e-8
    """Adam epsilon"""
    anneal: bool = True
    """anneal step size and clip factor with alpha going linearly from 1 to 0 over training (Sec. V)"""
    gamma: float = 0.99
    """discount gamma"""
    norm_reward: bool = True
    """scale rewards by a running std of the discounted return (common PPO practice; the paper does not say)"""
    gae_lambda: float = 0.95
    """TD parameter lambda of GAE and of the TD(lambda) targets"""
    clip_coef: float = 0.2
    """clipping factor epsilon before annealing (Table II: 0.2 alpha)"""
    vf_coef: float = 1.0
    """value loss coefficient c of eq. (16) (the paper: 1, separate networks)"""
    ent_coef: float = 0.0
    """entropy bonus coefficient (not in the paper, which uses none)"""
    max_grad_norm: Optional[float] = None
    """clip the gradient's global norm (not in the paper: off)"""
    norm_adv: bool = True
    """standardize the advantages within each minibatch (the paper does not say; common PPO practice)"""


def batch_sizes(args: Args) -> tuple[int, int, int]:
    """(batch_size N, minibatch_size M, num_iterations) derived from Args."""
    batch_size = args.num_envs * args.num_steps
    return batch_size, batch_size // args.num_minibatches, math.ceil(args.total_timesteps / batch_size)


# ---------------------------------------------------------------------------------- environment
def make_env(args: Args, render_mode=None) -> gym.vector.VectorEnv:
    """Vectorized env with normalized observations, raw-score episode statistics and reward scaling.

    Gymnasium 1.4's vector NormalizeObservation refuses SAME_STEP autoreset, so each actor's env
    normalizes its own observations; then info["final_obs"] is normalized like every other obs.
    """
    envs = gym.make_vec(
        args.env_id, num_envs=args.num_envs, vectorization_mode="sync",
        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
        wrappers=[gym.wrappers.NormalizeObservation], render_mode=render_mode,
    )
    envs = gym.wrappers.vector.RecordEpisodeStatistics(envs)  # raw return, before reward scaling
    if args.norm_reward:
        envs = gym.wrappers.vector.NormalizeReward(envs, gamma=args.gamma)
    envs = gym.wrappers.vector.ClipReward(envs, -10.0, 10.0)
    return envs


# ------------------------------------------------------------------------------------- networks
def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias_const)
    return layer


def mlp(in_dim, out_dim, out_std):
    return nn.Sequential(
        layer_init(nn.Linear(in_dim, 64)), nn.Tanh(),
        layer_init(nn.Linear(64, 64)), nn.Tanh(),
        layer_init(nn.Linear(64, out_dim), std=out_std),
    )


class Agent(nn.Module):
    """Policy N(mu(s; phi), sigma^2) with a state-independent sigma, and a separate value network V(s) (Sec. IV)."""

    def __init__(self, envs):
        super().__init__()
        obs_dim = int(np.prod(envs.single_observation_space.shape))
        action_dim = int(np.prod(envs.single_action_space.shape))
        self.actor_mean = mlp(obs_dim, action_dim, out_std=0.01)
        self.actor_log_std = nn.Parameter(torch.zeros(action_dim))  # log sigma, one per action dim
        self.critic = mlp(obs_dim, 1, out_std=1.0)

    def get_value(self, obs):
        return self.critic(obs).squeeze(-1)

    def get_policy(self, obs):
        mean = self.actor_mean(obs)
        return mean, self.actor_log_std.expand_as(mean)


# --------------------------------------------------------------------------- algorithm functions
def compute_gae(rewards, values, dones, next_value, next_done, gamma, gae_lambda):
    """Generalized advantage estimation (Schulman et al., 2015b).

    rewards, values, dones: [T, N]; next_value, next_done: [N]. dones[t] = 1 when the step that
    produced obs t ended an episode, so nothing is bootstrapped from step t-1 into step t.
    Returns (advantages, returns), both [T, N], with returns = advantages + values.
    """
    num_steps = rewards.shape[0]
    advantages = torch.zeros_like(rewards)
    last_gae = torch.zeros_like(next_value)
    for t in reversed(range(num_steps)):
        if t == num_steps - 1:
            next_nonterminal, next_values = 1.0 - next_done, next_value
        else:
            next_nonterminal, next_values = 1.0 - dones[t + 1], values[t + 1]
        delta = rewards[t] + gamma * next_values * next_nonterminal - values[t]  # TD error delta_t
        last_gae = delta + gamma * gae_lambda * next_nonterminal * last_gae
        advantages[t] = last_gae
    return advantages, advantages + values


def gaussian_log_prob(actions, mean, log_std):
    """log N(a; mu, sigma^2) summed over action dims. actions, mean: [B, A]; log_std: [B, A] or [A]. Returns [B]."""
    return (-0.5 * ((actions - mean) / log_std.exp()) ** 2 - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)


def gaussian_entropy(log_std):
    """Entropy of a diagonal Gaussian, summed over action dims. log_std: [B, A]. Returns [B]."""
    return (log_std + 0.5 * math.log(2 * math.pi * math.e)).sum(-1)


def ppo_er_loss(new_logp, behav_logp, advantages, clip_coef):
    """-L^CLIP-ER (eq. 12) with alpha_m = 1/M: mean of -min(R_m A_m, clip(R_m, 1-eps, 1+eps) A_m).

    All inputs [B]; only new_logp carries gradient. R_m = pi(a_m|s_m) / pi_{theta_i(m)}(a_m|s_m)
    (eq. 13) is against the policy that generated sample m. With one batch in memory it is PPO's loss (eq. 8).
    """
    ratio = torch.exp(new_logp - behav_logp.detach())
    surrogate = torch.min(ratio * advantages, torch.clamp(ratio, 1 - clip_coef, 1 + clip_coef) * advantages)
    return -surrogate.mean()


def linear_schedule(initial, iteration, num_iterations):
    """initial * alpha during iteration `iteration` (1-based), alpha = fraction of iterations not yet begun.

    alpha is 1 in the first iteration, 1/J in the last and 0 once all J are done ("linearly annealed
    from 1 to 0 as the time step continued", Sec. V; the timesteps-so-far convention of PPO's code).
    """
    return initial * max(0.0, 1.0 - (iteration - 1) / num_iterations)


class ReplayMemory:
    """R of eq. (11): the last L batches of (s, a, A_hat, V_hat, mu, log sigma), newest last.

    push() takes one batch as a dict of [T, K, ...] tensors (T = N/K steps of K actors). Advantages
    and targets are computed once, when a batch is stored, and never recomputed (Sec. IV).
    """

    def __init__(self, num_batches):
        self.batches = deque(maxlen=num_batches)

    def __len__(self):
        return len(self.batches)

    def push(self, batch):
        self.batches.append(batch)

    def data(self):
        """All stored samples flattened to [L*T*K, ...], oldest batch first, plus "age": [L*T*K]
        (0 for the newest batch, L-1 for the oldest)."""
        data = {key: torch.cat([b[key] for b in self.batches]).flatten(0, 1) for key in self.batches[0]}
        num_steps, num_envs = self.batches[0]["advantages"].shape
        ages = torch.arange(len(self) - 1, -1, -1, device=data["advantages"].device)
        data["age"] = ages.repeat_interleave(num_steps * num_envs)
        return data

    def minibatch_indices(self, minibatch_size):
        """One epoch: index tensors [M] into data() that visit every stored sample exactly once.

        Each minibatch holds M/K samples of each actor k, drawn from R_k (Algorithm 1, lines 10-13).
        """
        num_steps, num_envs = self.batches[0]["advantages"].shape
        device = self.batches[0]["advantages"].device
        rows, per_actor = len(self) * num_steps, minibatch_size // num_envs
        shuffled_rows = torch.argsort(torch.rand(rows, num_envs, device=device), dim=0)  # column k: a shuffle of R_k
        flat = shuffled_rows * num_envs + torch.arange(num_envs, device=device)  # [row, k] -> row * K + k
        return list(flat.reshape(rows // per_actor, per_actor * num_envs))


# ------------------------------------------------------------------------------------- training

def train(args: Args) -> dict:
    if args.eval_checkpoint is not None:
        return evaluate(args)
    args, checkpoint = resume_from(args)  # --resume: the checkpoint's flags; None for a new run
    check_args(args)
    batch_size, minibatch_size, num_iterations = batch_sizes(args)

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    device, device_note = choose_device(args.cuda)

    envs = make_env(args)
    tune_cpu(device, args.torch_threads, envs.single_observation_space.shape)
    run_dir = make_run_dir(args, f"{args.env_id}__{args.exp_name}__{args.seed}")
    print_startup(args, device_note, run_dir, steps=f"{num_iterations * batch_size:,} in {num_iterations:,} iterations "
                  f"of N = {batch_size:,} ({args.num_envs} actors x {args.num_steps} steps); M = {minibatch_size}, "
                  f"L = {args.replay_batches}", **resume_note(args, checkpoint))
    writer = open_writer(run_dir, args, checkpoint)

    agent = Agent(envs).to(device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=args.adam_eps)
    replay = ReplayMemory(args.replay_batches)
    models, optimizers = {"agent": agent}, {"optimizer": optimizer}  # what a checkpoint holds, with the replay memory
    obs_shape, action_shape = envs.single_observation_space.shape, envs.single_action_space.shape
    action_low = torch.as_tensor(envs.single_action_space.low, device=device)
    action_high = torch.as_tensor(envs.single_action_space.high, device=device)

    obs = torch.zeros((args.num_steps, args.num_envs) + obs_shape, device=device)
    actions = torch.zeros((args.num_steps, args.num_envs) + action_shape, device=device)
    behav_means = torch.zeros((args.num_steps, args.num_envs) + action_shape, device=device)
    behav_log_stds = torch.zeros((args.num_steps, args.num_envs) + action_shape, device=device)
    rewards = torch.zeros((args.num_steps, args.num_envs), device=device)
    dones = torch.zeros((args.num_steps, args.num_envs), device=device)
    values = torch.zeros((args.num_steps, args.num_envs), device=device)

    global_step, first_iteration = 0, 1
    episode_returns = deque(maxlen=100)
    next_obs, _ = envs.reset(seed=args.seed)
    next_obs = torch.as_tensor(next_obs, dtype=torch.float32, device=device)
    next_done = torch.zeros(args.num_envs, device=device)
    if checkpoint is not None:  # networks, Adam, normalizers, RNGs, env state, counters, replay memory
        global_step, first_iteration, next_obs, next_done = restore_run(
            checkpoint, models, optimizers, envs, episode_returns, next_obs, next_done)
        replay.batches.extend(checkpoint["replay"])
    start_step, start_time, progress = global_step, time.time(), Progress(num_iterations * batch_size, global_step)

    for iteration in range(first_iteration, num_iterations + 1):
        # step size beta = 3e-4 alpha and clip factor epsilon = 0.2 alpha (Table II)
        learning_rate = linear_schedule(args.learning_rate, iteration, num_iterations) if args.anneal else args.learning_rate
        clip_coef = linear_schedule(args.clip_coef, iteration, num_iterations) if args.anneal else args.clip_coef
        optimizer.param_groups[0]["lr"] = learning_rate

        for step in range(args.num_steps):  # Algorithm 1, line 3: K actors, N/K steps each
            global_step += args.num_envs
            obs[step], dones[step] = next_obs, next_done
            with torch.no_grad():
                mean, log_std = agent.get_policy(next_obs)
                values[step] = agent.get_value(next_obs)
                action = mean + log_std.exp() * torch.randn_like(mean)  # a ~ N(mu(s), sigma^2), eq. (10)
            actions[step], behav_means[step], behav_log_stds[step] = action, mean, log_std

            # the env sees the action clipped to its bounds; log-probabilities use the sampled one
            env_action = torch.clamp(action, action_low, action_high).cpu().numpy()
            next_obs_np, reward, terminated, truncated, info = envs.step(env_action)
            rewards[step] = torch.as_tensor(reward, dtype=torch.float32, device=device)
            # time-limit truncation is not termination: bootstrap with gamma * V(final obs)
            truncated_only = np.flatnonzero(truncated & ~terminated)
            if truncated_only.size:
                final_obs = torch.as_tensor(np.stack(info["final_obs"][truncated_only]), dtype=torch.float32, device=device)
                with torch.no_grad():
                    rewards[step, truncated_only] += args.gamma * agent.get_value(final_obs)
            next_obs = torch.as_tensor(next_obs_np, dtype=torch.float32, device=device)
            next_done = torch.as_tensor(terminated | truncated, dtype=torch.float32, device=device)
            if "episode" in info:
                for i in np.flatnonzero(info["_episode"]):
                    episode_returns.append(float(info["episode"]["r"][i]))
                    writer.add_scalar("charts/episodic_return", info["episode"]["r"][i], global_step)
                    writer.add_scalar("charts/episodic_length", info["episode"]["l"][i], global_step)
            progress.update(global_step, episode_returns)

        # A_hat (eq. 14) and V_hat = A_hat + V (eq. 15), computed once for this batch (lines 4-5)
        with torch.no_grad():
            next_value = agent.get_value(next_obs)
        advantages, returns = compute_gae(rewards, values, dones, next_value, next_done, args.gamma, args.gae_lambda)
        # line 6; obs stay as normalized at collection time, the input mu and sigma were computed from
        replay.push({"obs": obs.clone(), "actions": actions.clone(), "advantages": advantages, "returns": returns,
                     "behav_mean": behav_means.clone(), "behav_log_std": behav_log_stds.clone()})

        data = replay.data()
        # denominator of eq. (13): each sample's own behaviour policy, from its stored mu and sigma
        b_behav_logps = gaussian_log_prob(data["actions"], data["behav_mean"], data["behav_log_std"])
        b_obs, b_actions, b_advantages, b_returns = data["obs"], data["actions"], data["advantages"], data["returns"]
        b_fresh = data["age"] == 0

        stats = defaultdict(list)  # name -> per-minibatch values, averaged once per iteration
        ratio_max = torch.zeros((), device=device)
        clipped, counted = torch.zeros(2, device=device), torch.zeros(2, device=device)  # [fresh, replayed]
        for epoch in range(args.update_epochs):  # lines 8-16: T epochs of NL/M minibatches
            for mb_inds in replay.minibatch_indices(minibatch_size):
                mb_obs, mb_behav_logp, mb_advantages = b_obs[mb_inds], b_behav_logps[mb_inds], b_advantages[mb_inds]
                mean, log_std = agent.get_policy(mb_obs)
                new_logp = gaussian_log_prob(b_actions[mb_inds], mean, log_std)
                new_value = agent.get_value(mb_obs)
                if args.norm_adv:
                    mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)

                pg_loss = ppo_er_loss(new_logp, mb_behav_logp, mb_advantages, clip_coef)
                v_loss = ((new_value - b_returns[mb_inds]) ** 2).mean()  # L^V: MSE to the TD(lambda) targets
                entropy_loss = gaussian_entropy(log_std).mean()
                loss = pg_loss + args.vf_coef * v_loss - args.ent_coef * entropy_loss  # -L of eq. (16)
                if not torch.isfinite(loss):  # one check per step; name the culprit only when it fails
                    parts = {"policy_loss": pg_loss, "value_loss": v_loss, "entropy": entropy_loss}
                    name = next((k for k, v in parts.items() if not torch.isfinite(v)), "loss")
                    raise FloatingPointError(f"{name} is not finite at iteration {iteration}; stopping.")

                optimizer.zero_grad()
                loss.backward()
                if args.max_grad_norm is not None:
                    nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()

                with torch.no_grad():
                    logratio = new_logp - mb_behav_logp
                    ratio, mb_fresh = logratio.exp(), b_fresh[mb_inds]
                    is_clipped = ((ratio - 1).abs() > clip_coef).float()
                    for name, value in (
                        ("policy_loss", pg_loss), ("value_loss", v_loss), ("entropy", entropy_loss),
                        ("approx_kl", ((ratio - 1) - logratio).mean()),  # k3 estimate of KL to each sample's pi_behav
                        ("ratio_mean", ratio.mean()),
                    ):
                        stats[name].append(value.detach())
                    ratio_max = torch.maximum(ratio_max, ratio.max())
                    for age_group, mask in enumerate((mb_fresh, ~mb_fresh)):
                        clipped[age_group] += is_clipped[mask].sum()
                        counted[age_group] += mask.sum()

        fresh_returns, fresh_values = returns.reshape(-1), values.reshape(-1)
        var_returns = fresh_returns.var()
        explained_var = (1 - (fresh_returns - fresh_values).var() / var_returns).item() if var_returns > 0 else float("nan")
        sps = int((global_step - start_step) / (time.time() - start_time))
        writer.add_scalar("charts/learning_rate", learning_rate, global_step)
        writer.add_scalar("charts/clip_coef", clip_coef, global_step)
        writer.add_scalar("charts/replay_batches", len(replay), global_step)
        writer.add_scalar("charts/SPS", sps, global_step)
        for name, vals in stats.items():
            writer.add_scalar(f"losses/{name}", torch.stack(vals).mean().item(), global_step)
        writer.add_scalar("losses/ratio_max", ratio_max.item(), global_step)
        writer.add_scalar("losses/clipfrac", (clipped.sum() / counted.sum()).item(), global_step)
        writer.add_scalar("losses/clipfrac_fresh", (clipped[0] / counted[0]).item(), global_step)
        if counted[1] > 0:
            writer.add_scalar("losses/clipfrac_replayed", (clipped[1] / counted[1]).item(), global_step)
        writer.add_scalar("losses/explained_variance", explained_var, global_step)
        if args.checkpoint_every and iteration % args.checkpoint_every == 0:
            writer.flush()  # the logs up to the checkpoint are on disk before it is
            save_checkpoint(os.path.join(run_dir, "checkpoint.pt"), make_checkpoint(
                args, models, optimizers, envs, global_step, iteration, num_iterations, episode_returns,
                next_obs, next_done, replay=list(replay.batches)))

    if args.save_model:
        save_checkpoint(os.path.join(run_dir, "model.pt"), make_checkpoint(
            args, models, optimizers, envs, global_step, iteration, num_iterations, episode_returns,
            next_obs, next_done, replay=list(replay.batches)))
    progress.close(global_step, episode_returns)
    envs.close()
    writer.close()
    mean_return = float(np.mean(episode_returns)) if episode_returns else float("nan")
    return {"global_step": global_step, "sps": sps, "mean_return": mean_return, "run_dir": run_dir}


# ---------------------------------------------------------- run plumbing: not part of the algorithm
# CPU tuning, flag checks, device, run directory, start-up block, progress, checkpoints, resume, evaluation.
# No paper describes them; every script of this repository has these helpers, written the same way.


def keep_freed_memory():
    """Training on CPU with glibc: keep freed memory for reuse. By default glibc hands every freed block over
    32 MiB back to the OS, so each big activation or gradient buffer is page-faulted in again on every pass."""
    if platform.libc_ver()[0] != "glibc":
        return
    libc = ctypes.CDLL("libc.so.6")
    libc.mallopt(-4, 0)  # M_MMAP_MAX = 0: serve big blocks from the heap, not from their own mmap
    libc.mallopt(-1, 2**31 - 1)  # M_TRIM_THRESHOLD: give the heap's free top back only beyond 2 GiB


def tune_cpu(device, torch_threads: int, obs_shape) -> None:
    """On the CPU: keep freed memory, and use --torch-threads threads, or by default 1 for the MLP of vector
    observations and PyTorch's one per core for the IMPALA CNN (each the faster here: README, Speed)."""
    if device.type != "cpu":
        return
    keep_freed_memory()
    if torch_threads or len(obs_shape) != 3:
        torch.set_num_threads(torch_threads or 1)


PROGRESS_EVERY = 30  # seconds between plain progress lines when stdout is not a terminal
FLAG_RANGES = {  # the interval each numeric flag must lie in
    "seed": "[0, 4294967295]", "torch_threads": "[0, inf)", "checkpoint_every": "[0, inf)", "eval_episodes": "[1, inf)",
    "total_timesteps": "[1, inf)", "num_envs": "[1, inf)", "num_steps": "[1, inf)", "num_minibatches": "[1, inf)",
    "update_epochs": "[1, inf)", "replay_batches": "[1, inf)", "learning_rate": "(0, inf)", "adam_eps": "(0, inf)",
    "gamma": "[0, 1]", "gae_lambda": "[0, 1]", "clip_coef": "(0, 1]", "vf_coef": "[0, inf)", "ent_coef": "[0, inf)",
    "max_grad_norm": "(0, inf)",
}


def check_args(args: Args) -> None:
    """Stop with one sentence naming the flag before any work is done and before a run directory exists."""
    check_ranges(args, FLAG_RANGES)
    observation_space, action_space = env_spaces(args)
    if not isinstance(action_space, gym.spaces.Box):
        raise SystemExit(f"--env-id {args.env_id} has {action_space} actions; ppo_er.py needs continuous (Box) "
                         f"actions.")
    if not isinstance(observation_space, gym.spaces.Box) or len(observation_space.shape) != 1:
        raise SystemExit(f"--env-id {args.env_id} has {observation_space} observations; ppo_er.py needs vectors.")
    if args.num_steps % args.num_minibatches != 0:
        raise SystemExit(f"--num-minibatches {args.num_minibatches} must divide --num-steps {args.num_steps}: each "
                         f"minibatch takes M/K = num_steps / num_minibatches samples of each of the K actors.")
    # per sample: obs, action, behaviour mean and log-std (float32) and reward, done, value in the rollout; obs,
    # action, mean, log-std, advantage, target in each of the L stored batches and in their concatenation
    floats = observation_space.shape[0] + 3 * action_space.shape[0]
    sample_bytes = 4 * ((floats + 3) + 2 * args.replay_batches * (floats + 2))
    check_memory(args.num_envs * args.num_steps * sample_bytes, args.cuda, "The rollout and replay buffers",
                 "--num-envs, --num-steps or --replay-batches")
    check_writable("runs" if args.resume is None else os.path.dirname(args.resume) or ".")


def env_spaces(args: Args) -> tuple:
    """(observation space, action space) of one env, without building the vector env."""
    if args.env_id in PROCGEN_GAMES:
        raise SystemExit(f"--env-id {args.env_id} is a Procgen game with discrete actions; ppo_er.py needs "
                         f"continuous actions.")
    if args.env_id not in gym.registry:
        raise SystemExit(f"--env-id {args.env_id!r} is not a registered Gymnasium env.")
    try:
        env = gym.make(args.env_id)
    except gym.error.Error as error:
        raise SystemExit(f"--env-id {args.env_id} cannot be made: {error}") from None
    env.close()
    return env.observation_space, env.action_space


def check_ranges(args, ranges: dict) -> None:
    """Each flag in `ranges` (name -> interval such as "(0, 1]") lies in its interval; unset (None) passes."""
    for name, interval in ranges.items():
        value, (low, high) = getattr(args, name), (float(bound) for bound in interval[1:-1].split(","))
        if value is not None and not ((low <= value if interval[0] == "[" else low < value)
                                      and (value <= high if interval[-1] == "]" else value < high)):
            raise SystemExit(f"--{name.replace('_', '-')} must be in {interval}, got {value}.")


def available_memory(cuda: bool) -> dict:
    """Free memory now, {kind: bytes}: MemAvailable (Linux only) and, with cuda, the GPU's."""
    available = {}
    if cuda and torch.cuda.is_available():
        available["GPU memory"] = torch.cuda.mem_get_info()[0]
    if os.path.exists("/proc/meminfo"):
        with open("/proc/meminfo") as meminfo:
            lines = [line.split() for line in meminfo if line.startswith("MemAvailable:")]
        available.update({"memory": int(lines[0][1]) * 1024} if lines else {})
    return available


def check_memory(num_bytes: int, cuda: bool, what: str, flags: str) -> None:
    """Stop before allocating `num_bytes` that the free memory (MemAvailable, and the GPU's with cuda) cannot hold."""
    for kind, free in available_memory(cuda).items():
        if num_bytes > free:
            raise SystemExit(f"{what} need {num_bytes / 2**30:.1f} GiB but only {free / 2**30:.1f} GiB of {kind} "
                             f"is available; lower {flags}.")


def check_writable(directory: str) -> None:
    """The run directory can be made under `directory` (made later, after every check)."""
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise SystemExit(f"{os.path.abspath(directory)} is a file, so no run directory can be made in it; "
                         f"move it or run from another directory.")
    if not os.access(directory if os.path.isdir(directory) else ".", os.W_OK):
        raise SystemExit(f"{os.path.abspath(directory)} is not writable; run from a directory you can write to.")


def choose_device(cuda: bool) -> tuple:
    """(device, a note saying which one and why)."""
    if cuda and torch.cuda.is_available():
        return torch.device("cuda"), f"cuda ({torch.cuda.get_device_name()})"
    if cuda:
        return torch.device("cpu"), "cpu (no GPU is available, so --cuda falls back to the CPU)"
    return torch.device("cpu"), "cpu (--no-cuda)"


def make_run_dir(args: Args, name: str) -> str:
    """runs/{name}__{time}, made only now that every check passed; a resumed run keeps its own directory."""
    if args.resume is not None:
        return os.path.dirname(args.resume) or "."
    run_dir = os.path.join("runs", f"{name}__{int(time.time())}")
    os.makedirs(run_dir, exist_ok=True)
    return run_dir


def print_startup(args: Args, device_note: str, run_dir: str, **lines: str) -> None:
    """The start-up block: algorithm and paper, env, device and why, run directory, then `lines` (label: text)."""
    print(__doc__.splitlines()[0])
    for label, text in {"env": args.env_id, "device": device_note, "run dir": run_dir, **lines}.items():
        print(f"  {label.replace('_', ' '):<10} {text}")


def open_writer(run_dir: str, args: Args, checkpoint) -> SummaryWriter:
    """TensorBoard writer; a resumed run hides what its first life logged after the checkpoint (purge_step)."""
    if checkpoint is not None:
        return SummaryWriter(run_dir, purge_step=checkpoint["global_step"] + 1)
    writer = SummaryWriter(run_dir)
    table = "\n".join(f"|{k}|{v}|" for k, v in vars(args).items())
    writer.add_text("hyperparameters", f"|param|value|\n|-|-|\n{table}")
    return writer


class Progress:
    """A tqdm bar over env steps (ETA, mean return, SPS) on a terminal; otherwise a plain line every
    PROGRESS_EVERY seconds, so that logs of CI or `> log.txt` are not flooded."""

    def __init__(self, total_steps: int, start_step: int):
        self.total, self.start_step, self.start_time = total_steps, start_step, time.monotonic()
        self.last_report = self.start_time
        self.bar = None
        if sys.stdout.isatty():
            self.bar = tqdm(total=total_steps, initial=start_step, unit="step", unit_scale=True, file=sys.stdout,
                            dynamic_ncols=True, smoothing=0.05)

    def summary(self, global_step: int, episode_returns) -> dict:
        mean_return = float(np.mean(episode_returns)) if episode_returns else float("nan")
        return {"mean_return": f"{mean_return:.2f}",
                "SPS": int((global_step - self.start_step) / max(time.monotonic() - self.start_time, 1e-9))}

    def update(self, global_step: int, episode_returns) -> None:
        now = time.monotonic()
        if self.bar is not None:
            self.bar.update(global_step - self.bar.n)
            if now - self.last_report >= 1:
                self.last_report = now
                self.bar.set_postfix(self.summary(global_step, episode_returns))
        elif now - self.last_report >= PROGRESS_EVERY:
            self.last_report = now
            self.print_line(global_step, episode_returns)

    def print_line(self, global_step: int, episode_returns) -> None:
        elapsed, done = time.monotonic() - self.start_time, global_step - self.start_step
        eta = (self.total - global_step) * elapsed / done if done > 0 else float("nan")
        summary = self.summary(global_step, episode_returns)
        print(f"step {global_step:,}/{self.total:,} ({100 * global_step / self.total:.0f}%)  mean_return "
              f"{summary['mean_return']}  SPS {summary['SPS']:,}  elapsed {elapsed:.0f} s  ETA {eta:.0f} s", flush=True)

    def close(self, global_step: int, episode_returns) -> None:
        if self.bar is not None:
            self.bar.set_postfix(self.summary(global_step, episode_returns))
            self.bar.close()
        else:
            self.print_line(global_step, episode_returns)


def make_checkpoint(args, models, optimizers, envs, global_step, iteration, num_iterations, episode_returns,
                    next_obs, next_done, normalizers=None, **extra) -> dict:
    """The one checkpoint format of this repository (a dict that torch.load(weights_only=True) can read).

    models, optimizers: {name: module or optimizer}; normalizers: {name: object} for running statistics
    kept outside the env stack (saved as their attributes); None entries are left out; extra: more keys."""
    return {
        "args": asdict(args),
        "models": {name: model.state_dict() for name, model in models.items() if model is not None},
        "optimizers": {name: optimizer.state_dict() for name, optimizer in optimizers.items()},
        "normalizers": {**{name: {"mean": torch.as_tensor(rms.mean), "var": torch.as_tensor(rms.var),
                                  "count": float(rms.count)} for name, (_, rms) in env_normalizers(envs).items()},
                        **{name: dict(vars(normalizer)) for name, normalizer in (normalizers or {}).items()
                           if normalizer is not None}},
        "rng": rng_state(),
        "global_step": global_step,
        "iteration": iteration,
        "num_iterations": num_iterations,
        "episode_returns": list(episode_returns),
        "env": {"state": env_state(envs), "next_obs": next_obs, "next_done": next_done},
        **extra,
    }


def save_checkpoint(path: str, checkpoint: dict) -> None:
    """Write to a temporary file in the same directory, then rename: a crash never leaves a torn checkpoint."""
    tmp_path = f"{path}.tmp{os.getpid()}"
    with open(tmp_path, "wb") as file:
        torch.save(checkpoint, file)
        file.flush()
        os.fsync(file.fileno())
    os.replace(tmp_path, path)


def load_checkpoint(path: str, flag: str, device="cpu") -> dict:
    """torch.load with weights_only=True; one sentence naming `flag` if it is not a checkpoint of this script."""
    script = os.path.basename(__file__)
    if not os.path.isfile(path):
        raise SystemExit(f"{flag} {path}: no such file.")
    try:
        checkpoint = torch.load(path, map_location=device, weights_only=True)
    except Exception as error:
        raise SystemExit(f"{flag} {path} cannot be read as a checkpoint ({type(error).__name__}).") from None
    if not isinstance(checkpoint, dict) or set(checkpoint.get("args", ())) != {f.name for f in fields(Args)}:
        raise SystemExit(f"{flag} {path} is not a {script} checkpoint.")
    return checkpoint


def resume_from(args: Args) -> tuple:
    """--resume PATH: (the checkpoint's Args, the checkpoint); without it (args, None)."""
    if args.resume is None:
        return args, None
    given = [f"--{f.name.replace('_', '-')}" for f in fields(Args)
             if f.name not in ("resume", "cuda") and getattr(args, f.name) != getattr(Args(), f.name)]
    if given:
        raise SystemExit(f"--resume continues the run with the checkpoint's own flags; drop {', '.join(given)} "
                         f"(only --cuda/--no-cuda may be given with --resume).")
    checkpoint = load_checkpoint(args.resume, "--resume")
    resumed = replace(Args(**checkpoint["args"]), resume=args.resume, cuda=args.cuda)
    if checkpoint["iteration"] >= checkpoint["num_iterations"]:
        raise SystemExit(f"--resume {args.resume}: that run already finished all {checkpoint['iteration']} iterations.")
    return resumed, checkpoint


def resume_note(args: Args, checkpoint) -> dict:
    if checkpoint is None:
        return {}
    return {"resuming": f"after iteration {checkpoint['iteration']:,} (step {checkpoint['global_step']:,}) "
                        f"from {args.resume}"}


def restore_run(checkpoint, models, optimizers, envs, episode_returns, next_obs, next_done,
                normalizers=None) -> tuple:
    """Load a checkpoint into the live run (arguments as for make_checkpoint): (global_step, first iteration
    to run, next_obs, next_done). Gymnasium envs continue exactly where they were; envs that cannot be pickled
    (Procgen) restart fresh and keep only their normalizers' statistics: their current episodes are lost."""
    for name, model in models.items():
        if model is not None:
            model.load_state_dict(checkpoint["models"][name])
    for name, optimizer in optimizers.items():
        optimizer.load_state_dict(checkpoint["optimizers"][name])
    for name, normalizer in (normalizers or {}).items():
        if normalizer is not None:
            vars(normalizer).update(checkpoint["normalizers"][name])
    episode_returns.extend(checkpoint["episode_returns"])
    saved_env = checkpoint["env"]
    if saved_env["state"] is not None:
        restore_env_state(envs, saved_env["state"])
        next_obs, next_done = saved_env["next_obs"].to(next_obs.device), saved_env["next_done"].to(next_done.device)
    else:  # the freshly reset envs start new episodes (this also restarts the discounted returns of reward scaling)
        next_done = torch.ones_like(next_done)
    load_normalizers(envs, checkpoint["normalizers"])
    set_rng_state(checkpoint["rng"])
    return checkpoint["global_step"], checkpoint["iteration"] + 1, next_obs, next_done


def rng_state() -> dict:
    numpy_state = np.random.get_state()
    return {"python": random.getstate(), "numpy": (numpy_state[0], numpy_state[1].tolist(), *numpy_state[2:]),
            "torch": torch.get_rng_state(),
            **({"cuda": torch.cuda.get_rng_state_all()} if torch.cuda.is_available() else {})}


def set_rng_state(rng: dict) -> None:
    random.setstate(rng["python"])
    np.random.set_state((rng["numpy"][0], np.array(rng["numpy"][1], dtype=np.uint32), *rng["numpy"][2:]))
    torch.set_rng_state(rng["torch"])
    if "cuda" in rng and torch.cuda.is_available() and len(rng["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(rng["cuda"])


def env_normalizers(envs) -> dict:
    """The running statistics in a vector env stack, {name: (wrapper, RunningMeanStd)}: "reward" (vector
    NormalizeReward) and "obs_{i}" (NormalizeObservation of sub-env i)."""
    found, env = {}, envs
    while isinstance(env, gym.vector.VectorWrapper):
        if isinstance(env, gym.wrappers.vector.NormalizeReward):
            found["reward"] = (env, env.return_rms)
        env = env.env
    for i, sub_env in enumerate(getattr(env, "envs", ())):
        while isinstance(sub_env, gym.Wrapper):
            if isinstance(sub_env, gym.wrappers.NormalizeObservation):
                found[f"obs_{i}"] = (sub_env, sub_env.obs_rms)
            sub_env = sub_env.env
    return found


def load_normalizers(envs, states: dict, freeze: bool = False) -> None:
    """Put saved statistics into the env stack's normalizers; `freeze` stops them from updating (evaluation)."""
    for name, (wrapper, rms) in env_normalizers(envs).items():
        if name in states:
            rms.mean, rms.var = states[name]["mean"].numpy().copy(), states[name]["var"].numpy().copy()
            rms.count = states[name]["count"]
        wrapper.update_running_mean = not freeze


def env_state(envs):
    """Every layer of a Gymnasium vector env stack (wrappers, vector env, sub-envs with their RNGs), pickled
    attribute by attribute; functions such as make_vec's env factories are left out. None for Procgen."""
    if not isinstance(envs.unwrapped, gym.vector.SyncVectorEnv):
        return None
    layers, env = [], envs
    while env is not None:
        layer = {}
        for key, value in vars(env).items():
            try:
                layer[key] = pickle.dumps(value) if key != "env" else None
            except (pickle.PicklingError, AttributeError, TypeError):
                pass  # a function: the same in the restored stack
        layers.append({key: value for key, value in layer.items() if value is not None})
        env = getattr(env, "env", None)
    return pickle.dumps(layers)


def restore_env_state(envs, state: bytes) -> None:
    env = envs
    for layer in pickle.loads(state):
        vars(env).update({key: pickle.loads(value) for key, value in layer.items()})
        env = getattr(env, "env", None)


def acting_policy(args: Args, envs, models: dict, device):
    """The checkpoint's policy network as obs -> sampled env actions (clipped to the bounds, as in training)."""
    agent = Agent(envs).to(device)
    agent.load_state_dict(models["agent"])
    space = envs.single_action_space

    @torch.no_grad()
    def act(obs):
        mean, log_std = agent.get_policy(torch.as_tensor(obs, dtype=torch.float32, device=device))
        return np.clip((mean + log_std.exp() * torch.randn_like(mean)).cpu().numpy(), space.low, space.high)
    return act


def check_video_dependency() -> None:
    try:
        import moviepy  # noqa: F401  (Gymnasium's RecordVideo writes the videos with it)
    except ImportError:
        raise SystemExit("--capture-video needs the moviepy package, which is not installed: "
                         "pip install moviepy.") from None


def check_rendering(env_id: str) -> None:
    """--capture-video needs an env that renders frames (classic control: pygame; MuJoCo: OpenGL)."""
    if env_id not in PROCGEN_GAMES:  # Procgen's frames are its observations
        try:
            env = gym.make(env_id, render_mode="rgb_array")
            env.reset(seed=0)
            env.render()
            env.close()
        except Exception as error:
            raise SystemExit(f"--capture-video: {env_id} cannot render frames here ({error}).") from None


def evaluate(args: Args) -> dict:
    """--eval-checkpoint: play the saved policy (sampled, as in training) on one env with the saved
    normalization frozen; print and log (eval/mean_return, eval/std_return) the raw episodic return."""
    check_ranges(args, FLAG_RANGES)
    if args.resume is not None:
        raise SystemExit("--eval-checkpoint and --resume cannot be combined: evaluate, or continue training.")
    if args.capture_video:
        check_video_dependency()
    checkpoint = load_checkpoint(args.eval_checkpoint, "--eval-checkpoint")
    run_args = replace(Args(**checkpoint["args"]), num_envs=1, seed=args.seed, resume=None)
    if args.capture_video:
        check_rendering(run_args.env_id)
    check_writable("runs")
    device, device_note = choose_device(args.cuda)
    envs = make_env(run_args, render_mode="rgb_array" if args.capture_video else None)
    load_normalizers(envs, checkpoint["normalizers"], freeze=True)
    run_dir = make_run_dir(run_args, f"{run_args.env_id}__{run_args.exp_name}__{run_args.seed}__eval")
    print_startup(run_args, device_note, run_dir,
                  checkpoint=f"{args.eval_checkpoint} (step {checkpoint['global_step']:,})",
                  episodes=f"{args.eval_episodes}, actions sampled as in training, normalization frozen")
    if args.capture_video:
        envs = gym.wrappers.vector.RecordVideo(envs, os.path.join(run_dir, "videos"),
                                               episode_trigger=lambda episode: episode < args.eval_episodes)
    act = acting_policy(run_args, envs, checkpoint["models"], device)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    returns, (obs, _) = [], envs.reset(seed=args.seed)
    while len(returns) < args.eval_episodes:
        obs, _, _, _, info = envs.step(act(obs))
        if "episode" in info:
            returns.extend(info["episode"]["r"][info["_episode"]].tolist())
    envs.close()
    returns = returns[:args.eval_episodes]
    mean_return, std_return = float(np.mean(returns)), float(np.std(returns))
    writer = SummaryWriter(run_dir)
    writer.add_text("eval", f"checkpoint {args.eval_checkpoint}, {len(returns)} episodes, returns {returns}")
    writer.add_scalar("eval/mean_return", mean_return, checkpoint["global_step"])
    writer.add_scalar("eval/std_return", std_return, checkpoint["global_step"])
    writer.close()
    print(f"eval: mean return {mean_return:.2f}, std {std_return:.2f} over {len(returns)} episodes")
    return {"mean_return": mean_return, "std_return": std_return, "returns": returns, "run_dir": run_dir,
            "global_step": checkpoint["global_step"]}


if __name__ == "__main__":
    train(tyro.cli(Args, description=__doc__))
