"""PPG and PPG-EWMA with batch size-invariance: Cobbe et al., "Phasic policy gradient" (2020); Hilton, Cobbe &
Schulman, "Batch size-invariance for policy optimization" (2021).

PPG trains separate policy and value networks. A policy phase of N_pi iterations (rollout, E_pi policy
epochs, E_V value epochs) alternates with an auxiliary phase that distils the value targets of the
whole phase into an auxiliary value head on the policy network while behaviour cloning keeps the policy
where it was. PPG-EWMA uses an EWMA of the policy network's weights as the proximal policy of the
decoupled clipped objective (Sec. 2, Sec. 4), reinitialized at the start of every policy phase
(Appendix A). `--batch-divisor c` divides the batch size by c and multiplies N_pi by c so that the
phase holds the same number of environment steps (Sec. 4).

    python ppg_ewma.py                          # PPG-EWMA on Procgen starpilot, hard (aux buffer: 24.1 GiB of RAM)
    python ppg_ewma.py --batch-divisor 4        # 64 envs, N_pi 128, lr / 2, EWMA age and adv-norm span x4, aux
                                                # minibatch / 4 and its lr / 2 (Appendix B)
    python ppg_ewma.py --no-ewma                # plain PPG (proximal = behaviour policy)
    python ppg_ewma.py --env-id CartPole-v1 --num-envs 8 --num-steps 128 --gamma 0.99 --n-pi 8 \\
        --aux-minibatch-size 64 --total-timesteps 147456   # CPU recipe: 500 (the maximum), 26 s here
"""
import copy
import dataclasses
import math
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Literal, Optional

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import tyro

import harness


@dataclass
class Args(harness.RunArgs):  # run flags: seed, device, --bf16 (off), checkpoints, resume, evaluation
    # the paper's experiment: Procgen, 100M steps
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

    # PPG's hyperparameters (Table 1)
    num_envs: int = 256
    """parallel environments N, the total over all torchrun workers (the paper: 4 workers x 64)"""
    num_steps: int = 256
    """timesteps per rollout T"""
    num_minibatches: int = 8
    """minibatches per policy-phase epoch M: each holds N/M envs' whole trajectories (official layout), so M
    divides N, or M is a multiple of N that cuts each trajectory into M/N equal time chunks"""
    n_pi: int = 32
    """policy iterations per phase N_pi (the auxiliary buffer holds N_pi x T x N observations)"""
    update_epochs: int = 1
    """policy-phase policy epochs E_pi"""
    value_epochs: int = 1
    """policy-phase value-function epochs E_V"""
    aux_epochs: int = 6
    """auxiliary-phase epochs E_aux"""
    aux_minibatch_size: int = 4096
    """auxiliary-phase minibatch size in samples (Table 3's 16 N_pi minibatches an epoch at the default sizes), whole
    trajectories as officially; kept under --batch-divisor (apply_batch_divisor); the total over torchrun workers"""
    aux_learning_rate: float = 5e-4
    """auxiliary-phase Adam step size; kept under --batch-divisor (apply_batch_divisor)"""
    beta_clone: float = 1.0
    """auxiliary-phase behaviour-cloning coefficient beta_clone"""
    learning_rate: float = 5e-4
    """policy-phase Adam step size alpha"""
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
    norm_reward: bool = True
    """divide rewards by the running std of a discounted return, then clip them to +-10 (official code)"""
    reward_norm_gamma: float = 0.99
    """discount of the return whose std normalizes rewards (the official code: 0.99, separate from --gamma)"""
    norm_adv: bool = True
    """normalize advantages with EWMA estimates of their mean and std"""
    adv_norm_span: float = 1.0
    """span of the advantage mean/std EWMA, in iterations (1: this iteration's batch only)"""

    # PPG-EWMA: the decoupled objectives (Sec. 2) with an EWMA as the proximal policy (Appendix A)
    ewma: bool = True
    """proximal policy = EWMA of the policy weights (PPG-EWMA); --no-ewma: proximal = behaviour (PPG)"""
    ewma_com: float = 8.0
    """centre of mass of the proximal-policy EWMA in gradient steps, 1/(1-beta_prox) - 1 (8: beta_prox 0.889)"""
    objective: Literal["clip", "kl"] = "clip"
    """decoupled objective of Sec. 2: clipped (L^CLIP_decoupled) or KL-penalised (L^KLPEN_decoupled)"""
    kl_coef: float = 1.0
    """KL penalty beta for --objective kl (PPG's KL variant: 1; Fig. 2's reference line: 1/256 = 0.00390625)"""
    max_is_ratio: float = 100.0
    """cap on the importance weight pi/pi_behav (Appendix B: for staleness; the official code, as here, always)"""

    # batch size-invariance (Sec. 4)
    batch_divisor: int = 1
    """c: divide num_envs by c and adjust the hyperparameters below for batch size-invariance (Sec. 4)"""
    adjust_lr: bool = True
    """with --batch-divisor: divide the policy-phase Adam step size (by sqrt(c), or c under --lr-rule linear)"""
    lr_rule: Literal["sqrt", "linear"] = "sqrt"
    """Adam step size rule: sqrt (Sec. 3.2, Appendix C) or linear (the ablation of Fig. 5)"""
    adjust_ewma: bool = True
    """with --batch-divisor: multiply the EWMA centre of mass by c"""
    adjust_adv_norm: bool = True
    """with --batch-divisor: multiply the advantage-normalization span by c"""
    adjust_adam_betas: bool = False
    """with --batch-divisor: raise Adam's beta1 and beta2 to the power 1/c (Appendix D)"""
    adjust_n_pi: bool = True
    """with --batch-divisor: multiply N_pi by c, so a phase keeps the same number of env steps (Sec. 4)"""
    adjust_aux: bool = True
    """with --batch-divisor, the auxiliary phase as in Appendix B. The paper shrank its batch of 4 workers x 64 envs
    by dropping workers first, each keeping its aux minibatch. So the first factor a = min(c, 4) of c divides the aux
    minibatch (a total over any torchrun workers) and divides the aux step size by sqrt(a) (by a under --lr-rule
    linear); beyond c = 4 the aux phase stays as at 4. The aux Adam's betas are never adjusted"""

    # options beyond the paper, off by default
    exp_name: str = "ppg_ewma"
    """name of this experiment, part of the run directory's name"""
    shuffle_samples: bool = False
    """shuffle single samples into minibatches (policy, value and aux epochs) instead of whole env trajectories"""
    max_grad_norm: Optional[float] = None
    """clip the gradient's global norm (off: a clipped norm depends on the batch size)"""
    noise_scale: bool = False
    """log charts/grad_noise_scale, the simple noise scale B_simple of the policy phase's gradient (McCandlish et al.,
    2018), next to charts/minibatch_size: batch size-invariance is expected while the minibatch is well below it"""


def apply_batch_divisor(args: Args) -> Args:
    """The adjustments of Sec. 4 for a batch size divided by c = args.batch_divisor, as a new Args, and Appendix B's
    for the auxiliary phase: with N_pi x c its buffer holds the same samples; the paper reduced its 4 workers to 1
    first (c <= 4 here) and then the envs of each, keeping the aux minibatch per worker and adjusting the aux step
    size only while it cut workers."""
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
    if args.adjust_n_pi:
        changes["n_pi"] = args.n_pi * c
    if args.adjust_aux:  # the factor of c that cut the paper's workers
        workers_cut = min(c, 4)
        if args.aux_minibatch_size % workers_cut != 0:
            raise SystemExit(f"--aux-minibatch-size {args.aux_minibatch_size} must be a multiple of "
                             f"min(--batch-divisor, 4) = {workers_cut}, which --adjust-aux divides it by (Appendix B).")
        changes["aux_minibatch_size"] = args.aux_minibatch_size // workers_cut
        lr_divisor = workers_cut if args.lr_rule == "linear" else math.sqrt(workers_cut)
        changes["aux_learning_rate"] = args.aux_learning_rate / lr_divisor
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


def policy_loss(policy, args, obs, actions, advantages, behav_logp, prox_pi, prox_logp):
    """-L^CLIP_decoupled (or -L^KLPEN_decoupled) - c_ent entropy (Sec. 2, Table 1) of a minibatch with pi under theta:
    (loss, its two terms, log pi(a|s))."""
    new_pi = policy.get_pi(obs)
    new_logp, entropy = categorical_log_prob_and_entropy(new_pi, actions)
    if args.objective == "clip":
        pg_loss = decoupled_clip_loss(new_logp, prox_logp, behav_logp, advantages, args.clip_coef, args.max_is_ratio)
    else:
        kl = categorical_kl(prox_pi, new_pi)  # KL[pi_prox || pi]
        pg_loss = decoupled_kl_loss(new_logp, behav_logp, advantages, kl, args.kl_coef, args.max_is_ratio)
    entropy_loss = entropy.mean()
    return pg_loss - args.ent_coef * entropy_loss, pg_loss, entropy_loss, new_logp


def aux_loss(new_logits, old_logits, aux_values, values, returns, beta_clone):
    """PPG's auxiliary-phase loss, L_joint = L_aux + beta_clone KL[pi_old || pi], plus the true value loss L^value.
    new_logits, old_logits: [B, A] (old_logits: the pre-phase policy, no gradient); aux_values (aux head), values
    (value network), returns (V_targ): [B]."""
    clone_kl = categorical_kl(old_logits.detach(), new_logits).mean()
    l_aux = 0.5 * ((aux_values - returns) ** 2).mean()  # L^aux on the policy network's auxiliary head
    l_value = 0.5 * ((values - returns) ** 2).mean()  # L^value: the value network keeps training too
    return beta_clone * clone_kl + l_aux + l_value


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


def epoch_minibatches(args: Args) -> list:
    """One epoch's minibatches of flat indices: whole env trajectories (official layout) or shuffled samples."""
    if args.shuffle_samples:
        return list(torch.randperm(args.num_envs * args.num_steps).chunk(args.num_minibatches))
    return minibatch_indices(args.num_steps, args.num_envs, args.num_minibatches)


def phase_minibatch_indices(n_pi, num_steps, num_envs, num_minibatches, generator=None):
    """Minibatches of the auxiliary phase: whole trajectories, as flat indices into an [N_pi, T, N] buffer. The
    phase's N_pi x N trajectories play the envs of minibatch_indices; trajectory j is env j % N of iteration j // N."""
    trajectories = n_pi * num_envs
    minibatches = []
    for inds in minibatch_indices(num_steps, trajectories, num_minibatches, generator):
        t, j = inds // trajectories, inds % trajectories
        minibatches.append(((j // num_envs) * num_steps + t) * num_envs + j % num_envs)
    return minibatches


def auxiliary_phase(policy, value_net, optimizer, phase_obs, phase_returns, aux_epochs, aux_minibatch_size,
                    shuffle_samples, beta_clone, iteration, device):
    """PPG's auxiliary phase (Cobbe et al., 2020, Algorithm 1); returns the mean of each logged quantity. phase_obs:
    [N_pi, T, N, ...] (uint8 for Procgen, on the CPU); phase_returns: [N_pi, T, N], the policy phase's value targets.
    Minibatches move to `device` one at a time, so only the buffer must fit in RAM."""
    n_pi, num_steps, num_envs = phase_returns.shape
    num_samples, num_minibatches = phase_returns.numel(), phase_returns.numel() // aux_minibatch_size
    phase_obs, phase_returns = phase_obs.reshape((num_samples,) + phase_obs.shape[3:]), phase_returns.reshape(-1)
    # pi_old: the policy as the policy phase left it, for behaviour cloning (kept on the CPU with the buffer)
    old_logits = harness.in_chunks(lambda obs: policy.get_pi(obs.to(device)).cpu(), phase_obs, aux_minibatch_size)
    stats = {k: [] for k in ("aux_clone_kl", "aux_value_loss", "aux_true_value_loss", "aux_kl_moved")}
    for epoch in range(aux_epochs):
        if shuffle_samples:
            minibatches = torch.randperm(num_samples).chunk(num_minibatches)
        else:  # whole trajectories, as the official aux minibatches
            minibatches = phase_minibatch_indices(n_pi, num_steps, num_envs, num_minibatches)
        for mb_inds in minibatches:
            mb_obs, mb_returns = phase_obs[mb_inds].to(device), phase_returns[mb_inds].to(device)
            mb_old_logits = old_logits[mb_inds].to(device)
            new_logits, aux_values = policy(mb_obs)
            values = value_net(mb_obs)
            loss = aux_loss(new_logits, mb_old_logits, aux_values, values, mb_returns, beta_clone)
            harness.check_finite(iteration, aux_loss=loss)
            gradient_step(optimizer, loss, policy, value_net)  # torchrun: each worker's minibatch from its own buffer

            with torch.no_grad():
                clone_kl = categorical_kl(mb_old_logits, new_logits).mean().item()
                stats["aux_clone_kl"].append(clone_kl)
                stats["aux_value_loss"].append(0.5 * ((aux_values - mb_returns) ** 2).mean().item())
                stats["aux_true_value_loss"].append(0.5 * ((values - mb_returns) ** 2).mean().item())
                if epoch == aux_epochs - 1:  # last epoch's KL[old || new]: how far the phase moved pi
                    stats["aux_kl_moved"].append(clone_kl)
    return {k: float(np.mean(v)) if v else 0.0 for k, v in stats.items()}


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
    flags, checkpoint = harness.run_flags(args, SCRIPT)  # each checked; with --resume, the checkpoint's
    # the hyperparameters the run trains with: Sec. 4's adjustments for a batch divided by c = --batch-divisor, with
    # Appendix B's for the auxiliary phase (apply_batch_divisor; checkpoints keep the flags they came from)
    args = apply_batch_divisor(flags)

    batch_size = args.num_envs * args.num_steps  # N x T, over all torchrun workers
    minibatch_size = batch_size // args.num_minibatches
    num_iterations = math.ceil(args.total_timesteps / batch_size)  # the last one may run past --total-timesteps
    run = harness.start(SCRIPT, args, checkpoint, num_iterations, flags)  # checks, torchrun workers, seeds, device
    envs = run.open(make_env(run.args, run.render_mode))  # made after the seeding; then run dir, logs, start-up
    # run.args: args in one process; under torchrun this worker's share, N / W envs and a seed of its own
    args, device, writer = run.args, run.device, run.writer

    policy, value_net = PolicyNetwork(envs, args.bf16).to(device), ValueNetwork(envs, args.bf16).to(device)
    harness.broadcast_weights(policy, value_net)  # torchrun: every worker starts from rank 0's weights
    # PPG-EWMA: the proximal policy's weights theta_prox, an EWMA of theta with decay beta_prox and total weight w
    # (Appendix A), reset to theta at every policy phase's start
    ewma_policy = copy.deepcopy(policy).requires_grad_(False) if args.ewma else None
    ewma_decay, ewma_weight = com_to_decay(args.ewma_com), 1.0

    # pi_prox of a minibatch: the EWMA network's policy
    def prox_pi_of(obs):
        """pi_prox of the EWMA network: a no-grad pass, on the CPU 64 frames at a time (memory only: the same
        numbers as one pass)."""
        return harness.in_chunks(ewma_policy.get_pi, obs, 64 if device.type == "cpu" else len(obs))

    # one Adam for both networks: zero_grad() leaves the other network's gradients None, which Adam skips
    parameters = list(policy.parameters()) + list(value_net.parameters())
    optimizer = torch.optim.Adam(parameters, lr=args.learning_rate, eps=args.adam_eps,
                                 betas=(args.adam_beta1, args.adam_beta2), foreach=True)
    # Appendix B adjusts only the auxiliary phase's step size, so its Adam keeps the unadjusted betas
    aux_optimizer = torch.optim.Adam(parameters, lr=args.aux_learning_rate, eps=args.adam_eps,
                                     betas=(flags.adam_beta1, flags.adam_beta2), foreach=True)
    adv_moments = EwmaMoments(span_to_decay(args.adv_norm_span))
    noise_scale = GradientNoiseScale() if args.noise_scale else None
    reward_normalizer = RewardNormalizer(args.num_envs, args.reward_norm_gamma) if args.norm_reward else None
    num_actions = envs.single_action_space.n
    # the phase's observations (env dtype: uint8 for Procgen) and value targets wait on the CPU for the
    # auxiliary phase; empty: the OS commits the pages only as the first phase fills them
    obs_dtype, rollout_shape = harness.obs_dtype(envs), (args.num_steps, args.num_envs)  # [T, N]
    obs_shape = envs.single_observation_space.shape
    phase_obs = torch.empty((args.n_pi,) + rollout_shape + obs_shape, dtype=obs_dtype)
    phase_returns = torch.zeros((args.n_pi,) + rollout_shape)
    actions = torch.zeros(rollout_shape, dtype=torch.long, device=device)
    behav_pis = torch.zeros(rollout_shape + (num_actions,), device=device)  # pi_behav: the KL's pi_prox under PPG
    behav_logps, rewards, dones, values = (torch.zeros(rollout_shape, device=device) for _ in range(4))
    bootstraps = torch.zeros(rollout_shape, device=device)  # gamma V(final obs) at truncations

    next_obs, _ = envs.reset(seed=args.seed)
    next_obs = torch.as_tensor(next_obs, dtype=obs_dtype)
    next_done = torch.zeros(args.num_envs, device=device)
    # what a checkpoint holds (with the EWMA weight w, the env stack's state and statistics and the RNGs), restored
    # with --resume; checkpoints are taken only where a phase ends (its buffer is then spent), the first phase end
    # at or after every --checkpoint-every iterations
    saved = harness.Saved(models={"policy": policy, "value_net": value_net, "ewma_policy": ewma_policy},
                              optimizers={"optimizer": optimizer, "aux_optimizer": aux_optimizer},
                              normalizers={"reward": reward_normalizer, "advantages": adv_moments,
                                           "noise_scale": noise_scale}, keys={"ewma_weight": ewma_weight})
    global_step, first_iteration, next_obs, next_done = run.restore(saved, next_obs, next_done)
    if (first_iteration - 1) % args.n_pi:  # checkpoints are taken at phase ends only, so the next resets w and theta
        run.refuse(f"its iteration {first_iteration - 1:,} ends no phase of --n-pi {args.n_pi}")
    ewma_weight = run.restored("ewma_weight", lambda w: w >= 1, "is below 1")

    for iteration in range(first_iteration, num_iterations + 1):
        # a phase: N_pi iterations of the policy phase, then the auxiliary phase
        phase_iteration = (iteration - 1) % args.n_pi
        if phase_iteration == 0:
            phase_start = time.time()
            if ewma_policy is not None:  # Appendix A (bold): reinitialize the EWMA at every policy phase
                ewma_weight = update_ewma(ewma_policy, policy, 0.0, 0.0)  # decay 0: theta_prox <- theta, w <- 1

        # rollout: T steps of the N envs with the behaviour policy pi_behav
        obs = phase_obs[phase_iteration]  # the rollout's observations go straight into the phase's buffer (CPU)
        bootstraps.zero_()
        for step in range(args.num_steps):
            global_step += args.num_envs * run.world_size
            obs[step], dones[step] = next_obs, next_done
            with torch.no_grad():
                step_obs = next_obs.to(device)
                step_pi, values[step] = policy.get_pi(step_obs), value_net(step_obs)
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
                    bootstraps[step, truncated_only] = args.gamma * value_net(final_obs)
            next_obs = torch.as_tensor(next_obs_np, dtype=obs_dtype)
            next_done = torch.as_tensor(terminated | truncated, dtype=torch.float32, device=device)
            run.after_step(global_step, info)  # finished episodes, progress
        run.end_rollout()  # the rollout's episodes to TensorBoard (torchrun: all workers')

        # advantages: GAE on rewards scaled once per rollout, as officially (torchrun: one estimate over all
        # workers); the bootstrap V is already in scaled units
        with torch.no_grad():
            next_value = value_net(next_obs.to(device))
        scaled_rewards = reward_normalizer(rewards, dones, harness.global_batch) if reward_normalizer else rewards
        advantages, returns = compute_gae(scaled_rewards + bootstraps, values, dones, next_value, next_done,
                                          args.gamma, args.gae_lambda)
        phase_returns[phase_iteration] = returns.cpu()  # V_targ, reused by the auxiliary phase
        b_obs = obs.reshape((-1,) + obs_shape)
        b_actions, b_behav_pis = actions.reshape(-1), behav_pis.reshape(-1, num_actions)
        b_behav_logps, b_advantages = behav_logps.reshape(-1), advantages.reshape(-1)
        b_returns, b_values = returns.reshape(-1), values.reshape(-1)
        if args.norm_adv:  # full-batch normalization with EWMA moments over `adv_norm_span` iterations
            adv_moments.update(harness.global_batch(b_advantages))  # torchrun: moments of all workers' advantages
            b_advantages = adv_moments.normalize(b_advantages)

        # update: the policy phase's E_pi epochs on the policy network, then E_V on the value network
        stats = defaultdict(list)  # name -> per-minibatch values, averaged once per iteration
        for epoch in range(args.update_epochs):  # E_pi epochs of the decoupled objective on the policy network
            run.updating(f"policy epoch {epoch + 1}/{args.update_epochs}")
            for mb_inds in epoch_minibatches(args):
                # the minibatch, and its pi_prox: the EWMA network's (PPG-EWMA) or pi_behav (PPG)
                mb_obs, mb_actions = b_obs[mb_inds].to(device), b_actions[mb_inds]
                mb_behav_logp = b_behav_logps[mb_inds]
                if ewma_policy is not None:
                    prox_pi = prox_pi_of(mb_obs)
                    prox_logp = categorical_log_prob_and_entropy(prox_pi, mb_actions)[0]
                else:
                    prox_pi, prox_logp = b_behav_pis[mb_inds], mb_behav_logp
                # the loss: -L^CLIP_decoupled (or -L^KLPEN_decoupled) - c_ent entropy, with pi under theta
                loss, pg_loss, entropy_loss, new_logp = policy_loss(
                    policy, args, mb_obs, mb_actions, b_advantages[mb_inds], mb_behav_logp, prox_pi, prox_logp)
                harness.check_finite(iteration, policy_loss=pg_loss, entropy=entropy_loss)

                # one Adam step on theta (torchrun: on the workers' mean gradient), then theta_prox <- EWMA of theta
                gradient_step(optimizer, loss, policy, max_grad_norm=args.max_grad_norm, noise_scale=noise_scale)
                if ewma_policy is not None:  # PPG-EWMA: theta_prox <- EWMA of theta after every step
                    ewma_weight = update_ewma(ewma_policy, policy, ewma_weight, ewma_decay)
                add_statistics(stats, args, pg_loss, entropy_loss, new_logp, prox_logp, mb_behav_logp)
            if noise_scale is not None:
                noise_scale.end_epoch(args.num_envs * args.num_steps // args.num_minibatches)

        # then E_V epochs on the value network: one Adam step on c_VF L^value per minibatch
        for epoch in range(args.value_epochs):  # E_V epochs of L^value on the separate value network
            run.updating(f"value epoch {epoch + 1}/{args.value_epochs}")
            for mb_inds in epoch_minibatches(args):
                v_loss = value_loss(value_net(b_obs[mb_inds].to(device)), b_returns[mb_inds])
                harness.check_finite(iteration, value_loss=v_loss)
                gradient_step(optimizer, args.vf_coef * v_loss, value_net, max_grad_norm=args.max_grad_norm)
                stats["value_loss"].append(v_loss.detach())

        # auxiliary phase, after N_pi policy iterations: distil V_targ into the policy network's aux head
        if phase_iteration == args.n_pi - 1:
            aux_start = time.time()
            aux_stats = auxiliary_phase(policy, value_net, aux_optimizer, phase_obs, phase_returns, args.aux_epochs,
                                        args.aux_minibatch_size, args.shuffle_samples, args.beta_clone, iteration,
                                        device)
            # statistics
            for name, value in aux_stats.items():
                writer.add_scalar(f"losses/{name}", value, global_step)
            writer.add_scalar("charts/aux_learning_rate", aux_optimizer.param_groups[0]["lr"], global_step)
            writer.add_scalar("charts/policy_phase_time", aux_start - phase_start, global_step)
            writer.add_scalar("charts/aux_phase_time", time.time() - aux_start, global_step)

        # logging: the minibatches' means, the iteration's own scalars, the options'
        scalars = {f"losses/{name}": torch.stack(values).mean().item() for name, values in stats.items()}
        scalars.update({"charts/learning_rate": optimizer.param_groups[0]["lr"],
                        "losses/explained_variance": explained_variance(b_values, b_returns)})
        scalars.update({"charts/adv_mean": adv_moments.mean, "charts/adv_std": adv_moments.std}
                       if args.norm_adv else {})
        scalars.update({"charts/ewma_decay": ewma_decay, "charts/ewma_weight": ewma_weight} if args.ewma else {})
        scalars.update(noise_scale.end_iteration(minibatch_size) if noise_scale else {})
        for tag, value in scalars.items():
            writer.add_scalar(tag, value, global_step)

        run.end_iteration(iteration, global_step, next_obs, next_done, can_checkpoint=phase_iteration == args.n_pi - 1,
                          ewma_weight=ewma_weight)  # SPS, checkpoint
    return run.finish(iteration, global_step, next_obs, next_done, ewma_weight=ewma_weight)  # --save-model


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


def make_torso(obs_shape, bf16=False):
    """IMPALA CNN for images, 64-64 tanh MLP for vectors; returns (module, feature size)."""
    if len(obs_shape) == 3:
        return ImpalaCNN(obs_shape[-1], bf16=bf16).to(memory_format=torch.channels_last), 256  # ~1.8x faster on CPU
    return nn.Sequential(
        layer_init(nn.Linear(int(np.prod(obs_shape)), 64)), nn.Tanh(), layer_init(nn.Linear(64, 64)), nn.Tanh(),
    ), 64


def make_head(torso, hidden, outputs, mlp_std):
    """Official heads after the IMPALA CNN (normed init, scale 0.1); CleanRL's orthogonal init after the MLP."""
    if isinstance(torso, ImpalaCNN):
        return normed_init(nn.Linear(hidden, outputs), 0.1)
    return layer_init(nn.Linear(hidden, outputs), std=mlp_std)


class PolicyNetwork(nn.Module):
    """PPG's policy network: torso, policy head and the auxiliary value head V_theta_pi."""

    def __init__(self, envs, bf16=False):
        super().__init__()
        self.torso, hidden = make_torso(envs.single_observation_space.shape, bf16)
        self.actor = make_head(self.torso, hidden, envs.single_action_space.n, mlp_std=0.01)
        self.aux_critic = make_head(self.torso, hidden, 1, mlp_std=1.0)

    def get_pi(self, obs):
        return self.actor(self.torso(obs))

    def forward(self, obs):
        hidden = self.torso(obs)
        return self.actor(hidden), self.aux_critic(hidden).squeeze(-1)


class ValueNetwork(nn.Module):
    """PPG's separate value network V_theta_V: its own torso, so value training never disturbs the policy."""

    def __init__(self, envs, bf16=False):
        super().__init__()
        self.torso, hidden = make_torso(envs.single_observation_space.shape, bf16)
        self.critic = make_head(self.torso, hidden, 1, mlp_std=1.0)

    def forward(self, obs):
        return self.critic(self.torso(obs)).squeeze(-1)


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


# ------------------------------------------------------- a diagnostic the paper uses: the gradient noise scale
def noise_scale_estimates(small_sq_norm, small_batch, big_sq_norm, big_batch):
    """Unbiased (|G|^2, tr(Sigma)) from squared gradient norms at two batch sizes (McCandlish et al., 2018, App. A)."""
    grad_sq = (big_batch * big_sq_norm - small_batch * small_sq_norm) / (big_batch - small_batch)
    trace = (small_sq_norm - big_sq_norm) / (1.0 / small_batch - 1.0 / big_batch)
    return grad_sq, trace


class GradientNoiseScale:
    """--noise-scale: B_simple = tr(Sigma) / |G|^2 of the gradient stepped on, from each epoch's minibatch gradients
    (B_small) and their mean (B_big), EWMAs over iterations (McCandlish et al.); nan while the |G|^2 EWMA is <= 0."""

    def __init__(self, decay=0.9):
        self.decay, self.weight, self.grad_sq, self.trace = decay, 0.0, 0.0, 0.0
        self.sq_norms, self.grad_sum, self.epochs = [], None, []

    @torch.no_grad()
    def add(self, *modules):
        """After backward(): this minibatch's gradient (under torchrun, this worker's, before averaging)."""
        grad = torch.cat([p.grad.reshape(-1) for module in modules for p in module.parameters() if p.grad is not None])
        self.sq_norms.append(grad.square().sum())
        self.grad_sum = grad if self.grad_sum is None else self.grad_sum + grad

    def end_epoch(self, minibatch_size):
        num_minibatches = len(self.sq_norms)
        if num_minibatches > 1:  # two batch sizes are needed
            big_sq_norm = (self.grad_sum / num_minibatches).square().sum().item()
            self.epochs.append(noise_scale_estimates(torch.stack(self.sq_norms).mean().item(), minibatch_size,
                                                     big_sq_norm, num_minibatches * minibatch_size))
        self.sq_norms, self.grad_sum = [], None

    def end_iteration(self, minibatch_size) -> dict:
        """The iteration's B_simple, |G|^2, tr(Sigma) (nan until an epoch had two minibatches), the minibatch size."""
        if self.epochs:
            grad_sq, trace = (float(x) for x in np.mean(self.epochs, axis=0))  # floats: checkpoints keep them
            self.weight = self.decay * self.weight + 1.0
            self.grad_sq = self.decay * self.grad_sq + grad_sq
            self.trace = self.decay * self.trace + trace
            self.epochs = []
        weight = self.weight or float("nan")  # no estimate yet: nan
        b_simple = self.trace / self.grad_sq if self.grad_sq > 0 else float("nan")  # B_simple = tr(Sigma) / |G|^2
        return {"charts/grad_noise_scale": b_simple, "charts/grad_noise_trace": self.trace / weight,
                "charts/grad_sq_norm": self.grad_sq / weight, "charts/minibatch_size": minibatch_size}


# ---------------------------------------------------------------------------------------- what train() logs
@torch.no_grad()
def add_statistics(stats, args, pg_loss, entropy_loss, new_logp, prox_logp, behav_logp) -> None:
    """A policy minibatch's scalars into stats ({name: [value of each minibatch]}), averaged over the iteration."""
    logratio, behav_logratio = new_logp - prox_logp, new_logp - behav_logp
    for name, value in (
        ("policy_loss", pg_loss), ("entropy", entropy_loss),
        ("approx_kl", ((logratio.exp() - 1) - logratio).mean()),  # k3 of KL to pi_prox, a ~ pi_behav
        ("approx_kl_behav", ((behav_logratio.exp() - 1) - behav_logratio).mean()),
        ("clipfrac", ((logratio.exp() - 1).abs() > args.clip_coef).float().mean()),
        ("is_capped_frac", (behav_logratio > math.log(args.max_is_ratio)).float().mean()),
    ):
        stats[name].append(value.detach())


def explained_variance(values, returns) -> float:
    """1 - Var[returns - values] / Var[returns], nan where the returns do not vary."""
    return (1 - (returns - values).var() / returns.var()).item() if returns.var() > 0 else float("nan")


# ---------------------------------------------------------- what the run harness needs to know of this script
FLAG_RANGES = {  # the interval each numeric flag of this script must lie in (harness.py: the common ones)
    "num_levels": "[0, inf)", "start_level": "[0, inf)", "n_pi": "[1, inf)", "value_epochs": "[0, inf)",
    "adam_beta1": "[0, 1)", "adam_beta2": "[0, 1)", "reward_norm_gamma": "[0, 1]", "clip_coef": "(0, 1)",
    "kl_coef": "[0, inf)", "ent_coef": "[0, inf)", "vf_coef": "[0, inf)", "max_grad_norm": "(0, inf)",
    "max_is_ratio": "(1, inf]", "adv_norm_span": "[1, inf)", "aux_epochs": "[0, inf)", "aux_minibatch_size": "[1, inf)",
    "aux_learning_rate": "(0, inf)", "beta_clone": "[0, inf)", "ewma_com": "[0, inf)", "batch_divisor": "[1, inf)",
}


def check_args(args: Args, observation_space, action_space) -> None:
    """This script's own checks of the run's Args (the batch-divisor adjustments applied)."""
    harness.check_minibatches(args.num_steps, args.num_envs, args.num_minibatches, args.shuffle_samples)
    aux_size, num_steps = args.aux_minibatch_size, args.num_steps
    phase_size = args.n_pi * args.num_envs * num_steps
    whole = aux_size % num_steps == 0 or num_steps % aux_size == 0 or args.shuffle_samples
    if aux_size > phase_size or phase_size % aux_size != 0 or not whole:
        raise SystemExit(f"--aux-minibatch-size {aux_size} must divide the phase of {phase_size} samples (--n-pi "
                         f"{args.n_pi} x --num-envs {args.num_envs} x --num-steps {num_steps}) into whole "
                         f"trajectories (a multiple of --num-steps) or equal pieces of one (a divisor of --num-steps).")
    # the auxiliary phase keeps N_pi x T x N observations (uint8 64x64x3 = 12 KiB each for Procgen), and with each
    # a float32 value target and the pre-phase policy's float32 logits
    obs_bytes = math.prod(observation_space.shape) * np.dtype(observation_space.dtype).itemsize
    harness.check_memory(phase_size * (obs_bytes + 4 + 4 * action_space.n), False,
                         "The auxiliary phase's buffers (host memory)",
                         "--n-pi, --num-envs or --num-steps (--batch-divisor keeps them the same)")


def describe(args: Args, num_iterations: int) -> str:
    return harness.describe(args, num_iterations) + f", phases of {args.n_pi}"


def worker_share(args: Args, rank: int, world_size: int) -> Args:
    """harness.worker_share's Args, with auxiliary minibatches of aux_minibatch_size / W from its own phase buffer."""
    if args.aux_minibatch_size % world_size != 0:
        raise SystemExit(f"--aux-minibatch-size {args.aux_minibatch_size} is the total over all workers, so it must be "
                         f"a multiple of the {world_size} torchrun workers.")
    return dataclasses.replace(harness.worker_share(args, rank, world_size),
                               aux_minibatch_size=args.aux_minibatch_size // world_size)


def acting_policy(args: Args, envs, load, device):
    """The checkpoint's policy network (not the EWMA) as obs -> actions, sampled or (--eval-deterministic) the most
    likely."""
    policy = PolicyNetwork(envs).to(device)
    load(policy, "policy")  # the checkpoint's weights, checked

    def act(obs, reward, done):  # (the last step's reward and done: unused)
        logits = policy.get_pi(obs)
        harness.check_policy(logits)
        return logits.argmax(-1) if args.eval_deterministic else torch.distributions.Categorical(logits=logits).sample()
    return act


SCRIPT = harness.Script(file=__file__, doc=__doc__, args_type=Args, make_env=make_env, acting_policy=acting_policy,
                        flag_ranges=FLAG_RANGES, check_args=check_args, describe=describe,
                        worker_share=worker_share, procgen=True,
                        missing_flags={"adjust_aux": False},  # runs before --adjust-aux left the aux phase alone
                        checkpoint_keys=("ewma_weight",), policy="policy")


if __name__ == "__main__":
    train(tyro.cli(Args, description=__doc__))
