"""Worked examples for ppo_er.py: each test states its inputs, the hand arithmetic and the result."""
import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.wrappers.utils import RunningMeanStd
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from ppo_er import (Args, ReplayMemory, compute_gae, gaussian_log_prob, linear_schedule, make_env, ppo_er_loss,
                    train)

LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)  # 0.918939


def test_gaussian_log_prob_one_dim():
    # a = 1, mu = 0, sigma = 1:  -0.5 * 1^2 - 0 - 0.918939 = -1.418939
    # a = 0.5, mu = 1.5, sigma = 2:  -0.5 * (-1/2)^2 - log 2 - 0.918939 = -0.125 - 0.693147 - 0.918939 = -1.737086
    actions = torch.tensor([[1.0], [0.5]])
    mean = torch.tensor([[0.0], [1.5]])
    log_std = torch.tensor([[0.0], [math.log(2.0)]])
    assert gaussian_log_prob(actions, mean, log_std).tolist() == pytest.approx([-1.418939, -1.737086], abs=1e-6)


def test_gaussian_log_prob_sums_over_action_dims():
    # the two 1-D cases above as the two dims of one action: -1.418939 + -1.737086 = -3.156025
    actions, mean = torch.tensor([[1.0, 0.5]]), torch.tensor([[0.0, 1.5]])
    log_std = torch.tensor([0.0, math.log(2.0)])  # state-independent log sigma broadcasts over the batch
    assert gaussian_log_prob(actions, mean, log_std).item() == pytest.approx(-3.156025, abs=1e-6)
    reference = torch.distributions.Normal(mean, log_std.exp()).log_prob(actions).sum(-1)
    assert gaussian_log_prob(actions, mean, log_std).item() == pytest.approx(reference.item(), abs=1e-6)


def make_batch(tag, num_steps=2, num_envs=1):
    """A batch of [T, K] samples whose advantages all equal `tag`, so we can tell batches apart."""
    full = torch.full((num_steps, num_envs), float(tag))
    return {"obs": full.unsqueeze(-1), "actions": full.unsqueeze(-1), "advantages": full, "returns": full,
            "behav_mean": full.unsqueeze(-1), "behav_log_std": torch.zeros(num_steps, num_envs, 1)}


def test_replay_memory_keeps_newest_batches_in_order():
    replay = ReplayMemory(num_batches=2)
    for tag in (1, 2, 3):
        replay.push(make_batch(tag))
    # batch 1 fell out; batch 2 (one policy old, age 1) comes before batch 3 (fresh, age 0)
    data = replay.data()
    assert len(replay) == 2
    assert data["advantages"].tolist() == [2.0, 2.0, 3.0, 3.0]
    assert data["age"].tolist() == [1, 1, 0, 0]
    assert data["obs"].shape == (4, 1)


def test_replay_memory_with_one_batch_holds_only_the_newest():
    # L = 1 is PPO: after any number of pushes only the latest batch is trained on
    replay = ReplayMemory(num_batches=1)
    for tag in (1, 2, 3):
        replay.push(make_batch(tag))
    assert replay.data()["advantages"].tolist() == [3.0, 3.0]
    assert replay.data()["age"].tolist() == [0, 0]


def test_epoch_visits_every_stored_sample_once_with_m_over_k_per_actor():
    # L = 2 batches of T = 4 steps x K = 2 actors: 16 samples; M = 4 gives NL/M = 4 minibatches,
    # each with M/K = 2 samples of each actor (flat index = row * K + k, so actor = index % K)
    torch.manual_seed(0)
    replay = ReplayMemory(num_batches=2)
    replay.push(make_batch(1, num_steps=4, num_envs=2))
    replay.push(make_batch(2, num_steps=4, num_envs=2))
    minibatches = replay.minibatch_indices(minibatch_size=4)
    assert len(minibatches) == 4
    assert sorted(torch.cat(minibatches).tolist()) == list(range(16))
    for mb_inds in minibatches:
        assert sorted((mb_inds % 2).tolist()) == [0, 0, 1, 1]


def test_ppo_er_loss_by_hand_two_behaviour_policies():
    # New policy N(0.2, 1) for both samples; eps = 0.2.
    # Sample 1 (fresh) from N(0, 1), a = 0.5:  log R = -0.5*0.3^2 + 0.5*0.5^2 = 0.08, R = 1.083287;
    #   A = +1: min(1.083287, clip -> 1.083287) = 1.083287 (inside the clip range)
    # Sample 2 (replayed) from N(1, 1), a = 0:  log R = -0.5*0.2^2 + 0.5*1^2 = 0.48, R = 1.616074;
    #   A = +2: min(3.232148, 1.2 * 2) = 2.4 (clipped)
    # loss = -(1.083287 + 2.4) / 2 = -1.741644
    actions = torch.tensor([[0.5], [0.0]])
    behav_logp = gaussian_log_prob(actions, torch.tensor([[0.0], [1.0]]), torch.zeros(1))
    new_mean = torch.tensor([[0.2], [0.2]], requires_grad=True)
    new_logp = gaussian_log_prob(actions, new_mean, torch.zeros(1))
    advantages = torch.tensor([1.0, 2.0])
    loss = ppo_er_loss(new_logp, behav_logp, advantages, clip_coef=0.2)
    assert loss.item() == pytest.approx(-1.741644, abs=1e-5)

    # gradient: the clipped sample gives none; d loss / d mu_1 = -R_1 A_1 / 2 * (a_1 - mu_1) = -0.541644 * 0.3
    loss.backward()
    assert new_mean.grad[:, 0].tolist() == pytest.approx([-0.541644 * 0.3, 0.0], abs=1e-5)


def test_ppo_er_loss_with_one_batch_is_ppo_clipped_loss():
    # With every sample from the newest policy, eq. (12) is PPO's L^CLIP (eq. 8), written here the
    # usual way: mean of max(-A r, -A clip(r, 1-eps, 1+eps)), r = pi / pi_old
    torch.manual_seed(0)
    new_logp, old_logp, advantages = torch.randn(32) * 0.3, torch.randn(32) * 0.3, torch.randn(32)
    ratio = torch.exp(new_logp - old_logp)
    ppo_loss = torch.max(-advantages * ratio, -advantages * torch.clamp(ratio, 0.8, 1.2)).mean()
    assert ppo_er_loss(new_logp, old_logp, advantages, clip_coef=0.2).item() == pytest.approx(ppo_loss.item(), abs=1e-6)


def test_replayed_sample_ratio_uses_its_own_behaviour_policy():
    # Batch 1 was collected by N(1, 1), batch 2 (newest) by N(0, 1); same obs and action a = 0.
    # Current policy N(0.2, 1), A = 2, eps = 0.2.
    # Own behaviour (mu = 1):  R = exp(-0.02 + 0.5) = 1.616074 -> clipped: 1.2 * 2 = 2.4
    # Newest (mu = 0), wrong:  R = exp(-0.02)       = 0.980199 -> 0.980199 * 2 = 1.960397
    replay = ReplayMemory(num_batches=2)
    for behav_mean in (1.0, 0.0):
        replay.push({"obs": torch.zeros(1, 1, 1), "actions": torch.zeros(1, 1, 1),
                     "advantages": torch.full((1, 1), 2.0), "returns": torch.zeros(1, 1),
                     "behav_mean": torch.full((1, 1, 1), behav_mean), "behav_log_std": torch.zeros(1, 1, 1)})
    data = replay.data()
    b_behav_logps = gaussian_log_prob(data["actions"], data["behav_mean"], data["behav_log_std"])
    new_logp = gaussian_log_prob(data["actions"], torch.full((2, 1), 0.2), torch.zeros(1))
    per_sample = [ppo_er_loss(new_logp[i:i + 1], b_behav_logps[i:i + 1], data["advantages"][i:i + 1], 0.2).item()
                  for i in range(2)]
    assert per_sample[0] == pytest.approx(-2.4, abs=1e-5)  # replayed sample (age 1): its own N(1, 1)
    assert per_sample[0] != pytest.approx(-1.960397, abs=1e-3)
    assert per_sample[1] == pytest.approx(-1.960397, abs=1e-5)  # fresh sample: N(0, 1)


def test_linear_schedule_anneals_to_zero():
    # alpha = 1 - (i - 1) / J with J = 10 iterations: 1 at i = 1, 0.5 at i = 6, 1/J at i = 10, 0 after the last
    assert linear_schedule(3e-4, 1, 10) == pytest.approx(3e-4)
    assert linear_schedule(0.2, 6, 10) == pytest.approx(0.1)
    assert linear_schedule(3e-4, 10, 10) == pytest.approx(3e-5)
    assert linear_schedule(3e-4, 11, 10) == 0.0
    assert linear_schedule(0.2, 11, 10) == 0.0


def test_truncation_bootstrap_in_gae_input():
    # One actor, gamma = lambda = 0.5. Step 1 is truncated by a time limit with V(final obs) = 4, so
    # the loop adds gamma * 4 to its reward: r_1 = 1 + 0.5 * 4 = 3; obs 2 starts a new episode (dones[2] = 1).
    # t=2: delta = 1 + 0.5*2 - 3 = -1                     A_2 = -1
    # t=1: delta = 3 - 2 = 1 (no bootstrap into obs 2)     A_1 = 1
    # t=0: delta = 1 + 0.5*2 - 1 = 1                       A_0 = 1 + 0.25 * 1 = 1.25
    # targets V_hat = A + V = [2.25, 3, 2] (eq. 15); treating truncation as termination would give A_1 = -1
    rewards = torch.tensor([[1.0], [1.0 + 0.5 * 4.0], [1.0]])
    values = torch.tensor([[1.0], [2.0], [3.0]])
    dones = torch.tensor([[0.0], [0.0], [1.0]])
    advantages, returns = compute_gae(rewards, values, dones, torch.tensor([2.0]), torch.tensor([0.0]), 0.5, 0.5)
    assert advantages[:, 0].tolist() == pytest.approx([1.25, 1.0, -1.0])
    assert returns[:, 0].tolist() == pytest.approx([2.25, 3.0, 2.0])


def test_final_obs_for_the_bootstrap_is_normalized_like_other_obs():
    # V(final obs) must see the same normalization as every other input of V. Replay a raw Pendulum
    # episode beside make_env's and normalize its last obs by hand: (o - mean) / sqrt(var + 1e-8),
    # with running statistics over all obs so far (the reset obs and 200 step obs).
    envs, raw = make_env(Args(env_id="Pendulum-v1", num_envs=1)), gym.make("Pendulum-v1")
    envs.reset(seed=3)
    raw_obs, _ = raw.reset(seed=3)
    rms = RunningMeanStd(shape=raw_obs.shape)
    rms.update(raw_obs[None])
    for _ in range(200):
        _, _, _, truncated, info = envs.step(np.full((1, 1), 0.5, np.float32))
        raw_obs = raw.step(np.array([0.5], np.float32))[0]
        rms.update(raw_obs[None])
    assert truncated[0] and info["_final_obs"][0]
    expected = (raw_obs - rms.mean) / np.sqrt(rms.var + 1e-8)
    assert info["final_obs"][0] == pytest.approx(expected, abs=1e-4)
    envs.close()


@pytest.mark.parametrize("changes, flag", [
    ({"env_id": "starpilot"}, "--env-id"),
    ({"env_id": "CartPole-v1"}, "--env-id"),
    ({"env_id": "NoSuchEnv-v0"}, "--env-id"),
    ({"num_envs": 3}, "--num-envs"),
    ({"minibatch_size": 100}, "--minibatch-size"),
    ({"num_envs": 8, "minibatch_size": 4, "batch_size": 64}, "--minibatch-size"),
    ({"replay_batches": 0}, "--replay-batches"),
])
def test_bad_input_is_refused(changes, flag, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = Args(**{"env_id": "Pendulum-v1", "total_timesteps": 64, "batch_size": 64, **changes})
    with pytest.raises(SystemExit, match=flag):
        train(args)


def read_scalars(run_dir):
    events = EventAccumulator(str(run_dir))
    events.Reload()
    return {tag: [e.value for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


@pytest.mark.parametrize("env_id, num_envs", [("Pendulum-v1", 1), ("HalfCheetah-v5", 2)])
def test_train_smoke(env_id, num_envs, tmp_path, monkeypatch):
    # two iterations of N = 128: the first trains on one batch, the second on two (one replayed)
    monkeypatch.chdir(tmp_path)
    args = Args(exp_name="smoke", env_id=env_id, num_envs=num_envs, total_timesteps=256, batch_size=128,
                minibatch_size=32, update_epochs=2, cuda=False)
    result = train(args)
    assert result["global_step"] == 256
    scalars = read_scalars(tmp_path / result["run_dir"])
    assert scalars["charts/replay_batches"] == [1.0, 2.0]
    assert scalars["charts/learning_rate"] == pytest.approx([3e-4, 1.5e-4])  # alpha = 1, then 1/2
    assert scalars["charts/clip_coef"] == pytest.approx([0.2, 0.1])
    assert len(scalars["losses/clipfrac_replayed"]) == 1  # only the second iteration has replayed samples
    for tag in ("losses/policy_loss", "losses/value_loss", "losses/entropy", "losses/approx_kl",
                "losses/ratio_mean", "losses/ratio_max", "losses/clipfrac_fresh"):
        assert len(scalars[tag]) == 2 and np.all(np.isfinite(scalars[tag])), tag
    if env_id == "Pendulum-v1":  # a 200-step episode ended: its raw return is a Pendulum score
        assert -2000 < result["mean_return"] < 0 and "charts/episodic_return" in scalars
