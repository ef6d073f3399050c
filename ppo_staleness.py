"""PPO on artificially stale data, three objectives (Fig. 1): Hilton, Cobbe & Schulman, "Batch size-invariance for
policy optimization" (2021), Sec. 5.1.

Each rollout waits in a queue and is trained on `--staleness k` iterations after it was collected.
PPO's pi_old is then ambiguous: the recent policy (the weights before this iteration's updates) or
the behaviour policy (which collected the data k iterations ago). `--objective` picks one of:
  recent     pi_recent for importance sampling and for clipping (Fig. 1a: biased, unstable)
  decoupled  pi_recent as the proximal policy, pi_behav for importance sampling (Fig. 1b)
  behavior   pi_behav for both (Fig. 1c: plain PPO on stale data, held back by old clipping)

    python ppo_staleness.py                                    # decoupled, staleness 4, starpilot hard
    python ppo_staleness.py --objective recent --staleness 8   # one point of Fig. 1a
    python ppo_staleness.py --env-id CartPole-v1 --num-envs 8 --num-steps 32 --num-minibatches 4 \\
        --update-epochs 4 --learning-rate 1e-3 --gamma 0.99 --total-timesteps 60000 --staleness 8 \\
        --objective decoupled                                  # CPU recipe: about 450 of 500, 10 s here
"""
import math
from collections import defaultdict, deque
from dataclasses import dataclass
from typing import Literal, NamedTuple, Optional

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import tyro

import harness


@dataclass
class Args(harness.RunArgs):  # run flags: seed, device, --bf16 (off), checkpoints, resume, evaluation
    # the paper's experiment (Sec. 5.1): Procgen, 100M steps
    env_id: str = "starpilot"
    """a Procgen game, or a Gymnasium env with vector observations and discrete actions (CartPole-v1)"""
    distribution_mode: Literal["easy", "hard"] = "hard"
    """Procgen difficulty (the paper: hard)"""
    num_levels: int = 0
    """Procgen levels to train on; 0 means unlimited"""
    start_level: int = 0
    """Procgen's first level seed"""
    total_timesteps: int = 100_000_000
    """environment steps trained on (the paper: 100M); the k warm-up rollouts of --staleness are collected on top"""

    # staleness and the three objectives of Fig. 1
    staleness: int = 4
    """k: train on each rollout k iterations after it was collected (0: plain PPO); the k warm-up rollouts are
    extra, as in the official code: the run trains on total_timesteps of data and collects k batches more"""
    objective: Literal["recent", "decoupled", "behavior"] = "decoupled"
    """which policy is pi_old: recent (Fig. 1a), decoupled prox=recent/IS=behav (Fig. 1b), behavior (Fig. 1c)"""

    # PPO's hyperparameters (Table 1)
    num_envs: int = 256
    """parallel environments N, the total over all torchrun workers (the paper: 4 workers x 64)"""
    num_steps: int = 256
    """timesteps per rollout T"""
    num_minibatches: int = 8
    """minibatches per epoch M: each holds N/M envs' whole trajectories (official layout), so M divides N,
    or M is a multiple of N that cuts each trajectory into M/N equal time chunks"""
    update_epochs: int = 3
    """policy epochs E"""
    learning_rate: float = 5e-4
    """Adam step size alpha"""
    adam_eps: float = 1e-8
    """Adam epsilon"""
    adam_beta1: float = 0.9
    """Adam beta1"""
    adam_beta2: float = 0.999
    """Adam beta2"""
    gamma: float = 0.999
    """discount gamma"""
    gae_lambda: float = 0.95
    """GAE bootstrapping parameter lambda"""
    clip_coef: float = 0.2
    """clipping parameter epsilon"""
    ent_coef: float = 0.01
    """entropy coefficient"""
    vf_coef: float = 0.5
    """value function coefficient c_VF (Table 1): the value loss is c_VF * mean((V - V_targ)^2)"""
    max_is_ratio: float = 100.0
    """cap on the importance weight pi/pi_behav (Appendix B, for the staleness experiments)"""
    norm_reward: bool = True
    """divide rewards by the running std of a discounted return, then clip them to +-10 (official code)"""
    reward_norm_gamma: float = 0.99
    """discount of the return whose std normalizes rewards: 0.99 in the paper's official code, fixed and
    separate from --gamma"""
    norm_adv: bool = True
    """normalize advantages with the mean and std of the whole batch"""

    # options beyond the paper, off by default
    exp_name: str = "ppo_staleness"
    """name of this experiment, part of the run directory's name (with objective and staleness)"""
    shuffle_samples: bool = False
    """shuffle single samples into minibatches instead of whole env trajectories (not the paper's layout)"""
    max_grad_norm: Optional[float] = None
    """clip the gradient's global norm (off: a clipped norm depends on the batch size)"""


# ------------------------------------------------------------------- the algorithm: losses, GAE, the stale queue
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


def decoupled_clip_loss(new_logp, prox_logp, behav_logp, advantages, clip_coef, max_is_ratio=100.0):
    """-L^CLIP_decoupled (Sec. 2), the mean of -r_prox min(r_t A, clip(r_t, 1-eps, 1+eps) A), r_t = pi/pi_prox and
    r_prox = pi_prox/pi_behav: as r_prox > 0 and r_prox r_t = pi/pi_behav, -min((pi/pi_behav) A, r_prox clip(r_t) A).
    All [B], only new_logp with gradient. With prox_logp == behav_logp: PPO's loss where the cap does not bind."""
    prox_logp = prox_logp.detach()
    # Appendix B's cap pi/pi_behav <= max_is_ratio: raising log pi_behav lowers both terms alike; pi keeps its gradient
    behav_logp = torch.maximum(behav_logp.detach(), new_logp.detach() - math.log(max_is_ratio))
    log_is_ratio = new_logp - behav_logp  # log(pi/pi_behav) = log(r_prox r_t)
    log_clipped = torch.clamp(new_logp - prox_logp, math.log(1 - clip_coef), math.log(1 + clip_coef))  # clip(r_t)
    # r_prox clip(r_t) summed in log space, as the official code: a huge r_t times a tiny r_prox cannot overflow
    log_r_prox_clipped = log_clipped + prox_logp - behav_logp
    return -torch.min(torch.exp(log_is_ratio) * advantages, torch.exp(log_r_prox_clipped) * advantages).mean()


def value_loss(values, returns):
    """L^VF = mean((V - V_targ)^2), values and returns [B]; the total loss weights it by c_VF (0.5, Table 1)."""
    return ((values - returns) ** 2).mean()


class RewardNormalizer:
    """The official code's reward scaling: r / sqrt(Var[R] + 1e-8), clipped to +-clip, mean not subtracted; R_t = r_t +
    gamma R_{t-1}, each env's discounted return restarted at episode starts, Var[R] over every R, once per rollout."""

    def __init__(self, num_envs, gamma, clip=10.0):
        self.gamma, self.clip = gamma, clip
        self.returns = torch.zeros(num_envs)  # each env's R so far
        self.mean, self.var, self.count = 0.0, 1.0, 1e-4  # prior: a tiny sample with mean 0 and variance 1

    def __call__(self, rewards, dones, gather=None):
        """rewards, dones: [T, N] (dones[t] = 1: obs t starts an episode) -> scaled rewards; gather: all workers' R."""
        raw_rewards, raw_dones = rewards.cpu().numpy(), dones.cpu().numpy()  # the loop on NumPy, as compute_gae's
        returns, ret = np.zeros_like(raw_rewards), self.returns.cpu().numpy()
        for t in range(len(raw_rewards)):
            ret = returns[t] = raw_rewards[t] + self.gamma * (1.0 - raw_dones[t]) * ret
        self.returns = torch.as_tensor(ret)
        returns = torch.as_tensor(returns, device=rewards.device).reshape(-1)
        returns = returns if gather is None else gather(returns)
        n, batch_mean, batch_var = returns.numel(), returns.mean().item(), returns.var(unbiased=False).item()
        total, delta = self.count + n, batch_mean - self.mean  # merge the two samples' moments (Chan et al.)
        self.var = (self.var * self.count + batch_var * n + delta**2 * self.count * n / total) / total
        self.mean, self.count = self.mean + delta * n / total, total
        return torch.clamp(rewards / math.sqrt(self.var + 1e-8), -self.clip, self.clip)


def minibatch_indices(num_steps, num_envs, num_minibatches, generator=None):
    """The official minibatches: whole env trajectories, envs shuffled; M LongTensors of flat indices t*N + n.
    M <= N: minibatch i holds the T-step trajectories of the i-th group of N/M shuffled envs (T = 2, N = 4, M = 2,
    envs shuffled to 2, 0, 3, 1: [2, 6, 0, 4], [3, 7, 1, 5]). M > N: each trajectory is cut into M/N time chunks,
    one per minibatch, env by env (T = 4, N = 2, M = 4, no shuffle: [0, 2], [4, 6], [1, 3], [5, 7])."""
    envs = torch.randperm(num_envs, generator=generator)
    chunks = max(1, num_minibatches // num_envs)  # time chunks per trajectory
    groups = envs.reshape(num_minibatches // chunks, -1)  # [env groups, envs per minibatch]
    steps = torch.arange(num_steps).reshape(chunks, -1)  # [chunks, steps per chunk]
    # inds[g, c, e, s] = t * N + n for env n = groups[g, e] at its chunk c's s-th step t = steps[c, s]
    inds = steps[None, :, None, :] * num_envs + groups[:, None, :, None]  # [groups, chunks, envs, steps]
    return list(inds.reshape(num_minibatches, -1))


def epoch_minibatches(args: Args) -> list:
    """One epoch's minibatches of flat indices: whole env trajectories (official layout) or shuffled samples."""
    if args.shuffle_samples:
        return list(torch.randperm(args.num_envs * args.num_steps).chunk(args.num_minibatches))
    return minibatch_indices(args.num_steps, args.num_envs, args.num_minibatches)


class StaleQueue:
    """Artificial staleness (Sec. 5.1): push(rollout) returns the rollout pushed `staleness` pushes
    earlier, or None while warming up (staleness 0 returns the rollout just pushed)."""

    def __init__(self, staleness):
        self.staleness = staleness
        self.rollouts = deque()

    def push(self, rollout):
        self.rollouts.append(rollout)
        return self.rollouts.popleft() if len(self.rollouts) > self.staleness else None


def select_logps(objective, behav_logp, recent_logp):
    """(prox_logp, is_logp) of Fig. 1: the policy that clips and the one that importance-samples.

    behav_logp, recent_logp: [B]. recent -> (recent, recent) (a); decoupled -> (recent, behav) (b);
    behavior -> (behav, behav) (c). Only "decoupled" is both unbiased and recent.
    """
    if objective == "recent":
        return recent_logp, recent_logp
    if objective == "decoupled":
        return recent_logp, behav_logp
    if objective == "behavior":
        return behav_logp, behav_logp
    raise ValueError(f"unknown objective {objective!r}; expected recent, decoupled or behavior")


class Rollout(NamedTuple):
    """One iteration's data, self-contained so that it can be trained on k iterations later."""

    obs: torch.Tensor  # [T, N, *obs_shape], the env's dtype
    actions: torch.Tensor  # [T, N]
    behav_pis: torch.Tensor  # [T, N, A], pi_behav's logits
    behav_logps: torch.Tensor  # [T, N]
    values: torch.Tensor  # [T, N], V predicted at collection time
    rewards: torch.Tensor  # [T, N], raw: normalized when the rollout is trained on, as officially
    bootstraps: torch.Tensor  # [T, N], gamma V(final obs) at time-limit truncations, else 0
    dones: torch.Tensor  # [T, N]
    next_obs: torch.Tensor  # [N, *obs_shape], the observation after the rollout's last step
    next_done: torch.Tensor  # [N]


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
    batch_size = args.num_envs * args.num_steps  # N x T, over all torchrun workers
    minibatch_size = batch_size // args.num_minibatches
    num_iterations = math.ceil(args.total_timesteps / batch_size)  # trained on; the last may run past the steps
    last_iteration = count_iterations(args, num_iterations, checkpoint)  # k warm-up rollouts, then the trained ones
    run = harness.start(SCRIPT, args, checkpoint, last_iteration)  # checks, torchrun workers, seeds, device
    envs = run.open(make_env(run.args, run.render_mode))  # made after the seeding; then run dir, logs, start-up
    # run.args: args in one process; under torchrun this worker's share, N / W envs and a seed of its own
    args, device, writer = run.args, run.device, run.writer
    recent_chunk_size = 64 if device.type == "cpu" else minibatch_size  # CPU: bounds memory, same numbers

    agent = Agent(envs, args.bf16).to(device)
    harness.broadcast_weights(agent)  # torchrun: every worker starts from rank 0's weights
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=args.adam_eps,
                                 betas=(args.adam_beta1, args.adam_beta2), foreach=True)
    queue = StaleQueue(args.staleness)
    reward_normalizer = RewardNormalizer(args.num_envs, args.reward_norm_gamma) if args.norm_reward else None
    num_actions = envs.single_action_space.n
    obs_shape = envs.single_observation_space.shape
    obs_dtype = harness.obs_dtype(envs)

    next_obs, _ = envs.reset(seed=args.seed)
    next_obs = torch.as_tensor(next_obs, dtype=obs_dtype, device=device)
    next_done = torch.zeros(args.num_envs, device=device)
    # what a checkpoint holds besides the envs and RNGs, restored with --resume (not the queue: see count_iterations)
    saved = harness.Saved(models={"agent": agent}, optimizers={"optimizer": optimizer},
                              normalizers={"reward": reward_normalizer}, keys={"trained_steps": 0, "queued": 0})
    global_step, first_iteration, next_obs, next_done = run.restore(saved, next_obs, next_done)
    trained_steps = run.restored("trained_steps")

    for iteration in range(first_iteration, last_iteration + 1):
        # fresh storage every iteration: the queue keeps each rollout until it is trained on
        rollout_shape = (args.num_steps, args.num_envs)  # [T, N]
        obs = torch.zeros(rollout_shape + obs_shape, dtype=obs_dtype, device=device)
        actions = torch.zeros(rollout_shape, dtype=torch.long, device=device)
        behav_pis = torch.zeros(rollout_shape + (num_actions,), device=device)
        behav_logps, rewards, dones, values = (torch.zeros(rollout_shape, device=device) for _ in range(4))
        bootstraps = torch.zeros(rollout_shape, device=device)  # gamma V(final obs) at truncations

        # rollout: T steps of the N envs with the current weights, which become pi_behav once the rollout is stale
        for step in range(args.num_steps):
            global_step += args.num_envs * run.world_size
            obs[step], dones[step] = next_obs, next_done
            with torch.no_grad():
                step_pi, values[step] = agent(next_obs)
            run.check_policy(step_pi)  # finite, or the run stops in one sentence
            action = torch.distributions.Categorical(logits=step_pi, validate_args=False).sample()
            actions[step], behav_pis[step] = action, step_pi
            behav_logps[step] = categorical_log_prob_and_entropy(step_pi, action)[0]

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
            run.after_step(global_step, info)  # finished episodes, progress
        run.end_rollout()  # the rollout's episodes to TensorBoard (torchrun: all workers')

        # queued rollouts wait in host memory, which holds many more of them than a GPU would
        rollout = Rollout(obs, actions, behav_pis, behav_logps, values, rewards, bootstraps, dones, next_obs, next_done)
        stale = queue.push(Rollout(*(x.cpu() for x in rollout)))
        if stale is None:  # warm-up: the first k iterations only collect
            run.end_iteration(iteration, global_step, next_obs, next_done, queued=len(queue.rollouts),
                              trained_steps=trained_steps)
            continue
        stale = Rollout(*(x.to(device) for x in stale))
        trained_steps += batch_size

        # advantages of a stale rollout as in the official code (the paper is silent): the value predictions stored
        # when it was collected, and the current model's V(s_T) at its end; the bootstraps, gamma V in the units of
        # scaled rewards, are added after the scaling
        with torch.no_grad():
            next_value = agent.get_value(stale.next_obs)
        # rewards scaled once per trained rollout, in collection order, as officially (torchrun: one estimate)
        scaled_rewards = (reward_normalizer(stale.rewards, stale.dones, harness.global_batch) if reward_normalizer
                          else stale.rewards)
        advantages, returns = compute_gae(scaled_rewards + stale.bootstraps, stale.values, stale.dones, next_value,
                                          stale.next_done, args.gamma, args.gae_lambda)

        # the batch, its advantages normalized with the whole batch's mean and std
        b_obs = stale.obs.reshape((-1,) + obs_shape)
        b_actions, b_behav_pis = stale.actions.reshape(-1), stale.behav_pis.reshape(-1, num_actions)
        b_behav_logps, b_advantages = stale.behav_logps.reshape(-1), advantages.reshape(-1)
        b_returns, b_values = returns.reshape(-1), stale.values.reshape(-1)
        if args.norm_adv:  # full-batch normalization
            all_advantages = harness.global_batch(b_advantages)  # torchrun: all workers' advantages
            b_advantages = (b_advantages - all_advantages.mean()) / (all_advantages.std(unbiased=False) + 1e-8)

        # pi_recent: the weights before this iteration's updates, computed once and held fixed.
        # With k = 0 they are the weights that just collected the rollout: pi_recent = pi_behav.
        if args.staleness == 0:  # the same weights give the same logits: no forward pass
            b_recent_pis, b_recent_logps = b_behav_pis, b_behav_logps
        else:
            b_recent_pis = harness.in_chunks(agent.get_pi, b_obs, recent_chunk_size)
            b_recent_logps = categorical_log_prob_and_entropy(b_recent_pis, b_actions)[0]
        b_prox_logps, b_is_logps = select_logps(args.objective, b_behav_logps, b_recent_logps)

        # update: E epochs of M minibatches on the objective's L^CLIP
        stats = defaultdict(list)  # name -> per-minibatch values, averaged once per iteration
        for epoch in range(args.update_epochs):
            run.updating(f"epoch {epoch + 1}/{args.update_epochs}")
            for mb_inds in epoch_minibatches(args):
                # the minibatch's pi and V under theta, and the two policies the objective picked
                mb_inds = mb_inds.to(device)
                new_pi, new_value = agent(b_obs[mb_inds])
                new_logp, entropy = categorical_log_prob_and_entropy(new_pi, b_actions[mb_inds])
                prox_logp, is_logp = b_prox_logps[mb_inds], b_is_logps[mb_inds]

                # L^CLIP_decoupled with pi_prox, pi_behav := the two policies the objective picked; the cap acts on
                # the importance weight pi/pi_is, as the official code's
                pg_loss = decoupled_clip_loss(new_logp, prox_logp, is_logp, b_advantages[mb_inds],
                                              args.clip_coef, args.max_is_ratio)
                v_loss = value_loss(new_value, b_returns[mb_inds])
                entropy_loss = entropy.mean()
                loss = pg_loss - args.ent_coef * entropy_loss + args.vf_coef * v_loss
                harness.check_finite(iteration, policy_loss=pg_loss, value_loss=v_loss, entropy=entropy_loss)

                # one Adam step on theta (torchrun: on the workers' mean gradient)
                gradient_step(optimizer, loss, agent, max_grad_norm=args.max_grad_norm)

                # statistics, averaged over the iteration's minibatches
                with torch.no_grad():
                    logratio = new_logp - prox_logp
                    for name, value in (
                        ("policy_loss", pg_loss), ("value_loss", v_loss), ("entropy", entropy_loss),
                        ("approx_kl", ((logratio.exp() - 1) - logratio).mean()),  # k3 estimate of KL to pi_prox
                        ("clipfrac", ((logratio.exp() - 1).abs() > args.clip_coef).float().mean()),
                        ("is_capped_frac", (new_logp - is_logp > math.log(args.max_is_ratio)).float().mean()),
                        # exact KL[pi_behav || pi] and KL[pi_recent || pi] over the minibatch's states
                        ("kl_behav", categorical_kl(b_behav_pis[mb_inds], new_pi).mean()),
                        ("kl_recent", categorical_kl(b_recent_pis[mb_inds], new_pi).mean()),
                    ):
                        stats[name].append(value.detach())

        # logging
        writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
        for name, vals in stats.items():
            writer.add_scalar(f"losses/{name}", torch.stack(vals).mean().item(), global_step)
        writer.add_scalar("losses/explained_variance", explained_variance(b_values, b_returns), global_step)
        run.end_iteration(iteration, global_step, next_obs, next_done, queued=len(queue.rollouts),
                          trained_steps=trained_steps)  # SPS, checkpoint
    result = run.finish(iteration, global_step, next_obs, next_done, queued=len(queue.rollouts),
                        trained_steps=trained_steps)  # --save-model
    return {**result, "trained_steps": trained_steps}


# ------------------------------------------------------------------------------------------------------ networks
def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    """CleanRL's orthogonal init, for the MLPs of vector observations (the papers' official code has none)."""
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias_const)
    return layer


@torch.no_grad()
def normed_init(layer, scale):
    """The official code's init: each output unit's weights (a row, a filter) rescaled to L2 norm `scale`, biases 0."""
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
        self.res0, self.res1 = ResidualBlock(out_channels, res_scale), ResidualBlock(out_channels, res_scale)

    def forward(self, x):
        return self.res1(self.res0(self.pool(self.conv(x))))


class ImpalaCNN(nn.Module):
    """IMPALA CNN (Espeholt et al., 2018): [B, 64, 64, 3] uint8 -> [B, 256] float32. --bf16: convolutions and the dense
    layer in bfloat16 under autocast (float32 weights), each pass on the CPU, those with gradient on a GPU."""

    def __init__(self, in_channels=3, channels=(16, 32, 32), bf16=False):
        super().__init__()
        self.bf16 = bf16
        # official init: 1/sqrt(S) per stack, 1/sqrt(2) of that per block, its square root per conv: (2 S)^(-1/4)
        res_scale = (2 * len(channels)) ** -0.25
        sizes = zip((in_channels, *channels[:-1]), channels)  # each stack's input and output channels
        self.stacks = nn.Sequential(*(ConvSequence(inputs, outputs, res_scale) for inputs, outputs in sizes))
        self.fc = normed_init(nn.Linear(channels[-1] * 8 * 8, 256), 1.4)

    def forward(self, obs):
        bf16 = self.bf16 and (obs.device.type == "cpu" or torch.is_grad_enabled())
        with torch.autocast(obs.device.type, torch.bfloat16, enabled=bf16):
            # permute(0, 3, 1, 2) of an HWC batch is already a channels-last NCHW tensor: no copy
            x = self.stacks(obs.permute(0, 3, 1, 2).float() / 255.0)
            return torch.relu(self.fc(torch.relu(torch.flatten(x, 1)))).float()


class Agent(nn.Module):
    """Shared torso (IMPALA CNN for images, 64-64 tanh MLP for vectors), policy and value heads."""

    def __init__(self, envs, bf16=False):
        super().__init__()
        obs_shape, num_actions = envs.single_observation_space.shape, envs.single_action_space.n
        if len(obs_shape) == 3:  # official heads: normed init with scale 0.1
            self.torso = ImpalaCNN(obs_shape[-1], bf16=bf16)
            self.actor, self.critic = normed_init(nn.Linear(256, num_actions), 0.1), normed_init(nn.Linear(256, 1), 0.1)
            self.to(memory_format=torch.channels_last)  # about 1.8x faster convolutions on CPU
        else:  # an MLP torso of CleanRL's sizes and init, shared by both heads
            self.torso = nn.Sequential(
                layer_init(nn.Linear(int(np.prod(obs_shape)), 64)), nn.Tanh(), layer_init(nn.Linear(64, 64)), nn.Tanh(),
            )
            self.actor = layer_init(nn.Linear(64, num_actions), std=0.01)
            self.critic = layer_init(nn.Linear(64, 1), std=1.0)

    def get_pi(self, obs):
        return self.actor(self.torso(obs))

    def get_value(self, obs):
        return self.critic(self.torso(obs)).squeeze(-1)

    def forward(self, obs):
        hidden = self.torso(obs)
        return self.actor(hidden), self.critic(hidden).squeeze(-1)


# --------------------------------------------------------------------------------------------------- environment
def make_env(args: Args, render_mode=None) -> gym.vector.VectorEnv:
    """The N envs, recording raw-score episode statistics (train() scales the rewards: RewardNormalizer). Each env
    resets a finished episode inside the step that ended it (SAME_STEP autoreset, as Procgen's do): next_obs is the
    new episode's first observation, info["final_obs"] the finished one's last, which train() bootstraps from."""
    if args.env_id in harness.PROCGEN_GAMES:  # the game's 64x64x3 uint8 frames (no frame stack) and 15 actions; its
        envs = harness.ProcgenVecEnv(args, render_mode)  # levels as its flags say; a time-out ends one (no truncation)
    else:  # Dict, Tuple and n-D Box observations flattened, ints as float32
        envs = gym.make_vec(args.env_id, num_envs=args.num_envs, vectorization_mode="sync",
                            wrappers=[harness.vector_observations],
                            vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
                            **({"render_mode": render_mode} if render_mode else {}))
    return gym.wrappers.vector.RecordEpisodeStatistics(envs)  # raw game score


# ------------------------------------------------------------------------------------------ policy distributions
def categorical_log_prob_and_entropy(logits, actions):
    """Categorical log pi(a|s) of `actions` and entropy, both [B]."""
    log_probs = torch.log_softmax(logits, dim=-1)
    logp = log_probs.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
    return logp, -(log_probs.exp() * log_probs).sum(-1)


def categorical_kl(logits_p, logits_q):
    """Per-sample KL[p || q] between categoricals given by logits, [B]."""
    log_p, log_q = torch.log_softmax(logits_p, -1), torch.log_softmax(logits_q, -1)
    return (log_p.exp() * (log_p - log_q)).sum(-1)


# ---------------------------------------------------------------------------------------- what train() logs
def explained_variance(values, returns) -> float:
    """1 - Var[returns - values] / Var[returns], nan where the returns do not vary."""
    return (1 - (returns - values).var() / returns.var()).item() if returns.var() > 0 else float("nan")


# ---------------------------------------------------------- what the run harness needs to know of this script
FLAG_RANGES = {  # the interval each numeric flag of this script must lie in (harness.py: the common ones)
    "num_levels": "[0, inf)", "start_level": "[0, inf)", "adam_beta1": "[0, 1)", "adam_beta2": "[0, 1)",
    "reward_norm_gamma": "[0, 1]", "clip_coef": "(0, 1)", "ent_coef": "[0, inf)", "vf_coef": "[0, inf)",
    "max_grad_norm": "(0, inf)", "max_is_ratio": "(1, inf]", "staleness": "[0, inf)",
}


def check_args(args: Args, observation_space, action_space) -> None:
    """This script's own checks of the run's Args."""
    harness.check_minibatches(args.num_steps, args.num_envs, args.num_minibatches, args.shuffle_samples)
    obs_bytes = math.prod(observation_space.shape) * observation_space.dtype.itemsize
    harness.check_memory(queue_bytes(args.staleness, args.num_steps, args.num_envs, obs_bytes, action_space.n), False,
                         f"The {args.staleness + 1} rollouts that --staleness {args.staleness} keeps (host memory)",
                         "--staleness, --num-envs or --num-steps")


def queue_bytes(staleness, num_steps, num_envs, obs_bytes, num_actions):
    """Host memory of the k + 1 rollouts alive at once (k queued, one being collected or trained on)."""
    per_step = obs_bytes + 8 + 4 * (num_actions + 4)  # obs, int64 action, logits, logp, value, reward, done
    per_rollout = num_steps * num_envs * per_step + num_envs * (obs_bytes + 4)  # + next_obs, next_done
    return (staleness + 1) * per_rollout


def count_iterations(args: Args, num_iterations: int, checkpoint) -> int:
    """Iterations of the run: k warm-up rollouts, then num_iterations trained ones. The queue is not saved (k rollouts
    of 0.8 GB at the paper's scale), so a resumed run collects as many rollouts as its checkpoint's queue held again."""
    if checkpoint is not None:
        source = f"--resume {args.resume}"
        queued = checkpoint.get("queued")
        if type(queued) is not int:
            raise SystemExit(f"{source}: its queued is a {type(queued).__name__}, not an int: it is not this run's.")
        if not 0 <= queued <= args.staleness:
            raise SystemExit(f"{source}: its queued {queued} is not a queue's length under --staleness "
                             f"{args.staleness}.")
        return checkpoint["num_iterations"] + queued
    return num_iterations + args.staleness


def describe(args: Args, num_iterations: int) -> str:
    """The start-up block's line on the run's size: harness.describe's, and how many iterations are trained on."""
    trained = math.ceil(args.total_timesteps / (args.num_envs * args.num_steps))
    return harness.describe(args, num_iterations) + f", {trained:,} of them trained on"


def run_name(args: Args) -> str:
    return f"{harness.portable(args.env_id)}__{args.exp_name}_{args.objective}_k{args.staleness}__{args.seed}"


def acting_policy(args: Args, envs, load, device):
    """The checkpoint's policy, the latest weights, as obs -> actions, sampled or (--eval-deterministic) the most
    likely."""
    agent = Agent(envs).to(device)
    load(agent, "agent")  # the checkpoint's weights, checked

    def act(obs, reward, done):  # (the last step's reward and done: unused)
        logits = agent.get_pi(obs)
        harness.check_policy(logits)
        return logits.argmax(-1) if args.eval_deterministic else torch.distributions.Categorical(logits=logits).sample()
    return act


SCRIPT = harness.Script(file=__file__, doc=__doc__, args_type=Args, make_env=make_env, acting_policy=acting_policy,
                        flag_ranges=FLAG_RANGES, check_args=check_args, describe=describe,
                        worker_share=harness.worker_share, run_name=run_name, procgen=True,
                        checkpoint_keys=("trained_steps", "queued"))


if __name__ == "__main__":
    train(tyro.cli(Args, description=__doc__))
