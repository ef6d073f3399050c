"""V-MPO, discrete and continuous actions: Song et al., "V-MPO: On-Policy Maximum a Posteriori Policy Optimization for
Discrete and Continuous Control" (ICLR 2020).

A target network acts and is held fixed for T_target learning steps; the online network learns.
Each learning step is EM-style policy iteration (Sec. 4.2): the E-step builds a nonparametric target
psi(s, a) = softmax(A/eta) over the top half of the advantages, with the temperature eta tuned by a
convex loss; the M-step fits the policy to psi by weighted maximum likelihood under a KL trust region
to the target policy, with a learned Lagrange multiplier alpha. The value function regresses n-step
returns through a PopArt-normalized head (Sec. 4.1). No entropy bonus, no importance weights.

    python vmpo.py                                       # Procgen starpilot, hard
    python vmpo.py --env-id CartPole-v1 --num-envs 8 --num-steps 128 --num-minibatches 4 --gamma 0.99 \\
        --total-timesteps 150000 --learning-rate 1e-3 --multiplier-lr 1e-2   # CPU recipe: about 450, 13 s here
    python vmpo.py --env-id Pendulum-v1 --num-envs 8 --num-steps 256 --num-minibatches 8 --update-epochs 10 \\
        --gamma 0.9 --total-timesteps 300000 --learning-rate 1e-3 --multiplier-lr 1e-2 --norm-obs False   # 1 min
    python vmpo.py --env-id HalfCheetah-v5 --num-envs 8 --num-steps 256 --num-minibatches 8 --update-epochs 10 \\
        --gamma 0.99 --total-timesteps 1000000 --learning-rate 3e-4 --multiplier-lr 1e-2   # MuJoCo, 6 min here
    PYTHONPATH=benchmark python vmpo.py --lstm --env-id masked_cartpole:MaskedCartPole-v1 --num-envs 16 \\
        --num-steps 64 --num-minibatches 2 --norm-obs True --gamma 0.99 --total-timesteps 400000 \\
        --learning-rate 1e-3 --multiplier-lr 1e-2        # Fig. 1b's recurrent agent, CartPole without velocities
"""
import copy
import dataclasses
import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Literal, Optional

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import tyro

import harness


MULTIPLIER_MIN = 1e-8  # eta_min = alpha_min (Sec. 4.2.2)


@dataclass
class Args(harness.RunArgs):  # run flags: seed, device, --bf16 (off), checkpoints, resume, evaluation
    # the experiment: Procgen (the paper has none: ppo_ewma.py's setting), or a Gymnasium env
    env_id: str = "starpilot"
    """a Procgen game, or a Gymnasium env with vector observations and Discrete or Box actions"""
    distribution_mode: Literal["easy", "hard"] = "hard"
    """Procgen difficulty"""
    num_levels: int = 0
    """Procgen levels to train on; 0 means unlimited"""
    start_level: int = 0
    """Procgen's first level seed"""
    total_timesteps: int = 100_000_000
    """total environment steps (not in the paper, which has no Procgen: ppo_ewma.py's budget)"""

    # V-MPO's hyperparameters (Sec. 4, Appendix F)
    num_envs: int = 256
    """parallel environments N (not in the paper: ppo_ewma.py's Procgen setting)"""
    num_steps: int = 256
    """unroll length n of each rollout"""
    num_minibatches: int = 8
    """learning steps per epoch; each takes one minibatch of the rollout"""
    update_epochs: int = 1
    """passes over each rollout (1: every sample is used in one learning step, as in Algorithm 1)"""
    target_period: int = 0
    """T_target: target <- online every this many learning steps; 0 means once per iteration, after
    all of its update_epochs x num_minibatches learning steps"""
    learning_rate: float = 1e-4
    """Adam step size (the paper: 1e-4 in all experiments)"""
    multiplier_lr: Optional[float] = None
    """Adam step size for eta and alpha; None: --learning-rate (the paper: one Adam for all)"""
    adam_eps: float = 1e-8
    """Adam epsilon (TensorFlow's default, which the paper used)"""
    gamma: float = 0.999
    """discount gamma (not in the paper: the Procgen convention of ppo_ewma.py)"""
    gae_lambda: float = 1.0
    """lambda of compute_gae; 1 gives the paper's n-step returns bootstrapped at the unroll's end"""
    popart: bool = True
    """PopArt value normalization (Sec. 4.1)"""
    popart_beta: float = 1e-4
    """step size of PopArt's mean and second-moment statistics (the paper: 1e-4)"""
    top_k_fraction: float = 0.5
    """fraction of each minibatch, by largest advantage, used by the E-step (the paper: top 50%)"""
    eta_init: float = 1.0
    """initial temperature eta (the paper's appendix tables: 1)"""
    eps_eta: float = 0.01
    """E-step KL bound epsilon_eta (the paper's Gym table, Appendix F: 0.01)"""
    alpha_init: float = 5.0
    """initial KL multiplier alpha, discrete actions (the paper's appendix tables: 5)"""
    eps_alpha: float = 0.005
    """M-step KL bound epsilon_alpha, discrete actions (not from the paper's Gym table, which has Box actions only)"""
    alpha_mean_init: float = 1.0
    """initial alpha_mu of the Gaussian mean's KL (the paper's Gym table, Appendix F: 1)"""
    alpha_std_init: float = 1.0
    """initial alpha_Sigma of the Gaussian std's KL (the paper's Gym table, Appendix F: 1)"""
    eps_alpha_mean: float = 0.01
    """bound epsilon_alpha_mu on the mean's KL (the paper's Gym table, Appendix F: log-uniform in [0.005, 0.01];
    here its upper end, since runs of 1M steps are short)"""
    eps_alpha_std: float = 5e-5
    """bound epsilon_alpha_Sigma on the std's KL (the paper's Gym table, Appendix F: log-uniform in [5e-6, 5e-5);
    here its upper end, since runs are short; 10x it ended lower on Walker2d-v5: docs/vmpo.md, the ablation)"""
    lstm: bool = False
    """the paper's recurrent agent (Fig. 1b): one encoder feeds an LSTM core that also reads the previous action and
    reward, and both heads read the core (Box actions too). Minibatches are whole env unrolls, each replayed from the
    acting network's core state stored at its start (R2D2's stored state)"""
    whole_unrolls: bool = False
    """minibatches of whole env unrolls, as --lstm's always are (so that a feed-forward agent's E-step picks its top k
    from the same sets), instead of samples shuffled over the batch"""

    # options beyond the paper
    exp_name: str = "vmpo"
    """name of this experiment, part of the run directory's name"""
    norm_obs: Optional[bool] = None
    """normalize each env's vector observations by running statistics, then clip them to +-10 (as ppo_ewma.py; not
    in the paper); default: on for Box actions, off for discrete ones"""
    norm_reward: bool = True
    """scale rewards by a running std of the discounted return, then clip them to +-10 (not in the paper, which relies
    on PopArt); --no-norm-reward: the raw rewards"""
    min_std: float = 1e-3
    """Gaussian std = softplus(head output) + min_std (not in the paper: keeps log-probs finite)"""
    state_dependent_std: bool = True
    """the Gaussian's std is an output of the policy network; --no-state-dependent-std: one learned std per action
    dimension for every state, as PPO's (the paper does not say which; same softplus, floor and initial std)"""


def with_defaults(args: Args) -> Args:
    """Args with --norm-obs's default filled in where it is None: on for Box actions, off for discrete ones."""
    continuous = isinstance(harness.env_spaces(args.env_id, harness.PROCGEN_GAMES)[1], gym.spaces.Box)
    return dataclasses.replace(args, norm_obs=continuous if args.norm_obs is None else args.norm_obs)


# ------------------------------------------------------------- the algorithm: GAE, E-step, M-step, PopArt (Sec. 4)
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


def vmpo_e_step(advantages, temperature, eps_eta, top_k_fraction=0.5):
    """E-step on the top-k advantages: (psi weights [B], temperature loss L_eta).

    advantages: [B] (no gradient); temperature: eta, a scalar parameter. The k = max(1, int(top_k_fraction B))
    largest advantages form D~; psi = softmax(A/eta) over D~ and 0 elsewhere, with no gradient (Eq. 12).
    L_eta = eta eps_eta + eta log(1/|D~| sum_D~ exp(A/eta))  (Eq. 13).
    """
    advantages = advantages.detach()
    k = max(1, int(top_k_fraction * advantages.numel()))
    top_advantages, top_inds = torch.topk(advantages, k)
    scaled = top_advantages / temperature
    # log-mean-exp, stabilised by subtracting max(A/eta)
    max_scaled = scaled.max().detach()
    log_mean_exp = max_scaled + torch.log(torch.exp(scaled - max_scaled).mean())
    temperature_loss = temperature * eps_eta + temperature * log_mean_exp
    weights = torch.zeros_like(advantages)
    weights[top_inds] = torch.softmax(scaled.detach(), dim=0)
    return weights, temperature_loss


def vmpo_policy_loss(logp, weights):
    """L_pi = -sum psi(s, a) log pi(a|s)  (Eq. 12). logp, weights: [B]."""
    return -(weights.detach() * logp).sum()


def vmpo_kl_loss(kl, alpha, eps_alpha):
    """L_alpha = mean of alpha (eps_alpha - sg[KL]) + sg[alpha] KL  (Eq. 14).

    kl: [B] per-sample KL[pi_target || pi]; alpha: scalar parameter. The stop-gradients split one loss in two:
    alpha sees only (eps_alpha - KL), the policy only alpha KL, and one step moves both.
    """
    return (alpha * (eps_alpha - kl.detach())).mean() + (alpha.detach() * kl).mean()


def gaussian_kl_decoupled(mean_old, std_old, mean, std):
    """Decoupled KLs of diagonal Gaussians, per sample, summed over action dims: (C_mu, C_Sigma), [B].

    C_mu = KL[N(mu_old, S_old) || N(mu, S_old)] = 1/2 (mu - mu_old)^T S_old^-1 (mu - mu_old) depends
    on the mean only; C_Sigma = KL[N(mu_old, S_old) || N(mu_old, S)]
    = 1/2 (Tr(S^-1 S_old) - d + log |S|/|S_old|) on the std only (Abdolmaleki et al., 2018b), with
    S = diag(std^2). mean_old, std_old, mean, std: [B, D].
    """
    var_old, var = std_old**2, std**2
    kl_mean = 0.5 * ((mean - mean_old) ** 2 / var_old).sum(-1)
    kl_std = 0.5 * (var_old / var - 1.0 + torch.log(var / var_old)).sum(-1)
    return kl_mean, kl_std


@torch.no_grad()
def project_multipliers(multipliers, min_value=MULTIPLIER_MIN):
    """eta <- max(eta, eta_min), alpha <- max(alpha, alpha_min) in place (Algorithm 1)."""
    for multiplier in multipliers:
        multiplier.clamp_(min=min_value)


def unroll_minibatches(num_steps, num_envs, num_minibatches, device=None):
    """--whole-unrolls: M minibatches, each the whole unrolls of N/M shuffled envs, as (envs [N/M], their samples'
    flat indices t*N + n into the [T, N] rollout, t-major as Agent.unroll returns them, [T*N/M])."""
    groups = torch.randperm(num_envs, device=device).view(num_minibatches, -1)
    steps = torch.arange(num_steps, device=device)[:, None] * num_envs
    return [(envs, (steps + envs).flatten()) for envs in groups]


def epoch_minibatches(args: Args, device) -> list:
    """One epoch's minibatches as (envs, flat indices): whole unrolls (--whole-unrolls, --lstm: the E-step's top k
    within them) or shuffled samples (envs None)."""
    if args.whole_unrolls or args.lstm:
        return unroll_minibatches(args.num_steps, args.num_envs, args.num_minibatches, device)
    shuffled = torch.randperm(args.num_envs * args.num_steps, device=device)
    return [(None, inds) for inds in shuffled.chunk(args.num_minibatches)]


class PopArt(nn.Module):
    """Linear value head in normalized space with adaptive statistics (van Hasselt et al., 2016).

    V(s) = sigma * n(s) + mu. `update(targets)` moves mu and the second moment nu towards the
    targets' (ART) and rescales the layer so that V(s) stays exactly what it was (POP).
    """

    def __init__(self, in_features, beta=1e-4, scale_min=1e-2, scale_max=1e6):
        super().__init__()
        self.linear = layer_init(nn.Linear(in_features, 1), std=1.0)
        self.beta, self.scale_min, self.scale_max = beta, scale_min, scale_max
        self.register_buffer("mu", torch.zeros(()))
        self.register_buffer("nu", torch.ones(()))

    @property
    def sigma(self):
        return (self.nu - self.mu**2).clamp(self.scale_min**2, self.scale_max**2).sqrt()

    def forward(self, hidden):
        """Normalized value n(s): [B]."""
        return self.linear(hidden).squeeze(-1)

    def normalize(self, values):
        return (values - self.mu) / self.sigma

    def unnormalize(self, normalized):
        return self.sigma * normalized + self.mu

    @torch.no_grad()
    def update(self, targets):
        """targets: [B] unnormalized returns; one step of the statistics, outputs preserved."""
        mu_old, sigma_old = self.mu.clone(), self.sigma
        self.mu.lerp_(targets.mean(), self.beta)
        self.nu.lerp_((targets**2).mean(), self.beta)
        sigma = self.sigma
        # sigma' (w' h + b') + mu' = sigma (w h + b) + mu  with  w' = w sigma/sigma', b' = (sigma b + mu - mu')/sigma'
        self.linear.weight.mul_(sigma_old / sigma)
        self.linear.bias.mul_(sigma_old).add_(mu_old - self.mu).div_(sigma)


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
    args = with_defaults(flags)  # --norm-obs on for Box actions
    batch_size = args.num_envs * args.num_steps  # N x T, over all torchrun workers
    minibatch_size = batch_size // args.num_minibatches  # |D|
    num_iterations = math.ceil(args.total_timesteps / batch_size)  # the last one may run past --total-timesteps
    top_k = max(1, int(args.top_k_fraction * minibatch_size))  # |D~|, as vmpo_e_step chooses it
    run = harness.start(SCRIPT, args, checkpoint, num_iterations, flags)  # checks, torchrun workers, seeds, device
    envs = run.open(make_env(run.args, run.render_mode))  # made after the seeding; then run dir, logs, start-up
    # run.args: args in one process; under torchrun this worker's share, N / W envs and a seed of its own, whose
    # minibatches are its share of D: the E-step and PopArt take all workers' (harness.global_batch)
    args, device, writer = run.args, run.device, run.writer
    target_period = args.target_period or args.update_epochs * args.num_minibatches

    agent = Agent(envs, args.popart_beta, args.min_std, args.state_dependent_std, args.bf16, args.lstm).to(device)
    harness.broadcast_weights(agent)  # torchrun: every worker starts from rank 0's weights
    target_agent = copy.deepcopy(agent).requires_grad_(False)  # pi_target: acts, and is the KL's old policy
    # the M-step's KL bounds eps_alpha: one for categoricals, the mean's and the std's for Gaussians (Appendix C)
    if agent.continuous:
        kl_bounds = {"mean": args.eps_alpha_mean, "std": args.eps_alpha_std}
        alpha_inits = {"mean": args.alpha_mean_init, "std": args.alpha_std_init}
    else:
        kl_bounds, alpha_inits = {"policy": args.eps_alpha}, {"policy": args.alpha_init}
    # the Lagrange multipliers, eta and an alpha per bound: plain parameters of the one Adam, projected after a step
    multipliers = nn.ParameterDict({"eta": nn.Parameter(torch.tensor(args.eta_init, device=device)), **{
        f"alpha_{name}": nn.Parameter(torch.tensor(init, device=device)) for name, init in alpha_inits.items()}})
    optimizer = torch.optim.Adam(
        [{"params": agent.parameters()},
         {"params": list(multipliers.values()), "lr": args.multiplier_lr or args.learning_rate}],
        lr=args.learning_rate, eps=args.adam_eps, foreach=True,
    )

    # rollout storage, [T, N]; to_env: an action as the envs take it (Box: clipped to its bounds, for the env only)
    obs_dtype, rollout_shape = harness.obs_dtype(envs), (args.num_steps, args.num_envs)
    to_env = env_actions(envs.single_action_space)
    obs_shape, action_shape = envs.single_observation_space.shape, envs.single_action_space.shape
    obs = torch.zeros(rollout_shape + obs_shape, dtype=obs_dtype, device=device)
    action_dtype = torch.float32 if agent.continuous else torch.long
    actions = torch.zeros(rollout_shape + action_shape, dtype=action_dtype, device=device)
    rewards, dones, values = (torch.zeros(rollout_shape, device=device) for _ in range(3))
    if args.lstm:  # the core's inputs besides obs and dones, as the rollout fed them
        prev_actions, prev_rewards = torch.zeros_like(actions), torch.zeros(rollout_shape, device=device)

    next_obs, _ = envs.reset(seed=args.seed)
    next_obs = torch.as_tensor(next_obs, dtype=obs_dtype, device=device)
    next_done = torch.ones(args.num_envs, device=device)  # each env starts an episode (--lstm: zero memory)
    # what a checkpoint holds besides the env stack's state and statistics and the RNGs; --resume restores it
    # --lstm: what the acting network carries from step to step, its core state [N, 2, H] and last action and reward:
    # zero at the start, as the checkpoint left it with --resume
    memory = agent.core.initial_memory(args.num_envs, device) if args.lstm else {}
    saved = harness.Saved(models={"agent": agent, "target_agent": target_agent, "multipliers": multipliers},
                              optimizers={"optimizer": optimizer}, keys={"memory": memory} if args.lstm else {})
    global_step, first_iteration, next_obs, next_done = run.restore(saved, next_obs, next_done)  # with --resume
    learning_steps = (first_iteration - 1) * args.update_epochs * args.num_minibatches
    memory = run.restored("memory", agent.core.holds, "holds an action outside the action space") if args.lstm else {}

    for iteration in range(first_iteration, num_iterations + 1):
        # rollout: the target network acts n steps in each of the N envs (Algorithm 1)
        in_sync = learning_steps % target_period == 0  # target == online (the default: at every iteration's start)
        if args.lstm:  # R2D2's stored state: the acting network's at the unroll's start, which the online one replays
            start_states = memory["core_state"]
        for step in range(args.num_steps):
            global_step += args.num_envs * run.world_size
            obs[step], dones[step] = next_obs, next_done
            with torch.no_grad():  # the target network acts; V_phi(s) is the online network's (Sec. 4.1)
                if args.lstm:  # the target's core state carries on; its inputs are stored for the replay
                    prev_actions[step], prev_rewards[step] = memory["prev_action"], memory["prev_reward"]
                    step_pi, _, acting_state = target_agent.step(next_obs, next_done, **memory)
                else:
                    step_pi, values[step] = act_and_value(target_agent, agent, next_obs, in_sync)
            run.check_policy(step_pi)  # finite, or the run stops in one sentence
            action = sample_actions(step_pi, agent.continuous)
            actions[step] = action
            next_obs_np, reward, terminated, truncated, info = envs.step(to_env(action))
            rewards[step] = torch.as_tensor(reward, dtype=torch.float32, device=device)
            if args.lstm:  # the env's reward, before a truncation's bootstrap is added to it
                memory = {"core_state": acting_state, "prev_action": action, "prev_reward": rewards[step].clone()}
            # time-limit truncation is not termination: bootstrap with gamma * V(final obs)
            truncated_only = np.flatnonzero(truncated & ~terminated)
            if truncated_only.size:
                final_obs = torch.as_tensor(np.stack(info["final_obs"][truncated_only]), dtype=obs_dtype, device=device)
                with torch.no_grad():  # --lstm: from the acting network's core state before the reset, fed this step's
                    ended = {name: value[truncated_only] for name, value in memory.items()}  # action and reward
                    final_value = agent.get_value(final_obs, torch.zeros(truncated_only.size, device=device), **ended)
                    rewards[step, truncated_only] += args.gamma * final_value
            next_obs = torch.as_tensor(next_obs_np, dtype=obs_dtype, device=device)
            next_done = torch.as_tensor(terminated | truncated, dtype=torch.float32, device=device)
            run.after_step(global_step, info)  # finished episodes, progress
        run.end_rollout()  # the rollout's episodes to TensorBoard

        # G^(n) (gae_lambda 1, the default) bootstrapped with the online V at the unroll's end; A = G^(n) - V
        # (Sec. 4.1), not normalized: eta adapts to the advantages' scale
        with torch.no_grad():
            if args.lstm:  # V_phi(s): the online network replays the unroll from the stored state, as the update will
                _, normalized_values, core_state = agent.unroll(obs, dones, start_states, prev_actions, prev_rewards)
                values[:] = agent.critic.unnormalize(normalized_values).view(rollout_shape)
                next_value = agent.get_value(next_obs, next_done, **dict(memory, core_state=core_state))
            else:
                next_value = agent.get_value(next_obs)
        advantages, returns = compute_gae(rewards, values, dones, next_value, next_done, args.gamma, args.gae_lambda)

        b_obs, b_actions = obs.reshape((-1,) + obs_shape), actions.reshape((-1,) + action_shape)
        b_advantages, b_returns, b_values = advantages.reshape(-1), returns.reshape(-1), values.reshape(-1)

        # update: E epochs of M learning steps, each an E-step and an M-step (Sec. 4.2)
        stats = defaultdict(list)  # tag -> one value per learning step
        for epoch in range(args.update_epochs):
            run.updating(f"epoch {epoch + 1}/{args.update_epochs}")
            for mb_envs, mb_inds in epoch_minibatches(args, device):
                # the minibatch D: PopArt's statistics move to its returns, then pi and V of the online network on D
                # and pi_target's log-probabilities (logged)
                mb_obs, mb_actions, mb_returns = b_obs[mb_inds], b_actions[mb_inds], b_returns[mb_inds]
                if args.popart:  # statistics first (torchrun: all workers' returns), then regress onto targets
                    agent.critic.update(harness.global_batch(mb_returns))  # normalized by them
                if args.lstm:  # each env's unroll replayed from its stored state; backpropagation runs through it all
                    replay = (obs[:, mb_envs], dones[:, mb_envs], start_states[mb_envs], prev_actions[:, mb_envs],
                              prev_rewards[:, mb_envs])
                    new_pi, normalized_value, _ = agent.unroll(*replay)
                else:
                    new_pi, normalized_value = agent(mb_obs)
                new_logp, entropy = policy_log_prob_and_entropy(new_pi, mb_actions, agent.continuous)  # entropy: logged
                with torch.no_grad():
                    target_pi = target_agent.unroll(*replay)[0] if args.lstm else target_agent.get_pi(mb_obs)
                    target_logp = policy_log_prob_and_entropy(target_pi, mb_actions, agent.continuous)[0]  # logged

                # L_V (Eq. 1) in PopArt's normalized space
                v_loss = 0.5 * ((normalized_value - agent.critic.normalize(mb_returns)) ** 2).mean()
                # E-step over D~ (Eq. 12-13), then weighted maximum likelihood L_pi (Eq. 12). torchrun: D~ and psi's
                # normalizer over all workers' advantages; L_pi sums this worker's share, x W so that the average
                # of the workers' gradients is the gradient of the whole sum
                weights, temperature_loss = vmpo_e_step(harness.global_batch(b_advantages[mb_inds]),
                                                        multipliers["eta"], args.eps_eta, args.top_k_fraction)
                pg_loss = vmpo_policy_loss(new_logp, harness.own_part(weights)) * run.world_size
                # L_alpha on the full minibatch D (Eq. 14), decoupled for Gaussians (Appendix C)
                kls = policy_kls(target_pi, new_pi, agent.continuous)
                kl_loss = sum(vmpo_kl_loss(kls[k], multipliers[f"alpha_{k}"], kl_bounds[k]) for k in kl_bounds)
                loss = v_loss + pg_loss + temperature_loss + kl_loss  # Eq. 10-11
                parts = {"policy_loss": pg_loss, "value_loss": v_loss, "temperature_loss": temperature_loss,
                         "kl_loss": kl_loss}
                harness.check_finite(iteration, **parts)

                # one Adam step on Eq. 10's loss, eta and alpha >= 1e-8; theta_target <- theta_online every T_target
                gradient_step(optimizer, loss, agent, multipliers)
                project_multipliers(multipliers.values())
                learning_steps += 1
                if learning_steps % target_period == 0:  # theta_target <- theta_online every T_target steps
                    target_agent.load_state_dict(agent.state_dict())

                # statistics, averaged over the iteration's learning steps
                with torch.no_grad():
                    logratio = new_logp - target_logp
                    for name, value in parts.items():
                        stats[f"losses/{name}"].append(value.detach())
                    stats["losses/entropy"].append(entropy.mean())
                    stats["losses/approx_kl"].append(((logratio.exp() - 1) - logratio).mean())  # k3 to pi_target
                    # KL[psi || uniform over D~], the quantity eps_eta bounds (dL_eta/deta = eps_eta - it)
                    stats["kl/temperature"].append(torch.xlogy(weights, weights * top_k).sum())
                    for name in kl_bounds:
                        stats[f"kl/{name}"].append(kls[name].mean().detach())

        # logging
        writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
        for tag, vals in stats.items():
            writer.add_scalar(tag, torch.stack(vals).mean().item(), global_step)
        writer.add_scalar("losses/explained_variance", explained_variance(b_values, b_returns), global_step)
        # each KL next to its bound; a multiplier rises while its bound is exceeded
        writer.add_scalar("kl/temperature_bound", args.eps_eta, global_step)
        for name, multiplier in multipliers.items():
            writer.add_scalar(f"charts/{name}", multiplier.item(), global_step)
        for name, bound in kl_bounds.items():
            writer.add_scalar(f"kl/{name}_bound", bound, global_step)
        writer.add_scalar("charts/top_k_frac", top_k / minibatch_size, global_step)
        writer.add_scalar("charts/popart_mean", agent.critic.mu.item(), global_step)
        writer.add_scalar("charts/popart_std", agent.critic.sigma.item(), global_step)
        kept = {"memory": memory} if args.lstm else {}  # the acting network's memory, for --resume
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


def mlp(in_dim, hidden):
    """Two tanh layers of `hidden` units."""
    return nn.Sequential(layer_init(nn.Linear(in_dim, hidden)), nn.Tanh(), layer_init(nn.Linear(hidden, hidden)),
                         nn.Tanh())


class Agent(nn.Module):
    """Discrete actions: a shared torso (IMPALA CNN for images, 64-64 tanh MLP for vectors), policy and PopArt value
    heads. Box actions, as the paper's Gym agents (Appendix F): the policy and the value each have their own MLP
    (256-256 tanh) and linear readout; the policy's gives a diagonal Gaussian's mean and state-dependent std
    (--no-state-dependent-std: one learned std vector). --lstm, the paper's agent (Fig. 1b): the torso, shared by both
    heads for Box actions too, feeds an LSTM core (RecurrentCore) as wide as its output, and the heads read the core.

    The policy's parameters pi, [B, P]: categorical logits, or a Gaussian's mean and std side by side.
    """

    def __init__(self, envs, popart_beta=1e-4, min_std=1e-3, state_dependent_std=True, bf16=False, lstm=False):
        super().__init__()
        obs_shape, action_space = envs.single_observation_space.shape, envs.single_action_space
        self.continuous, self.min_std = isinstance(action_space, gym.spaces.Box), min_std
        self.value_torso = None  # None: the value reads the policy's torso
        if self.continuous:
            hidden = 256
            self.torso = mlp(obs_shape[0], hidden)
            self.value_torso = None if lstm else mlp(obs_shape[0], hidden)
        elif len(obs_shape) == 3:
            self.torso, hidden = ImpalaCNN(obs_shape[-1], bf16=bf16), 256
            self.to(memory_format=torch.channels_last)  # about 1.8x faster convolutions on CPU
        else:
            self.torso, hidden = mlp(obs_shape[0], 64), 64
        self.core = RecurrentCore(hidden, action_space, hidden) if lstm else None
        num_outputs = (1 + state_dependent_std) * action_space.shape[0] if self.continuous else action_space.n
        self.actor = layer_init(nn.Linear(hidden, num_outputs), std=0.01)
        self.critic = PopArt(hidden, beta=popart_beta)
        if self.continuous and not state_dependent_std:  # softplus(0): the state-dependent head's std at init
            self.std_param = nn.Parameter(torch.zeros(action_space.shape[0]))

    def policy(self, hidden):
        out = self.actor(hidden)
        if not self.continuous:
            return out
        if hasattr(self, "std_param"):  # --no-state-dependent-std
            mean, std_param = out, self.std_param.expand_as(out)
        else:
            mean, std_param = out.chunk(2, dim=-1)
        return torch.cat([mean, F.softplus(std_param) + self.min_std], dim=-1)

    def get_pi(self, obs):
        return self.policy(self.torso(obs))

    def get_value(self, obs, done=None, **memory):
        """Unnormalized V(s): [B]; --lstm: one step, as step() (without it, done and memory are not read)."""
        if self.core is not None:
            return self.critic.unnormalize(self.step(obs, done, **memory)[1])
        hidden = self.torso(obs) if self.value_torso is None else self.value_torso(obs)
        return self.critic.unnormalize(self.critic(hidden))

    def step(self, obs, done, core_state, prev_action, prev_reward):
        """--lstm, one step of a batch of envs (RecurrentCore.forward's inputs): (pi, normalized value n(s), next
        state)."""
        hidden, core_state = self.core(self.torso(obs), done, core_state, prev_action, prev_reward)
        return self.policy(hidden), self.critic(hidden), core_state

    def unroll(self, obs, dones, core_state, prev_actions, prev_rewards):
        """--lstm: unrolls [T, B] from their first step's core state, step by step as the rollout ran them (the same
        code path): (pi [T*B, P], n(s) [T*B], t-major; the last state). Gradients flow through the whole unroll."""
        outputs = []
        for t in range(len(obs)):
            *output, core_state = self.step(obs[t], dones[t], core_state, prev_actions[t], prev_rewards[t])
            outputs.append(output)
        return (*(torch.cat(output) for output in zip(*outputs)), core_state)

    def forward(self, obs):
        """(pi, normalized value n(s))."""
        hidden = self.torso(obs)
        value_hidden = hidden if self.value_torso is None else self.value_torso(obs)
        return self.policy(hidden), self.critic(value_hidden)


def act_and_value(target_agent, agent, obs, in_sync):
    """(pi of the target network, which acts; V_phi(s) of the online network). Right after a sync the two networks
    are the same, PopArt's statistics included, so one pass of the target gives both: speed only, same numbers."""
    if not in_sync:
        return target_agent.get_pi(obs), agent.get_value(obs)
    pi, normalized_value = target_agent(obs)
    return pi, target_agent.critic.unnormalize(normalized_value)


# --------------------------------------------------------------------------------------------------- environment
def make_env(args: Args, render_mode=None) -> gym.vector.VectorEnv:
    """The N envs. Each resets a finished episode inside the step that ended it (SAME_STEP autoreset, as Procgen's
    do): next_obs is the new episode's first observation, info["final_obs"] the finished one's last, which train()
    bootstraps from. Rewards are scaled by Gymnasium's NormalizeReward (the paper scales none and relies on PopArt;
    the batch size-invariance scripts use the official code's RewardNormalizer instead), after the raw-score
    episode statistics are recorded, then clipped to +-10; --no-norm-reward hands the raw rewards on."""
    if args.env_id in harness.PROCGEN_GAMES:  # the game's 64x64x3 uint8 frames (no frame stack) and 15 actions; its
        envs = harness.ProcgenVecEnv(args, render_mode)  # levels as its flags say; a time-out ends one (no truncation)
    else:
        wrappers = [harness.vector_observations]  # Dict, Tuple and n-D Box observations flattened, ints as float32
        if args.norm_obs:  # by each env's running mean and std, inside the autoreset so that final_obs is too; +-10
            wrappers += [gym.wrappers.NormalizeObservation, clip_observations]
        envs = gym.make_vec(args.env_id, num_envs=args.num_envs, vectorization_mode="sync", wrappers=wrappers,
                            vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
                            **({"render_mode": render_mode} if render_mode else {}))
    envs = gym.wrappers.vector.RecordEpisodeStatistics(envs)  # raw game score, before normalization
    if args.norm_reward:  # r / std of a running discounted return (gamma: the run's), then +-10 as a guard
        envs = gym.wrappers.vector.ClipReward(gym.wrappers.vector.NormalizeReward(envs, gamma=args.gamma), -10.0, 10.0)
    return envs


def clip_observations(env: gym.Env) -> gym.Env:
    return gym.wrappers.TransformObservation(env, lambda obs: np.clip(obs, -10.0, 10.0), None)


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


def policy_log_prob_and_entropy(pi, actions, continuous=False):
    """log pi(a|s) and entropy, both [B]; pi [B, P]: categorical logits, or a Gaussian's mean and std side by side."""
    if not continuous:
        return categorical_log_prob_and_entropy(pi, actions)
    normal = torch.distributions.Normal(*pi.chunk(2, dim=-1))
    return normal.log_prob(actions).sum(-1), normal.entropy().sum(-1)


def sample_actions(pi, continuous=False):
    """a ~ pi(.|s) per row of pi: a Gaussian's (mean and std side by side) or a categorical's (logits)."""
    if continuous:
        return torch.distributions.Normal(*pi.chunk(2, -1), validate_args=False).sample()
    return torch.distributions.Categorical(logits=pi, validate_args=False).sample()


def env_actions(action_space):
    """action -> what the envs take, NumPy: a Box action clipped to its bounds (its log-prob is the sampled one's)."""
    if not isinstance(action_space, gym.spaces.Box):
        return lambda action: action.cpu().numpy()
    return lambda action: np.clip(action.cpu().numpy(), action_space.low, action_space.high)


def policy_kls(target_pi, pi, continuous=False):
    """Per-sample KL terms of the M-step trust region, keyed like their bounds: {name: [B]}."""
    if not continuous:
        return {"policy": categorical_kl(target_pi, pi)}  # KL[pi_target || pi]
    kl_mean, kl_std = gaussian_kl_decoupled(*target_pi.chunk(2, dim=-1), *pi.chunk(2, dim=-1))
    return {"mean": kl_mean, "std": kl_std}


# ---------------------------------------------------------------------------------------- what train() logs
def explained_variance(values, returns) -> float:
    """1 - Var[returns - values] / Var[returns], nan where the returns do not vary."""
    return (1 - (returns - values).var() / returns.var()).item() if returns.var() > 0 else float("nan")


# ---------------------------------------------------------- what the run harness needs to know of this script
FLAG_RANGES = {  # the interval each numeric flag of this script must lie in (harness.py: the common ones)
    "num_levels": "[0, inf)", "start_level": "[0, inf)", "target_period": "[0, inf)", "multiplier_lr": "(0, inf)",
    "popart_beta": "(0, 1]", "top_k_fraction": "(0, 1]", "eta_init": "(0, inf)", "eps_eta": "(0, inf)",
    "alpha_init": "(0, inf)", "eps_alpha": "(0, inf)", "alpha_mean_init": "(0, inf)", "alpha_std_init": "(0, inf)",
    "eps_alpha_mean": "(0, inf)", "eps_alpha_std": "(0, inf)", "min_std": "(0, inf)",
}


def check_args(args: Args, observation_space, action_space) -> None:
    """This script's own checks of the run's Args."""
    if args.norm_obs and len(observation_space.shape) != 1:
        raise SystemExit(f"--norm-obs needs vector observations; --env-id {args.env_id} has images.")
    whole_unrolls = args.whole_unrolls or args.lstm
    if whole_unrolls and (args.num_minibatches > args.num_envs or args.num_envs % args.num_minibatches):
        raise SystemExit(f"--num-minibatches {args.num_minibatches} must divide --num-envs {args.num_envs}: with "
                         f"{'--lstm' if args.lstm else '--whole-unrolls'} each minibatch holds whole env unrolls.")
    harness.check_minibatches(args.num_steps, args.num_envs, args.num_minibatches, shuffle_samples=not whole_unrolls)
    batch_size = args.num_envs * args.num_steps
    # obs, actions, rewards, dones, values, advantages, returns: one of each per sample
    sample_bytes = (math.prod(observation_space.shape) * observation_space.dtype.itemsize
                    + (4 * math.prod(action_space.shape) if isinstance(action_space, gym.spaces.Box) else 8) + 5 * 4)
    harness.check_memory(batch_size * sample_bytes, args.cuda, "The rollout buffers", "--num-envs or --num-steps")


def acting_policy(args: Args, envs, load, device):
    """The checkpoint's acting network (V-MPO: the target network) as obs -> env actions, sampled or
    (--eval-deterministic) the mode: the most likely action, the Gaussian's mean."""
    agent = Agent(envs, args.popart_beta, args.min_std, args.state_dependent_std, lstm=args.lstm).to(device)
    load(agent, "target_agent")  # the checkpoint's weights, checked
    memory = agent.core.initial_memory(envs.num_envs, device) if args.lstm else {}

    def act(obs, prev_reward, done):  # --lstm: the previous step's reward and done, and its action below
        pi, _, memory["core_state"] = agent.step(obs, done, **dict(memory, prev_reward=prev_reward)) if args.lstm \
            else (agent.get_pi(obs), None, None)
        harness.check_policy(pi)
        if args.eval_deterministic:
            memory["prev_action"] = pi.chunk(2, dim=-1)[0] if agent.continuous else pi.argmax(-1)
        else:
            memory["prev_action"] = torch.distributions.Normal(*pi.chunk(2, dim=-1)).sample() if agent.continuous \
                else torch.distributions.Categorical(logits=pi).sample()
        return memory["prev_action"]
    return act


SCRIPT = harness.Script(file=__file__, doc=__doc__, args_type=Args, make_env=make_env, acting_policy=acting_policy,
                        flag_ranges=FLAG_RANGES, check_args=check_args, defaults=with_defaults,
                        worker_share=harness.worker_share, procgen=True, actions="any", checkpoint_keys=("memory",),
                        policy="target_agent")


if __name__ == "__main__":
    train(tyro.cli(Args, description=__doc__))
