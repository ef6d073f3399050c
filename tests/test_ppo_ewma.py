"""Worked examples for ppo_ewma.py: every number below is computed by hand in the comment above it."""
import dataclasses
import glob
import math
import os
import shutil
import signal
import sys
import time
from typing import Optional

import gymnasium as gym
import numpy as np
import pytest
import torch
import torch.nn as nn
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import checkpoints
import evaluation
import harness
import ppo_ewma
import resume
from saved_files import read_back
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
    next_value, next_done = torch.tensor([2.0, 5.0]), torch.tensor([0.0, 1.0])
    advantages, returns = compute_gae(rewards, values, dones, next_value, next_done, 0.9, 0.8)
    torch.testing.assert_close(advantages, torch.tensor([[2.12, 0.5184], [1.0, 0.72], [3.3, 1.0]]))
    # returns = advantages + values
    torch.testing.assert_close(returns, torch.tensor([[2.62, 0.5184], [2.0, 0.72], [4.8, 1.0]]))


def test_gae_and_reward_scaling_loops_on_numpy_give_the_tensor_loops_numbers():
    # compute_gae and RewardNormalizer loop over NumPy arrays for speed; the same float32 operations on tensors, in
    # the same order, give the same numbers bit for bit (64 steps, 3 envs, episode starts at random)
    g = torch.Generator().manual_seed(0)
    rewards, values = torch.randn(64, 3, generator=g) * 5, torch.randn(64, 3, generator=g)
    dones = (torch.rand(64, 3, generator=g) < 0.1).float()
    next_value, next_done = torch.randn(3, generator=g), torch.tensor([0.0, 1.0, 0.0])
    advantages, last_gae = torch.zeros_like(rewards), torch.zeros(3)
    for t in reversed(range(64)):
        next_nonterminal = 1.0 - (next_done if t == 63 else dones[t + 1])
        delta = rewards[t] + 0.99 * (next_value if t == 63 else values[t + 1]) * next_nonterminal - values[t]
        last_gae = advantages[t] = delta + 0.99 * 0.95 * next_nonterminal * last_gae
    numpy_advantages, numpy_returns = compute_gae(rewards, values, dones, next_value, next_done, 0.99, 0.95)
    assert torch.equal(numpy_advantages, advantages) and torch.equal(numpy_returns, advantages + values)
    returns, ret = torch.zeros_like(rewards), torch.zeros(3)
    for t in range(64):
        ret = returns[t] = rewards[t] + 0.99 * (1.0 - dones[t]) * ret
    normalizer = ppo_ewma.RewardNormalizer(num_envs=3, gamma=0.99)
    normalizer(rewards, dones)
    assert torch.equal(normalizer.returns, ret)
    assert normalizer.mean == pytest.approx(returns.mean().item() * 192 / 192.0001, rel=1e-12)  # the prior mean 0


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


def test_decoupled_clip_loss_importance_cap_in_both_terms_with_its_gradient():
    # cap 2; r = pi/pi_prox, clip(r, 0.8, 1.2); pi_behav' = max(pi_behav, pi/2) is the capped behaviour policy
    #   0: pi 0.6, pi_prox 0.4, pi_behav 0.2, A = +1: pi/pi_behav = 3 > 2, so pi_behav' = 0.3 and pi/pi_behav' = 2;
    #      r = 1.5 -> 1.2, pi_prox/pi_behav' = 4/3: min(2 * 1, (4/3) * 1.2 * 1) = 1.6 (clipped term)
    #   1: the same, A = -1: min(2 * -1, 1.6 * -1) = -2 (unclipped term, capped)
    #   2: pi 0.44, pi_prox = pi_behav = 0.4, A = +2: 1.1 < 2 (no cap), r = 1.1 (inside): min(2.2, 2.2) = 2.2
    # loss = -(1.6 - 2 + 2.2) / 3 = -0.6 (uncapped: sample 0's clipped term is 2 * 1.2 = 2.4 and sample 1's
    # unclipped one -3: -(2.4 - 3 + 2.2) / 3 = -0.5333)
    new_logp = torch.tensor([log(0.6), log(0.6), log(0.44)], requires_grad=True)
    prox_logp, behav_logp = torch.tensor([log(0.4)] * 3), torch.tensor([log(0.2), log(0.2), log(0.4)])
    loss = decoupled_clip_loss(new_logp, prox_logp, behav_logp, torch.tensor([1.0, -1.0, 2.0]), 0.2, max_is_ratio=2.0)
    assert loss.item() == pytest.approx(-0.6)
    # d loss / d new_logp: pi_behav' is a constant (new_logp.detach() raises it), so where the unclipped term wins the
    # gradient is -(pi/pi_behav') A / 3 as without the cap, and a clipped term gives none:
    #   0: clipped -> 0;  1: -(2 * -1) / 3 = 0.6667;  2: -(1.1 * 2) / 3 = -0.7333
    loss.backward()
    assert new_logp.grad.tolist() == pytest.approx([0.0, 2 / 3, -2.2 / 3])
    uncapped = decoupled_clip_loss(new_logp, prox_logp, behav_logp, torch.tensor([1.0, -1.0, 2.0]), 0.2, 100.0)
    assert uncapped.item() == pytest.approx(-1.6 / 3)


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
    new = apply_batch_divisor(Args(batch_divisor=4))  # the unset centre of mass is starpilot's default, 8
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
        # check_args takes the run's Args; c = 256: one env, 8 minibatches of 32 timesteps
        harness.check_args(args, ppo_ewma.SCRIPT)
        assert args.num_envs * args.num_steps // args.num_minibatches == 256 * 256 // c // 8


def test_every_numeric_flag_has_a_range():
    numeric = {f.name for f in dataclasses.fields(Args) if f.type in (int, float, Optional[int], Optional[float])}
    assert numeric == set(harness.COMMON_FLAG_RANGES) | set(ppo_ewma.FLAG_RANGES)


@pytest.mark.parametrize("change, flag", [
    ({"batch_divisor": 3}, "--batch-divisor 3"),  # does not divide 2 envs
    ({"batch_divisor": 0}, "--batch-divisor"),
    ({"num_minibatches": 3}, "--num-minibatches 3"),
    ({"env_id": "NoSuchEnv-v0"}, "--env-id 'NoSuchEnv-v0'"),
    ({"env_id": "Blackjack-v1"}, "--env-id Blackjack-v1 has Tuple"),  # observations that are not a vector
    ({"env_id": "starpilot", "norm_obs": True}, "--norm-obs needs vector observations"),
    ({"target_kl": 0.0}, "--target-kl"),
    ({"lr_kl_target": -1.0}, "--lr-kl-target"),
    ({"gae_lambda": 2.0}, "--gae-lambda"),
    ({"gamma": 1.5}, "--gamma"),
    ({"reward_norm_gamma": 1.5}, "--reward-norm-gamma"),
    ({"learning_rate": -1.0}, "--learning-rate"),
    ({"clip_coef": -0.1}, "--clip-coef"),
    ({"clip_coef": 1.0}, "--clip-coef"),  # log(1 - eps) of the clip would be log 0
    ({"ent_coef": -5.0}, "--ent-coef"),
    ({"vf_coef": -1.0}, "--vf-coef"),
    ({"kl_coef": -1.0}, "--kl-coef"),
    ({"max_grad_norm": -1.0}, "--max-grad-norm"),
    ({"max_is_ratio": 1.0}, "--max-is-ratio"),
    ({"update_epochs": 0}, "--update-epochs"),
    ({"adam_beta1": 1.5}, "--adam-beta1"),
    ({"adam_eps": 0.0}, "--adam-eps"),
    ({"ewma_com": -2.0}, "--ewma-com"),
    ({"adv_norm_span": 0.5}, "--adv-norm-span"),
    ({"seed": -1}, "--seed"),
    ({"num_envs": 0}, "--num-envs"),
    ({"num_envs": -3}, "--num-envs"),
    ({"num_steps": 0}, "--num-steps"),
    ({"total_timesteps": 0}, "--total-timesteps"),
    ({"checkpoint_every": -1}, "--checkpoint-every"),
    ({"num_envs": 2 * 10**9}, "--num-envs"),  # the rollout buffers cannot fit in memory
    ({"resume": "missing.pt"}, "--resume"),
    ({"eval_checkpoint": "missing.pt"}, "--eval-checkpoint"),
    ({"eval_checkpoint": "missing.pt", "eval_episodes": 0}, "--eval-episodes"),
])
def test_bad_input_names_the_flag_and_leaves_no_run_dir(tmp_path, monkeypatch, change, flag):
    monkeypatch.chdir(tmp_path)
    args = Args(env_id="CartPole-v1", num_envs=2, num_steps=8, num_minibatches=2, total_timesteps=16)
    with pytest.raises(SystemExit, match=flag):
        ppo_ewma.train(dataclasses.replace(args, **change))
    assert not (tmp_path / "runs").exists()  # refused before any work


def test_runs_path_that_is_a_file_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").write_text("not a directory")
    with pytest.raises(SystemExit, match=r"runs cannot hold a run directory \(File exists\): move it"):
        ppo_ewma.train(Args(env_id="CartPole-v1", num_envs=2, num_steps=8, num_minibatches=2))
    assert harness.LIVE_RUN is None  # the run, which had made its envs, let go of (Ctrl-C the caller's again)


def test_capture_video_without_moviepy_says_so_before_any_work(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "moviepy", None)  # makes `import moviepy` fail
    with pytest.raises(SystemExit, match="--capture-video needs the moviepy package"):
        ppo_ewma.train(Args(eval_checkpoint="any.pt", capture_video=True))
    assert not (tmp_path / "runs").exists()


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


def test_smoke_procgen_with_batch_divisor(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    # 4 envs / c=2 -> 2 envs x 16 steps = 32 samples per iteration, 2 iterations
    args = Args(exp_name="smoke", num_envs=4, batch_divisor=2, num_steps=16, num_minibatches=2, update_epochs=1,
                total_timesteps=64, distribution_mode="easy", cuda=False, save_model=True)
    result = ppo_ewma.train(args)
    assert result["global_step"] == 64
    logged = assert_logged_and_finite(result, ("charts/ewma_decay", "charts/ewma_weight"))
    assert logged["charts/ewma_decay"][0] == pytest.approx(16 / 17)  # centre of mass 8*2 = 16
    assert "  ewma_com: 8.0 -> 16.0\n" in capsys.readouterr().out  # the change is printed from the filled-in 8
    # 2 minibatches per iteration, w = 1 + b w twice from w = 1: 1 + b(1 + b) with b = 16/17
    b = 16 / 17
    assert logged["charts/ewma_weight"][0] == pytest.approx(1 + b * (1 + b))
    assert (tmp_path / result["run_dir"] / "model.safetensors").exists()


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


def test_nan_loss_stops_the_run_with_its_name_and_lets_go_of_the_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(ppo_ewma, "decoupled_clip_loss", lambda *args, **kwargs: torch.tensor(float("nan")))
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(SystemExit, match="^policy_loss is not finite at iteration 1: the run stops before this step"):
        ppo_ewma.train(Args(exp_name="nan", env_id="CartPole-v1", num_envs=2, num_steps=8, num_minibatches=2,
                            total_timesteps=16, cuda=False))
    # a notebook or a sweep goes on in this process: Ctrl-C is its own again, the run's lock and files closed
    assert signal.getsignal(signal.SIGINT) is before and harness.LIVE_RUN is None


@pytest.mark.parametrize("ewma", [True, False])
def test_training_loop_does_only_the_forward_passes_it_needs(tmp_path, monkeypatch, ewma):
    """Count samples through the torso: rollout N*T, bootstrap N, training E*B, and with the EWMA
    E*B more for pi_prox (Algorithm 2). N = 2, T = 8, B = 16, E = 3 -> 16 + 2 + 48 (+ 48)."""
    monkeypatch.chdir(tmp_path)
    rows = []
    original_init = ppo_ewma.Agent.__init__

    def counting_init(self, envs, *args):
        original_init(self, envs, *args)
        self.torso.register_forward_pre_hook(lambda module, inputs: rows.append(inputs[0].shape[0]))

    monkeypatch.setattr(ppo_ewma.Agent, "__init__", counting_init)
    ppo_ewma.train(Args(exp_name="count", env_id="CartPole-v1", num_envs=2, num_steps=8, num_minibatches=2,
                        update_epochs=3, total_timesteps=16, ewma=ewma, cuda=False))
    assert sum(rows) == 16 + 2 + 48 + (48 if ewma else 0)


def test_in_chunks_gives_the_same_numbers_as_one_pass():
    torch.manual_seed(0)
    envs = type("Spaces", (), {"single_observation_space": ppo_ewma.gym.spaces.Box(0, 255, (64, 64, 3), "uint8"),
                               "single_action_space": ppo_ewma.gym.spaces.Discrete(15)})()
    agent = ppo_ewma.Agent(envs)
    obs = torch.randint(0, 256, (10, 64, 64, 3), dtype=torch.uint8)
    chunked = harness.in_chunks(agent.get_pi, obs, chunk_size=4)  # chunks of 4, 4 and 2 rows
    torch.testing.assert_close(chunked, agent.get_pi(obs), rtol=0, atol=1e-6)
    assert not chunked.requires_grad


def test_reward_normalizer_two_envs_four_steps():
    # gamma 0.5; env 0 starts a new episode at obs 2 (dones[2] = 1), env 1 has none. R_t = r_t + 0.5 (1 - d_t) R_{t-1}
    #   env 0: rewards 1, 2, 3, 0 -> R = 1, 2 + 0.5*1 = 2.5, 3 (restart), 0 + 0.5*3 = 1.5
    #   env 1: rewards 2, 0, 4, 8 -> R = 2, 0 + 0.5*2 = 1, 4 + 0.5*1 = 4.5, 8 + 0.5*4.5 = 10.25
    # the 8 returns: mean 25.75/8 = 3.21875, E[R^2] = 148.8125/8 = 18.6015625,
    # var = 18.6015625 - 3.21875^2 = 8.2412109375
    # merged with the prior (count 1e-4, mean 0, var 1): (1e-4*1 + 8*8.2412109375 + 3.21875^2 * 1e-4*8/8.0001) / 8.0001
    #   = 8.2412499..., so the std is sqrt(8.24125 + 1e-8) = 2.8707577
    rewards = torch.tensor([[1.0, 2.0], [2.0, 0.0], [3.0, 4.0], [0.0, 8.0]])
    dones = torch.tensor([[0.0, 0.0], [0.0, 0.0], [1.0, 0.0], [0.0, 0.0]])
    normalizer = ppo_ewma.RewardNormalizer(num_envs=2, gamma=0.5, clip=2.5)
    scaled = normalizer(rewards, dones)
    assert normalizer.mean == pytest.approx(3.21875 * 8 / 8.0001)
    assert normalizer.var == pytest.approx(8.2412499, rel=1e-6)
    torch.testing.assert_close(normalizer.returns, torch.tensor([1.5, 10.25]))  # carried into the next rollout
    # r / 2.8707577: 1 -> 0.34834, 2 -> 0.69668, 3 -> 1.04502, 4 -> 1.39336; 8 -> 2.78672, clipped to 2.5
    expected = torch.tensor([[0.34834, 0.69668], [0.69668, 0.0], [1.04502, 1.39336], [0.0, 2.5]])
    torch.testing.assert_close(scaled, expected, atol=1e-5, rtol=0)
    # the mean is not subtracted: a zero reward stays zero
    assert scaled[3, 0] == 0.0


def test_reward_normalizer_updates_once_per_rollout():
    # the second rollout continues each env's return: env 0 had R = 1.5, env 1 R = 10.25 (gamma 0.5)
    #   one step of rewards (2, 0), no episode start: R = 2 + 0.75 = 2.75 and 0 + 5.125 = 5.125
    normalizer = ppo_ewma.RewardNormalizer(num_envs=2, gamma=0.5)
    normalizer(torch.tensor([[1.0, 2.0], [2.0, 0.0], [3.0, 4.0], [0.0, 8.0]]),
               torch.tensor([[0.0, 0.0], [0.0, 0.0], [1.0, 0.0], [0.0, 0.0]]))
    count, mean = normalizer.count, normalizer.mean
    normalizer(torch.tensor([[2.0, 0.0]]), torch.tensor([[0.0, 0.0]]))
    torch.testing.assert_close(normalizer.returns, torch.tensor([2.75, 5.125]))
    assert normalizer.count == pytest.approx(count + 2)  # one update with the rollout's N x T = 2 returns
    # new mean: (8.0001 * mean + 2.75 + 5.125) / 10.0001
    assert normalizer.mean == pytest.approx((count * mean + 2.75 + 5.125) / (count + 2))


def test_reward_normalizer_keeps_its_epsilon_inside_the_square_root():
    # 4 envs, one step of reward 0.001 each: R = 0.001, batch mean 0.001, batch var 0. Merged with the prior:
    #   var = (1e-4 * 1 + 4 * 0 + 0.001^2 * 1e-4 * 4 / 4.0001) / 4.0001 = 2.49994e-5
    #   0.001 / sqrt(2.49994e-5 + 1e-8) = 0.199962 (without the 1e-8: 0.200002)
    normalizer = ppo_ewma.RewardNormalizer(num_envs=4, gamma=0.99)
    scaled = normalizer(torch.full((1, 4), 0.001), torch.ones(1, 4))
    assert normalizer.var == pytest.approx(2.49994e-5, rel=1e-5)
    assert scaled.tolist() == [pytest.approx([0.199962] * 4, rel=1e-5)]


def test_reward_normalizer_takes_the_batch_variance_accurately_where_the_returns_are_large():
    # 8 envs, one step, every one an episode start: R = 1000, 1000.01, ..., 1000.07, whose variance is 5.25e-4. In
    # float32, E[R^2] - E[R]^2 loses it to cancellation (0.0625 here); a two-pass variance keeps it. Merged with the
    # prior (count 1e-4, mean 0, var 1): (1e-4 + 8 var_batch + mean^2 * 1e-4 * 8 / 8.0001) / 8.0001
    rewards = torch.tensor([[1000.0 + 0.01 * k for k in range(8)]])
    normalizer = ppo_ewma.RewardNormalizer(num_envs=8, gamma=0.99)
    normalizer(rewards, torch.ones(1, 8))
    returns = rewards.double().flatten()  # the float32 returns, their moments in float64
    mean, var = returns.mean().item(), returns.var(unbiased=False).item()
    assert normalizer.var == pytest.approx((1e-4 + 8 * var + mean**2 * 1e-4 * 8 / 8.0001) / 8.0001, rel=1e-6)


def test_minibatch_indices_whole_trajectories():
    # N = 4 envs, T = 4 steps, M = 2: the env permutation of seed 1 is [1, 3, 2, 0], so minibatch 0 holds the
    # full trajectories of envs 1 and 3, minibatch 1 those of envs 2 and 0. Flat index t*N + n = 4t + n.
    assert torch.randperm(4, generator=torch.Generator().manual_seed(1)).tolist() == [1, 3, 2, 0]
    minibatches = ppo_ewma.minibatch_indices(4, 4, 2, generator=torch.Generator().manual_seed(1))
    assert [mb.tolist() for mb in minibatches] == [[1, 5, 9, 13, 3, 7, 11, 15], [2, 6, 10, 14, 0, 4, 8, 12]]


def test_minibatch_indices_time_chunks_when_more_minibatches_than_envs():
    # N = 1, T = 8, M = 4: four consecutive 2-step chunks of the single env, in time order (flat index = t)
    minibatches = ppo_ewma.minibatch_indices(8, 1, 4)
    assert [mb.tolist() for mb in minibatches] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    # N = 2, T = 4, M = 4: the permutation of seed 1 is [1, 0]; env 1's two chunks (t 0-1, t 2-3), then env 0's.
    # Flat index 2t + n: env 1 -> [1, 3], [5, 7]; env 0 -> [0, 2], [4, 6]
    assert torch.randperm(2, generator=torch.Generator().manual_seed(1)).tolist() == [1, 0]
    minibatches = ppo_ewma.minibatch_indices(4, 2, 4, generator=torch.Generator().manual_seed(1))
    assert [mb.tolist() for mb in minibatches] == [[1, 3], [5, 7], [0, 2], [4, 6]]


def test_minibatch_indices_without_a_generator_draw_from_torchs_global_random_state():
    # train() calls it with no generator: each epoch must shuffle the envs anew, from torch's seeded global RNG
    torch.manual_seed(3)
    first, second = ppo_ewma.minibatch_indices(2, 8, 2), ppo_ewma.minibatch_indices(2, 8, 2)
    torch.manual_seed(3)
    assert [i.tolist() for i in ppo_ewma.minibatch_indices(2, 8, 2)] == [i.tolist() for i in first]  # seeded
    assert [i.tolist() for i in second] != [i.tolist() for i in first]  # 1 in 8! = 40,320 to be equal by chance


@pytest.mark.parametrize("num_steps, num_envs, num_minibatches",
                         [(4, 4, 2), (8, 1, 4), (256, 1, 8), (6, 8, 8), (4, 2, 4)])
def test_minibatch_indices_cover_every_sample_once(num_steps, num_envs, num_minibatches):
    minibatches = ppo_ewma.minibatch_indices(num_steps, num_envs, num_minibatches)
    assert len(minibatches) == num_minibatches
    assert len({len(mb) for mb in minibatches}) == 1  # equal sizes T*N/M
    assert sorted(torch.cat(minibatches).tolist()) == list(range(num_steps * num_envs))


@pytest.mark.parametrize("num_envs, num_steps, num_minibatches, accepted", [
    (8, 128, 4, True),   # 4 divides 8 envs: 2 whole trajectories per minibatch
    (4, 6, 8, True),     # 8 = 2 x 4 envs: each 6-step trajectory cut into 2 chunks of 3
    (8, 128, 3, False),  # 3 does not divide 8 envs, and is not a multiple of 8
    (4, 5, 8, False),    # 8 = 2 x 4 envs, but 5 steps do not cut into 2 equal chunks
    (3, 10, 2, False),   # 2 does not divide 3 envs
])
def test_minibatch_count_must_split_whole_trajectories(num_envs, num_steps, num_minibatches, accepted):
    args = Args(env_id="CartPole-v1", num_envs=num_envs, num_steps=num_steps, num_minibatches=num_minibatches)
    if accepted:
        harness.check_args(args, ppo_ewma.SCRIPT)
    else:
        with pytest.raises(SystemExit, match="--num-minibatches"):
            harness.check_args(args, ppo_ewma.SCRIPT)
    # sample shuffling only needs M to divide N x T: 8*128/3 no, 4*5/8 no, 3*10/2 = 15 yes
    shuffled = Args(env_id="CartPole-v1", num_envs=num_envs, num_steps=num_steps, num_minibatches=num_minibatches,
                    shuffle_samples=True)
    if (num_envs * num_steps) % num_minibatches == 0:
        harness.check_args(shuffled, ppo_ewma.SCRIPT)
    else:
        with pytest.raises(SystemExit, match="--num-minibatches"):
            harness.check_args(shuffled, ppo_ewma.SCRIPT)


class ProcgenLike:
    """Just the spaces of a Procgen vector env, enough to build the networks."""
    single_observation_space = ppo_ewma.gym.spaces.Box(0, 255, (64, 64, 3), dtype="uint8")
    single_action_space = ppo_ewma.gym.spaces.Discrete(15)


def official_scale(name):
    """The norm each layer's output units get (the official impala_cnn.py and ppg.py)."""
    if ".res" in name:
        return 6 ** -0.25  # residual convs: (1/sqrt(3 stacks * 2 blocks))^(1/2) = 0.6389
    if name.endswith(".conv"):
        return 1.0  # first conv of each stack
    if name.endswith("torso.fc"):
        return 1.4  # the 2048 -> 256 dense layer
    return 0.1  # policy, value and auxiliary-value heads


def check_official_init(model):
    """Every output unit's weight vector has norm official_scale to 1e-6 and every bias is 0; returns the
    (layer type, scale) pairs seen."""
    seen = set()
    for name, module in model.named_modules():
        if isinstance(module, (nn.Conv2d, nn.Linear)):
            scale = official_scale(name)
            norms = torch.linalg.vector_norm(module.weight.flatten(1), dim=1)
            torch.testing.assert_close(norms, torch.full_like(norms, scale), atol=1e-6, rtol=0)
            assert torch.all(module.bias == 0), name
            seen.add((type(module).__name__, round(scale, 4)))
    return seen


def test_official_init_of_the_procgen_network():
    torch.manual_seed(0)
    seen = check_official_init(ppo_ewma.Agent(ProcgenLike()))
    assert seen == {("Conv2d", 1.0), ("Conv2d", 0.6389), ("Linear", 1.4), ("Linear", 0.1)}


def test_bf16_runs_the_cnn_in_bfloat16_and_keeps_losses_gradients_and_weights_float32():
    # one fixed batch of 64 random frames through the same network in float32 and with --bf16 (autocast): measured on
    # an AVX2 EPYC, the loss differs by 3.3e-5 of itself and the gradients by 5-18% of their norm in the convolutions
    # (median 9%), 5% in the dense layer and at most 0.5% in the heads (docs/speed.md#bf16)
    torch.manual_seed(0)
    float32 = ppo_ewma.Agent(ProcgenLike())
    bf16 = ppo_ewma.Agent(ProcgenLike(), bf16=True)
    bf16.load_state_dict(float32.state_dict())
    obs = torch.randint(0, 256, (64, 64, 64, 3), dtype=torch.uint8)
    actions, advantages, returns = torch.randint(0, 15, (64,)), torch.randn(64), torch.randn(64)
    results = []
    for agent in (float32, bf16):
        pi, value = agent(obs)
        logp, entropy = ppo_ewma.categorical_log_prob_and_entropy(pi, actions)
        loss = (ppo_ewma.decoupled_clip_loss(logp, logp.detach() - 0.01, logp.detach(), advantages, 0.2)
                - 0.01 * entropy.mean() + 0.5 * ppo_ewma.value_loss(value, returns))
        loss.backward()
        assert pi.dtype == value.dtype == loss.dtype == torch.float32
        assert all(p.dtype == p.grad.dtype == torch.float32 for p in agent.parameters())  # master weights, Adam's input
        results.append((loss.item(), {name: p.grad for name, p in agent.named_parameters()}))
    (loss_32, grads_32), (loss_16, grads_16) = results
    assert abs(loss_16 - loss_32) < 1e-3 * abs(loss_32)
    errors = {name: ((grads_16[name] - grads_32[name]).norm() / grads_32[name].norm()).item() for name in grads_32}
    assert all(1e-3 < errors[name] < 0.5 for name in errors if name.startswith("torso"))  # bfloat16's 8 bits, bounded
    assert all(errors[name] < 0.05 for name in errors if not name.startswith("torso"))  # the heads run in float32


def test_the_bf16_benchmark_times_bfloat16_convolutions_and_float32_ones():
    # benchmark/bf16.py once timed float32 twice: its outer autocast did not reach inside ImpalaCNN, which opens its
    # own (enabled=False). Each column's convolutions are recorded here as the benchmark runs them
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmark"))
    import bf16 as benchmark
    works, cnns = benchmark.workloads(torch.device("cpu"), num_frames=8)
    dtypes = []
    for cnn in cnns.values():
        for module in cnn.modules():
            if isinstance(module, (nn.Conv2d, nn.Linear)):
                module.register_forward_hook(lambda module, inputs, output: dtypes.append(output.dtype))
    for name, work in works.items():
        if name.startswith("IMPALA"):
            for bf16 in (False, True):
                dtypes.clear()
                work(bf16)
                convolutions = dtypes[:-2]  # the last two: the float32 policy and value heads, outside the CNN
                assert len(convolutions) == 16 and set(convolutions) == {torch.bfloat16 if bf16 else torch.float32}
                assert dtypes[-2:] == [torch.float32] * 2


def test_bf16_is_refused_for_vector_observations(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit, match=r"^--bf16 runs the IMPALA CNN of image observations in bfloat16; --env-id "
                                         r"CartPole-v1 has vector ones, whose MLP it would not speed up"):
        ppo_ewma.train(Args(env_id="CartPole-v1", num_envs=2, num_steps=32, num_minibatches=2, bf16=True))
    assert not os.path.exists("runs")


def test_value_term_of_the_total_loss_is_half_the_mse():
    # V = (1, 2), V_targ = (0, 0): L^VF = mean(1, 4) = 2.5; c_VF = 0.5 (Table 1) -> 1.25 = 0.5 * MSE in the total loss,
    # as the official code's vfcoef * mean((V - V_targ)^2); the earlier 0.5 * c_VF * MSE would give 0.625
    v_loss = ppo_ewma.value_loss(torch.tensor([1.0, 2.0]), torch.tensor([0.0, 0.0]))
    assert v_loss.item() == pytest.approx(2.5)
    assert Args().vf_coef * v_loss.item() == pytest.approx(1.25)


def test_warning_when_epochs_or_the_kl_adaptive_step_size_break_invariance(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    config = dict(env_id="CartPole-v1", num_envs=4, batch_divisor=2, num_steps=8, num_minibatches=2,
                  total_timesteps=16, cuda=False)
    ppo_ewma.train(Args(update_epochs=2, **config))
    out = capsys.readouterr().out
    assert "Sec. 4 requires 1 policy epoch" in out and "kl-adaptive" not in out
    ppo_ewma.train(Args(update_epochs=1, lr_schedule="kl-adaptive", **config))
    out = capsys.readouterr().out
    assert "Sec. 4" not in out and "warning: --lr-schedule kl-adaptive steers every epoch's KL into fixed bounds" in out


# ------------------------------------------------------------- checkpoints, resume, evaluation
TINY_CARTPOLE = dict(env_id="CartPole-v1", num_envs=2, num_steps=32, num_minibatches=2, gamma=0.99, cuda=False)


def scalars_with_steps(run_dir):
    """{tag: [(step, value), ...]} as TensorBoard shows them (events after a resume point purged)."""
    events = EventAccumulator(str(run_dir))
    events.Reload()
    # nan (e.g. a noise scale not measurable yet) as the string "nan", so that equal logs compare equal
    return {tag: [(e.step, "nan" if math.isnan(e.value) else e.value) for e in events.Scalars(tag)]
            for tag in events.Tags()["scalars"]}


def test_checkpoint_round_trip_gives_the_same_networks_ewma_and_normalizers(tmp_path):
    args = Args(**TINY_CARTPOLE)
    envs = ppo_ewma.make_env(args)
    torch.manual_seed(0)
    agent = ppo_ewma.Agent(envs)
    ewma_agent = ppo_ewma.Agent(envs)
    optimizer = torch.optim.Adam(agent.parameters(), lr=5e-4)
    obs = torch.tensor([[0.1, -0.2, 0.03, 0.4], [1.0, 0.5, -0.5, 0.0]])
    agent.get_pi(obs).sum().backward()
    optimizer.step()
    reward_normalizer, adv_moments = ppo_ewma.RewardNormalizer(2, 0.99), EwmaMoments(0.5)
    reward_normalizer(torch.tensor([[1.0, 2.0], [3.0, 4.0]]), torch.zeros(2, 2))
    adv_moments.update(torch.tensor([1.0, 3.0]))
    saved = harness.Saved(models={"agent": agent, "ewma_agent": ewma_agent}, optimizers={"optimizer": optimizer},
                              normalizers={"reward": reward_normalizer, "advantages": adv_moments})
    checkpoint = harness.make_checkpoint(args, saved, envs, torch.zeros(2, 4), torch.zeros(2), global_step=64,
                                         iteration=1, num_iterations=4, episode_returns=[], ewma_weight=2.5)
    path = str(tmp_path / "checkpoint.safetensors")
    harness.save_checkpoint(path, dict(checkpoint, script="ppo_ewma.py"))
    assert os.listdir(tmp_path) == ["checkpoint.safetensors"]

    loaded = checkpoints.read(path, "--resume", ppo_ewma.SCRIPT)
    torch.manual_seed(1)
    fresh, fresh_ewma = ppo_ewma.Agent(envs), ppo_ewma.Agent(envs)
    assert not torch.equal(fresh.get_pi(obs), agent.get_pi(obs))
    fresh_normalizer, fresh_moments = ppo_ewma.RewardNormalizer(2, 0.99), EwmaMoments(0.5)
    fresh_optimizer = torch.optim.Adam(fresh.parameters(), lr=5e-4)
    fresh_saved = harness.Saved(models={"agent": fresh, "ewma_agent": fresh_ewma},
                                    optimizers={"optimizer": fresh_optimizer},
                                    normalizers={"reward": fresh_normalizer, "advantages": fresh_moments},
                                    keys={"ewma_weight": 1.0})
    keys = resume.restore_run(loaded, fresh_saved, envs, torch.ones(2, 4), torch.ones(2), "--resume", 64, 4,
                              harness)[-1]
    assert torch.equal(fresh.get_pi(obs), agent.get_pi(obs))
    assert torch.equal(fresh_ewma(obs)[1], ewma_agent(obs)[1])
    assert keys["ewma_weight"] == 2.5
    # each env's discounted return R: [1, 2] after step 0, then [3 + 0.99 * 1, 4 + 0.99 * 2] = [3.99, 5.98]
    assert fresh_normalizer.returns.tolist() == pytest.approx([3.99, 5.98])
    assert (fresh_normalizer.mean, fresh_normalizer.var, fresh_normalizer.count) == (
        reward_normalizer.mean, reward_normalizer.var, reward_normalizer.count)
    assert (fresh_moments.mean, fresh_moments.std) == (2.0, 1.0)  # mean of [1, 3] = 2, population std 1
    assert fresh_optimizer.state_dict()["state"][0]["step"].item() == 1
    envs.close()


class Killed(Exception):
    """Stands for the process being killed."""


@pytest.mark.parametrize("config", [
    {},  # PPO-EWMA, reward normalization, advantage moments
    {"num_envs": 4, "batch_divisor": 2, "shuffle_samples": True, "update_epochs": 1},  # raw flags are resumed
    # Box actions: observation statistics in the env stack, the step size adapted inside the optimizer's state
    {"env_id": "Pendulum-v1", "num_envs": 1, "num_steps": 64, "num_minibatches": 4, "clip_vloss": True,
     "lr_schedule": "kl-adaptive"},  # one 200-step episode ends in the 4 iterations
    {"norm_value": True},  # the value normalizer's statistics
])
def test_resumed_run_logs_what_the_uninterrupted_run_logs(tmp_path, monkeypatch, config):
    """4 iterations on CartPole. The killed run writes checkpoints every iteration and dies while writing
    iteration 3's, after iteration 3 was logged; resumed from iteration 2's, it must log exactly what an
    uninterrupted run logs (TensorBoard drops the first attempt at iteration 3)."""
    monkeypatch.chdir(tmp_path)
    config = dict(TINY_CARTPOLE, total_timesteps=4 * 64, **config)
    full = ppo_ewma.train(Args(exp_name="full", **config))

    real_save = harness.save_checkpoint

    def save_then_die_at_iteration_3(path, checkpoint, dir_fd=None):
        if checkpoint["iteration"] == 3:
            raise Killed
        real_save(path, checkpoint, dir_fd)

    monkeypatch.setattr(harness, "save_checkpoint", save_then_die_at_iteration_3)
    with pytest.raises(Killed):
        ppo_ewma.train(Args(exp_name="killed", checkpoint_every=1, **config))
    monkeypatch.setattr(harness, "save_checkpoint", real_save)
    (run_dir,) = glob.glob("runs/*__killed__*")

    time.sleep(1 - time.time() % 1)  # to the next second: event files are read in name order, which starts with it
    resumed = ppo_ewma.train(Args(resume=f"{run_dir}/checkpoint.safetensors", cuda=False))
    assert resumed["run_dir"] == run_dir and resumed["global_step"] == full["global_step"] == 256
    assert resumed["mean_return"] == full["mean_return"]
    expected, got = scalars_with_steps(full["run_dir"]), scalars_with_steps(run_dir)
    del expected["charts/SPS"], got["charts/SPS"]
    assert len(got["losses/policy_loss"]) == 4
    assert got == expected


def test_evaluation_of_a_saved_cartpole_checkpoint(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    trained = ppo_ewma.train(Args(exp_name="trained", total_timesteps=128, save_model=True, **TINY_CARTPOLE))
    result = ppo_ewma.train(Args(eval_checkpoint=f"{trained['run_dir']}/model.safetensors", eval_episodes=3, cuda=False))
    # named after the checkpoint's run: runs/CartPole-v1__trained__1__<time>__eval__<time>
    assert os.path.basename(result["run_dir"]).startswith(os.path.basename(trained["run_dir"]) + "__eval__")
    assert len(result["returns"]) == 3 and all(r >= 1 for r in result["returns"])  # CartPole: +1 per step
    assert result["mean_return"] == pytest.approx(np.mean(result["returns"]))
    scalars = scalars_with_steps(result["run_dir"])
    assert scalars["eval/mean_return"] == [(128, pytest.approx(result["mean_return"]))]
    assert scalars["eval/std_return"] == [(128, pytest.approx(result["std_return"]))]
    assert f"mean return {result['mean_return']:.2f}" in capsys.readouterr().out


def test_train_output_without_a_terminal_is_the_start_up_block_and_plain_lines(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    result = ppo_ewma.train(Args(exp_name="quiet", total_timesteps=256, **TINY_CARTPOLE))
    out = capsys.readouterr().out
    assert "\r" not in out
    lines = out.splitlines()
    assert lines[0].startswith("PPO and PPO-EWMA") and "Hilton, Cobbe & Schulman" in lines[0]
    assert lines[1:5] == ["  env        CartPole-v1", "  device     cpu (--no-cuda)",
                          f"  run dir    {result['run_dir']}",
                          "  steps      256 in 4 iterations of 64 (2 envs x 32 steps)"]
    assert lines[5] == "  saves      checkpoint.safetensors every 30 minutes and at the end, model.safetensors at the end"
    assert len(lines) == 8 and lines[6].startswith("step 256/256 (100%)")  # many episodes ended: no line for each
    model = os.path.join(result["run_dir"], "model.safetensors")
    assert lines[7] == f"saved {model}; play it: python ppo_ewma.py --eval-checkpoint {model}"


def test_reward_normalizer_shares_one_estimate_over_workers():
    # Two torchrun workers with 1 env each (gamma 0.5): worker A sees rewards 1, 2, 3, 0 with an episode start at
    # obs 2, worker B sees 2, 0, 4, 8. gather concatenates the other worker's returns, as global_batch does, so each
    # worker's estimate equals one normalizer's over both envs: the two-env example above (var 8.2412499...).
    rewards_a, dones_a = torch.tensor([[1.0], [2.0], [3.0], [0.0]]), torch.tensor([[0.0], [0.0], [1.0], [0.0]])
    rewards_b, dones_b = torch.tensor([[2.0], [0.0], [4.0], [8.0]]), torch.zeros(4, 1)
    returns_b = torch.tensor([2.0, 1.0, 4.5, 10.25])  # B's R: 2, 0 + 0.5*2, 4 + 0.5*1, 8 + 0.5*4.5
    worker_a = ppo_ewma.RewardNormalizer(num_envs=1, gamma=0.5)
    scaled_a = worker_a(rewards_a, dones_a, gather=lambda mine: torch.cat([mine, returns_b]))
    single = ppo_ewma.RewardNormalizer(num_envs=2, gamma=0.5)
    single(torch.cat([rewards_a, rewards_b], 1), torch.cat([dones_a, dones_b], 1))
    assert worker_a.var == pytest.approx(single.var) and worker_a.var == pytest.approx(8.2412499, rel=1e-6)
    assert worker_a.count == pytest.approx(8.0001)  # both workers' 4 returns, once
    torch.testing.assert_close(worker_a.returns, torch.tensor([1.5]))  # its own env's R is not shared
    torch.testing.assert_close(scaled_a, rewards_a / math.sqrt(8.2412499 + 1e-8), atol=1e-5, rtol=0)


# ----------------------------------------------------------------------------------- MultiDiscrete actions
NVEC = [2, 3]  # two sub-actions, of 2 and 3 values
# sub-action 1: logits (0, ln 3), probabilities (1/4, 3/4); sub-action 2: logits (0, 0, 0), uniform 1/3
LOGITS_P = torch.tensor([[0.0, math.log(3.0), 0.0, 0.0, 0.0]])
# sub-action 1: (1/2, 1/2); sub-action 2: logits (0, 0, ln 2), probabilities (1/4, 1/4, 1/2)
LOGITS_Q = torch.tensor([[0.0, 0.0, 0.0, 0.0, math.log(2.0)]])


def test_multidiscrete_log_prob_and_entropy_add_over_sub_actions_by_hand():
    logp, entropy = ppo_ewma.policy_log_prob_and_entropy(LOGITS_P, torch.tensor([[1, 2]]), nvec=NVEC)
    # log(3/4) + log(1/3) = log(1/4) = -1.386294
    assert logp.item() == pytest.approx(-1.386294, abs=1e-6)
    # H1 = -(1/4 log 1/4 + 3/4 log 3/4) = 0.346574 + 0.215762 = 0.562335; H2 = log 3 = 1.098612; sum 1.660947
    assert entropy.item() == pytest.approx(1.660947, abs=1e-6)


def test_multidiscrete_kl_adds_over_sub_actions_by_hand():
    # KL1 = 1/4 log(1/4 / 1/2) + 3/4 log(3/4 / 1/2) = -0.173287 + 0.304099 = 0.130812
    # KL2 = 1/3 (log(4/3) + log(4/3) + log(2/3)) = 1/3 (0.287682 + 0.287682 - 0.405465) = 0.056633; sum 0.187445
    assert ppo_ewma.policy_kl(LOGITS_P, LOGITS_Q, nvec=NVEC).item() == pytest.approx(0.187445, abs=1e-6)
    assert ppo_ewma.policy_kl(LOGITS_P, LOGITS_P, nvec=NVEC).item() == pytest.approx(0.0, abs=1e-7)


def test_multidiscrete_sampling_and_mode_take_one_value_per_sub_action():
    torch.manual_seed(0)
    actions = ppo_ewma.sample_actions(LOGITS_P.expand(20000, 5), nvec=NVEC)
    assert actions.shape == (20000, 2) and actions.dtype == torch.long
    # each sub-action follows its own categorical: P(a1 = 1) = 3/4, P(a2 = v) = 1/3 (std of a mean of 20000
    # Bernoulli draws: at most 0.0035, so 0.015 is over 4 std)
    assert (actions[:, 0] == 1).float().mean().item() == pytest.approx(0.75, abs=0.015)
    assert (actions[:, 1] == 2).float().mean().item() == pytest.approx(1 / 3, abs=0.015)
    # the argmax of each sub-action's logits; a tie goes to the first value
    assert ppo_ewma.sample_actions(LOGITS_Q, nvec=NVEC, mode=True).tolist() == [[0, 2]]


# ----------------------------------------------------------------------------------- continuous actions
def test_gaussian_log_prob_and_entropy_by_hand():
    actions, mean, log_std = torch.tensor([[0.5, -1.0]]), torch.zeros(1, 2), torch.tensor([[0.0, math.log(2.0)]])
    # dim 1 (sigma 1): -0.5 * 0.5^2 - 0 - 0.5 log(2 pi) = -0.125 - 0.918939 = -1.043939
    # dim 2 (sigma 2): -0.5 * (1/2)^2 - log 2 - 0.918939 = -0.125 - 0.693147 - 0.918939 = -1.737086
    assert ppo_ewma.gaussian_log_prob(actions, mean, log_std).item() == pytest.approx(-2.781025, abs=1e-6)
    # 0.5 log(2 pi e) = 1.418939 per dim, plus log sigma: 1.418939 + (0.693147 + 1.418939) = 3.531024
    assert ppo_ewma.gaussian_entropy(log_std).item() == pytest.approx(3.531024, abs=1e-6)
    logp, entropy = ppo_ewma.policy_log_prob_and_entropy(torch.cat([mean, log_std], -1), actions, continuous=True)
    assert (logp.item(), entropy.item()) == pytest.approx((-2.781025, 3.531024), abs=1e-6)


def test_gaussian_kl_by_hand_and_against_torch():
    mean_p, log_std_p = torch.tensor([[0.0, 0.3]]), torch.tensor([[0.0, -0.2]])
    mean_q, log_std_q = torch.tensor([[1.0, 0.3]]), torch.tensor([[math.log(2.0), -0.2]])
    # dim 1: log(2/1) + (1 + (0 - 1)^2) / (2 * 4) - 1/2 = 0.693147 + 0.25 - 0.5 = 0.443147; dim 2: p == q, 0
    assert ppo_ewma.gaussian_kl(mean_p, log_std_p, mean_q, log_std_q).item() == pytest.approx(0.443147, abs=1e-6)
    torch.manual_seed(0)
    mean_p, mean_q, log_std_p, log_std_q = torch.randn(4, 5, 3).unbind()
    expected = torch.distributions.kl_divergence(torch.distributions.Normal(mean_p, log_std_p.exp()),
                                                 torch.distributions.Normal(mean_q, log_std_q.exp())).sum(-1)
    torch.testing.assert_close(ppo_ewma.gaussian_kl(mean_p, log_std_p, mean_q, log_std_q), expected)
    assert torch.all(ppo_ewma.gaussian_kl(mean_p, log_std_p, mean_p, log_std_p).abs() < 1e-6)


def test_clipped_value_loss_by_hand_with_its_gradient():
    values = torch.tensor([1.0, 3.0, 0.5], requires_grad=True)
    old_values, returns = torch.tensor([0.8, 2.0, 0.5]), torch.tensor([2.0, 3.0, 1.0])
    # V - V_old = [0.2, 1.0, 0.0] -> clipped to [0.2, 0.2, 0.0]: V_clip = [1.0, 2.2, 0.5]
    # (V - R)^2 = [1, 0, 0.25]; (V_clip - R)^2 = [1, 0.64, 0.25]; max = [1, 0.64, 0.25]; mean 1.89 / 3 = 0.63
    loss = ppo_ewma.clipped_value_loss(values, old_values, returns, 0.2)
    assert loss.item() == pytest.approx(0.63)
    assert ppo_ewma.value_loss(values, returns).item() == pytest.approx(1.25 / 3)  # unclipped: [1, 0, 0.25]
    loss.backward()
    # the clipped branch wins for sample 2 and is constant in V there: no gradient; 2 (V - R) / 3 elsewhere
    torch.testing.assert_close(values.grad, torch.tensor([-2 / 3, 0.0, -1 / 3]))


def test_kl_adaptive_step_size_follows_skrl_rule_over_a_sequence():
    # target 0.008, band [0.004, 0.016]: above divides by 1.5, below multiplies by 1.5, inside keeps
    lr, seen = 1e-3, []
    for kl in (0.02, 0.001, 0.01, 0.0001):
        lr = ppo_ewma.kl_adaptive_lr(lr, kl, 0.008)
        seen.append(lr)
    assert seen == pytest.approx([1e-3 / 1.5, 1e-3, 1e-3, 1.5e-3])
    assert ppo_ewma.kl_adaptive_lr(0.009, 0.0, 0.008) == 0.01  # 0.0135 capped at max_lr 1e-2
    assert ppo_ewma.kl_adaptive_lr(1e-6, 1.0, 0.008) == 1e-6  # 6.7e-7 held at min_lr 1e-6


def test_linear_schedule_goes_from_the_full_step_size_to_one_jth():
    # J = 4 iterations of 3e-4: alpha = 1, 3/4, 1/2, 1/4
    expected = [3e-4, 2.25e-4, 1.5e-4, 7.5e-5]
    assert [ppo_ewma.linear_schedule(3e-4, i, 4) for i in (1, 2, 3, 4)] == pytest.approx(expected)


def test_target_kl_cuts_the_epochs_and_logs_how_many_ran(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = dict(TINY_CARTPOLE, total_timesteps=128, update_epochs=4, learning_rate=1e-2)
    # the first minibatch is the behaviour policy itself (KL 0); after one step of size 1e-2 the next one's KL
    # to pi_behav exceeds 1e-5, so the iteration stops after 1 of its 4 x 2 minibatches: 0.5 epochs
    stopped = scalars_with_steps(ppo_ewma.train(Args(exp_name="stopped", target_kl=1e-5, **config))["run_dir"])
    assert [value for _, value in stopped["charts/update_epochs_run"]] == [0.5, 0.5]
    full = scalars_with_steps(ppo_ewma.train(Args(exp_name="full", target_kl=1e3, **config))["run_dir"])
    assert [value for _, value in full["charts/update_epochs_run"]] == [4.0, 4.0]


def test_the_kl_to_pi_behav_is_logged_as_the_iteration_mean_and_the_last_epoch_mean(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    kls = []  # each epoch's mean of its minibatches' k3 estimates of KL[pi_behav || pi], before their steps
    monkeypatch.setattr(harness, "mean_over_workers", lambda x: kls.append(x.item()) or x if x.dim() == 0 else x)
    config = dict(TINY_CARTPOLE, total_timesteps=2 * 64, update_epochs=3, learning_rate=1e-2)
    logged = scalars_with_steps(ppo_ewma.train(Args(exp_name="kl", **config))["run_dir"])
    first, second = kls[:3], kls[3:]  # 2 iterations of 3 epochs (of 2 minibatches each)
    assert [v for _, v in logged["losses/approx_kl_behav"]] == pytest.approx([np.mean(first), np.mean(second)])
    assert [v for _, v in logged["losses/approx_kl_behav_last"]] == pytest.approx([first[2], second[2]])
    assert first[2] > first[0]  # the policy moves away from pi_behav epoch by epoch: the mean understates the end


def test_learning_rate_schedules_are_logged(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = dict(TINY_CARTPOLE, total_timesteps=4 * 64, learning_rate=4e-4)
    linear = scalars_with_steps(ppo_ewma.train(Args(exp_name="linear", lr_schedule="linear", **config))["run_dir"])
    assert [v for _, v in linear["charts/learning_rate"]] == pytest.approx([4e-4, 3e-4, 2e-4, 1e-4])
    # kl-adaptive: 3 epochs per iteration, each multiplies or divides by 1.5 or keeps, within [1e-6, 1e-2]: a power
    # of 1.5 times 4e-4, or a bound
    adaptive = scalars_with_steps(ppo_ewma.train(Args(exp_name="kl", lr_schedule="kl-adaptive", **config))["run_dir"])
    allowed = [4e-4 * 1.5 ** k for k in range(-12, 13)] + [1e-6, 1e-2]
    values = [value for _, value in adaptive["charts/learning_rate"]]
    assert all(any(value == pytest.approx(a) for a in allowed) for value in values), values
    assert len(set(values)) > 1  # it moved


def test_defaults_that_depend_on_the_action_type():
    continuous = ppo_ewma.apply_batch_divisor(Args(env_id="Pendulum-v1"))
    discrete = ppo_ewma.apply_batch_divisor(Args(env_id="CartPole-v1"))
    assert (continuous.ent_coef, continuous.norm_obs) == (0.0, True)
    assert (discrete.ent_coef, discrete.norm_obs) == (0.01, False)  # the paper's; CartPole raw
    chosen = ppo_ewma.apply_batch_divisor(Args(env_id="Pendulum-v1", ent_coef=0.005, norm_obs=False, ewma_com=2.0))
    assert (chosen.ent_coef, chosen.norm_obs, chosen.ewma_com) == (0.005, False, 2.0)
    # the EWMA's centre of mass: the paper's 8 for discrete actions; for continuous ones three iterations' gradient
    # steps, 3 x E x M = 3 x 3 epochs x 8 minibatches = 72 (MuJoCo's 10 x 32: 960), then x c = 2 under
    # --batch-divisor 2 (144); starpilot keeps the paper's 8 x 2 = 16
    assert (continuous.ewma_com, discrete.ewma_com) == (72.0, 8.0)
    mujoco_sized = Args(env_id="Pendulum-v1", update_epochs=10, num_minibatches=32)
    assert ppo_ewma.apply_batch_divisor(mujoco_sized).ewma_com == 960.0
    assert ppo_ewma.apply_batch_divisor(Args(env_id="Pendulum-v1", batch_divisor=2)).ewma_com == 144.0
    assert apply_batch_divisor(Args(env_id="Pendulum-v1", batch_divisor=2, adjust_ewma=False)).ewma_com == 72.0
    assert ppo_ewma.apply_batch_divisor(Args(batch_divisor=2)).ewma_com == 16.0


@pytest.mark.parametrize("env_id, ewma_com, warned", [
    ("Pendulum-v1", 5.9, True),  # E x M = 3 x 4 = 12 gradient steps; the warning below half of them
    ("Pendulum-v1", 6.0, False), ("Pendulum-v1", None, False),  # None: the default, 3 x 12 = 36
    ("CartPole-v1", 1.0, False),  # measured only for continuous actions; Procgen's 8 of 24 is the paper's
])
def test_a_small_ewma_centre_of_mass_is_warned_of_for_continuous_actions(tmp_path, monkeypatch, capsys, env_id,
                                                                          ewma_com, warned):
    monkeypatch.chdir(tmp_path)
    ppo_ewma.train(Args(env_id=env_id, num_envs=1, num_steps=64, num_minibatches=4, total_timesteps=64,
                        ewma_com=ewma_com, cuda=False))
    assert ("warning: --ewma-com" in capsys.readouterr().out) == warned


@pytest.mark.parametrize("config", [
    {},  # PPO-EWMA, clipped decoupled objective
    {"ewma": False, "objective": "kl", "clip_vloss": True, "target_kl": 0.05, "lr_schedule": "linear"},
    {"num_envs": 2, "batch_divisor": 2, "adjust_adam_betas": True},
])
def test_smoke_pendulum(tmp_path, monkeypatch, config):
    monkeypatch.chdir(tmp_path)
    config = dict({"env_id": "Pendulum-v1", "num_envs": 1, "num_steps": 128, "num_minibatches": 4, "cuda": False},
                  **config)  # 2 iterations of 128 steps: one 200-step episode ends
    result = ppo_ewma.train(Args(exp_name="pendulum", total_timesteps=256, **config))
    scalars = scalars_with_steps(result["run_dir"])
    assert result["global_step"] == 256 and np.isfinite(result["mean_return"])  # 200-step episodes ended
    for tag in ("losses/policy_loss", "losses/value_loss", "losses/entropy", "losses/approx_kl_behav"):
        assert len(scalars[tag]) == 2 and all(np.isfinite(v) for _, v in scalars[tag]), tag
    # the state-independent log-std starts at 0: entropy 1.418939 per action dim (Pendulum has one)
    assert scalars["losses/entropy"][0][1] == pytest.approx(1.418939, abs=0.02)
    evaluation = ppo_ewma.train(Args(eval_checkpoint=f"{result['run_dir']}/model.safetensors", eval_episodes=2, cuda=False))
    assert len(evaluation["returns"]) == 2 and all(-2000 < r < 0 for r in evaluation["returns"])


def test_box_actions_reach_the_env_clipped_while_log_probs_use_the_sampled_action():
    pi = torch.tensor([[5.0, 0.0]])  # mean 5, log-std 0, far outside Pendulum's bounds [-2, 2]
    torch.manual_seed(0)
    action = ppo_ewma.sample_actions(pi, continuous=True)
    assert action.item() > 2.0  # sampled beyond the bound
    envs = ppo_ewma.make_env(ppo_ewma.apply_batch_divisor(Args(env_id="Pendulum-v1", num_envs=1)))
    assert ppo_ewma.env_actions(envs.single_action_space, "cpu")(action).tolist() == [[2.0]]  # the training loop's
    agent = ppo_ewma.Agent(envs)
    with torch.no_grad():
        agent.actor_mean[-1].bias.fill_(5.0)
    load = lambda module, name: module.load_state_dict(agent.state_dict())  # noqa: E731
    sample = ppo_ewma.acting_policy(Args(), envs, load, torch.device("cpu"))  # evaluation clips as training does
    actions = evaluation.actor(sample, envs, torch.device("cpu"))(envs.reset(seed=0)[0], [0.0], [True])
    assert actions.shape == (1, 1) and actions.max() <= 2.0
    envs.close()


def test_decoupled_clip_loss_stays_finite_where_r_alone_would_overflow():
    # seen on Pendulum: an action both pi (log-prob -760) and pi_prox (-850) find far less likely than pi_behav did
    # (-3.79). r = exp(90) overflows float32 and pi_prox/pi_behav = exp(-846) underflows to 0: inf * 0 = nan. In log
    # space (the official code's way) pi/pi_behav = exp(-756) and (pi_prox/pi_behav) clip(r) are both ~0.
    new_logp = torch.tensor([-760.0, math.log(0.5)], requires_grad=True)
    prox_logp, behav_logp = torch.tensor([-850.0, math.log(0.5)]), torch.tensor([-3.79, math.log(0.5)])
    loss = decoupled_clip_loss(new_logp, prox_logp, behav_logp, torch.tensor([-2.4, 1.0]), 0.2)
    loss.backward()
    # sample 2 is on-policy: -(1 * 1.0) / 2 = -0.5; sample 1 adds ~0
    assert loss.item() == pytest.approx(-0.5) and torch.all(torch.isfinite(new_logp.grad))


# ------------------------------------------------------------------------------------- gradient noise scale
def test_noise_scale_estimates_by_hand():
    # |G_small|^2 = 10 at B_small = 2, |G_big|^2 = 4 at B_big = 8:
    # |G|^2 = (8 * 4 - 2 * 10) / (8 - 2) = 12 / 6 = 2; tr(Sigma) = (10 - 4) / (1/2 - 1/8) = 6 / 0.375 = 16; B = 8
    assert ppo_ewma.noise_scale_estimates(10.0, 2, 4.0, 8) == pytest.approx((2.0, 16.0))


def test_noise_scale_recovers_b_simple_of_a_linear_regression():
    # loss 0.5 (x.w - y)^2 with x ~ N(0, I_d), y = x.w* + eps, eps ~ N(0, sigma^2), at w = w* + delta. The per-sample
    # gradient is g = (x.delta - eps) x, so G = E[g] = delta and Sigma = (|delta|^2 + sigma^2) I + delta delta^T:
    # tr(Sigma) = d (|delta|^2 + sigma^2) + |delta|^2. With d = 10, delta = e_1, sigma^2 = 4: 10 * 5 + 1 = 51, and
    # |G|^2 = 1, so B_simple = 51.
    torch.manual_seed(0)
    d, minibatch, num_minibatches = 10, 8, 8
    model = torch.nn.Module()
    model.w = w = torch.nn.Parameter(torch.zeros(d))
    delta, noise_scale = torch.zeros(d), ppo_ewma.GradientNoiseScale(decay=1.0)  # decay 1: a plain average
    delta[0] = 1.0
    for _ in range(1000):  # iterations of one epoch each
        for _ in range(num_minibatches):
            x = torch.randn(minibatch, d)
            y = x @ (-delta) + 2.0 * torch.randn(minibatch)  # w* = -delta, so w = 0 = w* + delta
            w.grad = None
            (0.5 * (x @ w - y) ** 2).mean().backward()
            noise_scale.add(model)
        noise_scale.end_epoch(minibatch)
        b_simple = noise_scale.end_iteration(minibatch)["charts/grad_noise_scale"]
    assert b_simple == pytest.approx(51.0, rel=0.1)  # 1000 epochs: about 5% standard error here


def test_noise_scale_and_minibatch_size_are_logged(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = ppo_ewma.train(Args(exp_name="noise", total_timesteps=128, noise_scale=True, **TINY_CARTPOLE))
    scalars = scalars_with_steps(result["run_dir"])
    assert [v for _, v in scalars["charts/minibatch_size"]] == [32, 32]  # 2 envs x 32 steps in 2 minibatches
    assert all(np.isfinite(v) for _, v in scalars["charts/grad_noise_scale"])
    quiet = scalars_with_steps(ppo_ewma.train(Args(exp_name="quiet", total_timesteps=128, noise_scale=False,
                                                   **TINY_CARTPOLE))["run_dir"])
    assert "charts/grad_noise_scale" not in quiet


def test_noise_scale_changes_nothing_that_is_learned(tmp_path, monkeypatch):
    # it only reads the gradients after backward(): with it off, every other logged value is the same
    monkeypatch.chdir(tmp_path)
    on = scalars_with_steps(ppo_ewma.train(Args(exp_name="on", total_timesteps=256, noise_scale=True,
                                                **TINY_CARTPOLE))["run_dir"])
    off = scalars_with_steps(ppo_ewma.train(Args(exp_name="off", total_timesteps=256, noise_scale=False,
                                                 **TINY_CARTPOLE))["run_dir"])
    learned = [tag for tag in off if tag.startswith(("losses/", "charts/episodic_return"))]
    assert "losses/policy_loss" in learned and "charts/episodic_return" in learned
    assert all(on[tag] == off[tag] for tag in learned)


# --------------------------------------------------------------------------------------------------- --norm-value
def test_norm_value_standardizes_by_every_return_so_far():
    # --norm-value's statistics are EWMA moments of decay 1: plain running moments. Returns [1, 3], then [5, 7]:
    #   first: mean 2, var 1; then mean 16/4 = 4, E[x^2] = 84/4 = 21, var 21 - 16 = 5
    moments = EwmaMoments(1.0)
    moments.update(torch.tensor([1.0, 3.0]))
    assert (moments.mean, moments.std) == (pytest.approx(2.0), pytest.approx(1.0))
    moments.update(torch.tensor([5.0, 7.0]))
    assert (moments.mean, moments.std) == (pytest.approx(4.0), pytest.approx(math.sqrt(5.0)))
    # a target of 6: (6 - 4) / (sqrt 5 + 1e-8) = 0.8944272
    assert moments.normalize(torch.tensor(6.0)).item() == pytest.approx(0.8944272, rel=1e-6)
    # raw_value, the other way: a head's output of 0.5 is the return 4 + 0.5 sqrt 5 = 5.118034; beyond 5 it is
    # clipped to 5 first: 4 + 5 sqrt 5 = 15.18034; without statistics the output is as it is
    outputs = torch.tensor([0.5, 7.0])
    assert ppo_ewma.raw_value(outputs, moments).tolist() == pytest.approx([5.118034, 15.18034], rel=1e-6)
    assert ppo_ewma.raw_value(outputs, None) is outputs and ppo_ewma.raw_value(outputs, EwmaMoments(1.0)) is outputs


def test_norm_value_trains_on_standardized_returns_clipped_at_5(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    targets, real_value_loss = [], ppo_ewma.value_loss
    monkeypatch.setattr(ppo_ewma, "value_loss", lambda values, returns: targets.append(returns) or real_value_loss(
        values, returns))
    run = lambda name: ppo_ewma.train(Args(**dict(TINY_CARTPOLE, total_timesteps=3 * 64, ewma=False, norm_value=True,  # noqa: E731
                                                  exp_name=name)))
    result = run("standardized")
    assert abs(torch.cat(targets).mean().item()) < 1.0  # the returns, standardized (raw CartPole returns are ~10)
    real_update, targets[:] = ppo_ewma.EwmaMoments.update, []

    def narrow(self, x):  # the value statistics' std made 0.01: every standardized return beyond 5, clipped to 5
        real_update(self, x)
        if self.decay == 1.0:
            self.sum_sq = self.weight * (self.mean**2 + 1e-4)
    monkeypatch.setattr(ppo_ewma.EwmaMoments, "update", narrow)
    run("narrow")
    assert torch.cat(targets).abs().max().item() == 5.0  # skrl's clip_threshold
    value = read_back(f"{result['run_dir']}/checkpoint.safetensors")["normalizers"]["value"]
    assert value["sum"] / value["weight"] > 1.0 and value["decay"] == 1.0  # the returns' moments, kept


def per_env_normalized_envs(env_id, num_envs):
    """ppo_ewma.py's env stack until bded84a: Gymnasium's NormalizeObservation and a +-10 clip inside each env."""
    clip = lambda env: gym.wrappers.TransformObservation(env, lambda obs: np.clip(obs, -10.0, 10.0), None)  # noqa
    envs = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="sync", wrappers=[
        harness.vector_observations, gym.wrappers.NormalizeObservation, clip],
        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP})
    return gym.wrappers.vector.RecordEpisodeStatistics(envs)


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])  # episodes that terminate; that are truncated
def test_observations_normalized_over_the_vector_are_the_per_env_wrappers_bit_for_bit(env_id):
    # 2 envs, 450 random steps: CartPole's episodes end every ~20 steps, Pendulum's are truncated at 200; each ended
    # env updates on its final observation, then on its new episode's first (count 1e-4 + 451 + its episode ends)
    reference = per_env_normalized_envs(env_id, 2)
    envs = ppo_ewma.make_env(Args(env_id=env_id, num_envs=2, norm_obs=True))
    assert [type(layer).__name__ for layer in (envs, envs.env)] == ["RecordEpisodeStatistics",
                                                                     "NormalizeObservationPerEnv"]
    assert envs.single_observation_space == reference.single_observation_space  # Box(-inf, inf, float32)
    obs, reference_obs = envs.reset(seed=5)[0], reference.reset(seed=5)[0]
    assert np.array_equal(obs, reference_obs) and obs.dtype == np.float32
    reference.action_space.seed(0)
    ends = 0
    for _ in range(450):
        action = reference.action_space.sample()
        step, reference_step = envs.step(action), reference.step(action)
        for value, reference_value in zip(step[:4], reference_step[:4]):
            assert np.array_equal(value, reference_value) and value.dtype == reference_value.dtype
        for i in np.flatnonzero(step[2] | step[3]):  # the bootstrap's final observation, normalized alike
            assert np.array_equal(step[4]["final_obs"][i], reference_step[4]["final_obs"][i])
            ends += 1
    assert ends >= 4
    statistics, reference_statistics = harness.normalizer_states(envs), harness.normalizer_states(reference)
    assert sorted(statistics) == sorted(reference_statistics) == ["obs_0", "obs_1"]
    for name, state in statistics.items():
        assert state["count"] == reference_statistics[name]["count"] > 451
        assert all(torch.equal(state[key], reference_statistics[name][key]) for key in ("mean", "var"))


def test_a_checkpoint_of_an_earlier_version_is_refused_naming_the_commit_that_reads_it(tmp_path, monkeypatch):
    # tests/old_checkpoints/ppo_ewma_pendulum.pt: iteration 3 of 4 of a Pendulum run written at bded84a, torch.save's
    # zip of a pickle; since checkpoints are safetensors files, a .pt file is said to be an earlier version's
    monkeypatch.chdir(tmp_path)
    os.makedirs("runs/old")
    shutil.copy(os.path.join(os.path.dirname(__file__), "old_checkpoints", "ppo_ewma_pendulum.pt"), "runs/old/x.pt")
    for args in (Args(eval_checkpoint="runs/old/x.pt", cuda=False), Args(resume="runs/old/x.pt", cuda=False)):
        with pytest.raises(SystemExit, match=r" runs/old/x\.pt is a \.pt file of an earlier version of this project "
                                             r"\(torch\.save's zip\), which this version does not read: run it with "
                                             r"that version \(git checkout 18fb459\)\.$"):
            ppo_ewma.train(args)
