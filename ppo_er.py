"""PPO with multi-batch experience replay (PPO-ER): Han & Sung, "Multi-Batch Experience Replay for Fast Convergence of
Continuous Action Control".

Each iteration collects a batch of N samples from the current policy, computes GAE advantages and
TD(lambda) targets for it once, and stores it with the behaviour policy's mean and std in a replay
memory R of the last L batches (eq. 11). The update runs T epochs of minibatches drawn from all N*L
stored samples, each sample's importance ratio taken against the policy that generated it (eq. 12-13).
L = 1 is PPO, on the same code path.

    python ppo_er.py                                     # PPO-ER (L = 2) on HalfCheetah-v5, 1M steps
    python ppo_er.py --replay-batches 1                  # the paper's PPO baseline
    python ppo_er.py --num-envs 8 --num-steps 256        # K = 8 actors, each N/K = 256 steps
    python ppo_er.py --env-id Pendulum-v1 --total-timesteps 100000 --norm-obs False   # CPU recipe
"""
import math
from collections import defaultdict, deque
from functools import partial
from dataclasses import dataclass
from typing import Annotated, Optional

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import tyro

import harness


@dataclass
class Args(harness.RunArgs):  # run flags: seed, device, --bf16 (off), checkpoints, resume, evaluation
    # the experiment: MuJoCo, 1M steps
    env_id: str = "HalfCheetah-v5"
    """a Gymnasium env with vector observations and continuous (Box) actions"""
    total_timesteps: int = 1_000_000
    """total environment steps"""

    # PPO-ER's hyperparameters (Table II)
    num_envs: int = 1
    """actors K (Table II: 1 or 8)"""
    num_steps: int = 2048
    """steps of each actor per iteration, N/K: the batch of N = num_envs x num_steps samples that one policy
    collects (Table II: N = 2048)"""
    num_minibatches: int = 32
    """N/M, where the paper's M is the minibatch size (in the other scripts, M counts minibatches): M = N /
    num_minibatches, M/K samples from each actor (Table II: M = 64); an epoch over L batches takes L x N/M"""
    update_epochs: int = 10
    """epochs T over the replay memory per iteration (Table II)"""
    replay_batches: int = 2
    """replay policy depth L: batches kept in memory (the paper: 2; 1 is PPO)"""
    learning_rate: float = 3e-4
    """Adam step size beta before annealing (Table II: 3e-4 alpha, alpha the annealing factor from 1 to 0)"""
    adam_eps: float = 1e-8
    """Adam epsilon"""
    anneal: bool = True
    """anneal step size and clip factor with alpha going linearly from 1 to 0 over training (Sec. V)"""
    gamma: float = 0.99
    """discount gamma"""
    gae_lambda: float = 0.95
    """TD parameter lambda of GAE and of the TD(lambda) targets"""
    clip_coef: float = 0.2
    """clipping factor epsilon before annealing (Table II: 0.2 alpha)"""
    vf_coef: float = 1.0
    """value loss coefficient c of eq. (16) (the paper: 1, separate networks)"""

    # options beyond the paper (common PPO practice where it is on)
    exp_name: str = "ppo_er"
    """name of this experiment, part of the run directory's name"""
    norm_obs: Annotated[bool, tyro.conf.FlagConversionOff] = True
    """normalize each env's observations by running statistics, then clip them to +-10 (the paper does not say)"""
    norm_reward: bool = True
    """scale rewards by a running std of the discounted return, then clip them to +-10 (common PPO practice; the
    paper does not say); --no-norm-reward: the raw rewards"""
    ent_coef: float = 0.0
    """entropy bonus coefficient (not in the paper, which uses none)"""
    max_grad_norm: Optional[float] = None
    """clip the gradient's global norm (not in the paper: off)"""
    norm_adv: bool = True
    """standardize the advantages within each minibatch (the paper does not say; common PPO practice)"""


# ------------------------------------------------------------------- the algorithm: GAE, the loss, the replay memory
def compute_gae(rewards, values, dones, next_value, next_done, gamma, gae_lambda):
    """Generalized advantage estimation (Schulman et al., 2015b): (advantages, returns = advantages + values), [T, N].
    rewards, values, dones: [T, N] (dones[t] = 1: obs t starts an episode); next_value, next_done: [N]."""
    step_rewards, step_values, step_dones = (x.cpu().numpy() for x in (rewards, values, dones))  # NumPy: 4.4x faster
    # each step's next value and whether the episode goes on into it; after the last step, the bootstrap's
    next_values = np.concatenate([step_values[1:], next_value.cpu().numpy()[None]])
    next_nonterminals = 1.0 - np.concatenate([step_dones[1:], next_done.cpu().numpy()[None]])
    advantages, last_gae = np.zeros_like(step_rewards), np.zeros_like(step_rewards[0])
    for t in reversed(range(len(step_rewards))):
        delta = step_rewards[t] + gamma * next_values[t] * next_nonterminals[t] - step_values[t]  # TD error delta_t
        last_gae = advantages[t] = delta + gamma * gae_lambda * next_nonterminals[t] * last_gae
    advantages = torch.as_tensor(advantages, device=values.device)
    return advantages, advantages + values


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


def normalize_advantages(advantages):
    """--norm-adv: advantages standardized within their minibatch (the paper does not say; torchrun: by the mean and
    std of all workers' shares of it)."""
    all_advantages = harness.global_batch(advantages)
    return (advantages - all_advantages.mean()) / (all_advantages.std() + 1e-8)


class ReplayMemory:
    """R of eq. (11): the last L batches of (s, a, A_hat, V_hat, mu, log sigma), newest last.

    push() takes one batch as a dict of [N/K, K, ...] tensors (N/K steps of each of K actors). Advantages
    and targets are computed once, when a batch is stored, and never recomputed (Sec. IV). It holds i' = i, ..., i-L+1
    (Sec. IV; eq. 11's i-L-1 is a typo), fewer than L batches in the first L-1 iterations.
    """

    def __init__(self, num_batches):
        self.batches = deque(maxlen=num_batches)

    def __len__(self):
        return len(self.batches)

    def push(self, batch):
        self.batches.append(batch)

    def data(self):
        """All stored samples flattened to [L*N, ...], oldest batch first, plus "age": [L*N]
        (0 for the newest batch, L-1 for the oldest)."""
        data = {key: torch.cat([b[key] for b in self.batches]).flatten(0, 1) for key in self.batches[0]}
        num_steps, num_envs = self.batches[0]["advantages"].shape
        ages = torch.arange(len(self) - 1, -1, -1, device=data["advantages"].device)
        data["age"] = ages.repeat_interleave(num_steps * num_envs)
        return data

    def minibatch_indices(self, minibatch_size):
        """One epoch: index tensors [M] into data() that visit every stored sample exactly once.

        Each minibatch holds M/K samples of each actor k, drawn from R_k (Algorithm 1, lines 10-13) without
        replacement within the epoch: M/K consecutive rows of each column's shuffle.
        """
        num_steps, num_envs = self.batches[0]["advantages"].shape
        device = self.batches[0]["advantages"].device
        rows, per_actor = len(self) * num_steps, minibatch_size // num_envs
        shuffled_rows = torch.argsort(torch.rand(rows, num_envs, device=device), dim=0)  # column k: a shuffle of R_k
        flat = shuffled_rows * num_envs + torch.arange(num_envs, device=device)  # [row, k] -> row * K + k
        return list(flat.reshape(rows // per_actor, per_actor * num_envs))


def gradient_step(optimizer, loss, *modules, max_grad_norm=None, noise_scale=None) -> None:
    """One Adam step on the loss for `modules` (torchrun: on the workers' mean gradient), its norm <= max_grad_norm."""
    optimizer.zero_grad()
    loss.backward()
    if noise_scale is not None:
        noise_scale.add(*modules)
    harness.average_gradients(*modules)  # torchrun: the mean over the workers; one process: nothing
    if max_grad_norm is not None:
        nn.utils.clip_grad_norm_([p for module in modules for p in module.parameters()], max_grad_norm)
    optimizer.step()


# ------------------------------------------------------------------------------------------------------ training
def train(args: Args) -> dict:
    if args.eval_checkpoint is not None:
        return harness.evaluate(args, SCRIPT)
    args, checkpoint = harness.run_flags(args, SCRIPT)  # each checked; with --resume, the checkpoint's
    batch_size = args.num_envs * args.num_steps  # N = K actors x N/K steps, over all torchrun workers
    num_iterations = math.ceil(args.total_timesteps / batch_size)  # the last one may run past --total-timesteps
    run = harness.start(SCRIPT, args, checkpoint, num_iterations)  # checks, torchrun workers, seeds, device
    envs = run.open(make_env(run.args, run.render_mode))  # made after the seeding; then run dir, logs, start-up
    # run.args: args in one process; under torchrun this worker's share, K / W actors and a seed of its own. Each
    # worker's replay memory holds its own actors' batches: the memory R of the paper is their union
    args, device, writer = run.args, run.device, run.writer
    minibatch_size = args.num_envs * args.num_steps // args.num_minibatches  # M / W on each of the W workers

    agent = Agent(envs).to(device)
    harness.broadcast_weights(agent)  # torchrun: every worker starts from rank 0's weights
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=args.adam_eps, foreach=True)
    replay = ReplayMemory(args.replay_batches)
    obs_shape, action_shape = envs.single_observation_space.shape, envs.single_action_space.shape
    action_low = torch.as_tensor(envs.single_action_space.low, device=device)
    action_high = torch.as_tensor(envs.single_action_space.high, device=device)

    rollout_shape = (args.num_steps, args.num_envs)  # [N/K, K]: steps of the K actors ([T, N] of compute_gae)
    obs = torch.zeros(rollout_shape + obs_shape, device=device)
    actions, behav_means, behav_log_stds = (torch.zeros(rollout_shape + action_shape, device=device) for _ in range(3))
    rewards, dones, values = (torch.zeros(rollout_shape, device=device) for _ in range(3))

    next_obs, _ = envs.reset(seed=args.seed)
    next_obs = torch.as_tensor(next_obs, dtype=torch.float32, device=device)
    next_done = torch.zeros(args.num_envs, device=device)
    # what a checkpoint holds besides the env stack's state and statistics and the RNGs; --resume restores it
    batch = {"obs": obs, "actions": actions, "advantages": rewards, "returns": rewards, "behav_mean": behav_means,
             "behav_log_std": behav_log_stds}  # what each stored batch holds: a checkpoint's are checked against it
    saved = harness.Saved(models={"agent": agent}, optimizers={"optimizer": optimizer},
                              keys={"replay": deque([batch], maxlen=args.replay_batches)})
    global_step, first_iteration, next_obs, next_done = run.restore(saved, next_obs, next_done)  # with --resume
    if run.checkpoint is not None:  # the stored batches
        replay.batches.extend(run.restored("replay"))

    for iteration in range(first_iteration, num_iterations + 1):
        # step size beta = 3e-4 alpha and clip factor epsilon = 0.2 alpha (Table II)
        learning_rate, clip_coef = args.learning_rate, args.clip_coef
        if args.anneal:
            learning_rate = linear_schedule(args.learning_rate, iteration, num_iterations)
            clip_coef = linear_schedule(args.clip_coef, iteration, num_iterations)
        optimizer.param_groups[0]["lr"] = learning_rate

        # rollout: Algorithm 1, line 3: K actors, N/K steps each
        for step in range(args.num_steps):
            global_step += args.num_envs * run.world_size
            obs[step], dones[step] = next_obs, next_done
            with torch.no_grad():
                step_pi, values[step] = agent.get_pi(next_obs), agent.get_value(next_obs)
            run.check_policy(step_pi)  # finite, or the run stops in one sentence
            mean, log_std = step_pi.chunk(2, dim=-1)
            action = mean + log_std.exp() * torch.randn_like(mean)  # a ~ N(mu(s), sigma^2), eq. (10)
            actions[step], behav_means[step], behav_log_stds[step] = action, mean, log_std

            # the env sees the action clipped to its bounds; log-probabilities use the sampled one
            env_action = torch.clamp(action, action_low, action_high).cpu().numpy()
            next_obs_np, reward, terminated, truncated, info = envs.step(env_action)
            rewards[step] = torch.as_tensor(reward, dtype=torch.float32, device=device)
            # time-limit truncation is not termination: bootstrap with gamma * V(final obs) (not in the paper)
            truncated_only = np.flatnonzero(truncated & ~terminated)
            if truncated_only.size:
                final_obs = torch.as_tensor(np.stack(info["final_obs"][truncated_only]), dtype=torch.float32,
                                            device=device)
                with torch.no_grad():
                    rewards[step, truncated_only] += args.gamma * agent.get_value(final_obs)
            next_obs = torch.as_tensor(next_obs_np, dtype=torch.float32, device=device)
            next_done = torch.as_tensor(terminated | truncated, dtype=torch.float32, device=device)
            run.after_step(global_step, info)  # finished episodes, progress
        run.end_rollout()  # the rollout's episodes to TensorBoard

        # A_hat (eq. 14) and V_hat = A_hat + V (eq. 15), computed once for this batch (lines 4-5)
        with torch.no_grad():
            next_value = agent.get_value(next_obs)
        advantages, returns = compute_gae(rewards, values, dones, next_value, next_done, args.gamma, args.gae_lambda)
        # line 6: obs are stored as normalized at collection, the very inputs behind the stored mu and sigma
        replay.push({"obs": obs.clone(), "actions": actions.clone(), "advantages": advantages, "returns": returns,
                     "behav_mean": behav_means.clone(), "behav_log_std": behav_log_stds.clone()})

        # denominator of eq. (13) for all N*L stored samples: each sample's own behaviour policy, from its stored mu
        # and sigma
        data = replay.data()
        b_behav_logps = gaussian_log_prob(data["actions"], data["behav_mean"], data["behav_log_std"])
        b_obs, b_actions, b_advantages, b_returns = data["obs"], data["actions"], data["advantages"], data["returns"]
        b_fresh = data["age"] == 0  # logging only: clipfrac of fresh and replayed samples (Sec. III-B's bias)

        # update: lines 8-16
        stats = defaultdict(list)  # name -> per-minibatch values, averaged once per iteration
        ratio_max = torch.zeros((), device=device)
        clipped, counted = torch.zeros(2, device=device), torch.zeros(2, device=device)  # [fresh, replayed]
        for epoch in range(args.update_epochs):  # lines 8-16: T epochs of NL/M minibatches
            run.updating(f"epoch {epoch + 1}/{args.update_epochs}")
            for mb_inds in replay.minibatch_indices(minibatch_size):
                # the minibatch's pi and V under theta
                mb_obs, mb_behav_logp, mb_advantages = b_obs[mb_inds], b_behav_logps[mb_inds], b_advantages[mb_inds]
                mean, log_std = agent.get_pi(mb_obs).chunk(2, dim=-1)
                new_logp = gaussian_log_prob(b_actions[mb_inds], mean, log_std)
                new_value = agent.get_value(mb_obs)
                mb_advantages = normalize_advantages(mb_advantages) if args.norm_adv else mb_advantages  # --norm-adv

                # the loss: -L^CLIP-ER (eq. 12) + c L^V (eq. 16); the entropy term is --ent-coef's (0, as in the paper)
                pg_loss = ppo_er_loss(new_logp, mb_behav_logp, mb_advantages, clip_coef)
                v_loss = ((new_value - b_returns[mb_inds]) ** 2).mean()  # L^V: MSE to the TD(lambda) targets
                entropy_loss = gaussian_entropy(log_std).mean()
                loss = pg_loss + args.vf_coef * v_loss - args.ent_coef * entropy_loss  # -L of eq. (16)
                harness.check_finite(iteration, policy_loss=pg_loss, value_loss=v_loss, entropy=entropy_loss)

                # one Adam step on theta (the two networks share no weight: eq. (16) optimized separately)
                gradient_step(optimizer, loss, agent, max_grad_norm=args.max_grad_norm)

                # statistics, over the iteration's minibatches
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

        # logging
        writer.add_scalar("charts/learning_rate", learning_rate, global_step)
        writer.add_scalar("charts/clip_coef", clip_coef, global_step)
        writer.add_scalar("charts/replay_batches", len(replay), global_step)
        for name, vals in stats.items():
            writer.add_scalar(f"losses/{name}", torch.stack(vals).mean().item(), global_step)
        writer.add_scalar("losses/ratio_max", ratio_max.item(), global_step)
        writer.add_scalar("losses/clipfrac", (clipped.sum() / counted.sum()).item(), global_step)
        writer.add_scalar("losses/clipfrac_fresh", (clipped[0] / counted[0]).item(), global_step)
        if counted[1] > 0:
            writer.add_scalar("losses/clipfrac_replayed", (clipped[1] / counted[1]).item(), global_step)
        explained_var = explained_variance(values.reshape(-1), returns.reshape(-1))  # of this iteration's batch
        writer.add_scalar("losses/explained_variance", explained_var, global_step)
        run.end_iteration(iteration, global_step, next_obs, next_done, replay=list(replay.batches))  # SPS, checkpoint
    return run.finish(iteration, global_step, next_obs, next_done, replay=list(replay.batches))  # --save-model


# ------------------------------------------------------------------------------------------------------ networks
def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    """CleanRL's orthogonal init, for the MLPs of vector observations (the papers' official code has none)."""
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias_const)
    return layer


def mlp(in_dim, out_dim, out_std):  # 64-64 tanh
    return nn.Sequential(layer_init(nn.Linear(in_dim, 64)), nn.Tanh(), layer_init(nn.Linear(64, 64)), nn.Tanh(),
                         layer_init(nn.Linear(64, out_dim), std=out_std))


class Agent(nn.Module):
    """Policy N(mu(s; phi), sigma^2) with a state-independent sigma, and a separate value network V(s) (Sec. IV). The
    policy's parameters pi, [B, P]: the mean and log-std side by side."""

    def __init__(self, envs):
        super().__init__()
        obs_dim = int(np.prod(envs.single_observation_space.shape))
        action_dim = int(np.prod(envs.single_action_space.shape))
        self.actor_mean = mlp(obs_dim, action_dim, out_std=0.01)
        self.actor_log_std = nn.Parameter(torch.zeros(action_dim))  # log sigma, one per action dim
        self.critic = mlp(obs_dim, 1, out_std=1.0)

    def get_value(self, obs):
        return self.critic(obs).squeeze(-1)

    def get_pi(self, obs):
        mean = self.actor_mean(obs)
        return torch.cat([mean, self.actor_log_std.expand_as(mean)], dim=-1)


# --------------------------------------------------------------------------------------------------- environment
def make_env(args: Args, render_mode=None) -> gym.vector.VectorEnv:
    """The K actors' envs. Each resets a finished episode inside the step that ended it (SAME_STEP autoreset):
    next_obs is the new episode's first observation, info["final_obs"] the finished one's last, which train()
    bootstraps from. Rewards are scaled by Gymnasium's NormalizeReward, as SB3's and CleanRL's PPO do (the batch
    size-invariance scripts use the official code's RewardNormalizer instead), after the raw-score episode
    statistics are recorded."""
    # Dict, Tuple and n-D Box observations (images too) flattened, ints as float32
    wrappers = [partial(harness.vector_observations, images=False)]
    if args.norm_obs:  # by each env's running mean and std, inside the autoreset so that final_obs is too; +-10
        wrappers += [gym.wrappers.NormalizeObservation, clip_observations]
    envs = gym.make_vec(args.env_id, num_envs=args.num_envs, vectorization_mode="sync", wrappers=wrappers,
                        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
                        **({"render_mode": render_mode} if render_mode else {}))
    envs = gym.wrappers.vector.RecordEpisodeStatistics(envs)  # raw return, before reward scaling
    if args.norm_reward:  # not in the paper: scaled, then clipped to +-10 as a guard (raw rewards stay as they are)
        envs = gym.wrappers.vector.ClipReward(gym.wrappers.vector.NormalizeReward(envs, gamma=args.gamma), -10.0, 10.0)
    return envs


def clip_observations(env: gym.Env) -> gym.Env:
    return gym.wrappers.TransformObservation(env, lambda obs: np.clip(obs, -10.0, 10.0), None)


# ------------------------------------------------------------------------------------------ policy distributions
def gaussian_log_prob(actions, mean, log_std):
    """log N(a; mu, sigma^2) summed over action dims. actions, mean: [B, A]; log_std: [B, A] or [A]. Returns [B]."""
    return (-0.5 * ((actions - mean) / log_std.exp()) ** 2 - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)


def gaussian_entropy(log_std):
    """Entropy of a diagonal Gaussian, summed over action dims. log_std: [B, A]. Returns [B]."""
    return (log_std + 0.5 * math.log(2 * math.pi * math.e)).sum(-1)


# ---------------------------------------------------------------------------------------- what train() logs
def explained_variance(values, returns) -> float:
    """1 - Var[returns - values] / Var[returns], nan where the returns do not vary."""
    return (1 - (returns - values).var() / returns.var()).item() if returns.var() > 0 else float("nan")


# ---------------------------------------------------------- what the run harness needs to know of this script
FLAG_RANGES = {  # the interval each numeric flag of this script must lie in (harness.py: the common ones)
    "replay_batches": "[1, inf)", "clip_coef": "(0, 1]", "vf_coef": "[0, inf)", "ent_coef": "[0, inf)",
    "max_grad_norm": "(0, inf)",
}


def check_args(args: Args, observation_space, action_space) -> None:
    """This script's own checks of the run's Args."""
    if args.num_steps % args.num_minibatches != 0:
        raise SystemExit(f"--num-minibatches {args.num_minibatches} must divide --num-steps {args.num_steps}: each "
                         f"minibatch takes M/K = num_steps / num_minibatches samples of each of the K actors.")
    # per sample: obs, action, behaviour mean and log-std (float32) and reward, done, value in the rollout; obs,
    # action, mean, log-std, advantage, target in each of the L stored batches and in their concatenation
    floats = observation_space.shape[0] + 3 * action_space.shape[0]
    sample_bytes = 4 * ((floats + 3) + 2 * args.replay_batches * (floats + 2))
    harness.check_memory(args.num_envs * args.num_steps * sample_bytes, args.cuda, "The rollout and replay buffers",
                         "--num-envs, --num-steps or --replay-batches")


def describe(args: Args, num_iterations: int) -> str:
    """The start-up block's line on the run's size, with the paper's N, M and L."""
    batch_size = args.num_envs * args.num_steps
    return (harness.describe(args, num_iterations) + f"; N = {batch_size:,}, M = "
            f"{batch_size // args.num_minibatches}, L = {args.replay_batches}")


def acting_policy(args: Args, envs, load, device):
    """The checkpoint's policy network as obs -> actions, sampled or (--eval-deterministic) the mean (the harness clips
    them to the bounds, as training does)."""
    agent = Agent(envs).to(device)
    load(agent, "agent")  # the checkpoint's weights, checked

    def act(obs, reward, done):  # (the last step's reward and done: unused)
        pi = agent.get_pi(obs)
        harness.check_policy(pi)
        mean, log_std = pi.chunk(2, dim=-1)
        return mean if args.eval_deterministic else mean + log_std.exp() * torch.randn_like(mean)
    return act


SCRIPT = harness.Script(file=__file__, doc=__doc__, args_type=Args, make_env=make_env, acting_policy=acting_policy,
                        flag_ranges=FLAG_RANGES, check_args=check_args, describe=describe,
                        worker_share=harness.worker_share, actions="continuous", images=False,
                        checkpoint_keys=("replay",))


if __name__ == "__main__":
    train(tyro.cli(Args, description=__doc__))
