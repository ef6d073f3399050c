"""Worked examples for vmpo.py: hand-computed values of every contract function, gradient checks
where a stop-gradient matters, and tiny smoke runs of train()."""
import copy
import dataclasses
import errno
import glob
import math
import os
import sys
import time
from typing import Optional

import gymnasium
import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import checkpoints
import harness
from saved_files import read_back
import vmpo


# ------------------------------------------------------------------------------------ E-step
def test_e_step_temperature_loss_by_hand():
    # A = [1, 2], eta = 1, all samples kept (k = 2), eps_eta = 0.01:
    # L_eta = eta eps + eta log((e^1 + e^2) / 2) = 0.01 + log(5.053668) = 0.01 + 1.6201145 = 1.6301145
    eta = torch.tensor(1.0, requires_grad=True)
    weights, loss = vmpo.vmpo_e_step(torch.tensor([1.0, 2.0]), eta, eps_eta=0.01, top_k_fraction=1.0)
    assert loss.item() == pytest.approx(1.6301145, abs=1e-6)
    # psi = softmax([1, 2]) = [1/(1+e), e/(1+e)] = [0.2689414, 0.7310586]
    assert weights.tolist() == pytest.approx([0.2689414, 0.7310586], abs=1e-6)


def test_e_step_keeps_top_half_of_advantages():
    # B = 6, k = int(0.5 * 6) = 3: the samples with A = 4, 5, 6 (indices 2, 0, 5 below).
    # psi over them = softmax([4, 5, 6]) = [e^-2, e^-1, 1] / (e^-2 + e^-1 + 1) = [0.0900306, 0.2447285, 0.6652410]
    advantages = torch.tensor([5.0, 1.0, 4.0, 2.0, 3.0, 6.0])
    weights, _ = vmpo.vmpo_e_step(advantages, torch.tensor(1.0), eps_eta=0.01, top_k_fraction=0.5)
    assert weights.tolist() == pytest.approx([0.2447285, 0.0, 0.0900306, 0.0, 0.0, 0.6652410], abs=1e-6)


def test_temperature_loss_is_over_the_top_k_only():
    # A = [5, 1, 4, 2], k = int(0.5 * 4) = 2: D~ = {5, 4}; eta = 1, eps_eta = 0.01:
    # L_eta = 0.01 + log((e^5 + e^4) / 2) = 0.01 + log(101.505655) = 4.6301145; over all of D it would be
    # 0.01 + log((e^5 + e^1 + e^4 + e^2) / 4) = 3.9855547
    _, loss = vmpo.vmpo_e_step(torch.tensor([5.0, 1.0, 4.0, 2.0]), torch.tensor(1.0), eps_eta=0.01, top_k_fraction=0.5)
    assert loss.item() == pytest.approx(4.6301145, abs=1e-5)


def test_e_step_weights_sum_to_one_and_carry_no_gradient():
    advantages = torch.tensor([0.3, -1.2, 2.5, 0.7, 1.1], requires_grad=True)
    eta = torch.tensor(0.5, requires_grad=True)
    weights, loss = vmpo.vmpo_e_step(advantages, eta, eps_eta=0.1, top_k_fraction=0.5)
    assert weights.sum().item() == pytest.approx(1.0)
    assert (weights > 0).sum().item() == 2  # k = int(0.5 * 5) = 2
    assert not weights.requires_grad
    loss.backward()
    assert advantages.grad is None  # the temperature loss trains eta only


def test_e_step_keeps_at_least_one_sample():
    # int(0.5 * 1) = 0, so k = max(1, 0) = 1: psi = [1], L_eta = eta eps + eta log(exp(3/eta)) = 2*0.1 + 3 = 3.2
    weights, loss = vmpo.vmpo_e_step(torch.tensor([3.0]), torch.tensor(2.0), eps_eta=0.1, top_k_fraction=0.5)
    assert weights.tolist() == [1.0]
    assert loss.item() == pytest.approx(3.2)


def test_e_step_with_huge_temperature_is_uniform_over_the_batch():
    # top_k_fraction 1 and eta -> infinity: psi -> 1/B, so L_pi becomes plain behaviour cloning of the batch
    weights, _ = vmpo.vmpo_e_step(torch.tensor([-3.0, 0.5, 2.0, 7.0]), torch.tensor(1e6), 0.01, 1.0)
    assert weights.tolist() == pytest.approx([0.25] * 4, abs=1e-5)


def test_temperature_gradient_is_eps_plus_log_mean_exp_minus_weighted_advantage():
    # dL_eta/deta = eps + log-mean-exp(A/eta) - sum psi A/eta  (= eps - KL[psi || uniform over D~]).
    # A = [1, 2], eta = 2: A/eta = [0.5, 1]; lme = log((e^0.5 + e^1)/2) = log(2.1835015) = 0.7809298;
    # psi = [0.3775407, 0.6224593]; sum psi A/eta = 0.1887703 + 0.6224593 = 0.8112297;
    # grad = 0.01 + 0.7809298 - 0.8112297 = -0.0202999
    eta = torch.tensor(2.0, requires_grad=True)
    _, loss = vmpo.vmpo_e_step(torch.tensor([1.0, 2.0]), eta, eps_eta=0.01, top_k_fraction=1.0)
    loss.backward()
    assert eta.grad.item() == pytest.approx(-0.0202999, abs=1e-6)


def test_e_step_is_stable_for_huge_advantages():
    # exp(1000) overflows float32; subtracting max(A/eta) keeps L_eta = eta eps + max + log(mean(exp(. - max)))
    # = 0.01 + 1000 + log((e^-1 + 1)/2) = 1000.01 - 0.3799890 = 999.6300110
    weights, loss = vmpo.vmpo_e_step(torch.tensor([999.0, 1000.0]), torch.tensor(1.0), 0.01, 1.0)
    assert torch.isfinite(weights).all()
    assert loss.item() == pytest.approx(999.6300110, abs=1e-3)


def test_e_step_subtracts_the_max_of_a_over_eta_where_eta_is_small():
    # A = [2, 1, 0, -1], eta 0.01, eps 0.01: D~ = {2, 1}, A/eta = [200, 100]; the max of A alone (2) leaves exp(198)
    # to overflow. log-mean-exp = 200 + log((1 + e^-100) / 2) = 199.306853; L = 0.01 * 0.01 + 0.01 * 199.306853
    # = 1.993169. dL/deta = eps + lme - sum psi A / eta = 0.01 + 199.306853 - (1 * 2 + e^-100 * 1) / 0.01 = -0.683147
    eta = torch.tensor(0.01, requires_grad=True)
    _, loss = vmpo.vmpo_e_step(torch.tensor([2.0, 1.0, 0.0, -1.0]), eta, 0.01, 0.5)
    loss.backward()
    assert loss.item() == pytest.approx(1.993169, rel=1e-5) and eta.grad.item() == pytest.approx(-0.683147, abs=1e-3)


def test_e_step_keeps_exactly_k_samples_with_ties_and_odd_batches():
    # k = max(1, int(0.5 B)): B = 4 with three tied A = 1 keeps 2 of them (a threshold A >= 1 would keep 3); B = 7
    # keeps int(3.5) = 3 (round(3.5) = 4 would keep 4)
    weights, _ = vmpo.vmpo_e_step(torch.tensor([1.0, 1.0, 1.0, 0.0]), torch.tensor(1.0), 0.01, 0.5)
    assert (weights > 0).sum().item() == 2 and weights.sum().item() == pytest.approx(1.0) and weights[3] == 0
    weights, _ = vmpo.vmpo_e_step(torch.arange(7.0), torch.tensor(1.0), 0.01, 0.5)
    assert (weights > 0).tolist() == [False] * 4 + [True] * 3


# ------------------------------------------------------------------------------------ M-step
def test_policy_loss_by_hand():
    # -(0.2 log 0.5 + 0.8 log 0.25) = 0.2 * 0.6931472 + 0.8 * 1.3862944 = 1.2476649
    logp = torch.log(torch.tensor([0.5, 0.25]))
    assert vmpo.vmpo_policy_loss(logp, torch.tensor([0.2, 0.8])).item() == pytest.approx(1.2476649)


def test_kl_loss_gradients_have_no_cross_terms():
    kl = torch.tensor([0.01, 0.03], requires_grad=True)
    alpha = torch.tensor(2.0, requires_grad=True)
    loss = vmpo.vmpo_kl_loss(kl, alpha, eps_alpha=0.005)
    # value: mean(2 (0.005 - kl)) + mean(2 kl) = 2 * 0.005 = 0.01 (the KL terms cancel in value, not in gradient)
    assert loss.item() == pytest.approx(0.01)
    grad_kl, grad_alpha = torch.autograd.grad(loss, (kl, alpha), create_graph=True)
    assert grad_alpha.item() == pytest.approx(0.005 - 0.02)  # eps - mean KL
    assert grad_kl.tolist() == pytest.approx([1.0, 1.0])  # alpha / B = 2 / 2
    # no cross terms: dL/dkl does not depend on alpha and dL/dalpha not on kl (both are constants of the graph)
    assert not grad_kl.requires_grad and not grad_alpha.requires_grad


def test_gaussian_kl_decoupled_by_hand():
    # mean_old = [0, 0], std_old = [1, 2], mean = [1, 1], std = [2, 1]
    # C_mu    = 0.5 (1/1 + 1/4) = 0.625
    # C_Sigma = 0.5 [(1/4 - 1 + log 4) + (4/1 - 1 + log 1/4)] = 0.5 (0.25 - 1 + 4 - 1) = 1.125
    mean_old, std_old = torch.tensor([[0.0, 0.0]]), torch.tensor([[1.0, 2.0]])
    mean, std = torch.tensor([[1.0, 1.0]]), torch.tensor([[2.0, 1.0]])
    kl_mean, kl_std = vmpo.gaussian_kl_decoupled(mean_old, std_old, mean, std)
    assert kl_mean.tolist() == pytest.approx([0.625])
    assert kl_std.tolist() == pytest.approx([1.125])
    # C_Sigma is the exact KL[N(mu_old, S_old) || N(mu_old, S)]
    exact = torch.distributions.kl_divergence(torch.distributions.Normal(mean_old, std_old),
                                              torch.distributions.Normal(mean_old, std)).sum(-1)
    assert kl_std.tolist() == pytest.approx(exact.tolist())
    # std_old = [1, 2], std = [2, 3], not a permutation of each other, so the log terms do not cancel:
    # C_Sigma = 0.5 [(1/4 - 1 + log 4) + (4/9 - 1 + log 9/4)] = 0.5 (0.6362944 + 0.2553737) = 0.4458345
    kl_std = vmpo.gaussian_kl_decoupled(mean_old, std_old, mean, torch.tensor([[2.0, 3.0]]))[1]
    assert kl_std.item() == pytest.approx(0.4458345, abs=1e-6)


def test_gaussian_kl_decoupled_zero_when_equal_and_mean_part_ignores_online_std():
    mean_old, std_old = torch.tensor([[0.3, -1.0]]), torch.tensor([[0.5, 1.5]])
    kl_mean, kl_std = vmpo.gaussian_kl_decoupled(mean_old, std_old, mean_old.clone(), std_old.clone())
    assert kl_mean.item() == 0.0 and kl_std.item() == pytest.approx(0.0, abs=1e-7)
    mean = torch.tensor([[1.0, 0.0]], requires_grad=True)
    std = torch.tensor([[0.7, 0.9]], requires_grad=True)
    kl_mean, kl_std = vmpo.gaussian_kl_decoupled(mean_old, std_old, mean, std)
    assert torch.autograd.grad(kl_mean.sum(), std, allow_unused=True)[0] is None
    assert torch.autograd.grad(kl_std.sum(), mean, allow_unused=True)[0] is None


def test_projection_keeps_multipliers_at_least_1e_minus_8():
    eta, alpha, alpha_big = (torch.nn.Parameter(torch.tensor(v)) for v in (-0.5, 1e-12, 3.0))
    vmpo.project_multipliers([eta, alpha, alpha_big])
    assert eta.item() == pytest.approx(1e-8) and alpha.item() == pytest.approx(1e-8)
    assert alpha_big.item() == 3.0
    # after an Adam step that drives eta negative (lr 1 from eta = 0.1, gradient +1), projection restores it
    eta = torch.nn.Parameter(torch.tensor(0.1))
    optimizer = torch.optim.Adam([eta], lr=1.0)
    eta.sum().backward()
    optimizer.step()
    assert eta.item() < 0
    vmpo.project_multipliers([eta])
    assert eta.item() == pytest.approx(1e-8)


# ------------------------------------------------------------------------- policy evaluation
def test_compute_gae_with_lambda_one_gives_n_step_returns():
    # gamma = 0.5, V(s_3) = 10, values 0: G_2 = 1 + 0.5*10 = 6, G_1 = 1 + 0.5*6 = 4, G_0 = 1 + 0.5*4 = 3.
    # With dones[1] = 1 (step 0 ended an episode) G_0 = 1: no bootstrap across the boundary.
    rewards, values = torch.ones(3, 1), torch.zeros(3, 1)
    next_value, next_done = torch.tensor([10.0]), torch.zeros(1)
    _, returns = vmpo.compute_gae(rewards, values, torch.zeros(3, 1), next_value, next_done, 0.5, 1.0)
    assert returns.squeeze(1).tolist() == pytest.approx([3.0, 4.0, 6.0])
    dones = torch.tensor([[0.0], [1.0], [0.0]])
    _, returns = vmpo.compute_gae(rewards, values, dones, next_value, next_done, 0.5, 1.0)
    assert returns.squeeze(1).tolist() == pytest.approx([1.0, 4.0, 6.0])


def test_popart_preserves_outputs_and_tracks_moments():
    torch.manual_seed(0)
    popart = vmpo.PopArt(4, beta=0.5)
    hidden = torch.randn(3, 4)
    before = popart.unnormalize(popart(hidden))
    popart.update(torch.tensor([100.0, 200.0]))
    # mu = 0.5*0 + 0.5*150 = 75; nu = 0.5*1 + 0.5*(100^2 + 200^2)/2 = 12500.5; sigma = sqrt(12500.5 - 75^2) = 82.9187
    assert popart.mu.item() == pytest.approx(75.0)
    assert popart.sigma.item() == pytest.approx(math.sqrt(6875.5), rel=1e-5)
    assert popart.unnormalize(popart(hidden)).tolist() == pytest.approx(before.tolist(), rel=1e-4, abs=1e-4)
    assert popart.normalize(torch.tensor(75.0)).item() == pytest.approx(0.0)


def test_popart_scale_is_bounded_below():
    # constant zero targets with beta = 1: nu = mu = 0, sigma = sqrt(0) -> clamped to the lower bound 1e-2
    popart = vmpo.PopArt(2, beta=1.0)
    popart.update(torch.zeros(4))
    assert popart.sigma.item() == pytest.approx(1e-2)


# ------------------------------------------------------------------ the recurrent agent (--lstm, Fig. 1b)
def test_unroll_minibatches_are_whole_env_unrolls_by_hand():
    # T = 3, N = 4, M = 2; seed 1 shuffles the envs to [1, 3, 2, 0]: minibatch 0 holds envs 1 and 3, minibatch 1
    # envs 2 and 0, each env's samples t*N + n for t = 0, 1, 2, t-major: [1, 3, 5, 7, 9, 11] and [2, 0, 6, 4, 10, 8]
    torch.manual_seed(1)
    (envs0, inds0), (envs1, inds1) = vmpo.unroll_minibatches(num_steps=3, num_envs=4, num_minibatches=2)
    assert envs0.tolist() == [1, 3] and inds0.tolist() == [1, 3, 5, 7, 9, 11]
    assert envs1.tolist() == [2, 0] and inds1.tolist() == [2, 0, 6, 4, 10, 8]


def test_lstm_core_zeroes_its_state_and_the_previous_action_and_reward_where_an_episode_starts():
    # One unit; every weight 0 but the g gate's from the features, the one-hot of action 1 and the reward (each 1),
    # every bias 0: i = f = o = sigmoid(0) = 0.5, g = tanh(x + [a = 1] + r), c' = f c + i g, h' = o tanh(c').
    # Inputs x = 0.5, a = 1, r = 1, state h = 0.3, c = 2.
    # Within an episode: g = tanh(2.5) = 0.9866143, c' = 1 + 0.4933071 = 1.4933071, h' = 0.5 tanh(c') = 0.4519657.
    # Where one starts, state, action and reward are zeroed but the features are not: g = tanh(0.5) = 0.4621172,
    # c' = 0.2310586, h' = 0.5 tanh(0.2310586) = 0.1135163.
    core = vmpo.RecurrentCore(1, gymnasium.spaces.Discrete(2), 1)
    with torch.no_grad():
        for param in core.parameters():
            param.zero_()
        core.lstm.weight_ih[2] = torch.tensor([1.0, 0.0, 1.0, 1.0])  # row 2: the g gate; columns x, a = 0, a = 1, r
    h, state = core(torch.tensor([[0.5], [0.5]]), torch.tensor([0.0, 1.0]), torch.tensor([[[0.3], [2.0]]] * 2),
                    torch.tensor([1, 1]), torch.tensor([1.0, 1.0]))
    assert h.squeeze(1).tolist() == pytest.approx([0.4519657, 0.1135163], abs=1e-6)
    assert state[:, 1, 0].tolist() == pytest.approx([1.4933071, 0.2310586], abs=1e-6)  # c'
    assert torch.equal(state[:, 0], h)


def test_the_core_starts_at_1_for_the_forget_gate_and_0_for_the_other_biases():
    core = vmpo.RecurrentCore(3, gymnasium.spaces.Box(-1.0, 1.0, (2,)), 4)
    assert core.lstm.weight_ih.shape == (16, 3 + 2 + 1)  # features, the continuous action, the reward
    assert core.lstm.bias_ih.tolist() == [0.0] * 4 + [1.0] * 4 + [0.0] * 8 and not core.lstm.bias_hh.any()


def lstm_agent(env_id="CartPole-v1"):
    return vmpo.Agent(vmpo.make_env(vmpo.with_defaults(vmpo.Args(env_id=env_id, num_envs=1, cuda=False))), lstm=True)


def test_an_unroll_restarts_where_an_episode_starts():
    # 3 envs, 6 steps from a random core state and random previous actions and rewards; env 1 starts an episode at
    # step 2 and env 2 at step 0. From there each must give what an unroll from other random memory gives when it
    # starts an episode at its first step (at every later step the same obs and previous action and reward).
    torch.manual_seed(0)
    agent = lstm_agent()
    obs, state = torch.randn(6, 3, 4), torch.randn(3, 2, 64)
    prev_actions, prev_rewards, dones = torch.randint(0, 2, (6, 3)), torch.randn(6, 3), torch.zeros(6, 3)
    dones[2, 1] = dones[0, 2] = 1.0
    with torch.no_grad():
        pi, value = (x.view(6, 3, -1) for x in agent.unroll(obs, dones, state, prev_actions, prev_rewards)[:2])
        for env, start in ((1, 2), (2, 0)):
            other_actions, other_rewards = prev_actions[start:, env:env + 1].clone(), prev_rewards[start:, env:env + 1]
            other_actions[0], other_rewards = 1 - other_actions[0], other_rewards + 5.0  # all but step 0's are used
            other_rewards[1:] -= 5.0
            fresh_pi, fresh_value, _ = agent.unroll(obs[start:, env:env + 1], dones[start:, env:env + 1],
                                                 torch.randn(1, 2, 64), other_actions, other_rewards)
            torch.testing.assert_close(pi[start:, env], fresh_pi, rtol=0, atol=1e-6)
            torch.testing.assert_close(value[start:, env, 0], fresh_value, rtol=0, atol=1e-6)
        # and without the episode start, the state it had carries on: another state gives other outputs
        carried = agent.unroll(obs[2:, 1:2], torch.zeros(4, 1), torch.randn(1, 2, 64), prev_actions[2:, 1:2],
                               prev_rewards[2:, 1:2])[0]
        assert (carried - pi[2:, 1]).abs().min() > 1e-6


def test_replaying_an_unroll_with_the_acting_network_recomputes_the_rollout(monkeypatch, tmp_path):
    """CartPole, 4 envs x 32 steps, 2 iterations (episodes end inside them), 2 minibatches of 2 envs. In iteration 2
    the target network (the acting one: the online network's copy after iteration 1) replays each minibatch from
    the stored core states, which iteration 1 left behind. Put together in the rollout's env order, the replayed
    inputs give, through the same code path and the same shapes, the rollout's pi and values bit for bit; each
    minibatch's replay (2 rows a step, not 4) agrees to float32 rounding."""
    monkeypatch.chdir(tmp_path)
    steps, unrolls, groups = [], [], []
    real_step, real_unroll, real_minibatches = vmpo.Agent.step, vmpo.Agent.unroll, vmpo.unroll_minibatches
    acting = lambda agent: not next(agent.parameters()).requires_grad  # noqa: E731  (the target network)

    def step(agent, obs, *inputs, **memory):
        outputs = real_step(agent, obs, *inputs, **memory)
        if acting(agent) and len(obs) == 4:  # a rollout step (the target's replays take 2 envs)
            steps.append(outputs[0])
        return outputs

    def unroll(agent, *inputs):
        outputs = real_unroll(agent, *inputs)
        if not torch.is_grad_enabled():  # the online network's values after the rollout, the target's replays
            unrolls.append((copy.deepcopy(agent), inputs, outputs))
        return outputs

    monkeypatch.setattr(vmpo.Agent, "step", step)
    monkeypatch.setattr(vmpo.Agent, "unroll", unroll)
    monkeypatch.setattr(vmpo, "unroll_minibatches", lambda *args: groups.append(real_minibatches(*args)) or groups[-1])
    vmpo.train(vmpo.Args(env_id="CartPole-v1", num_envs=4, num_steps=32, num_minibatches=2, total_timesteps=256,
                         lstm=True, cuda=False))
    online, rollout_inputs, (_, rollout_values, _) = unrolls[-3]  # iteration 2's values, then its 2 replays
    target = unrolls[-1][0]
    rollout_pi = torch.stack(steps[32:])  # [T, N, 2]
    rollout_value = online.critic.unnormalize(rollout_values).view(32, 4)
    assert rollout_inputs[2].abs().min() > 0  # the stored state is iteration 1's, not a fresh start
    assert rollout_inputs[1].any() and not rollout_inputs[1].all()  # episodes ended inside the unrolls
    assert (rollout_inputs[4][1:] > 0).all()  # the core was fed the previous reward: CartPole's 1, normalized
    full = [torch.zeros_like(x) for x in rollout_inputs]  # obs, dones [T, N, ...], states [N, 2, H], actions, rewards
    max_error = 0.0
    for (envs, _), (_, inputs, (pi, value, _)) in zip(groups[-1], unrolls[-2:]):
        for i, (whole, part) in enumerate(zip(full, inputs)):
            whole[(slice(None), envs) if i != 2 else envs] = part  # item 2: the core states, [N, 2, H]
        max_error = max(max_error, (pi.view(32, 2, 2) - rollout_pi[:, envs]).abs().max().item(),
                        (target.critic.unnormalize(value).view(32, 2) - rollout_value[:, envs]).abs().max().item())
    assert all(torch.equal(whole, given) for whole, given in zip(full, rollout_inputs))  # as the rollout stored them
    with torch.no_grad():
        pi, value, _ = real_unroll(target, *full)
    assert torch.equal(pi.view(32, 4, 2), rollout_pi)
    assert torch.equal(target.critic.unnormalize(value).view(32, 4), rollout_value)
    assert max_error < 1e-5


def test_the_truncation_bootstrap_reads_the_core_state_from_before_the_reset(monkeypatch, tmp_path):
    # Pendulum, 2 envs x 100 steps, 2 iterations: both envs reach the 200-step time limit at the last step. The
    # online network values the final observation from the acting network's core state after that step, with the
    # step's action and reward, not from the zero memory of the episode that the env has already started.
    monkeypatch.chdir(tmp_path)
    states, values = [], []
    real_step, real_value = vmpo.Agent.step, vmpo.Agent.get_value

    def step(agent, obs, *inputs, **memory):
        outputs = real_step(agent, obs, *inputs, **memory)
        if not next(agent.parameters()).requires_grad and len(obs) == 2 and not values:  # the rollout's target
            states.append(outputs[2])
        return outputs

    def get_value(agent, obs, done=None, **memory):
        if len(states) == 200 and done is not None:  # at step 200 (the truncation), then after it
            values.append((agent, done, memory))
        return real_value(agent, obs, done, **memory)

    monkeypatch.setattr(vmpo.Agent, "step", step)
    monkeypatch.setattr(vmpo.Agent, "get_value", get_value)
    vmpo.train(vmpo.Args(env_id="Pendulum-v1", num_envs=2, num_steps=100, num_minibatches=2, total_timesteps=400,
                         gamma=0.99, lstm=True, cuda=False))
    (agent, done, memory), (_, next_done, _) = values  # the truncation's bootstrap, then the unroll's
    assert next(agent.parameters()).requires_grad  # the online network's V_phi
    assert done.tolist() == [0.0, 0.0] and next_done.tolist() == [1.0, 1.0]
    assert torch.equal(memory["core_state"], states[199]) and memory["core_state"].abs().min() > 0
    assert memory["prev_action"].shape == (2, 1) and memory["prev_reward"].abs().min() > 0


def test_with_lstm_box_actions_share_one_torso_and_core():
    agent = lstm_agent("Pendulum-v1")
    assert agent.value_torso is None and agent.core.lstm.input_size == 256 + 1 + 1  # features, action, reward
    memory = agent.core.initial_memory(3)
    _, value, _ = agent.step(torch.randn(3, 3), torch.zeros(3), **memory)
    value.sum().backward()  # the value's gradient reaches the shared torso and core
    assert all(p.grad is not None for p in [*agent.torso.parameters(), *agent.core.parameters()])


def test_evaluation_of_a_saved_lstm_run(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    trained = vmpo.train(vmpo.Args(exp_name="trained", total_timesteps=128, save_model=True, lstm=True,
                                   **TINY_CARTPOLE))
    result = vmpo.train(vmpo.Args(eval_checkpoint=f"{trained['run_dir']}/model.safetensors", eval_episodes=3, cuda=False))
    assert len(result["returns"]) == 3 and all(r >= 1 for r in result["returns"])


# -------------------------------------------------------------------------------- bad input
def test_every_numeric_flag_has_a_range():
    numeric = {f.name for f in dataclasses.fields(vmpo.Args) if f.type in (int, float, Optional[int], Optional[float])}
    assert numeric == set(harness.COMMON_FLAG_RANGES) | set(vmpo.FLAG_RANGES)


@pytest.mark.parametrize("change, flag", [
    ({"gae_lambda": 2.0}, "--gae-lambda"),
    ({"gamma": 1.5}, "--gamma"),
    ({"learning_rate": -1.0}, "--learning-rate"),
    ({"learning_rate": float("nan")}, "--learning-rate"),
    ({"multiplier_lr": -1.0}, "--multiplier-lr"),
    ({"adam_eps": 0.0}, "--adam-eps"),
    ({"update_epochs": 0}, "--update-epochs"),
    ({"eta_init": -1.0}, "--eta-init"),
    ({"eps_eta": -1.0}, "--eps-eta"),
    ({"alpha_init": 0.0}, "--alpha-init"),
    ({"eps_alpha": -1.0}, "--eps-alpha"),
    ({"alpha_mean_init": -1.0}, "--alpha-mean-init"),
    ({"eps_alpha_std": 0.0}, "--eps-alpha-std"),
    ({"popart_beta": 2.0}, "--popart-beta"),
    ({"min_std": -1.0}, "--min-std"),
    ({"seed": -1}, "--seed"),
    ({"num_envs": 0}, "--num-envs"),
    ({"num_envs": -3}, "--num-envs"),
    ({"num_steps": 0}, "--num-steps"),
    ({"total_timesteps": 0}, "--total-timesteps"),
    ({"num_levels": -1}, "--num-levels"),
    ({"checkpoint_every": -1}, "--checkpoint-every"),
    ({"top_k_fraction": 0.0}, "--top-k-fraction"),
    ({"target_period": -1}, "--target-period"),
    ({"num_minibatches": 3}, "--num-minibatches"),
    ({"num_minibatches": 32}, "--num-minibatches"),  # more minibatches than the 16 samples
    ({"num_minibatches": 4, "lstm": True}, "--num-minibatches 4 must divide --num-envs 2: with --lstm"),
    ({"num_minibatches": 4, "whole_unrolls": True}, "--num-minibatches 4 must divide --num-envs 2: with --whole"),
    ({"env_id": "NoSuchEnv-v0"}, "--env-id"),
    ({"env_id": "FrozenLake-v1"}, "--env-id"),  # Discrete observations
    ({"env_id": "starpilot", "norm_obs": True}, "--norm-obs needs vector observations"),
    ({"num_envs": 10**9}, "--num-envs"),  # 8 GB x 10^9: the rollout buffers cannot fit in memory
    ({"resume": "missing.pt"}, "--resume"),
    ({"eval_checkpoint": "missing.pt"}, "--eval-checkpoint"),
    ({"eval_checkpoint": "missing.pt", "eval_episodes": 0}, "--eval-episodes"),
])
def test_bad_input_names_the_flag_and_leaves_no_run_dir(monkeypatch, tmp_path, change, flag):
    monkeypatch.chdir(tmp_path)
    args = dataclasses.replace(vmpo.Args(env_id="CartPole-v1", num_envs=2, num_steps=8, num_minibatches=2), **change)
    with pytest.raises(SystemExit, match=flag):
        vmpo.train(args)
    assert not (tmp_path / "runs").exists()


def test_memory_check_says_how_much_the_rollout_needs(monkeypatch, tmp_path):
    # CartPole: obs 4 float32 = 16 B, action 8 B (long), 5 float32 = 20 B: 44 B per sample;
    # 10^9 envs x 8 steps x 44 B = 3.52e11 B = 327.8 GiB
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit, match=r"need 327\.8 GiB .* lower --num-envs or --num-steps"):
        vmpo.train(vmpo.Args(env_id="CartPole-v1", num_envs=10**9, num_steps=8, num_minibatches=2))


def test_runs_path_that_is_a_file_is_refused(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").write_text("not a directory")
    with pytest.raises(SystemExit, match=r"runs cannot hold a run directory \(File exists\): move it"):
        vmpo.train(vmpo.Args(env_id="CartPole-v1", num_envs=2, num_steps=8, num_minibatches=2))
    assert (tmp_path / "runs").read_text() == "not a directory"


def test_capture_video_without_moviepy_says_so_before_any_work(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "moviepy", None)  # makes `import moviepy` fail
    with pytest.raises(SystemExit, match="--capture-video needs the moviepy package"):
        vmpo.train(vmpo.Args(eval_checkpoint="any.pt", capture_video=True))
    assert not (tmp_path / "runs").exists()


# ------------------------------------------------------------------------------------- smoke
def _smoke(monkeypatch, tmp_path, tags, **kwargs):
    monkeypatch.chdir(tmp_path)
    args = vmpo.Args(exp_name="smoke", cuda=False, **kwargs)
    result = vmpo.train(args)
    assert result["global_step"] == args.total_timesteps
    events = EventAccumulator(glob.glob(f"{result['run_dir']}/events.*")[0])
    events.Reload()
    for tag in ("losses/policy_loss", "losses/value_loss", "losses/temperature_loss", "losses/kl_loss",
                "charts/eta", "kl/temperature", "kl/temperature_bound", "charts/popart_std", *tags):
        values = [s.value for s in events.Scalars(tag)]
        assert values and all(math.isfinite(v) for v in values), tag
    assert all(s.value >= 1e-8 for s in events.Scalars("charts/eta"))
    return result


@pytest.mark.parametrize("lstm", [False, True])
def test_smoke_procgen(monkeypatch, tmp_path, lstm):
    pytest.importorskip("procgen")
    _smoke(monkeypatch, tmp_path, ("kl/policy", "charts/alpha_policy"), env_id="starpilot", num_envs=2,
           num_steps=8, num_minibatches=2, total_timesteps=16, lstm=lstm)


def test_smoke_cartpole(monkeypatch, tmp_path):
    _smoke(monkeypatch, tmp_path, ("kl/policy", "kl/policy_bound", "charts/alpha_policy"),
           env_id="CartPole-v1", num_envs=2, num_steps=32, num_minibatches=2, total_timesteps=256,
           gamma=0.99, target_period=3)


def test_smoke_pendulum_with_truncation(monkeypatch, tmp_path):
    # 2 envs x 2 x 128 steps: every env passes Pendulum's 200-step time limit, so the bootstrap runs
    result = _smoke(monkeypatch, tmp_path, ("kl/mean", "kl/std", "kl/std_bound", "charts/alpha_mean",
                                            "charts/alpha_std"),
                    env_id="Pendulum-v1", num_envs=2, num_steps=128, num_minibatches=2, total_timesteps=512,
                    gamma=0.99)
    assert math.isfinite(result["mean_return"])


@pytest.mark.parametrize("target_period, expected_rows", [(0, 100), (3, 116)])
def test_rollout_uses_one_forward_pass_while_target_equals_online(monkeypatch, tmp_path, target_period, expected_rows):
    """Count rows through the torso. CartPole, N = 2, T = 8, B = 16, 2 minibatches, 1 epoch, 2 iterations.
    Per iteration: rollout N*T per pass, bootstrap N, learning B (online) + B (target).
    target_period 0 syncs after each iteration's 2 steps, so target == online in every rollout: 1 pass.
    target_period 3 syncs after step 3 only: out of sync in iteration 2, but in sync at the start (step 0),
    so the rollouts take 1 + 2 passes in all. Totals: 2*(16+2+32) = 100, and 100 + 16 = 116."""
    monkeypatch.chdir(tmp_path)
    rows = []
    original_init = vmpo.Agent.__init__

    def counting_init(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        self.torso.register_forward_pre_hook(lambda module, inputs: rows.append(inputs[0].shape[0]))

    monkeypatch.setattr(vmpo.Agent, "__init__", counting_init)
    vmpo.train(vmpo.Args(exp_name="count", env_id="CartPole-v1", num_envs=2, num_steps=8, num_minibatches=2,
                         update_epochs=1, total_timesteps=32, target_period=target_period, cuda=False))
    assert sum(rows) == expected_rows


# ------------------------------------------------------------- checkpoints, resume, evaluation
TINY_CARTPOLE = dict(env_id="CartPole-v1", num_envs=2, num_steps=32, num_minibatches=2, gamma=0.99, cuda=False,
                     learning_rate=1e-3, multiplier_lr=1e-2)


def read_scalars(run_dir):
    """{tag: [(step, value), ...]} as TensorBoard shows them (events after a resume point purged)."""
    events = EventAccumulator(str(run_dir))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_checkpoint_round_trip_gives_the_same_networks_multipliers_and_adam(tmp_path):
    args = vmpo.Args(**TINY_CARTPOLE)
    envs = vmpo.make_env(args)
    torch.manual_seed(0)
    agent = vmpo.Agent(envs)
    agent.critic.update(torch.tensor([3.0, 5.0]))  # PopArt statistics away from their initial values
    eta = torch.nn.Parameter(torch.tensor(0.7))
    multipliers = torch.nn.ParameterDict({"eta": eta, "alpha_policy": torch.nn.Parameter(torch.tensor(2.5))})
    optimizer = torch.optim.Adam([*agent.parameters(), *multipliers.values()], lr=1e-3)
    agent.get_pi(torch.ones(3, 4)).sum().add(eta).backward()
    optimizer.step()  # Adam now has moments and a step count
    next_obs, next_done = torch.zeros(2, 4), torch.zeros(2)
    saved = harness.Saved(models={"agent": agent, "multipliers": multipliers}, optimizers={"optimizer": optimizer})
    checkpoint = harness.make_checkpoint(args, saved, envs, next_obs, next_done, global_step=64, iteration=1,
                                             num_iterations=4, episode_returns=[10.0, 12.0],
                                         script="vmpo.py")
    path = str(tmp_path / "checkpoint.safetensors")
    harness.save_checkpoint(path, checkpoint)
    assert os.listdir(tmp_path) == ["checkpoint.safetensors"]  # the temporary file was renamed

    assert checkpoints.read(path, "--resume", vmpo.SCRIPT)["kind"] == "checkpoint"  # the first pass takes it
    loaded = read_back(path)
    torch.manual_seed(1)  # different initial weights
    fresh = vmpo.Agent(envs)
    fresh_multipliers = torch.nn.ParameterDict({"eta": torch.nn.Parameter(torch.tensor(1.0)),
                                                "alpha_policy": torch.nn.Parameter(torch.tensor(5.0))})
    fresh_optimizer = torch.optim.Adam([*fresh.parameters(), *fresh_multipliers.values()], lr=1e-3)
    obs = torch.tensor([[0.1, -0.2, 0.03, 0.4], [1.0, 0.5, -0.5, 0.0]])
    assert not torch.equal(fresh.get_pi(obs), agent.get_pi(obs))
    fresh.load_state_dict(loaded["models"]["agent"])
    fresh_multipliers.load_state_dict(loaded["models"]["multipliers"])
    fresh_optimizer.load_state_dict(loaded["optimizers"]["optimizer"])
    assert torch.equal(fresh.get_pi(obs), agent.get_pi(obs))
    assert torch.equal(fresh.get_value(obs), agent.get_value(obs))  # PopArt's mu and sigma came back too
    assert fresh_multipliers["eta"].item() == eta.item() and fresh_multipliers["alpha_policy"].item() == 2.5
    assert fresh_optimizer.state_dict()["state"][0]["step"].item() == 1
    assert torch.equal(fresh_optimizer.state_dict()["state"][0]["exp_avg"],
                       optimizer.state_dict()["state"][0]["exp_avg"])
    assert loaded["global_step"] == 64 and loaded["iteration"] == 1 and loaded["args"]["env_id"] == "CartPole-v1"
    assert set(loaded) >= {"args", "models", "optimizers", "normalizers", "rng", "global_step", "iteration"}
    envs.close()


@pytest.mark.parametrize("env_id, norm_obs, normalized", [
    ("Pendulum-v1", None, True), ("Pendulum-v1", False, False),  # the default: on for Box actions
    ("CartPole-v1", None, False), ("CartPole-v1", True, True),  # off for Discrete ones
])
def test_norm_obs_normalizes_then_clips_to_10(env_id, norm_obs, normalized):
    envs = vmpo.make_env(vmpo.with_defaults(vmpo.Args(env_id=env_id, num_envs=1, norm_obs=norm_obs, cuda=False)))
    first, _ = envs.reset(seed=0)
    assert ("obs_0" in harness.env_normalizers(envs)) == normalized
    if normalized:  # a running mean of 1000 and variance 1: every obs is (o - 1000) / 1, about -1000, then -10
        wrapper, rms = harness.env_normalizers(envs)["obs_0"]
        wrapper.update_running_mean, rms.mean[:], rms.var[:] = False, 1000.0, 1.0
        obs = envs.step(envs.action_space.sample())[0]
        assert np.array_equal(obs, np.full_like(obs, -10.0))
    envs.close()


def test_no_norm_reward_hands_the_raw_reward_on():
    envs = vmpo.make_env(vmpo.with_defaults(vmpo.Args(env_id="Pendulum-v1", norm_reward=False, num_envs=1)))
    assert set(harness.env_normalizers(envs)) == {"obs_0"}
    # not clipped to +-10: Pendulum at theta = pi, theta_dot = 8, torque 0 gives -(pi^2 + 0.1 * 8^2 + 0.001 * 0^2)
    # = -(9.8696 + 6.4) = -16.2696
    envs.reset(seed=0)
    envs.unwrapped.envs[0].unwrapped.state = np.array([np.pi, 8.0])
    assert envs.step(np.zeros((1, 1), dtype=np.float32))[1][0] == pytest.approx(-16.2696, abs=1e-4)
    envs.close()


def test_box_actions_have_separate_policy_and_value_mlps_of_256_units():
    envs = vmpo.make_env(vmpo.with_defaults(vmpo.Args(env_id="Pendulum-v1", num_envs=1, cuda=False)))
    agent = vmpo.Agent(envs)
    widths = lambda net: [m.out_features for m in net if isinstance(m, torch.nn.Linear)]  # noqa: E731
    assert widths(agent.torso) == widths(agent.value_torso) == [256, 256]
    pi, value = agent(torch.randn(5, 3))
    mean, std = pi.chunk(2, dim=-1)  # a Gaussian's mean and std side by side
    value.sum().backward()  # the value's gradient reaches its own MLP and readout, nothing of the policy's
    policy_params = [*agent.torso.parameters(), *agent.actor.parameters()]
    assert all(p.grad is None for p in policy_params)
    assert all(p.grad is not None for p in agent.value_torso.parameters())
    agent.zero_grad(set_to_none=True)
    (mean.sum() + std.sum()).backward()  # and the policy's gradient reaches nothing of the value's
    assert all(p.grad is None for p in [*agent.value_torso.parameters(), *agent.critic.parameters()])
    assert all(p.grad is not None for p in policy_params)
    discrete = vmpo.Agent(vmpo.make_env(vmpo.with_defaults(vmpo.Args(env_id="CartPole-v1", num_envs=1, cuda=False))))
    assert discrete.value_torso is None and widths(discrete.torso) == [64, 64]  # one torso, as before


def test_state_independent_std_is_one_learned_vector_with_the_default_initial_std():
    envs = vmpo.make_env(vmpo.with_defaults(vmpo.Args(env_id="HalfCheetah-v5", num_envs=1, cuda=False)))
    torch.manual_seed(0)
    default, independent = vmpo.Agent(envs), vmpo.Agent(envs, state_dependent_std=False)
    obs = torch.randn(4, 17)
    # the default's head outputs are near 0 at init, so its std is near softplus(0) + 1e-3 = log 2 + 1e-3 = 0.69415
    assert torch.allclose(default.get_pi(obs).chunk(2, -1)[1], torch.tensor(0.69415), atol=0.02)
    mean, std = independent.get_pi(obs).chunk(2, -1)
    assert mean.shape == std.shape == (4, 6)
    assert torch.equal(std, torch.full((4, 6), float(torch.nn.functional.softplus(torch.tensor(0.0))) + 1e-3))
    std.sum().backward()  # the std's gradient reaches its vector alone, not the network
    assert independent.std_param.grad is not None
    assert all(p.grad is None or not p.grad.any() for p in independent.actor.parameters())
    envs.close()


def test_observation_and_reward_statistics_round_trip_and_freeze():
    # Pendulum normalizes observations (per env) and rewards; run 50 steps, save, load into a fresh stack
    args = vmpo.with_defaults(vmpo.Args(env_id="Pendulum-v1", num_envs=2, num_steps=8, num_minibatches=2, cuda=False))
    envs = vmpo.make_env(args)
    envs.reset(seed=0)
    for _ in range(50):
        envs.step(np.full((2, 1), 0.5, np.float32))
    saved = harness.make_checkpoint(args, harness.Saved({}, {}), envs, None, None)["normalizers"]
    assert set(saved) == {"reward", "obs_0", "obs_1"} and saved["obs_0"]["count"] == pytest.approx(51 + 1e-4)
    fresh = vmpo.make_env(args)
    checkpoints.load_normalizers(fresh, saved, harness)
    for name, (wrapper, rms) in harness.env_normalizers(fresh).items():
        assert np.array_equal(rms.mean, saved[name]["mean"].numpy()) and rms.count == saved[name]["count"]
        assert not wrapper.update_running_mean  # frozen for evaluation
    fresh.reset(seed=1)
    fresh.step(np.zeros((2, 1), np.float32))
    assert harness.env_normalizers(fresh)["obs_0"][1].count == saved["obs_0"]["count"]  # stepping did not update it
    envs.close()
    fresh.close()


def test_a_crash_while_writing_keeps_the_previous_checkpoint(monkeypatch, tmp_path):
    path = str(tmp_path / "checkpoint.safetensors")
    harness.save_checkpoint(path, {"iteration": 1})

    def disk_full(fd):  # the bytes went out, but the disk could not take them
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(harness.os, "fsync", disk_full)
    with pytest.raises(SystemExit, match=r"checkpoint\.safetensors could not be written \(the disk is full\); the one "
                                         r"before is kept\.$"):
        harness.save_checkpoint(path, {"iteration": 2})
    monkeypatch.undo()
    assert read_back(path)["iteration"] == 1 and os.listdir(tmp_path) == ["checkpoint.safetensors"]  # no temporary


class Killed(Exception):
    """Stands for the process being killed."""


@pytest.mark.parametrize("env_id, lstm", [("CartPole-v1", False), ("Pendulum-v1", False), ("Hopper-v5", False),
                                          ("CartPole-v1", True), ("Pendulum-v1", True)])
def test_resumed_run_logs_what_the_uninterrupted_run_logs(monkeypatch, tmp_path, env_id, lstm):
    """4 iterations. The killed run writes checkpoints every iteration and dies while writing the one of
    iteration 3, after iteration 3 was logged; resumed from iteration 2's checkpoint it must redo iteration 3
    (TensorBoard drops the first attempt) and 4, and log exactly what an uninterrupted run logs. --lstm: the
    acting network's core state and last action and reward come back from the checkpoint."""
    monkeypatch.chdir(tmp_path)
    if env_id == "Hopper-v5":  # MuJoCo: the simulator's state and its time limit's counter come back from data
        pytest.importorskip("mujoco")
    # Pendulum: 2 envs x 64 steps x 4 iterations, so each env finishes one 200-step episode (time limit)
    config = dict(TINY_CARTPOLE, env_id=env_id, num_steps=32 if env_id == "CartPole-v1" else 64, lstm=lstm)
    config["total_timesteps"] = 4 * 2 * config["num_steps"]
    full = vmpo.train(vmpo.Args(exp_name="full", **config))

    real_save = harness.save_checkpoint

    def save_then_die_at_iteration_3(path, checkpoint, dir_fd=None):
        if checkpoint["iteration"] == 3:
            raise Killed
        real_save(path, checkpoint, dir_fd)

    monkeypatch.setattr(harness, "save_checkpoint", save_then_die_at_iteration_3)
    with pytest.raises(Killed):
        vmpo.train(vmpo.Args(exp_name="killed", checkpoint_every=1, **config))
    monkeypatch.setattr(harness, "save_checkpoint", real_save)
    (run_dir,) = glob.glob("runs/*__killed__*")
    checkpoint = read_back(f"{run_dir}/checkpoint.safetensors")
    assert checkpoint["iteration"] == 2 and ("memory" in checkpoint) == lstm
    if lstm:  # h and c of each env, not the initial zeros
        assert checkpoint["memory"]["core_state"].shape == (2, 2, 64 if env_id == "CartPole-v1" else 256)
        assert checkpoint["memory"]["core_state"].abs().min() > 0

    # TensorBoard reads a run's event files in name order, and the name starts with the time in whole
    # seconds: a real restart comes seconds later, so this one starts in the next second at least
    time.sleep(1 - time.time() % 1)
    resumed = vmpo.train(vmpo.Args(resume=f"{run_dir}/checkpoint.safetensors", cuda=False))
    assert resumed["run_dir"] == run_dir and resumed["global_step"] == full["global_step"]
    assert resumed["mean_return"] == full["mean_return"]  # the last 100 episodes' returns are in the checkpoint
    expected, got = read_scalars(full["run_dir"]), read_scalars(run_dir)
    del expected["charts/SPS"], got["charts/SPS"]
    assert len(got["losses/policy_loss"]) == 4  # iterations 1, 2, 3 (second attempt), 4
    assert got == expected


def test_resume_takes_only_cuda_from_the_command_line(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit, match="drop --seed, --total-timesteps"):
        vmpo.train(vmpo.Args(resume="runs/x/checkpoint.safetensors", seed=3, total_timesteps=5, cuda=False))


def test_resume_procgen_restarts_its_envs_fresh_and_says_so(monkeypatch, tmp_path, capsys):
    pytest.importorskip("procgen")
    monkeypatch.chdir(tmp_path)
    real_save = harness.save_checkpoint

    def save_then_die_at_iteration_2(path, checkpoint, dir_fd=None):
        if checkpoint["iteration"] == 2:
            raise Killed
        real_save(path, checkpoint, dir_fd)

    monkeypatch.setattr(harness, "save_checkpoint", save_then_die_at_iteration_2)
    with pytest.raises(Killed):
        vmpo.train(vmpo.Args(env_id="starpilot", num_envs=2, num_steps=8, num_minibatches=2, total_timesteps=32,
                             checkpoint_every=1, cuda=False))
    monkeypatch.setattr(harness, "save_checkpoint", real_save)
    (run_dir,) = glob.glob("runs/starpilot__*")
    checkpoint = read_back(f"{run_dir}/checkpoint.safetensors")
    assert checkpoint["iteration"] == 1 and checkpoint["env"]["state"] == {  # Procgen's C++ envs are not data
        "restarts": "ProcgenVecEnv's envs cannot be saved as data"}
    assert "reward" in checkpoint["normalizers"]
    time.sleep(1 - time.time() % 1)  # to the next second: event files are read in name order, which starts with it
    capsys.readouterr()
    resumed = vmpo.train(vmpo.Args(resume=f"{run_dir}/checkpoint.safetensors", cuda=False))
    assert resumed["global_step"] == 32
    assert ("note: --resume: the envs restart with new episodes (ProcgenVecEnv's envs cannot be saved as data)."
            in capsys.readouterr().out.splitlines())
    assert [step for step, _ in read_scalars(run_dir)["losses/policy_loss"]] == [16, 32]


def test_evaluation_of_a_saved_cartpole_checkpoint(monkeypatch, tmp_path, capsys):
    monkeypatch.chdir(tmp_path)
    trained = vmpo.train(vmpo.Args(exp_name="trained", total_timesteps=128, save_model=True, **TINY_CARTPOLE))
    result = vmpo.train(vmpo.Args(eval_checkpoint=f"{trained['run_dir']}/model.safetensors", eval_episodes=3, cuda=False))
    assert len(result["returns"]) == 3 and all(r >= 1 for r in result["returns"])  # CartPole: +1 per step
    assert result["mean_return"] == pytest.approx(np.mean(result["returns"]))
    assert result["std_return"] == pytest.approx(np.std(result["returns"]))
    assert "__eval__" in result["run_dir"] and result["run_dir"] != trained["run_dir"]
    scalars = read_scalars(result["run_dir"])
    assert scalars["eval/mean_return"] == [(128, pytest.approx(result["mean_return"]))]
    assert scalars["eval/std_return"] == [(128, pytest.approx(result["std_return"]))]
    assert f"mean return {result['mean_return']:.2f}" in capsys.readouterr().out


def test_train_output_without_a_terminal_is_the_start_up_block_and_plain_lines(monkeypatch, tmp_path, capsys):
    monkeypatch.chdir(tmp_path)
    result = vmpo.train(vmpo.Args(exp_name="quiet", total_timesteps=256, **TINY_CARTPOLE))
    out = capsys.readouterr().out
    assert "\r" not in out
    lines = out.splitlines()
    assert lines[0].startswith("V-MPO") and "Song et al." in lines[0]
    assert lines[1:5] == ["  env        CartPole-v1", "  device     cpu (--no-cuda)",
                          f"  run dir    {result['run_dir']}",
                          "  steps      256 in 4 iterations of 64 (2 envs x 32 steps)"]
    assert lines[5] == "  saves      checkpoint.safetensors every 30 minutes and at the end, model.safetensors at the end"
    assert len(lines) == 8 and lines[6].startswith("step 256/256 (100%)")  # dozens of episodes ended: no line for each
    model = os.path.join(result["run_dir"], "model.safetensors")
    assert lines[7] == f"saved {model}; play it: python vmpo.py --eval-checkpoint {model}"


def test_impala_cnn_has_the_official_init():
    # the same IMPALA CNN as the batch-size-invariance scripts: each output unit's weight norm is 1.0 (first conv
    # of a stack), 6^(-1/4) = 0.6389 (residual convs) or 1.4 (dense); biases 0. V-MPO's heads keep their own init.
    torch.manual_seed(0)
    seen = set()
    for name, module in vmpo.ImpalaCNN(3).named_modules():
        if isinstance(module, (torch.nn.Conv2d, torch.nn.Linear)):
            scale = 6 ** -0.25 if ".res" in name else 1.0 if name.endswith(".conv") else 1.4
            norms = torch.linalg.vector_norm(module.weight.flatten(1), dim=1)
            torch.testing.assert_close(norms, torch.full_like(norms, scale), atol=1e-6, rtol=0)
            assert torch.all(module.bias == 0), name
            seen.add((type(module).__name__, round(scale, 4)))
    assert seen == {("Conv2d", 1.0), ("Conv2d", 0.6389), ("Linear", 1.4)}
