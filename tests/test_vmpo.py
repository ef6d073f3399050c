"""Worked examples for vmpo.py: hand-computed values of every contract function, gradient checks
where a stop-gradient matters, and tiny smoke runs of train()."""
import glob
import math

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

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


# -------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("change, flag", [
    ({"top_k_fraction": 0.0}, "--top-k-fraction"),
    ({"target_period": -1}, "--target-period"),
    ({"num_minibatches": 3}, "--num-minibatches"),
    ({"env_id": "NoSuchEnv-v0"}, "--env-id"),
])
def test_bad_input_names_the_flag(change, flag):
    args = vmpo.Args(env_id="CartPole-v1", num_envs=2, num_steps=8)
    for key, value in change.items():
        setattr(args, key, value)
    with pytest.raises(SystemExit, match=flag):
        vmpo.train(args)


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


def test_smoke_procgen(monkeypatch, tmp_path):
    pytest.importorskip("procgen")
    _smoke(monkeypatch, tmp_path, ("kl/policy", "charts/alpha_policy"), env_id="starpilot", num_envs=2,
           num_steps=8, num_minibatches=2, total_timesteps=16)


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
