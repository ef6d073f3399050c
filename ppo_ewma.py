"""PPO and PPO-EWMA with batch size-invariance: Hilton, Cobbe & Schulman, "Batch size-invariance for policy optimization" (2021).

PPO-EWMA keeps an exponentially-weighted moving average (EWMA) of the policy network's weights and
uses it as the proximal policy of the decoupled objectives (Sec. 2, Sec. 4, Appendix A, Algorithm 2);
the behaviour policy, which collected the data, is used only for importance sampling.
`--batch-divisor c` divides the batch size by c and adjusts the other hyperparameters so that
training stays (approximately) the same as a function of environment steps (Sec. 3-4).

    python ppo_ewma.py                                   # PPO-EWMA on Procgen starpilot, hard
    python ppo_ewma.py --batch-divisor 4                 # 64 envs, lr / 2, EWMA and adv-norm spans x4
    python ppo_ewma.py --no-ewma                         # plain PPO (proximal = behaviour policy)
    python ppo_ewma.py --env-id CartPole-v1 --num-envs 8 --num-steps 128 --gamma 0.99 \\
        --total-timesteps 200000                         # learns in minutes on a laptop CPU
"""
import copy
import ctypes
import dataclasses
import importlib.util
import math
import os
import pickle
import platform
import random
import sys
import time
from collections import defaultdict, deque
from dataclasses import asdict, dataclass, fields, replace
from typing import Literal, Optional

import gymnasium as gym
import numpy as np
import torch
import torch.distributed as dist
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
    exp_name: str = "ppo_ewma"
    """name of this experiment, part of the run directory's name"""
    seed: int = 1
    """seed of random, numpy, torch and the environment (Procgen's rand_seed)"""
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

    env_id: str = "starpilot"
    """a Procgen game, or a Gymnasium env with vector observations and discrete actions (CartPole-v1)"""
    distribution_mode: Literal["easy", "hard"] = "hard"
    """Procgen difficulty (the paper: hard)"""
    num_levels: int = 0
    """Procgen levels to train on; 0 means unlimited"""
    start_level: int = 0
    """Procgen's first level seed"""
    total_timesteps: int = 100_000_000
    """total environment steps (the paper: 100M)"""
    num_envs: int = 256
    """parallel environments N, the total over all torchrun workers (the paper: 4 workers x 64)"""
    num_steps: int = 256
    """timesteps per rollout T"""
    num_minibatches: int = 8
    """minibatches per epoch M: each holds N/M envs' whole trajectories (official layout), so M divides N,
    or M is a multiple of N that cuts each trajectory into M/N equal time chunks"""
    shuffle_samples: bool = False
    """shuffle single samples into minibatches instead of whole env trajectories (not the paper's layout)"""
    update_epochs: int = 3
    """policy epochs E"""

    learning_rate: float = 5e-4
    """Adam step size alpha (this paper's symbol; in ppo_er.py alpha is an annealing factor, in vmpo.py a KL
    multiplier)"""
    adam_eps: float = 1e-8
    """Adam epsilon"""
    adam_beta1: float = 0.9
    """Adam beta1"""
    adam_beta2: float = 0.999
    """Adam beta2"""
    gamma: float = 0.999
    """discount gamma"""
    norm_reward: bool = True
    """divide rewards by the running std of a discounted return, then clip them to +-10 (official code)"""
    reward_norm_gamma: float = 0.99
    """discount of the return whose std normalizes rewards: 0.99 in the paper's official code, fixed and
    separate from --gamma"""
    gae_lambda: float = 0.95
    """GAE bootstrapping parameter lambda"""
    objective: Literal["clip", "kl"] = "clip"
    """decoupled objective of Sec. 2: clipped (L^CLIP_decoupled) or KL-penalised (L^KLPEN_decoupled)"""
    clip_coef: float = 0.2
    """clipping parameter epsilon"""
    kl_coef: float = 1.0
    """KL penalty beta for --objective kl (not in this paper: 1 is the fixed beta of PPG's KL variant)"""
    ent_coef: float = 0.01
    """entropy coefficient"""
    vf_coef: float = 0.5
    """value function coefficient c_VF (Table 1): the value loss is c_VF * mean((V - V_targ)^2)"""
    max_grad_norm: Optional[float] = None
    """clip the gradient's global norm (off: a clipped norm depends on the batch size)"""
    max_is_ratio: float = 100.0
    """cap on the importance weight pi/pi_behav (Appendix B)"""
    norm_adv: bool = True
    """normalize advantages with EWMA estimates of their mean and std"""
    adv_norm_span: float = 1.0
    """span of the advantage mean/std EWMA, in iterations (1: this iteration's batch only)"""

    ewma: bool = True
    """proximal policy = EWMA of the policy weights (PPO-EWMA); --no-ewma: proximal = behaviour (PPO)"""
    ewma_com: float = 8.0
    """centre of mass of the proximal-policy EWMA in gradient steps, 1/(1-beta_prox) - 1 (8: beta_prox 0.889)"""

    batch_divisor: int = 1
    """c: divide num_envs by c and adjust the hyperparameters below for batch size-invariance (Sec. 4)"""
    adjust_lr: bool = True
    """with --batch-divisor: divide the Adam step size (by sqrt(c), or c under --lr-rule linear)"""
    lr_rule: Literal["sqrt", "linear"] = "sqrt"
    """Adam step size rule: sqrt (Sec. 3.2, Appendix C) or linear (the ablation of Fig. 5)"""
    adjust_ewma: bool = True
    """with --batch-divisor: multiply the EWMA centre of mass by c"""
    adjust_adv_norm: bool = True
    """with --batch-divisor: multiply the advantage-normalization span by c"""
    adjust_adam_betas: bool = False
    """with --batch-divisor: raise Adam's beta1 and beta2 to the power 1/c (Appendix D)"""


def apply_batch_divisor(args: Args) -> Args:
    """The adjustments of Sec. 4 for a batch size divided by c = args.batch_divisor, as a new Args."""
    c = args.batch_divisor
    if c < 1 or args.num_envs % c != 0:
        raise SystemExit(f"--batch-divisor {c} must be a positive divisor of --num-envs {args.num_envs}.")
    changes = {"num_envs": args.num_envs // c}
    if args.adjust_lr:
        changes["learning_rate"] = args.learning_rate / (c if args.lr_rule == "linear" else math.sqrt(c))
    if args.adjust_ewma:
        changes["ewma_com"] = args.ewma_com * c
    if args.adjust_adv_norm:
        changes["adv_norm_span"] = args.adv_norm_span * c
    if args.adjust_adam_betas:
        changes["adam_beta1"] = args.adam_beta1 ** (1 / c)
        changes["adam_beta2"] = args.adam_beta2 ** (1 / c)
    return dataclasses.replace(args, **changes)


def batch_sizes(args: Args) -> tuple[int, int, int]:
    """(batch_size, minibatch_size, num_iterations) derived from Args."""
    batch_size = args.num_envs * args.num_steps
    return batch_size, batch_size // args.num_minibatches, math.ceil(args.total_timesteps / batch_size)


# ---------------------------------------------------------------------------------- environment
class ProcgenVecEnv(gym.vector.VectorEnv):
    """procgen.ProcgenEnv as a Gymnasium VectorEnv: uint8 HWC observations, 15 discrete actions.

    Procgen resets a finished level inside `step`, so the observation returned with done=True is
    already the next episode's first one (SAME_STEP autoreset). Procgen never truncates.
    """

    metadata = {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP, "render_fps": 15}

    def __init__(self, num_envs, env_name, num_levels, start_level, distribution_mode, seed, render_mode=None):
        from procgen import ProcgenEnv  # imported here: only Procgen runs need the old gym stack

        self.venv = ProcgenEnv(
            num_envs=num_envs, env_name=env_name, num_levels=num_levels, start_level=start_level,
            distribution_mode=distribution_mode, rand_seed=seed,
        )
        self.num_envs, self.render_mode = num_envs, render_mode
        self.single_observation_space = gym.spaces.Box(0, 255, (64, 64, 3), np.uint8)
        self.single_action_space = gym.spaces.Discrete(self.venv.action_space.n)
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, num_envs)

    def reset(self, *, seed=None, options=None):
        return self.venv.reset()["rgb"], {}

    def step(self, actions):
        obs, rewards, dones, _ = self.venv.step(np.asarray(actions))
        return obs["rgb"], rewards.astype(np.float64), dones, np.zeros_like(dones), {}

    def render(self):
        """The 64x64 frames the agent sees, one per env (for video)."""
        return list(self.venv.env.observe()[1]["rgb"])

    def close(self):
        self.venv.close()


def make_env(args: Args, render_mode=None) -> gym.vector.VectorEnv:
    """Vectorized env that records raw-score episode statistics (rewards are normalized in train())."""
    if args.env_id in PROCGEN_GAMES:
        envs = ProcgenVecEnv(
            args.num_envs, args.env_id, args.num_levels, args.start_level, args.distribution_mode, args.seed,
            render_mode,
        )
    else:
        envs = gym.make_vec(
            args.env_id, num_envs=args.num_envs, vectorization_mode="sync",
            vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}, render_mode=render_mode,
        )
    return gym.wrappers.vector.RecordEpisodeStatistics(envs)  # raw game score


# ------------------------------------------------------------------------------------- networks
def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    """CleanRL's orthogonal init, for the MLP of vector envs (the official code has no MLP)."""
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias_const)
    return layer


@torch.no_grad()
def normed_init(layer, scale):
    """The official code's init: each output unit's weight vector (a row, a filter) rescaled to L2 norm
    `scale`, every bias zero."""
    weight = layer.weight
    weight.mul_(scale / torch.linalg.vector_norm(weight, dim=tuple(range(1, weight.dim())), keepdim=True))
    layer.bias.zero_()
    return layer


class ResidualBlock(nn.Module):
    def __init__(self, channels, scale):
        super().__init__()
        self.conv0 = normed_init(nn.Conv2d(channels, channels, kernel_size=3, padding=1), scale)
        self.conv1 = normed_init(nn.Conv2d(channels, channels, kernel_size=3, padding=1), scale)

    def forward(self, x):
        return x + self.conv1(torch.relu(self.conv0(torch.relu(x))))


class ConvSequence(nn.Module):
    def __init__(self, in_channels, out_channels, res_scale):
        super().__init__()
        self.conv = normed_init(nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1), 1.0)
        self.pool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.res0 = ResidualBlock(out_channels, res_scale)
        self.res1 = ResidualBlock(out_channels, res_scale)

    def forward(self, x):
        return self.res1(self.res0(self.pool(self.conv(x))))


class ImpalaCNN(nn.Module):
    """IMPALA CNN (Espeholt et al., 2018): [B, 64, 64, 3] uint8 -> [B, 256] features."""

    def __init__(self, in_channels=3, channels=(16, 32, 32)):
        super().__init__()
        # official init: each of the S stacks has scale 1/sqrt(S), each of its 2 blocks 1/sqrt(2) of that,
        # and each conv of a block the square root of the block's scale: (2 S)^(-1/4) = 6^(-1/4) for S = 3
        res_scale = (2 * len(channels)) ** -0.25
        stacks = []
        for out_channels in channels:
            stacks.append(ConvSequence(in_channels, out_channels, res_scale))
            in_channels = out_channels
        self.stacks = nn.Sequential(*stacks)
        self.fc = normed_init(nn.Linear(channels[-1] * 8 * 8, 256), 1.4)

    def forward(self, obs):
        # permute(0, 3, 1, 2) of an HWC batch is already a channels-last NCHW tensor: no copy
        x = self.stacks(obs.permute(0, 3, 1, 2).float() / 255.0)
        return torch.relu(self.fc(torch.relu(torch.flatten(x, 1))))


class Agent(nn.Module):
    """Shared torso (IMPALA CNN for images, 64-64 tanh MLP for vectors), policy and value heads."""

    def __init__(self, envs):
        super().__init__()
        obs_shape, num_actions = envs.single_observation_space.shape, envs.single_action_space.n
        if len(obs_shape) == 3:  # official heads: normed init with scale 0.1
            self.torso = ImpalaCNN(obs_shape[-1])
            self.actor, self.critic = normed_init(nn.Linear(256, num_actions), 0.1), normed_init(nn.Linear(256, 1), 0.1)
            self.to(memory_format=torch.channels_last)  # about 1.8x faster convolutions on CPU
        else:  # CleanRL's MLP and heads
            self.torso = nn.Sequential(
                layer_init(nn.Linear(int(np.prod(obs_shape)), 64)), nn.Tanh(), layer_init(nn.Linear(64, 64)), nn.Tanh(),
            )
            self.actor, self.critic = layer_init(nn.Linear(64, num_actions), std=0.01), layer_init(nn.Linear(64, 1), std=1.0)

    def get_logits(self, obs):
        return self.actor(self.torso(obs))

    def get_value(self, obs):
        return self.critic(self.torso(obs)).squeeze(-1)

    def forward(self, obs):
        hidden = self.torso(obs)
        return self.actor(hidden), self.critic(hidden).squeeze(-1)


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


def decoupled_clip_loss(new_logp, prox_logp, behav_logp, advantages, clip_coef, max_is_ratio=100.0):
    """-L^CLIP_decoupled (Sec. 2): mean of -(pi_prox/pi_behav) * min(r A, clip(r, 1-eps, 1+eps) A).

    r = pi/pi_prox. All inputs [B]; only new_logp carries gradient. pi/pi_behav is capped at
    max_is_ratio by raising behav_logp (Appendix B). With prox_logp == behav_logp this is PPO's loss.
    """
    prox_logp, behav_logp = prox_logp.detach(), behav_logp.detach()
    behav_logp = torch.maximum(behav_logp, new_logp.detach() - math.log(max_is_ratio))
    ratio = torch.exp(new_logp - prox_logp)
    prox_is_weight = torch.exp(prox_logp - behav_logp)  # pi_prox / pi_behav
    surrogate = torch.min(ratio * advantages, torch.clamp(ratio, 1 - clip_coef, 1 + clip_coef) * advantages)
    return -(prox_is_weight * surrogate).mean()


def decoupled_kl_loss(new_logp, behav_logp, advantages, kl, kl_coef, max_is_ratio=100.0):
    """-L^KLPEN_decoupled (Sec. 2): mean of -(pi/pi_behav) A + beta KL[pi_prox || pi].

    new_logp, behav_logp, advantages: [B]; kl: [B], per-sample KL[pi_prox || pi] (carries gradient).
    pi/pi_behav is capped at max_is_ratio as in decoupled_clip_loss.
    """
    behav_logp = torch.maximum(behav_logp.detach(), new_logp.detach() - math.log(max_is_ratio))
    is_ratio = torch.exp(new_logp - behav_logp)
    return (-is_ratio * advantages + kl_coef * kl).mean()


def value_loss(values, returns):
    """L^VF = mean((V - V_targ)^2), values and returns [B]; the total loss weights it by c_VF (0.5, Table 1)."""
    return ((values - returns) ** 2).mean()


@torch.no_grad()
def update_ewma(ewma_model, model, weight, decay):
    """theta_prox <- EWMA_beta(theta) in place (Appendix A); returns the new total weight w.

    w_new = 1 + beta w;  theta_prox = theta / w_new + beta (w / w_new) theta_prox. decay 0 copies theta.
    """
    new_weight = 1.0 + decay * weight
    for ewma_param, param in zip(ewma_model.parameters(), model.parameters()):
        ewma_param.mul_(decay * weight / new_weight).add_(param, alpha=1.0 / new_weight)
    return new_weight


def com_to_decay(com):
    """EWMA decay beta whose centre of mass 1/(1-beta) - 1 equals com."""
    return com / (com + 1.0)


def decay_to_com(decay):
    """Centre of mass 1/(1-beta) - 1 of an EWMA with decay beta (in updates)."""
    return 1.0 / (1.0 - decay) - 1.0


def span_to_decay(span):
    """EWMA decay beta whose span (effective sample size) 2/(1-beta) - 1 equals span (footnote 1)."""
    return 1.0 - 2.0 / (span + 1.0)


class EwmaMoments:
    """EWMA estimates of a stream's mean and std, each batch weighted by its size."""

    def __init__(self, decay):
        self.decay = decay
        self.weight = self.sum = self.sum_sq = 0.0

    def update(self, x):
        n, batch_mean = x.numel(), x.mean().item()
        batch_var = x.var(unbiased=False).item()
        self.weight = self.decay * self.weight + n
        self.sum = self.decay * self.sum + n * batch_mean
        self.sum_sq = self.decay * self.sum_sq + n * (batch_var + batch_mean**2)

    @property
    def mean(self):
        return self.sum / self.weight

    @property
    def std(self):
        return math.sqrt(max(self.sum_sq / self.weight - self.mean**2, 0.0))

    def normalize(self, x):
        return (x - self.mean) / (self.std + 1e-8)


class RewardNormalizer:
    """The official code's reward scaling: r / sqrt(Var[R] + 1e-8), clipped to +-clip, mean not subtracted.

    R_t = r_t + gamma R_{t-1} is each env's discounted sum of past rewards, restarted at episode starts.
    Var[R] is a running estimate over every R seen, updated once per rollout with all its N x T values.
    """

    def __init__(self, num_envs, gamma, clip=10.0):
        self.gamma, self.clip = gamma, clip
        self.returns = torch.zeros(num_envs)  # each env's R so far
        self.mean, self.var, self.count = 0.0, 1.0, 1e-4  # prior: a tiny sample with mean 0 and variance 1

    def __call__(self, rewards, dones, gather=None):
        """rewards, dones: [T, N] (dones[t] = 1: obs t starts an episode). Returns the scaled rewards.
        gather: torchrun workers pass a function that concatenates every worker's [B] returns, so that all
        share one estimate, as the official code's all-reduced statistics."""
        returns, ret = torch.zeros_like(rewards), self.returns.to(rewards.device)
        for t in range(len(rewards)):
            ret = returns[t] = rewards[t] + self.gamma * (1.0 - dones[t]) * ret
        self.returns = ret
        returns = returns.reshape(-1) if gather is None else gather(returns.reshape(-1))
        n, batch_mean, batch_var = returns.numel(), returns.mean().item(), returns.var(unbiased=False).item()
        total, delta = self.count + n, batch_mean - self.mean  # merge the two samples' moments (Chan et al.)
        self.var = (self.var * self.count + batch_var * n + delta**2 * self.count * n / total) / total
        self.mean, self.count = self.mean + delta * n / total, total
        return torch.clamp(rewards / math.sqrt(self.var + 1e-8), -self.clip, self.clip)


def minibatch_indices(num_steps, num_envs, num_minibatches, generator=None):
    """The official minibatches: whole env trajectories, envs shuffled; M LongTensors of flat indices t*N + n.

    M <= N: minibatch i holds the full T-step trajectories of the i-th group of N/M shuffled envs.
    M > N: each env's trajectory is cut into M/N consecutive time chunks, one per minibatch, an env's
    chunks one after another in time order (at N = 1, T = 256, M = 8: eight consecutive 32-step pieces).
    """
    envs = torch.randperm(num_envs, generator=generator)
    chunks = max(1, num_minibatches // num_envs)  # time chunks per trajectory
    groups = envs.reshape(num_minibatches // chunks, -1)  # [env groups, envs per minibatch]
    steps = torch.arange(num_steps).reshape(chunks, -1)  # [chunks, steps per chunk]
    inds = steps[None, :, None, :] * num_envs + groups[:, None, :, None]  # [groups, chunks, envs, steps]
    return list(inds.reshape(num_minibatches, -1))


# ------------------------------------------------------------------------------------- training
def epoch_minibatches(args: Args) -> list:
    """One epoch's minibatches, flat indices into the [T, N] rollout: whole env trajectories (the official
    layout) or, with --shuffle-samples, single samples."""
    if args.shuffle_samples:
        return list(torch.randperm(args.num_envs * args.num_steps).chunk(args.num_minibatches))
    return minibatch_indices(args.num_steps, args.num_envs, args.num_minibatches)


def log_prob_and_entropy(logits, actions):
    """Categorical log pi(a|s) of `actions` and entropy, both [B]."""
    log_probs = torch.log_softmax(logits, dim=-1)
    logp = log_probs.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
    return logp, -(log_probs.exp() * log_probs).sum(-1)


def categorical_kl(logits_p, logits_q):
    """Per-sample KL[p || q] between categoricals given by logits, [B]."""
    log_p, log_q = torch.log_softmax(logits_p, -1), torch.log_softmax(logits_q, -1)
    return (log_p.exp() * (log_p - log_q)).sum(-1)


@torch.no_grad()
def logits_in_chunks(model, obs, chunk_size):
    """model.get_logits(obs) without gradient, chunk_size rows at a time: the same numbers as one pass.

    Why, on CPU: it bounds a pass's memory to 64 frames' activations (16 MiB per layer) and is no slower.
    Here a 2048-frame pass took 1.21 s at once and 1.09 s in chunks of 64 on one thread, about the same on
    two (2.83 s at once before keep_freed_memory, when each large buffer was page-faulted in again).
    """
    return torch.cat([model.get_logits(obs[start:start + chunk_size]) for start in range(0, len(obs), chunk_size)])


def train(args: Args) -> dict:
    if args.eval_checkpoint is not None:
        return evaluate(args)
    args, checkpoint = resume_from(args)  # --resume: the checkpoint's flags; None for a new run
    rank, world_size = start_workers(args)  # torchrun: check the split over the workers, join them (last section)
    check_args(args)
    raw_args, args = args, apply_batch_divisor(args)
    batch_size, minibatch_size, num_iterations = batch_sizes(args)
    ewma_decay = com_to_decay(args.ewma_com)

    args = worker_share(args, rank, world_size)  # torchrun: this worker's num_envs / W envs and its own seed
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    device, device_note = choose_device(args.cuda)
    prox_chunk_size = 64 if device.type == "cpu" else minibatch_size  # see logits_in_chunks

    envs = make_env(args)
    tune_cpu(device, args.torch_threads, envs.single_observation_space.shape)
    run_dir = make_run_dir(args, f"{args.env_id}__{args.exp_name}__{args.seed}") if rank == 0 else None
    print_startup(args, device_note, run_dir, steps=f"{num_iterations * batch_size:,} in {num_iterations:,} iterations "
                  f"of {batch_size:,} ({args.num_envs * world_size} envs x {args.num_steps} steps)",
                  **resume_note(args, checkpoint), **workers_note(args, world_size))
    if args.batch_divisor != 1:
        print(f"--batch-divisor {args.batch_divisor}:\n{hyperparameter_changes(raw_args, args)}")
    if args.batch_divisor != 1 and args.update_epochs > 1:
        print(f"warning: --update-epochs {args.update_epochs} > 1, so the batch-divisor adjustments do not make "
              f"training invariant (Sec. 4 requires 1 policy epoch; the paper's sweep uses PPG-EWMA for this).")
    writer = open_writer(run_dir, args, checkpoint) if rank == 0 else NoWriter()  # torchrun: only rank 0 logs
    if args.batch_divisor != 1 and checkpoint is None:
        writer.add_text("batch_divisor", hyperparameter_changes(raw_args, args).replace("\n", "  \n"))

    agent = Agent(envs).to(device)
    broadcast_weights(agent)  # torchrun: every worker starts from rank 0's weights
    ewma_agent = copy.deepcopy(agent).requires_grad_(False) if args.ewma else None
    ewma_weight = 1.0  # w of Appendix A: theta_prox <- theta, w <- 1
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=args.adam_eps,
                                 betas=(args.adam_beta1, args.adam_beta2))
    adv_moments = EwmaMoments(span_to_decay(args.adv_norm_span))
    reward_normalizer = RewardNormalizer(args.num_envs, args.reward_norm_gamma) if args.norm_reward else None
    num_actions = envs.single_action_space.n
    # what a checkpoint holds, with the EWMA weight w
    models, optimizers = {"agent": agent, "ewma_agent": ewma_agent}, {"optimizer": optimizer}
    normalizers = {"reward": reward_normalizer, "advantages": adv_moments}

    # rollout storage; observations keep the env's dtype (uint8 for Procgen: 4x smaller than float)
    obs_dtype = torch.from_numpy(np.zeros(0, envs.single_observation_space.dtype)).dtype
    obs = torch.zeros((args.num_steps, args.num_envs) + envs.single_observation_space.shape, dtype=obs_dtype, device=device)
    actions = torch.zeros((args.num_steps, args.num_envs), dtype=torch.long, device=device)
    logits = torch.zeros((args.num_steps, args.num_envs, num_actions), device=device)  # pi_prox of --no-ewma --objective kl
    behav_logps = torch.zeros((args.num_steps, args.num_envs), device=device)
    rewards = torch.zeros((args.num_steps, args.num_envs), device=device)
    bootstraps = torch.zeros((args.num_steps, args.num_envs), device=device)  # gamma V(final obs) at truncations
    dones = torch.zeros((args.num_steps, args.num_envs), device=device)
    values = torch.zeros((args.num_steps, args.num_envs), device=device)

    global_step, first_iteration = 0, 1
    episode_returns = deque(maxlen=100)
    next_obs, _ = envs.reset(seed=args.seed)
    next_obs = torch.as_tensor(next_obs, dtype=obs_dtype, device=device)
    next_done = torch.zeros(args.num_envs, device=device)
    if checkpoint is not None:  # networks, Adam, normalizers, RNGs, env state, counters
        global_step, first_iteration, next_obs, next_done = restore_run(
            checkpoint, models, optimizers, envs, episode_returns, next_obs, next_done, normalizers)
        ewma_weight = checkpoint["ewma_weight"]
    start_step, start_time, progress = global_step, time.time(), Progress(num_iterations * batch_size, global_step)

    for iteration in range(first_iteration, num_iterations + 1):
        bootstraps.zero_()
        episodes = []  # (step, return, length) of each episode that ends in this rollout
        for step in range(args.num_steps):
            global_step += args.num_envs * world_size
            obs[step], dones[step] = next_obs, next_done
            with torch.no_grad():
                step_logits, values[step] = agent(next_obs)
            action = torch.distributions.Categorical(logits=step_logits, validate_args=False).sample()  # no device sync
            actions[step], logits[step] = action, step_logits
            behav_logps[step] = log_prob_and_entropy(step_logits, action)[0]

            next_obs_np, reward, terminated, truncated, info = envs.step(action.cpu().numpy())
            rewards[step] = torch.as_tensor(reward, dtype=torch.float32, device=device)
            # time-limit truncation is not termination: bootstrap with gamma * V(final obs)
            truncated_only = np.flatnonzero(truncated & ~terminated)
            if truncated_only.size:
                final_obs = torch.as_tensor(np.stack(info["final_obs"][truncated_only]), dtype=obs_dtype, device=device)
                with torch.no_grad():
                    bootstraps[step, truncated_only] = args.gamma * agent.get_value(final_obs)
            next_obs = torch.as_tensor(next_obs_np, dtype=obs_dtype, device=device)
            next_done = torch.as_tensor(terminated | truncated, dtype=torch.float32, device=device)
            if "episode" in info:
                for i in np.flatnonzero(info["_episode"]):
                    episodes.append((global_step, float(info["episode"]["r"][i]), int(info["episode"]["l"][i])))
            progress.update(global_step, episode_returns)
        for episode_step, episode_return, episode_length in gather_episodes(episodes):  # torchrun: all workers'
            episode_returns.append(episode_return)
            writer.add_scalar("charts/episodic_return", episode_return, episode_step)
            writer.add_scalar("charts/episodic_length", episode_length, episode_step)

        with torch.no_grad():
            next_value = agent.get_value(next_obs)
        # rewards scaled once per rollout as officially (torchrun: one estimate over all workers); the
        # bootstrap V is already in scaled units
        scaled_rewards = reward_normalizer(rewards, dones, global_batch) if reward_normalizer else rewards
        advantages, returns = compute_gae(scaled_rewards + bootstraps, values, dones, next_value, next_done,
                                          args.gamma, args.gae_lambda)

        b_obs = obs.reshape((-1,) + envs.single_observation_space.shape)
        b_actions, b_logits = actions.reshape(-1), logits.reshape(-1, num_actions)
        b_behav_logps, b_advantages = behav_logps.reshape(-1), advantages.reshape(-1)
        b_returns, b_values = returns.reshape(-1), values.reshape(-1)
        if args.norm_adv:  # full-batch normalization with EWMA moments over `adv_norm_span` iterations
            adv_moments.update(global_batch(b_advantages))  # torchrun: moments of all workers' advantages
            b_advantages = adv_moments.normalize(b_advantages)

        stats = defaultdict(list)  # name -> per-minibatch values, averaged once per iteration
        for epoch in range(args.update_epochs):
            for mb_inds in epoch_minibatches(args):
                mb_inds = mb_inds.to(device)
                mb_obs, mb_advantages, mb_behav_logp = b_obs[mb_inds], b_advantages[mb_inds], b_behav_logps[mb_inds]
                new_logits, new_value = agent(mb_obs)
                new_logp, entropy = log_prob_and_entropy(new_logits, b_actions[mb_inds])
                if ewma_agent is not None:  # pi_prox: one forward pass of the EWMA network
                    prox_logits = logits_in_chunks(ewma_agent, mb_obs, prox_chunk_size)
                    prox_logp = log_prob_and_entropy(prox_logits, b_actions[mb_inds])[0]
                else:
                    prox_logits, prox_logp = b_logits[mb_inds], mb_behav_logp

                if args.objective == "clip":
                    pg_loss = decoupled_clip_loss(new_logp, prox_logp, mb_behav_logp, mb_advantages,
                                                  args.clip_coef, args.max_is_ratio)
                else:
                    kl = categorical_kl(prox_logits, new_logits)  # KL[pi_prox || pi]
                    pg_loss = decoupled_kl_loss(new_logp, mb_behav_logp, mb_advantages, kl, args.kl_coef,
                                                args.max_is_ratio)
                v_loss = value_loss(new_value, b_returns[mb_inds])
                entropy_loss = entropy.mean()
                loss = pg_loss - args.ent_coef * entropy_loss + args.vf_coef * v_loss
                if not torch.isfinite(loss):  # one check per step; name the culprit only when it fails
                    parts = {"policy_loss": pg_loss, "value_loss": v_loss, "entropy": entropy_loss}
                    name = next((k for k, v in parts.items() if not torch.isfinite(v)), "loss")
                    raise FloatingPointError(f"{name} is not finite at iteration {iteration}; stopping.")

                optimizer.zero_grad()
                loss.backward()
                average_gradients(agent)  # torchrun: the mean gradient of all workers' minibatches
                if args.max_grad_norm is not None:
                    nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()
                if ewma_agent is not None:
                    ewma_weight = update_ewma(ewma_agent, agent, ewma_weight, ewma_decay)

                with torch.no_grad():
                    logratio, behav_logratio = new_logp - prox_logp, new_logp - mb_behav_logp
                    for name, value in (
                        ("policy_loss", pg_loss), ("value_loss", v_loss), ("entropy", entropy_loss),
                        ("approx_kl", ((logratio.exp() - 1) - logratio).mean()),  # k3 estimate of KL to pi_prox
                        ("approx_kl_behav", ((behav_logratio.exp() - 1) - behav_logratio).mean()),
                        ("clipfrac", ((logratio.exp() - 1).abs() > args.clip_coef).float().mean()),
                        ("is_capped_frac", (behav_logratio > math.log(args.max_is_ratio)).float().mean()),
                    ):
                        stats[name].append(value.detach())

        var_returns = b_returns.var()
        explained_var = (1 - (b_returns - b_values).var() / var_returns).item() if var_returns > 0 else float("nan")
        sps = int((global_step - start_step) / (time.time() - start_time))
        writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
        writer.add_scalar("charts/SPS", sps, global_step)
        for name, vals in stats.items():
            writer.add_scalar(f"losses/{name}", torch.stack(vals).mean().item(), global_step)
        writer.add_scalar("losses/explained_variance", explained_var, global_step)
        if args.norm_adv:
            writer.add_scalar("charts/adv_mean", adv_moments.mean, global_step)
            writer.add_scalar("charts/adv_std", adv_moments.std, global_step)
        if ewma_agent is not None:
            writer.add_scalar("charts/ewma_decay", ewma_decay, global_step)
            writer.add_scalar("charts/ewma_weight", ewma_weight, global_step)
        if args.checkpoint_every and iteration % args.checkpoint_every == 0:
            writer.flush()  # the logs up to the checkpoint are on disk before it is
            save_checkpoint(os.path.join(run_dir, "checkpoint.pt"), make_checkpoint(
                raw_args, models, optimizers, envs, global_step, iteration, num_iterations, episode_returns,
                next_obs, next_done, normalizers, ewma_weight=ewma_weight))

    if args.save_model and rank == 0:
        save_checkpoint(os.path.join(run_dir, "model.pt"), make_checkpoint(
            raw_args, models, optimizers, envs, global_step, iteration, num_iterations, episode_returns,
            next_obs, next_done, normalizers, ewma_weight=ewma_weight))
    progress.close(global_step, episode_returns)
    envs.close()
    writer.close()
    stop_workers()
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
    "num_levels": "[0, inf)", "start_level": "[0, inf)", "total_timesteps": "[1, inf)", "num_envs": "[1, inf)",
    "num_steps": "[1, inf)", "num_minibatches": "[1, inf)", "update_epochs": "[1, inf)", "learning_rate": "(0, inf)",
    "adam_eps": "(0, inf)", "adam_beta1": "[0, 1)", "adam_beta2": "[0, 1)", "gamma": "[0, 1]",
    "reward_norm_gamma": "[0, 1]", "gae_lambda": "[0, 1]", "clip_coef": "(0, 1]", "kl_coef": "[0, inf)",
    "ent_coef": "[0, inf)", "vf_coef": "[0, inf)", "max_grad_norm": "(0, inf)", "max_is_ratio": "(1, inf]",
    "adv_norm_span": "[1, inf)", "ewma_com": "[0, inf)", "batch_divisor": "[1, inf)",
}


def check_args(args: Args) -> None:
    """Stop with one sentence naming the flag before any work is done and before a run directory exists.
    `args` are the command line's; the batch-divisor adjustments are checked too."""
    check_ranges(args, FLAG_RANGES)
    observation_space, action_space = env_spaces(args)
    if not isinstance(action_space, gym.spaces.Discrete):
        raise SystemExit(f"--env-id {args.env_id} has {action_space} actions; ppo_ewma.py needs discrete actions.")
    if not isinstance(observation_space, gym.spaces.Box) or not (
            len(observation_space.shape) == 1 or observation_space.shape == (64, 64, 3)):
        raise SystemExit(f"--env-id {args.env_id} has {observation_space} observations; ppo_ewma.py needs vectors "
                         f"or 64x64x3 images.")
    adjusted = apply_batch_divisor(args)
    check_minibatches(adjusted.num_steps, adjusted.num_envs, adjusted.num_minibatches, adjusted.shuffle_samples)
    # obs, action (int64), logits; behaviour log-prob, reward, bootstrap, done, value, advantage, return, scaled reward
    sample_bytes = (math.prod(observation_space.shape) * observation_space.dtype.itemsize + 8
                    + 4 * (action_space.n + 8))
    check_memory(adjusted.num_envs * adjusted.num_steps * sample_bytes, args.cuda, "The rollout buffers",
                 "--num-envs or --num-steps")
    check_writable("runs" if args.resume is None else os.path.dirname(args.resume) or ".")


def check_minibatches(num_steps, num_envs, num_minibatches, shuffle_samples):
    """Stop unless the minibatches split the batch evenly: by whole env trajectories, or by samples."""
    t, n, m = num_steps, num_envs, num_minibatches
    if shuffle_samples:
        if not 1 <= m <= n * t or (n * t) % m != 0:
            raise SystemExit(f"--num-minibatches {m} must divide the batch of {n * t} samples (--num-envs {n} x --num-steps {t}).")
    elif m < 1 or (n % m != 0 if m <= n else m % n != 0 or t % (m // n) != 0):
        raise SystemExit(
            f"--num-minibatches {m} must divide --num-envs {n} (whole trajectories per minibatch), or be a "
            f"multiple of it that cuts --num-steps {t} into equal time chunks (or pass --shuffle-samples)."
        )


def hyperparameter_changes(before: Args, after: Args) -> str:
    keys = [f.name for f in dataclasses.fields(Args)]
    return "\n".join(f"  {k}: {getattr(before, k)} -> {getattr(after, k)}" for k in keys
                     if getattr(before, k) != getattr(after, k))


def env_spaces(args: Args) -> tuple:
    """(observation space, action space) of one env, without building the vector env."""
    if args.env_id in PROCGEN_GAMES:
        if importlib.util.find_spec("procgen") is None:
            raise SystemExit(f"--env-id {args.env_id} needs the procgen package: pip install -r requirements.txt.")
        return gym.spaces.Box(0, 255, (64, 64, 3), np.uint8), gym.spaces.Discrete(15)
    if args.env_id not in gym.registry:
        raise SystemExit(f"--env-id {args.env_id!r} is neither a Procgen game nor a registered Gymnasium env.")
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
    """The checkpoint's policy (the network that collected the data, not the EWMA) as obs -> sampled actions."""
    agent = Agent(envs).to(device)
    agent.load_state_dict(models["agent"])
    obs_dtype = torch.from_numpy(np.zeros(0, envs.single_observation_space.dtype)).dtype

    @torch.no_grad()
    def act(obs):
        logits = agent.get_logits(torch.as_tensor(obs, dtype=obs_dtype, device=device))
        return torch.distributions.Categorical(logits=logits).sample().cpu().numpy()
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


# ---------------------------------------------------- distributed workers (torchrun): not part of the algorithm
# `torchrun --nproc_per_node W` runs W copies of this script, one per GPU (several machines: torchrun's --nnodes
# and --rdzv-* flags). --num-envs stays the total: each worker steps num_envs / W envs with its own seed,
# normalizes its own rewards and cuts its own rollouts into minibatches. The workers average every gradient, so
# their weights (and any EWMA of them) stay identical without being sent, and they normalize advantages with the
# moments of the whole batch. Only rank 0 prints, logs and saves. In a single process every helper does nothing.
def start_workers(args: Args) -> tuple[int, int]:
    """Under torchrun (args: the command line's): take this worker's GPU, check the flags and their split over the
    workers, join the others (NCCL with one GPU each when CUDA is used, Gloo on CPU) and silence stdout on ranks
    > 0; return (rank, W). In a single process: (0, 1), and nothing is done."""
    rank, world_size = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    if world_size == 1:
        return 0, 1
    cuda = torch.cuda.is_available() and args.cuda
    if cuda:  # before anything touches CUDA (check_args does), or every worker opens a context on GPU 0
        local_rank, local_size = int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
        if local_size > torch.cuda.device_count():
            raise SystemExit(f"torchrun started {local_size} workers on a machine with {torch.cuda.device_count()} "
                             f"GPUs; NCCL needs one GPU per worker (lower --nproc_per_node, or pass --no-cuda).")
        torch.cuda.set_device(local_rank)  # torch.device("cuda") is now this worker's GPU
    check_args(args)  # a bad flag is named as in a single process
    if args.resume is not None or args.checkpoint_every:
        raise SystemExit("--resume and --checkpoint-every work in a single process only: a checkpoint holds the "
                         "envs, reward normalizer and random state of one worker, not the others'.")
    num_envs = apply_batch_divisor(args).num_envs
    total = f"--num-envs {args.num_envs}"
    if args.batch_divisor != 1:
        total += f" / --batch-divisor {args.batch_divisor} = {num_envs}"
    if num_envs % world_size != 0:
        raise SystemExit(f"{total} is the total over all workers, so it must be a multiple of the {world_size} "
                         f"torchrun workers.")
    try:
        check_args(worker_share(args, rank, world_size))  # e.g. the minibatches now split each worker's envs
    except SystemExit as error:
        raise SystemExit(f"With {world_size} torchrun workers each one runs {num_envs // world_size} of the {total} "
                         f"envs: {error}") from None
    dist.init_process_group("nccl" if cuda else "gloo")
    if rank != 0:
        sys.stdout = open(os.devnull, "w")
    return rank, world_size


def worker_share(args: Args, rank: int, world_size: int) -> Args:
    """This worker's Args: num_envs / W envs and seed + rank * num_envs / W. A Gymnasium vector env seeds its env i
    with seed + i, so the W workers together step the very envs of a single process."""
    if world_size == 1:
        return args
    num_envs = args.num_envs // world_size
    return replace(args, num_envs=num_envs, seed=args.seed + rank * num_envs)


def workers_note(args: Args, world_size: int) -> dict:
    """The start-up block's line on the torchrun workers (args: rank 0's share); none in a single process."""
    if world_size == 1:
        return {}
    return {"workers": f"{world_size} torchrun workers ({dist.get_backend()}), each with {args.num_envs} envs and seed "
                       f"{args.seed} + {args.num_envs} x rank; the flags printed and logged are rank 0's share"}


class NoWriter:
    """The SummaryWriter of the workers other than rank 0: it writes nothing."""

    def add_scalar(self, *args, **kwargs):
        pass

    add_text = add_scalar

    def flush(self):
        pass

    close = flush


@torch.no_grad()
def broadcast_weights(*modules):
    """Copy rank 0's parameters to every worker (the workers' seeds, and so their initializations, differ)."""
    if dist.is_initialized():
        params = [p for module in modules for p in module.parameters()]
        flat = torch.cat([p.reshape(-1) for p in params])
        dist.broadcast(flat, src=0)
        for param, new in zip(params, flat.split([p.numel() for p in params])):
            param.copy_(new.view_as(param))


@torch.no_grad()
def average_gradients(*modules):
    """Replace every gradient by its mean over the workers (one all-reduce). Each worker's loss is a mean over its
    equal share of the minibatch, so this is the gradient of the whole minibatch."""
    if dist.is_initialized():
        grads = [p.grad for module in modules for p in module.parameters() if p.grad is not None]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)  # sum over workers
        flat /= dist.get_world_size()
        for grad, mean in zip(grads, flat.split([g.numel() for g in grads])):
            grad.copy_(mean.view_as(grad))


def global_batch(x):
    """x [B] of every worker, concatenated in rank order: [W * B], the same on every worker. Single process: x."""
    if not dist.is_initialized():
        return x
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts)


def gather_episodes(episodes):
    """Every worker's list of (step, return, length), merged in step order (TensorBoard discards a tag's points
    logged after a smaller step). Single process: the list itself."""
    if not dist.is_initialized():
        return episodes
    lists = [None] * dist.get_world_size()
    dist.all_gather_object(lists, episodes)
    return sorted((episode for worker in lists for episode in worker), key=lambda episode: episode[0])


def stop_workers():
    """Leave the group of workers (single process: nothing to do)."""
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    train(tyro.cli(Args, description=__doc__))
