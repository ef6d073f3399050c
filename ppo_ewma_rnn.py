"""PPO-EWMA with a recurrent policy: ppo_ewma.py's algorithm (Hilton, Cobbe & Schulman, "Batch size-invariance for
policy optimization", 2021) with an LSTM, a GRU or an RNN between its torso and its heads.

The core reads the torso's features, the previous action and the previous reward (V-MPO's recurrent agent, Song et
al. 2019, Fig. 1b, with PPO's heads). Each rollout stores every env's core state at its start, and each minibatch is
whole env unrolls replayed from those states (R2D2's stored state, Kapturowski et al. 2019); the EWMA network, which
never acts, replays them too. Everything else is ppo_ewma.py's: the decoupled objectives, the EWMA, the batch
divisor, the options. Discrete and Box actions; skrl keeps its recurrent PPO in a file of its own (ppo_rnn.py), as
this one is kept apart from ppo_ewma.py.

    python ppo_ewma_rnn.py --rnn lstm                    # PPO-EWMA with an LSTM on Procgen starpilot, hard
    PYTHONPATH=benchmark python ppo_ewma_rnn.py --rnn lstm --env-id masked_cartpole:MaskedCartPole-v1 \\
        --num-envs 8 --num-steps 128 --gamma 0.99 --total-timesteps 200000   # CartPole without its velocities
"""
import copy
import dataclasses
import math
from collections import defaultdict
from typing import Literal, Optional

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import tyro
from gymnasium.wrappers.utils import RunningMeanStd

import harness


@dataclasses.dataclass
class Args(harness.RunArgs):  # run flags: seed, device, --bf16 (off), checkpoints, resume, evaluation
    # the paper's experiment: Procgen, 100M steps
    env_id: str = "starpilot"
    """a Procgen game, or any id gym.make takes (`module:EnvId` too) with Box, Dict or Tuple observations and
    Discrete (CartPole-v1) or Box (Pendulum-v1, HalfCheetah-v5) actions"""
    distribution_mode: Literal["easy", "hard"] = "hard"
    """Procgen difficulty (the paper: hard)"""
    num_levels: int = 0
    """Procgen levels to train on; 0 means unlimited"""
    start_level: int = 0
    """Procgen's first level seed"""
    total_timesteps: int = 100_000_000
    """total environment steps (the paper: 100M)"""

    # PPO's hyperparameters (Table 1)
    num_envs: int = 256
    """parallel environments N, the total over all torchrun workers (the paper: 4 workers x 64)"""
    num_steps: int = 256
    """timesteps per rollout T"""
    num_minibatches: int = 8
    """minibatches per epoch M (it divides N), each N/M envs' whole unrolls replayed from their stored states"""
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
    ent_coef: Optional[float] = None
    """entropy coefficient; default: 0.01 for discrete actions (the paper), 0 for Box ones (the PPO paper's MuJoCo)"""
    vf_coef: float = 0.5
    """value function coefficient c_VF (Table 1): the value loss is c_VF * mean((V - V_targ)^2)"""
    norm_reward: bool = True
    """divide rewards by the running std of a discounted return, then clip them to +-10 (official code)"""
    reward_norm_gamma: float = 0.99
    """discount of the return whose std normalizes rewards (the official code: 0.99, separate from --gamma)"""
    norm_adv: bool = True
    """normalize advantages with EWMA estimates of their mean and std"""
    adv_norm_span: float = 1.0
    """span of the advantage mean/std EWMA, in iterations (1: this iteration's batch only)"""

    # PPO-EWMA: the decoupled objectives (Sec. 2) with an EWMA as the proximal policy (Appendix A)
    ewma: bool = True
    """proximal policy = EWMA of the policy weights (PPO-EWMA); --no-ewma: proximal = behaviour (PPO)"""
    ewma_com: Optional[float] = None
    """centre of mass of the proximal policy's EWMA in gradient steps, 1/(1-beta_prox) - 1; default 8, Box 3 x E x M"""
    objective: Literal["clip", "kl"] = "clip"
    """decoupled objective of Sec. 2: clipped (L^CLIP_decoupled) or KL-penalised (L^KLPEN_decoupled)"""
    kl_coef: float = 1.0
    """KL penalty beta for --objective kl (this paper gives none; 1 is the fixed beta of PPG's KL variant)"""
    max_is_ratio: float = 100.0
    """cap on the importance weight pi/pi_behav (Appendix B: for staleness; the official code, as here, always)"""

    # batch size-invariance (Sec. 4)
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

    # options beyond the paper, off by default
    rnn: Literal["lstm", "gru", "rnn"] = "lstm"
    """the recurrent core's cell: PyTorch's LSTMCell, GRUCell or RNNCell (Elman's, tanh), as wide as the torso's output
    (256 after the IMPALA CNN, 64 after the MLP); for Box actions one 64-64 tanh torso feeds both heads"""
    exp_name: str = "ppo_ewma_rnn"
    """name of this experiment, part of the run directory's name"""
    norm_obs: Optional[bool] = None
    """normalize each env's vector observations by running statistics, then clip to +-10; default: on for Box actions"""
    max_grad_norm: Optional[float] = None
    """clip the gradient's global norm (off: a clipped norm depends on the batch size)"""
    target_kl: Optional[float] = None
    """end the update before the first step whose minibatch's k3 estimate of KL[pi_behav || pi] exceeds this (SB3)"""
    clip_vloss: bool = False
    """clip the value loss around the rollout's values by --clip-coef, as PPO2 in OpenAI baselines and CleanRL"""
    lr_schedule: Literal["constant", "linear", "kl-adaptive"] = "constant"
    """step size multiplier after --batch-divisor's: constant (the paper), linear to 0 (PPO) or kl-adaptive (skrl's)"""
    lr_kl_target: float = 0.008
    """KL target of --lr-schedule kl-adaptive (skrl's kl_threshold default)"""
    norm_value: bool = False
    """skrl's value preprocessor: the value head predicts standardized returns; GAE and bootstraps use raw_value's"""


def with_defaults(args: Args) -> Args:
    """args with its None defaults filled in: the paper's for discrete actions, ones measured on MuJoCo for Box."""
    box = isinstance(harness.env_spaces(args.env_id, harness.PROCGEN_GAMES)[1], gym.spaces.Box)
    defaults = dict(ent_coef=0.0, ewma_com=3.0 * args.update_epochs * args.num_minibatches, norm_obs=True) if box \
        else dict(ent_coef=0.01, ewma_com=8.0, norm_obs=False)  # the paper's
    return dataclasses.replace(args, **{name: value for name, value in defaults.items() if getattr(args, name) is None})


def apply_batch_divisor(args: Args) -> Args:
    """The Args a run trains with: with_defaults, then Sec. 4's adjustments for a batch divided by c = batch_divisor."""
    args, c = with_defaults(args), args.batch_divisor
    if c < 1 or args.num_envs % c != 0:
        raise SystemExit(f"--batch-divisor {c} must be a positive divisor of --num-envs {args.num_envs}.")
    changes = {"num_envs": args.num_envs // c}  # T, M and E stay: the batch and every minibatch shrink by c
    if args.adjust_lr:
        changes["learning_rate"] = args.learning_rate / (c if args.lr_rule == "linear" else math.sqrt(c))
    if args.adjust_ewma:
        changes["ewma_com"] = args.ewma_com * c
    if args.adjust_adv_norm:
        changes["adv_norm_span"] = args.adv_norm_span * c
    if args.adjust_adam_betas:
        changes.update(adam_beta1=args.adam_beta1 ** (1 / c), adam_beta2=args.adam_beta2 ** (1 / c))
    return dataclasses.replace(args, **changes)


# ------------------------------------------------------------------- the algorithm: losses, GAE, EWMA, normalizers
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


def decoupled_kl_loss(new_logp, behav_logp, advantages, kl, kl_coef, max_is_ratio=100.0):
    """-L^KLPEN_decoupled (Sec. 2): mean of -(pi/pi_behav) A + beta KL[pi_prox || pi] (kl, with gradient); all [B]."""
    behav_logp = torch.maximum(behav_logp.detach(), new_logp.detach() - math.log(max_is_ratio))
    is_ratio = torch.exp(new_logp - behav_logp)
    return (-is_ratio * advantages + kl_coef * kl).mean()


def value_loss(values, returns):
    """L^VF = mean((V - V_targ)^2), values and returns [B]; the total loss weights it by c_VF (0.5, Table 1)."""
    return ((values - returns) ** 2).mean()


def minibatch_loss(agent, args, unrolls, actions, advantages, behav_logp, prox_pi, prox_logp, v_old, v_targets):
    """-L^CLIP_decoupled (or -L^KLPEN_decoupled) + c_VF L^VF - c_ent entropy (Sec. 2, Table 1) of a minibatch with
    pi and V under theta, of its unrolls replayed (Agent.unroll's inputs): (loss, its three terms, log pi(a|s))."""
    new_pi, new_value = agent.unroll(*unrolls)[:2]
    new_logp, entropy = policy_log_prob_and_entropy(new_pi, actions, agent.continuous)
    if args.objective == "clip":
        pg_loss = decoupled_clip_loss(new_logp, prox_logp, behav_logp, advantages, args.clip_coef, args.max_is_ratio)
    else:
        kl = policy_kl(prox_pi, new_pi, agent.continuous)  # KL[pi_prox || pi]
        pg_loss = decoupled_kl_loss(new_logp, behav_logp, advantages, kl, args.kl_coef, args.max_is_ratio)
    v_loss = clipped_value_loss(new_value, v_old, v_targets, args.clip_coef) if args.clip_vloss else \
        value_loss(new_value, v_targets)
    entropy_loss = entropy.mean()
    return pg_loss - args.ent_coef * entropy_loss + args.vf_coef * v_loss, pg_loss, v_loss, entropy_loss, new_logp


@torch.no_grad()
def update_ewma(ewma_model, model, weight, decay):
    """theta_prox <- theta / w_new + beta (w / w_new) theta_prox in place (Appendix A); returns w_new = 1 + beta w."""
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
        self.decay, self.weight, self.sum, self.sum_sq = decay, 0.0, 0.0, 0.0

    def update(self, x):
        n, batch_mean, batch_var = x.numel(), x.mean().item(), x.var(unbiased=False).item()
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


def minibatch_envs(num_steps, num_envs, num_minibatches) -> list:
    """One epoch's minibatches as the envs whose whole unrolls each holds, N/M each: minibatch_indices' layout."""
    return [inds.view(-1, num_steps)[:, 0] for inds in minibatch_indices(num_steps, num_envs, num_minibatches)]


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
    if args.eval_checkpoint is not None:  # play a saved policy instead (evaluation.py)
        return harness.evaluate(args, SCRIPT)
    flags, checkpoint = harness.run_flags(args, SCRIPT)  # each checked; with --resume, the checkpoint's
    # the hyperparameters the run trains with (apply_batch_divisor); checkpoints keep the flags they came from
    args = apply_batch_divisor(flags)

    batch_size = args.num_envs * args.num_steps  # N x T, over all torchrun workers
    num_iterations = math.ceil(args.total_timesteps / batch_size)  # the last one may run past --total-timesteps
    run = harness.start(SCRIPT, args, checkpoint, num_iterations, flags)  # checks, torchrun workers, seeds, device
    envs = run.open(make_env(run.args, run.render_mode))  # made after the seeding; then run dir, logs, start-up
    args, device, writer = run.args, run.device, run.writer  # run.args under torchrun: this worker's share, N / W envs

    agent = Agent(envs, args.bf16, args.rnn).to(device)
    harness.broadcast_weights(agent)  # torchrun: every worker starts from rank 0's weights
    # PPO-EWMA: the proximal policy's weights theta_prox <- theta, an EWMA with decay beta_prox and weight w = 1
    ewma_agent = copy.deepcopy(agent).requires_grad_(False) if args.ewma else None
    ewma_decay, ewma_weight = com_to_decay(args.ewma_com), 1.0
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=args.adam_eps,
                                 betas=(args.adam_beta1, args.adam_beta2), fused=True)
    adv_moments = EwmaMoments(span_to_decay(args.adv_norm_span))
    reward_normalizer = RewardNormalizer(args.num_envs, args.reward_norm_gamma) if args.norm_reward else None
    value_moments = EwmaMoments(1.0) if args.norm_value else None  # --norm-value: every return so far (raw_value)
    warn_about_settings(args, agent.continuous)

    # rollout storage, [T, N]; bootstraps: gamma V(final obs) at truncations; the core's other inputs, for the replay
    continuous, to_env = agent.continuous, env_actions(envs.single_action_space, device)
    obs_dtype, rollout_shape = harness.obs_dtype(envs), (args.num_steps, args.num_envs)
    obs_shape, action_shape = envs.single_observation_space.shape, envs.single_action_space.shape
    obs = torch.zeros(rollout_shape + obs_shape, dtype=obs_dtype, device=device)
    actions = torch.zeros(rollout_shape + action_shape, dtype=torch.float if continuous else torch.long, device=device)
    behav_pis = torch.zeros(rollout_shape + (agent.pi_size,), device=device)  # pi_behav: the KL's pi_prox under PPO
    rewards, dones, values, bootstraps = (torch.zeros(rollout_shape, device=device) for _ in range(4))
    prev_actions, prev_rewards = torch.zeros_like(actions), torch.zeros(rollout_shape, device=device)

    next_obs = torch.as_tensor(envs.reset(seed=args.seed)[0], dtype=obs_dtype, device=device)
    next_done = torch.zeros(args.num_envs, device=device)
    # what the acting network carries from step to step: its core state, its last action and the last raw reward
    memory = agent.core.initial_memory(args.num_envs, device)
    # what a checkpoint holds besides the env stack's state and statistics and the RNGs; --resume restores it
    saved = harness.Saved(models={"agent": agent, "ewma_agent": ewma_agent}, optimizers={"optimizer": optimizer},
                          normalizers={"reward": reward_normalizer, "advantages": adv_moments, "value": value_moments},
                          keys={"ewma_weight": ewma_weight, "memory": memory})
    global_step, first_iteration, next_obs, next_done = run.restore(saved, next_obs, next_done)  # with --resume
    ewma_weight = run.restored("ewma_weight", lambda w: w >= 1, "is below 1")  # theta_prox's w, across iterations
    memory = run.restored("memory", agent.core.holds, "holds an action outside the action space")

    for iteration in range(first_iteration, num_iterations + 1):
        if args.lr_schedule == "linear":  # --lr-schedule linear
            optimizer.param_groups[0]["lr"] = linear_schedule(args.learning_rate, iteration, num_iterations)

        # rollout: T steps of the N envs with the behaviour policy pi_behav, the current weights (theta_behav = theta),
        # its core state carried on from the last rollout; each env's state at the start kept, to replay from (R2D2)
        bootstraps.zero_()
        start_states = memory["core_state"]
        for step in range(args.num_steps):
            global_step += args.num_envs * run.world_size
            obs[step], dones[step] = next_obs, next_done
            prev_actions[step], prev_rewards[step] = memory["prev_action"], memory["prev_reward"]
            with torch.no_grad():
                step_pi, step_value, core_state = agent.step(next_obs, next_done, **memory)
                values[step] = raw_value(step_value, value_moments)
            run.check_policy(step_pi)  # finite, or the run stops in one sentence
            action = sample_actions(step_pi, continuous)
            actions[step], behav_pis[step] = action, step_pi
            next_obs_np, reward, terminated, truncated, info = envs.step(to_env(action))
            rewards[step] = torch.as_tensor(reward, dtype=torch.float32, device=device)
            # the raw reward: the scaled one is known only once the rollout ends
            memory = {"core_state": core_state, "prev_action": action, "prev_reward": rewards[step].clone()}
            # time-limit truncation is not termination: gamma V(final obs), scaled units, goes to the scaled reward; V
            # from the core state before the reset, one step on
            truncated_only = np.flatnonzero(truncated & ~terminated)
            if truncated_only.size:
                final_obs = torch.as_tensor(np.stack(info["final_obs"][truncated_only]), dtype=obs_dtype, device=device)
                ended = {name: value[truncated_only] for name, value in memory.items()}
                with torch.no_grad():
                    final_value = agent.step(final_obs, torch.zeros(truncated_only.size, device=device), **ended)[1]
                    bootstraps[step, truncated_only] = args.gamma * raw_value(final_value, value_moments)
            next_obs = torch.as_tensor(next_obs_np, dtype=obs_dtype, device=device)
            next_done = torch.as_tensor(terminated | truncated, dtype=torch.float32, device=device)
            run.after_step(global_step, info)  # finished episodes, progress
        run.end_rollout()  # the rollout's episodes to TensorBoard (torchrun: all workers')

        # advantages: GAE on rewards scaled once per rollout, as officially (torchrun: one estimate over all workers)
        with torch.no_grad():
            next_value = raw_value(agent.step(next_obs, next_done, **memory)[1], value_moments)
        scaled_rewards = reward_normalizer(rewards, dones, harness.global_batch) if reward_normalizer else rewards
        advantages, returns = compute_gae(scaled_rewards + bootstraps, values, dones, next_value, next_done,
                                          args.gamma, args.gae_lambda)
        b_actions, b_behav_pis = actions.flatten(0, 1), behav_pis.flatten(0, 1)
        b_behav_logps = policy_log_prob_and_entropy(b_behav_pis, b_actions, continuous)[0]  # log pi_behav(a|s)
        b_advantages, b_returns, b_values = advantages.reshape(-1), returns.reshape(-1), values.reshape(-1)
        if args.norm_adv:  # full-batch normalization with EWMA moments over `adv_norm_span` iterations
            adv_moments.update(harness.global_batch(b_advantages))  # torchrun: moments of all workers' advantages
            b_advantages = adv_moments.normalize(b_advantages)
        v_targets, v_old = b_returns, b_values  # the value loss's, in the value head's units
        if args.norm_value:  # --norm-value: the statistics move to this iteration's returns (torchrun: all workers')
            value_moments.update(harness.global_batch(b_returns))
            v_targets, v_old = (value_moments.normalize(v).clamp(-5.0, 5.0) for v in (b_returns, b_values))

        # update: E epochs of M minibatches on the decoupled objective
        stats = defaultdict(list)  # name -> per-minibatch values, averaged once per iteration
        gradient_steps, over_target_kl = 0, False
        for epoch in range(args.update_epochs):
            run.updating(f"epoch {epoch + 1}/{args.update_epochs}")
            epoch_kls = []  # k3 estimates of KL[pi_behav || pi] before each step
            for mb_envs in minibatch_envs(args.num_steps, args.num_envs, args.num_minibatches):
                # the minibatch: whole unrolls of N/M envs, t-major, replayed from their stored states; its pi_prox:
                # the EWMA network's, replayed alike without gradient (as R2D2's target network), or pi_behav (PPO)
                mb_envs = mb_envs.to(device)
                mb_inds = (torch.arange(args.num_steps, device=device)[:, None] * args.num_envs + mb_envs).flatten()
                unrolls = (obs[:, mb_envs], dones[:, mb_envs], start_states[mb_envs], prev_actions[:, mb_envs],
                           prev_rewards[:, mb_envs])
                mb_actions, mb_behav_logp = b_actions[mb_inds], b_behav_logps[mb_inds]
                if ewma_agent is not None:
                    with torch.no_grad():
                        prox_pi = ewma_agent.unroll(*unrolls)[0]
                    prox_logp = policy_log_prob_and_entropy(prox_pi, mb_actions, continuous)[0]
                else:
                    prox_pi, prox_logp = b_behav_pis[mb_inds], mb_behav_logp
                # the loss: -L^CLIP_decoupled (or -L^KLPEN_decoupled) + c_VF L^VF - c_ent entropy, under theta
                loss, pg_loss, v_loss, entropy_loss, new_logp = minibatch_loss(
                    agent, args, unrolls, mb_actions, b_advantages[mb_inds], mb_behav_logp, prox_pi, prox_logp,
                    v_old[mb_inds], v_targets[mb_inds])
                harness.check_finite(iteration, policy_loss=pg_loss, value_loss=v_loss, entropy=entropy_loss)
                behav_logratio = (new_logp - mb_behav_logp).detach()  # k3 of KL[pi_behav || pi] before the step
                epoch_kls.append(((behav_logratio.exp() - 1) - behav_logratio).mean())
                if over_target_kl := past_target_kl(epoch_kls[-1], args.target_kl):  # --target-kl: skip the rest
                    break

                # one Adam step on theta (torchrun: on the workers' mean gradient), then theta_prox <- EWMA of theta
                gradient_step(optimizer, loss, agent, max_grad_norm=args.max_grad_norm)
                gradient_steps += 1
                if ewma_agent is not None:  # PPO-EWMA: theta_prox <- EWMA of theta after every step
                    ewma_weight = update_ewma(ewma_agent, agent, ewma_weight, ewma_decay)
                add_statistics(stats, args, pg_loss, v_loss, entropy_loss, new_logp, prox_logp, behav_logratio)
            epoch_kl = harness.mean_over_workers(torch.stack(epoch_kls).mean())
            if args.lr_schedule == "kl-adaptive":  # skrl: after every epoch, from the epoch's mean KL
                optimizer.param_groups[0]["lr"] = kl_adaptive_lr(optimizer.param_groups[0]["lr"], epoch_kl.item(),
                                                                 args.lr_kl_target)
            if over_target_kl:
                break  # --target-kl: the remaining epochs are skipped

        # logging: the minibatches' means, the iteration's own scalars, the options'
        scalars = {f"losses/{name}": torch.stack(terms).mean().item() for name, terms in stats.items()}
        scalars.update({"charts/learning_rate": optimizer.param_groups[0]["lr"],
                        "losses/approx_kl_behav_last": epoch_kl.item(),  # the last epoch's, each before its step
                        "losses/explained_variance": explained_variance(b_values, b_returns)})
        scalars.update({"charts/ewma_decay": ewma_decay, "charts/ewma_weight": ewma_weight} if args.ewma else {})
        scalars.update(option_scalars(args, gradient_steps, adv_moments, value_moments))
        for tag, value in scalars.items():
            writer.add_scalar(tag, value, global_step)
        kept = {"ewma_weight": ewma_weight, "memory": memory}  # for --resume
        run.end_iteration(iteration, global_step, next_obs, next_done, **kept)  # SPS, checkpoint
    return run.finish(iteration, global_step, next_obs, next_done, **kept)  # --save-model


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


class RecurrentCore(nn.Module):
    """The agent's memory (V-MPO's Fig. 1b): a recurrent cell (vmpo.py's --lstm: an LSTM; ppo_ewma_rnn.py's --rnn: an
    LSTM, a GRU or an Elman RNN) reading the encoder's features, the previous action (one-hot if discrete) and reward,
    the state and those two zeroed where an episode starts. Its state is one tensor, [B, S, H] (an LSTM's h and c:
    S = 2; a GRU's or an RNN's h: S = 1), which a rollout stores and indexes by env."""

    CELLS = {"lstm": nn.LSTMCell, "gru": nn.GRUCell, "rnn": nn.RNNCell}

    def __init__(self, in_features, action_space, hidden, cell="lstm"):
        super().__init__()
        self.num_actions = None if isinstance(action_space, gym.spaces.Box) else int(action_space.n)
        self.action_shape = action_space.shape  # () for indices
        self.kind, self.state_size = cell, 2 if cell == "lstm" else 1
        setattr(self, cell, self.CELLS[cell](in_features + (self.num_actions or action_space.shape[0]) + 1, hidden))
        with torch.no_grad():  # biases 0 but an LSTM's forget gate's 1 (PyTorch's gate order i, f, g, o), as
            getattr(self, cell).bias_hh.zero_()  # TensorFlow's and Sonnet's LSTMs: the state is kept at first
            getattr(self, cell).bias_ih.zero_()[hidden:2 * hidden] = 1.0 if cell == "lstm" else 0.0

    def initial_memory(self, batch_size, device=None):
        """What the core carries from one step to the next (forward's last three inputs), all zero."""
        hidden = getattr(self, self.kind).hidden_size
        return {"core_state": torch.zeros(batch_size, self.state_size, hidden, device=device),
                "prev_action": torch.zeros(batch_size, *self.action_shape, device=device).to(
                    torch.float32 if self.num_actions is None else torch.long),
                "prev_reward": torch.zeros(batch_size, device=device)}

    def holds(self, memory) -> bool:
        """Whether a memory read from a checkpoint could be one a run carried: its actions are of the action space."""
        action = memory["prev_action"]
        return self.num_actions is None or bool(((action >= 0) & (action < self.num_actions)).all())

    def forward(self, features, done, core_state, prev_action, prev_reward):
        """One step: features [B, F], done [B] (1 where this step's observation starts an episode), core_state
        [B, S, H], prev_action [B] (indices) or [B, A], prev_reward [B] -> (output h [B, H], next state [B, S, H])."""
        keep = (1.0 - done).unsqueeze(-1)
        action = prev_action if self.num_actions is None else nn.functional.one_hot(prev_action, self.num_actions)
        inputs = torch.cat([features, keep * action, keep * prev_reward.unsqueeze(-1)], dim=-1)
        if self.state_size == 2:  # an LSTM: (h, c)
            h, c = self.lstm(inputs, (keep * core_state[:, 0], keep * core_state[:, 1]))
            return h, torch.stack([h, c], dim=1)
        h = getattr(self, self.kind)(inputs, keep * core_state[:, 0])
        return h, h.unsqueeze(1)


class Agent(nn.Module):
    """A torso (the IMPALA CNN for images, a 64-64 tanh MLP for vectors), a RecurrentCore as wide as it, and linear
    policy and value heads on the core's output. pi, [B, pi_size]: logits, or a diagonal Gaussian's mean and its
    state-independent log-std side by side."""

    def __init__(self, envs, bf16=False, rnn="lstm"):
        super().__init__()
        obs_shape, action_space = envs.single_observation_space.shape, envs.single_action_space
        self.continuous = isinstance(action_space, gym.spaces.Box)
        num_outputs = gym.spaces.flatdim(action_space)  # Box: action dims; Discrete: n
        self.pi_size = 2 * num_outputs if self.continuous else num_outputs
        if len(obs_shape) == 3:  # official heads: normed init with scale 0.1
            self.torso, hidden = ImpalaCNN(obs_shape[-1], bf16=bf16), 256
            self.actor, self.critic = normed_init(nn.Linear(256, num_outputs), 0.1), normed_init(nn.Linear(256, 1), 0.1)
            self.to(memory_format=torch.channels_last)  # about 1.8x faster convolutions on CPU
        else:  # an MLP torso of CleanRL's sizes and init, shared by both heads
            self.torso, hidden = nn.Sequential(
                layer_init(nn.Linear(int(np.prod(obs_shape)), 64)), nn.Tanh(), layer_init(nn.Linear(64, 64)), nn.Tanh(),
            ), 64
            self.actor = layer_init(nn.Linear(64, num_outputs), std=0.01)
            self.critic = layer_init(nn.Linear(64, 1), std=1.0)
        if self.continuous:
            self.actor_log_std = nn.Parameter(torch.zeros(num_outputs))  # log sigma, one per action dim
        self.core = RecurrentCore(hidden, action_space, hidden, rnn)

    def step(self, obs, done, core_state, prev_action, prev_reward):
        """One step of a batch of envs (RecurrentCore.forward's inputs): (pi, V(s), next core state)."""
        hidden, core_state = self.core(self.torso(obs), done, core_state, prev_action, prev_reward)
        pi = self.actor(hidden)
        if self.continuous:
            pi = torch.cat([pi, self.actor_log_std.expand_as(pi)], dim=-1)
        return pi, self.critic(hidden).squeeze(-1), core_state

    def unroll(self, obs, dones, core_state, prev_actions, prev_rewards):
        """Unrolls [T, B] from their first step's state, step by step as the rollout ran them (the same code path):
        (pi [T*B, pi_size], V(s) [T*B], t-major; the last state). Gradients flow through the whole unroll."""
        outputs = []
        for t in range(len(obs)):
            *output, core_state = self.step(obs[t], dones[t], core_state, prev_actions[t], prev_rewards[t])
            outputs.append(output)
        return (*(torch.cat(output) for output in zip(*outputs)), core_state)


# --------------------------------------------------------------------------------------------------- environment
def make_env(args: Args, render_mode=None) -> gym.vector.VectorEnv:
    """The N envs, recording raw-score episode statistics. SAME_STEP autoreset (as Procgen's): a step that ends an
    episode returns the next one's first observation, and in info["final_obs"] the ended one's last (to bootstrap)."""
    if args.env_id in harness.PROCGEN_GAMES:  # the game's 64x64x3 uint8 frames (no frame stack) and 15 actions; its
        envs = harness.ProcgenVecEnv(args, render_mode)  # levels as its flags say; a time-out ends one (no truncation)
    else:
        envs = gym.make_vec(args.env_id, num_envs=args.num_envs, vectorization_mode="sync",
                            wrappers=[harness.vector_observations],  # Dict, Tuple, n-D Box flattened, ints as float32
                            vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
                            **({"render_mode": render_mode} if render_mode else {}))
        envs = NormalizeObservationPerEnv(envs) if args.norm_obs else envs  # by each env's running mean and std; +-10
    return gym.wrappers.vector.RecordEpisodeStatistics(envs)  # raw game score


class NormalizeObservationPerEnv(gym.vector.VectorWrapper):
    """Each env's observations standardized by its own running mean and variance, clipped to +-10 (Gymnasium's per-env
    NormalizeObservation); an ended episode's final one (info["final_obs"]) first. Checkpoints: obs_0, obs_1, ..."""

    def __init__(self, envs, epsilon=1e-8, clip=10.0):
        super().__init__(envs)
        assert envs.metadata["autoreset_mode"] == gym.vector.AutoresetMode.SAME_STEP  # final_obs in the step's info
        self.single_observation_space = gym.spaces.Box(-np.inf, np.inf, envs.single_observation_space.shape, np.float32)
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, envs.num_envs)
        self.obs_rms = [RunningMeanStd(shape=self.single_observation_space.shape, dtype=np.float32)
                        for _ in range(envs.num_envs)]
        self.epsilon, self.clip, self.update_running_mean = epsilon, clip, True  # False: frozen (evaluation)

    def normalized(self, i, obs):
        rms = self.obs_rms[i]
        if self.update_running_mean:  # RunningMeanStd.update(obs[None]) written out: the same float ops, 4x faster
            delta, count = obs - rms.mean, rms.count + 1
            rms.var = (rms.var * rms.count + np.square(delta) * rms.count / count) / count
            rms.mean, rms.count = rms.mean + delta / count, count
        return np.clip(np.float32((obs - rms.mean) / np.sqrt(rms.var + self.epsilon)), -self.clip, self.clip)

    def reset(self, **kwargs):
        if "reset_mask" in (kwargs.get("options") or {}):  # the envs left alone would be updated too
            raise ValueError("NormalizeObservationPerEnv resets every env: it takes no reset_mask")
        obs, info = self.env.reset(**kwargs)
        return np.stack([self.normalized(i, env_obs) for i, env_obs in enumerate(obs)]), info

    def step(self, actions):
        obs, reward, terminated, truncated, info = self.env.step(actions)
        for i in np.flatnonzero(terminated | truncated):  # the final observation first, as inside the autoreset
            info["final_obs"][i] = self.normalized(i, info["final_obs"][i])
        obs = np.stack([self.normalized(i, env_obs) for i, env_obs in enumerate(obs)])
        return obs, reward, terminated, truncated, info


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


def gaussian_log_prob(actions, mean, log_std):
    """log N(a; mu, sigma^2) summed over action dims. actions, mean: [B, A]; log_std: [B, A] or [A]. Returns [B]."""
    return (-0.5 * ((actions - mean) / log_std.exp()) ** 2 - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)


def gaussian_entropy(log_std):
    """Entropy of a diagonal Gaussian, summed over action dims. log_std: [B, A]. Returns [B]."""
    return (log_std + 0.5 * math.log(2 * math.pi * math.e)).sum(-1)


def gaussian_kl(mean_p, log_std_p, mean_q, log_std_q):
    """Diagonal Gaussians' KL[p || q], [B, A] -> [B]: sum of log(s_q/s_p) + (s_p^2 + (mu_p - mu_q)^2)/(2 s_q^2) - 0.5"""
    var_ratio = torch.exp(2 * (log_std_p - log_std_q))  # sigma_p^2 / sigma_q^2
    return (log_std_q - log_std_p + 0.5 * (var_ratio + (mean_p - mean_q) ** 2 / torch.exp(2 * log_std_q)) - 0.5).sum(-1)


def policy_log_prob_and_entropy(pi, actions, continuous=False):
    """log pi(a|s) of `actions` and the entropy, both [B]; pi [B, P]: categorical logits, or Gaussian mean and
    log-std side by side."""
    if continuous:
        mean, log_std = pi.chunk(2, dim=-1)
        return gaussian_log_prob(actions, mean, log_std), gaussian_entropy(log_std)
    return categorical_log_prob_and_entropy(pi, actions)


def policy_kl(pi_p, pi_q, continuous=False):
    """Per-sample KL[p || q] of two policies' parameters (policy_log_prob_and_entropy's), [B]."""
    return gaussian_kl(*pi_p.chunk(2, dim=-1), *pi_q.chunk(2, dim=-1)) if continuous else categorical_kl(pi_p, pi_q)


def sample_actions(pi, continuous=False, mode=False):
    """a ~ pi(.|s) per row, no device sync; `mode` (--eval-deterministic): the mean or argmax."""
    if continuous:
        mean, log_std = pi.chunk(2, dim=-1)
        return mean if mode else mean + log_std.exp() * torch.randn_like(mean)
    return pi.argmax(-1) if mode else torch.distributions.Categorical(logits=pi, validate_args=False).sample()


def env_actions(action_space, device):
    """action -> what the envs take, NumPy: a Box action clipped to its bounds (its log-prob is the sampled one's)."""
    if not isinstance(action_space, gym.spaces.Box):
        return lambda action: action.cpu().numpy()
    low, high = (torch.as_tensor(bound, device=device) for bound in (action_space.low, action_space.high))
    return lambda action: torch.clamp(action, low, high).cpu().numpy()


# ---------------------------------------------------------------------- options beyond the paper, what train() logs
def clipped_value_loss(values, old_values, returns, clip_coef):
    """--clip-vloss (PPO2): mean of max((V - V_targ)^2, (V_old + clip(V - V_old, -eps, eps) - V_targ)^2), all [B]."""
    clipped = old_values + torch.clamp(values - old_values, -clip_coef, clip_coef)
    return torch.max((values - returns) ** 2, (clipped - returns) ** 2).mean()


def raw_value(value, moments):
    """--norm-value: the value head's output, a standardized return clipped to +-5 (skrl's), as a return."""
    standardized = moments is not None and moments.weight  # off, or no return seen yet: as it is
    return value.clamp(-5.0, 5.0) * (moments.std + 1e-8) + moments.mean if standardized else value


def past_target_kl(kl, target_kl) -> bool:
    """--target-kl (SB3): whether the k3 estimate of KL[pi_behav || pi] before a step is past it (torchrun: a mean)."""
    return target_kl is not None and bool(harness.mean_over_workers(kl) > target_kl)


def linear_schedule(initial, iteration, num_iterations):
    """initial * (1 - (iteration - 1) / num_iterations): 1 in the first iteration (1-based), 1/J in the last."""
    return initial * max(0.0, 1.0 - (iteration - 1) / num_iterations)


def kl_adaptive_lr(lr, kl, kl_target, min_lr=1e-6, max_lr=1e-2, kl_factor=2.0, lr_factor=1.5):
    """skrl's KLAdaptiveLR rule, with its defaults: the step size after an epoch whose mean KL was `kl`."""
    if kl > kl_target * kl_factor:
        return max(lr / lr_factor, min_lr)
    return min(lr * lr_factor, max_lr) if kl < kl_target / kl_factor else lr


@torch.no_grad()
def add_statistics(stats, args, pg_loss, v_loss, entropy_loss, new_logp, prox_logp, behav_logratio) -> None:
    """A minibatch's scalars into stats ({name: [value of each minibatch]}), averaged over the iteration when logged."""
    logratio = new_logp - prox_logp
    for name, value in (
        ("policy_loss", pg_loss), ("value_loss", v_loss), ("entropy", entropy_loss),
        ("approx_kl", ((logratio.exp() - 1) - logratio).mean()),  # k3 estimate of KL to pi_prox
        ("approx_kl_behav", ((behav_logratio.exp() - 1) - behav_logratio).mean()),
        ("clipfrac", ((logratio.exp() - 1).abs() > args.clip_coef).float().mean()),
        ("is_capped_frac", (behav_logratio > math.log(args.max_is_ratio)).float().mean()),
    ):
        stats[name].append(value.detach())


def explained_variance(values, returns) -> float:
    """1 - Var[returns - values] / Var[returns], nan where the returns do not vary."""
    return (1 - (returns - values).var() / returns.var()).item() if returns.var() > 0 else float("nan")


def option_scalars(args, gradient_steps, adv_moments, value_moments) -> dict:
    """The scalars of the options on: --target-kl's epochs run, the advantage and value statistics."""
    scalars = {"charts/update_epochs_run": gradient_steps / args.num_minibatches} if args.target_kl is not None else {}
    if args.norm_adv:
        scalars.update({"charts/adv_mean": adv_moments.mean, "charts/adv_std": adv_moments.std})
    if args.norm_value:
        scalars.update({"charts/value_moments_mean": value_moments.mean, "charts/value_moments_std": value_moments.std})
    return scalars


# ---------------------------------------------------------- what the run harness needs to know of this script
FLAG_RANGES = {  # the interval each numeric flag of this script must lie in (harness.py: the common ones)
    "num_levels": "[0, inf)", "start_level": "[0, inf)", "adam_beta1": "[0, 1)", "adam_beta2": "[0, 1)",
    "reward_norm_gamma": "[0, 1]", "clip_coef": "(0, 1)", "kl_coef": "[0, inf)", "ent_coef": "[0, inf)",
    "vf_coef": "[0, inf)", "max_grad_norm": "(0, inf)", "max_is_ratio": "(1, inf]", "adv_norm_span": "[1, inf)",
    "target_kl": "(0, inf)", "lr_kl_target": "(0, inf)", "ewma_com": "[0, inf)", "batch_divisor": "[1, inf)",
}


def check_args(args: Args, observation_space, action_space) -> None:
    """This script's own checks of the run's Args (the batch-divisor adjustments applied)."""
    if args.norm_obs and len(observation_space.shape) != 1:
        raise SystemExit(f"--norm-obs needs vector observations; --env-id {args.env_id} has images.")
    if args.num_minibatches > args.num_envs or args.num_envs % args.num_minibatches:
        raise SystemExit(f"--num-minibatches {args.num_minibatches} must divide --num-envs {args.num_envs}: each "
                         f"minibatch replays whole env unrolls from their stored states.")
    # obs (uint8 or float32), action and the previous one, pi; behaviour log-prob, reward and the previous one,
    # bootstrap, done, value, advantage, return, scaled reward
    continuous = isinstance(action_space, gym.spaces.Box)
    obs_bytes = math.prod(observation_space.shape) * (1 if observation_space.dtype == np.uint8 else 4)
    action_bytes = (4 if continuous else 8) * math.prod(action_space.shape)  # a Discrete's shape is ()
    pi_floats = (3 if continuous else 1) * gym.spaces.flatdim(action_space)
    sample_bytes = obs_bytes + 2 * action_bytes + 4 * (pi_floats + 8)
    harness.check_memory(args.num_envs * args.num_steps * sample_bytes, args.cuda, "The rollout buffers",
                         "--num-envs or --num-steps")


def warn_about_settings(args: Args, continuous: bool) -> None:
    """Warn where a setting undoes --batch-divisor's adjustments, or where a Box policy's EWMA is too young."""
    if args.batch_divisor != 1 and args.update_epochs > 1:
        print(f"warning: --update-epochs {args.update_epochs} > 1, so the batch-divisor adjustments do not make "
              f"training invariant (Sec. 4 requires 1 policy epoch; the paper's sweep uses PPG-EWMA for this).")
    if args.batch_divisor != 1 and args.lr_schedule == "kl-adaptive":
        print("warning: --lr-schedule kl-adaptive steers every epoch's KL into fixed bounds: no step-size adjustment.")
    if continuous and args.ewma and args.ewma_com < args.update_epochs * args.num_minibatches / 2:  # E x M / 2
        print(f"warning: --ewma-com {args.ewma_com:g} is under half of update-epochs x num-minibatches (E x M); on "
              f"MuJoCo (320) 107 and 8 collapsed, 320 and 960 held: docs/ppo_ewma.md#measured-on-mujoco-the-ewmas-age")


def acting_policy(args: Args, envs, load, device):
    """The checkpoint's policy (the network that collected the data, not the EWMA) as (obs, the last step's reward and
    done) -> actions, sampled or (--eval-deterministic) the mode, carrying the core state and the action from step to
    step."""
    agent = Agent(envs, rnn=args.rnn).to(device)
    load(agent, "agent")  # the checkpoint's weights, checked
    memory = agent.core.initial_memory(envs.num_envs, device)

    def sample(obs, prev_reward, done):
        pi, _, memory["core_state"] = agent.step(obs, done, **dict(memory, prev_reward=prev_reward))
        harness.check_policy(pi)
        memory["prev_action"] = sample_actions(pi, agent.continuous, mode=args.eval_deterministic)
        return memory["prev_action"]
    return sample


SCRIPT = harness.Script(file=__file__, doc=__doc__, args_type=Args, make_env=make_env, acting_policy=acting_policy,
                        flag_ranges=FLAG_RANGES, check_args=check_args, defaults=with_defaults,
                        worker_share=harness.worker_share, procgen=True, actions="any",
                        checkpoint_keys=("ewma_weight", "memory"))


if __name__ == "__main__":
    train(tyro.cli(Args, description=__doc__))
