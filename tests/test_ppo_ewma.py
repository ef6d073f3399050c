"""Worked examples for ppo_ewma.py: every number below is computed by hand in the comment above it."""
import glob
import math

import pytest
import torch
import torch.nn as nn
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import ppo_ewma
from ppo_ewma import (
    Args, EwmaMoments, apply_batch_divisor, com_to_decay, compute_gae, decay_to_com, decoupled_clip_loss,
    decoupled_kl_loss, span_to_decay, update_ewma,
)

log = math.log


def test_compute_gae_across_episode_boundary():
    # env 0: dones[2] = 1, so step 1 does not bootstrap into step 2. gamma 0.9, lambda 0.8.
    #   t=2: delta = 3 + 0.9*2.0 - 1.5 = 3.3                 A2 = 3.3
    #   t=1: delta = 2 + 0 - 1.0 = 1.0 (episode ended)        A1 = 1.0
    #   t=0: delta = 1 + 0.9*1.0 - 0.5 = 1.4                 A0 = 1.4 + 0.9*0.8*1.0 = 2.12
    # env 1: next_done = 1, so the last step does not bootstrap from next_value = 5.
    #   t=2: delta = 1 - 0 = 1                               A2 = 1
    #   t=1: delta = 0                                       A1 = 0.72*1 = 0.72
    #   t=0: delta = 0                                       A0 = 0.72*0.72 = 0.5184
    rewards = torch.tensor([[1.0, 0.0], [2.0, 0.0], [3.0, 1.0]])
    values = torch.tensor([[0.5, 0.0], [1.0, 0.0], [1.5, 0.0]])
    dones = torch.tensor([[0.0, 0.0], [0.0, 0.0], [1.0, 0.0]])
    advantages, returns = compute_gae(rewards, values, dones, torch.tensor([2.0, 5.0]), torch.tensor([0.0, 1.0]), 0.9, 0.8)
    torch.testing.assert_close(advantages, torch.tensor([[2.12, 0.5184], [1.0, 0.72], [3.3, 1.0]]))
    # returns = advantages + values
    torch.testing.assert_close(returns, torch.tensor([[2.62, 0.5184], [2.0, 0.72], [4.8, 1.0]]))


def clip_example():
    """Four samples covering both signs of A, clipped and unclipped (clip_coef 0.2)."""
    new_logp = torch.tensor([log(0.6), log(0.3), log(0.44), log(0.6)], requires_grad=True)
    prox_logp = torch.tensor([log(0.4), log(0.4), log(0.4), log(0.4)], requires_grad=True)
    behav_logp = torch.tensor([log(0.5), log(0.2), log(0.4), log(0.8)], requires_grad=True)
    advantages = torch.tensor([1.0, -1.0, 2.0, -1.0])
    return new_logp, prox_logp, behav_logp, advantages


def test_decoupled_clip_loss_by_hand():
    # sample: r = pi/pi_prox, w = pi_prox/pi_behav, term = w * min(r A, clip(r, 0.8, 1.2) A)
    #   0: r = 1.5,  A = +1, min(1.5, 1.2) = 1.2 (clipped),        w = 0.8 -> 0.96
    #   1: r = 0.75, A = -1, min(-0.75, -0.8) = -0.8 (clipped),    w = 2.0 -> -1.6
    #   2: r = 1.1,  A = +2, min(2.2, 2.2) = 2.2 (inside),         w = 1.0 -> 2.2
    #   3: r = 1.5,  A = -1, min(-1.5, -1.2) = -1.5 (pessimistic), w = 0.5 -> -0.75
    # loss = -(0.96 - 1.6 + 2.2 - 0.75) / 4 = -0.81 / 4 = -0.2025
    new_logp, prox_logp, behav_logp, advantages = clip_example()
    loss = decoupled_clip_loss(new_logp, prox_logp, behav_logp, advantages, clip_coef=0.2)
    assert loss.item() == pytest.approx(-0.2025)


def test_decoupled_clip_loss_gradient_reaches_new_logp_only():
    # d loss / d new_logp_i = -w_i r_i A_i / 4 where the min picks the unclipped term, else 0:
    #   0: clipped -> 0;  1: clipped -> 0;  2: -(1 * 1.1 * 2) / 4 = -0.55;  3: -(0.5 * 1.5 * -1) / 4 = 0.1875
    new_logp, prox_logp, behav_logp, advantages = clip_example()
    decoupled_clip_loss(new_logp, prox_logp, behav_logp, advantages, clip_coef=0.2).backward()
    assert new_logp.grad.tolist() == pytest.approx([0.0, 0.0, -0.55, 0.1875])
    assert prox_logp.grad is None and behav_logp.grad is None  # pi_prox and pi_behav are constants


def test_decoupled_clip_loss_importance_cap():
    # pi = 0.6, pi_prox = 0.4, pi_behav = 0.2: pi/pi_behav = 3 > cap 2, so pi_behav is raised to 0.6/2 = 0.3.
    # w = 0.4/0.3 = 4/3; r = 1.5 clipped to 1.2 with A = +1; loss = -(4/3)*1.2 = -1.6 (uncapped: -2*1.2 = -2.4)
    args = (torch.tensor([log(0.6)]), torch.tensor([log(0.4)]), torch.tensor([log(0.2)]), torch.tensor([1.0]))
    assert decoupled_clip_loss(*args, clip_coef=0.2, max_is_ratio=2.0).item() == pytest.approx(-1.6)
    assert decoupled_clip_loss(*args, clip_coef=0.2, max_is_ratio=100.0).item() == pytest.approx(-2.4)


def test_decoupled_clip_loss_with_prox_equal_behav_is_ppo():
    torch.manual_seed(0)
    behav_logp = torch.log(torch.rand(64) * 0.9 + 0.05)
    new_logp = behav_logp + 0.5 * torch.randn(64)  # ratios within [e^-2.5, e^2.5], far below the cap
    advantages = torch.randn(64)
    ratio = torch.exp(new_logp - behav_logp)
    ppo = -torch.min(ratio * advantages, torch.clamp(ratio, 0.8, 1.2) * advantages).mean()  # L^CLIP, eq. (7)
    assert decoupled_clip_loss(new_logp, behav_logp, behav_logp, advantages, 0.2).item() == pytest.approx(ppo.item())


def test_decoupled_kl_loss_by_hand():
    # term = -(pi/pi_behav) A + beta KL, beta = 0.5:
    #   0: -(0.6/0.5)*1 + 0.5*0.1 = -1.2 + 0.05 = -1.15
    #   1: -(0.3/0.2)*(-1) + 0.5*0.2 = 1.5 + 0.1 = 1.6
    # mean = (-1.15 + 1.6)/2 = 0.225
    new_logp = torch.tensor([log(0.6), log(0.3)])
    behav_logp = torch.tensor([log(0.5), log(0.2)])
    loss = decoupled_kl_loss(new_logp, behav_logp, torch.tensor([1.0, -1.0]), torch.tensor([0.1, 0.2]), kl_coef=0.5)
    assert loss.item() == pytest.approx(0.225)
    # cap 2: pi/pi_behav = 0.6/0.2 = 3 is capped to 2, so the term is -2*1 + 0 = -2
    capped = decoupled_kl_loss(torch.tensor([log(0.6)]), torch.tensor([log(0.2)]), torch.tensor([1.0]),
                               torch.tensor([0.0]), kl_coef=0.5, max_is_ratio=2.0)
    assert capped.item() == pytest.approx(-2.0)


def test_categorical_kl_by_hand():
    # p = (0.5, 0.5), q = (0.25, 0.75): KL[p||q] = 0.5 log(0.5/0.25) + 0.5 log(0.5/0.75) = 0.5 log 2 + 0.5 log(2/3)
    kl = ppo_ewma.categorical_kl(torch.log(torch.tensor([[0.5, 0.5]])), torch.log(torch.tensor([[0.25, 0.75]])))
    assert kl.item() == pytest.approx(0.5 * log(2) + 0.5 * log(2 / 3))


def scalar_model(value):
    model = nn.Linear(1, 1)
    with torch.no_grad():
        model.weight.fill_(value)
        model.bias.fill_(-value)
    return model


def test_update_ewma_matches_appendix_a_weighted_average():
    # theta takes the values 1, 2, 4, 8 after each gradient step; beta = 0.5; theta_prox <- theta_0, w <- 1.
    # Appendix A: EWMA = (theta_t + b theta_{t-1} + ... + b^t theta_0) / (1 + b + ... + b^t)
    #   t=1: (2 + 0.5*1) / 1.5 = 1.6667
    #   t=2: (4 + 0.5*2 + 0.25*1) / 1.75 = 5.25/1.75 = 3.0
    #   t=3: (8 + 0.5*4 + 0.25*2 + 0.125*1) / 1.875 = 10.625/1.875 = 5.6667
    # and w = 1 + b w: 1.5, 1.75, 1.875
    ewma, weight = scalar_model(1.0), 1.0
    for theta, expected, expected_weight in ((2.0, 5 / 3, 1.5), (4.0, 3.0, 1.75), (8.0, 10.625 / 1.875, 1.875)):
        weight = update_ewma(ewma, scalar_model(theta), weight, decay=0.5)
        assert weight == pytest.approx(expected_weight)
        assert ewma.weight.item() == pytest.approx(expected)
        assert ewma.bias.item() == pytest.approx(-expected)


def test_update_ewma_decay_zero_copies():
    ewma, model = scalar_model(3.0), scalar_model(-7.0)
    assert update_ewma(ewma, model, weight=5.0, decay=0.0) == 1.0  # w_new = 1 + 0*5
    assert ewma.weight.item() == -7.0 and ewma.bias.item() == 7.0


def test_decay_conversions():
    assert com_to_decay(8) == pytest.approx(8 / 9)  # 0.889, Table 4
    assert decay_to_com(8 / 9) == pytest.approx(8.0)  # 1/(1 - 8/9) - 1 = 9 - 1
    assert com_to_decay(32) == pytest.approx(32 / 33)  # com 8 x c=4
    assert span_to_decay(1) == 0.0  # 1 - 2/2: plain per-batch estimate
    assert span_to_decay(4) == pytest.approx(0.6)  # 1 - 2/5; span 2/(1-0.6) - 1 = 4


def test_ewma_moments_two_updates():
    # decay 0.5. x1 = [1, 3]: n 2, mean 2, var 1   -> w = 2, s = 4, q = 2*(1+4) = 10
    # x2 = [4, 6, 8]: n 3, mean 6, var 8/3           -> w = 0.5*2 + 3 = 4, s = 0.5*4 + 18 = 20,
    #                                                   q = 0.5*10 + 3*(8/3 + 36) = 5 + 116 = 121
    # mean = 20/4 = 5; var = 121/4 - 25 = 5.25; std = sqrt(5.25) = 2.29129
    moments = EwmaMoments(decay=0.5)
    moments.update(torch.tensor([1.0, 3.0]))
    assert (moments.mean, moments.std) == (pytest.approx(2.0), pytest.approx(1.0))
    moments.update(torch.tensor([4.0, 6.0, 8.0]))
    assert moments.mean == pytest.approx(5.0)
    assert moments.std == pytest.approx(math.sqrt(5.25))
    # normalize(7) = (7 - 5) / (2.29129 + 1e-8) = 0.87287
    assert moments.normalize(torch.tensor([7.0])).item() == pytest.approx(2 / math.sqrt(5.25))


def test_apply_batch_divisor_at_c4():
    # c = 4: 256/4 = 64 envs; lr 5e-4/sqrt(4) = 2.5e-4; centre of mass 8*4 = 32; span 1*4 = 4; betas unchanged
    new = apply_batch_divisor(Args(batch_divisor=4))
    assert (new.num_envs, new.learning_rate, new.ewma_com, new.adv_norm_span) == (64, pytest.approx(2.5e-4), 32, 4)
    assert (new.adam_beta1, new.adam_beta2) == (0.9, 0.999)
    assert new.num_steps == 256 and new.num_minibatches == 8  # T and the minibatch count stay


def test_apply_batch_divisor_ablation_switches():
    base = dict(batch_divisor=4)
    assert apply_batch_divisor(Args(**base, adjust_lr=False)).learning_rate == 5e-4
    assert apply_batch_divisor(Args(**base, lr_rule="linear")).learning_rate == pytest.approx(1.25e-4)  # 5e-4/4
    assert apply_batch_divisor(Args(**base, adjust_ewma=False)).ewma_com == 8
    assert apply_batch_divisor(Args(**base, adjust_adv_norm=False)).adv_norm_span == 1
    betas = apply_batch_divisor(Args(**base, adjust_adam_betas=True))
    # Appendix D: beta^(1/c): 0.9^0.25 = 0.974004, 0.999^0.25 = 0.99975
    assert (betas.adam_beta1, betas.adam_beta2) == (pytest.approx(0.974004, abs=1e-6), pytest.approx(0.99975, abs=1e-6))


def test_every_divisor_of_the_paper_sweep_is_accepted():
    for c in (1, 4, 16, 64, 256):
        args = apply_batch_divisor(Args(batch_divisor=c))
        assert args.num_envs == 256 // c
        ppo_ewma.check_args(args)  # c = 256: one env, 256 samples, 8 minibatches of 32 timesteps
        assert ppo_ewma.batch_sizes(args)[1] == 256 * 256 // c // 8


def test_bad_input_names_the_flag(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit, match="--batch-divisor 3"):
        apply_batch_divisor(Args(batch_divisor=3))
    with pytest.raises(SystemExit, match="--num-minibatches 8"):
        ppo_ewma.train(Args(num_envs=1, num_steps=4, env_id="CartPole-v1"))
    with pytest.raises(SystemExit, match="--env-id 'NoSuchEnv-v0'"):
        ppo_ewma.train(Args(env_id="NoSuchEnv-v0"))
    with pytest.raises(SystemExit, match="--env-id Pendulum-v1 has a continuous action space"):
        ppo_ewma.train(Args(env_id="Pendulum-v1", num_envs=2, num_steps=8, num_minibatches=2))
    assert not (tmp_path / "runs").exists()  # refused before any work


def scalars(run_dir):
    accumulator = EventAccumulator(glob.glob(f"{run_dir}/events.out.tfevents.*")[0])
    accumulator.Reload()
    return {tag: [event.value for event in accumulator.Scalars(tag)] for tag in accumulator.Tags()["scalars"]}


def assert_logged_and_finite(result, extra_tags=()):
    logged = scalars(result["run_dir"])
    for tag in ("charts/SPS", "charts/learning_rate", "losses/policy_loss", "losses/value_loss", "losses/entropy",
                "losses/approx_kl", "losses/approx_kl_behav", "losses/clipfrac", "losses/is_capped_frac",
                "losses/explained_variance", "charts/adv_mean", "charts/adv_std", *extra_tags):
        assert tag in logged, tag
    for tag in ("losses/policy_loss", "losses/value_loss", "losses/entropy", "losses/approx_kl"):
        assert all(math.isfinite(v) for v in logged[tag]), tag
    return logged


def test_smoke_procgen_with_batch_divisor(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # 4 envs / c=2 -> 2 envs x 16 steps = 32 samples per iteration, 2 iterations
    args = Args(exp_name="smoke", num_envs=4, batch_divisor=2, num_steps=16, num_minibatches=2, update_epochs=1,
                total_timesteps=64, distribution_mode="easy", cuda=False, save_model=True)
    result = ppo_ewma.train(args)
    assert result["global_step"] == 64
    logged = assert_logged_and_finite(result, ("charts/ewma_decay", "charts/ewma_weight"))
    assert logged["charts/ewma_decay"][0] == pytest.approx(16 / 17)  # centre of mass 8*2 = 16
    # 2 minibatches per iteration, w = 1 + b w twice from w = 1: 1 + b(1 + b) with b = 16/17
    b = 16 / 17
    assert logged["charts/ewma_weight"][0] == pytest.approx(1 + b * (1 + b))
    assert (tmp_path / result["run_dir"] / "model.pt").exists()


def test_smoke_cartpole_kl_objective_without_ewma(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = Args(exp_name="smoke", env_id="CartPole-v1", num_envs=4, num_steps=32, num_minibatches=4,
                total_timesteps=512, objective="kl", ewma=False, gamma=0.99, cuda=False)
    result = ppo_ewma.train(args)
    logged = assert_logged_and_finite(result, ("charts/episodic_return",))
    assert "charts/ewma_weight" not in logged
    # without the EWMA the proximal policy is the behaviour policy, so both KL estimates coincide
    assert logged["losses/approx_kl"] == pytest.approx(logged["losses/approx_kl_behav"])
    assert result["mean_return"] > 0


def test_nan_loss_stops_the_run_with_its_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(ppo_ewma, "decoupled_clip_loss", lambda *args, **kwargs: torch.tensor(float("nan")))
    with pytest.raises(FloatingPointError, match="policy_loss is not finite at iteration 1"):
        ppo_ewma.train(Args(exp_name="nan", env_id="CartPole-v1", num_envs=2, num_steps=8, num_minibatches=2,
                            total_timesteps=16, cuda=False))


@pytest.mark.parametrize("ewma", [True, False])
def test_training_loop_does_only_the_forward_passes_it_needs(tmp_path, monkeypatch, ewma):
    """Count samples through the torso: rollout N*T, bootstrap N, training E*B, and with the EWMA
    E*B more for pi_prox (Algorithm 2). N = 2, T = 8, B = 16, E = 3 -> 16 + 2 + 48 (+ 48)."""
    monkeypatch.chdir(tmp_path)
    rows = []
    original_init = ppo_ewma.Agent.__init__

    def counting_init(self, envs):
        original_init(self, envs)
        self.torso.register_forward_pre_hook(lambda module, inputs: rows.append(inputs[0].shape[0]))

    monkeypatch.setattr(ppo_ewma.Agent, "__init__", counting_init)
    ppo_ewma.train(Args(exp_name="count", env_id="CartPole-v1", num_envs=2, num_steps=8, num_minibatches=2,
                        update_epochs=3, total_timesteps=16, ewma=ewma, cuda=False))
    assert sum(rows) == 16 + 2 + 48 + (48 if ewma else 0)


def test_logits_in_chunks_gives_the_same_numbers_as_one_pass():
    torch.manual_seed(0)
    envs = type("Spaces", (), {"single_observation_space": ppo_ewma.gym.spaces.Box(0, 255, (64, 64, 3), "uint8"),
                               "single_action_space": ppo_ewma.gym.spaces.Discrete(15)})()
    agent = ppo_ewma.Agent(envs)
    obs = torch.randint(0, 256, (10, 64, 64, 3), dtype=torch.uint8)
    chunked = ppo_ewma.logits_in_chunks(agent, obs, chunk_size=4)  # chunks of 4, 4 and 2 rows
    torch.testing.assert_close(chunked, agent.get_logits(obs), rtol=0, atol=1e-6)
    assert not chunked.requires_grad
