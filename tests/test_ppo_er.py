"""Worked examples for ppo_er.py: each test states its inputs, the hand arithmetic and the result."""
import dataclasses
import glob
import math
import os
import sys
import time
from typing import Optional

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.wrappers.utils import RunningMeanStd
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import checkpoints
import harness
from saved_files import read_back
import ppo_er
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


def test_replay_memory_data_is_row_major_over_actors_as_minibatch_indices_reads_it():
    # L = 2 batches of T = 2 steps x K = 3 actors, each sample tagged 100 * batch + 10 * t + k. data() flattens
    # each [T, K] batch row by row, oldest batch first, so that flat index = row * K + k with row = batch * T + t
    # (minibatch_indices' layout): [100, 101, 102, 110, 111, 112, 200, ..., 212]
    replay = ReplayMemory(num_batches=2)
    for tag in (1, 2):
        batch = make_batch(0, num_steps=2, num_envs=3)
        tags = 100 * tag + 10 * torch.arange(2.0)[:, None] + torch.arange(3.0)  # [T, K]
        replay.push({**batch, "advantages": tags, "obs": tags.unsqueeze(-1)})
    data = replay.data()
    assert data["advantages"].tolist() == [100, 101, 102, 110, 111, 112, 200, 201, 202, 210, 211, 212]
    assert data["obs"][:, 0].tolist() == data["advantages"].tolist()
    assert data["age"].tolist() == [1] * 6 + [0] * 6
    torch.manual_seed(0)  # each minibatch of 6 takes M/K = 2 samples of each actor k = tag % 10
    for mb_inds in replay.minibatch_indices(minibatch_size=6):
        assert sorted((data["advantages"][mb_inds] % 10).tolist()) == [0, 0, 1, 1, 2, 2]


def test_replay_memory_in_warm_up_holds_what_was_pushed_and_train_can_extend_its_batches():
    # L = 2 with one batch pushed: its samples are the newest (age 0), and an epoch visits those 4 only
    replay = ReplayMemory(num_batches=2)
    replay.push(make_batch(1, num_steps=2, num_envs=2))
    assert len(replay) == 1 and replay.data()["age"].tolist() == [0, 0, 0, 0]
    assert sorted(torch.cat(replay.minibatch_indices(minibatch_size=2)).tolist()) == [0, 1, 2, 3]
    # a resumed train() puts the checkpoint's batches back with replay.batches.extend(...): the deque itself
    replay.batches.extend([make_batch(2, num_steps=2, num_envs=2)])
    assert len(replay) == 2 and replay.data()["advantages"].tolist() == [1.0] * 4 + [2.0] * 4


def test_replay_epochs_shuffle_each_actors_rows_anew_and_apart():
    # T = 8 steps of K = 2 actors, one batch, minibatches of 1 sample per actor. Each actor's rows are shuffled on
    # their own (the sample of actor 0 and that of actor 1 in a minibatch come from different rows somewhere), and
    # each epoch anew
    torch.manual_seed(0)
    replay = ReplayMemory(num_batches=1)
    replay.push(make_batch(1, num_steps=8, num_envs=2))
    first, second = replay.minibatch_indices(minibatch_size=2), replay.minibatch_indices(minibatch_size=2)
    assert [mb.tolist() for mb in first] != [mb.tolist() for mb in second]
    rows = [sorted((mb // 2).tolist()) for mb in first]  # flat index = row * K + k
    assert any(row[0] != row[1] for row in rows)


def test_replay_epoch_visits_every_stored_sample_once_with_m_over_k_per_actor():
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


def test_ppo_er_loss_gradient_reaches_new_logp_only_and_stays_finite_at_low_log_probs():
    # log pi = -120 and log pi_behav = -120.1, as a 17-dim Gaussian far from its mean gives: e^-120 is 0 in float32,
    # so the ratio must come from the log-probs' difference: R = e^0.1 = 1.105171, inside [0.8, 1.2]; A = 1
    new_logp, behav_logp = torch.tensor([-120.0], requires_grad=True), torch.tensor([-120.1], requires_grad=True)
    loss = ppo_er_loss(new_logp, behav_logp, torch.tensor([1.0]), clip_coef=0.2)
    assert loss.item() == pytest.approx(-1.105171, rel=1e-5)
    loss.backward()
    assert new_logp.grad.item() == pytest.approx(-1.105171, rel=1e-5) and behav_logp.grad is None  # a constant


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


@pytest.mark.parametrize("norm_obs", [True, False])
def test_norm_obs_normalizes_then_clips_to_10(norm_obs):
    envs = make_env(Args(env_id="Pendulum-v1", num_envs=1, norm_obs=norm_obs))
    envs.reset(seed=0)
    assert ("obs_0" in harness.env_normalizers(envs)) == norm_obs
    if norm_obs:  # a running mean of 1000 and variance 1: every obs is (o - 1000) / 1, about -1000, then -10
        wrapper, rms = harness.env_normalizers(envs)["obs_0"]
        wrapper.update_running_mean, rms.mean[:], rms.var[:] = False, 1000.0, 1.0
        obs = envs.step(np.zeros((1, 1), np.float32))[0]
        assert np.array_equal(obs, np.full_like(obs, -10.0))
    envs.close()


def test_every_numeric_flag_has_a_range():
    numeric = {f.name for f in dataclasses.fields(Args) if f.type in (int, float, Optional[int], Optional[float])}
    assert numeric == set(harness.COMMON_FLAG_RANGES) | set(ppo_er.FLAG_RANGES)


@pytest.mark.parametrize("changes, flag", [
    ({"env_id": "starpilot"}, "--env-id"),
    ({"env_id": "CartPole-v1"}, "--env-id"),
    ({"env_id": "NoSuchEnv-v0"}, "--env-id"),
    ({"num_envs": 0}, "--num-envs"),
    ({"num_envs": -3}, "--num-envs"),
    ({"num_steps": 0}, "--num-steps"),
    ({"num_minibatches": 0}, "--num-minibatches"),
    ({"num_minibatches": 3}, "--num-minibatches"),  # 64 steps per actor do not split into 3
    ({"num_minibatches": 128}, "--num-minibatches"),  # more minibatches than samples per actor
    ({"replay_batches": 0}, "--replay-batches"),
    ({"update_epochs": 0}, "--update-epochs"),
    ({"total_timesteps": 0}, "--total-timesteps"),
    ({"gae_lambda": 2.0}, "--gae-lambda"),
    ({"gamma": 1.5}, "--gamma"),
    ({"learning_rate": -1.0}, "--learning-rate"),
    ({"adam_eps": 0.0}, "--adam-eps"),
    ({"clip_coef": -0.1}, "--clip-coef"),
    ({"vf_coef": -1.0}, "--vf-coef"),
    ({"ent_coef": -5.0}, "--ent-coef"),
    ({"max_grad_norm": -1.0}, "--max-grad-norm"),
    ({"seed": -1}, "--seed"),
    ({"checkpoint_every": -1}, "--checkpoint-every"),
    ({"num_envs": 10**8}, "--num-envs"),  # the rollout and replay buffers cannot fit in memory
    ({"resume": "missing.pt"}, "--resume"),
    ({"eval_checkpoint": "missing.pt"}, "--eval-checkpoint"),
    ({"eval_checkpoint": "missing.pt", "eval_episodes": 0}, "--eval-episodes"),
])
def test_bad_input_names_the_flag_and_leaves_no_run_dir(changes, flag, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = Args(**{"env_id": "Pendulum-v1", "total_timesteps": 64, "num_steps": 64, **changes})
    with pytest.raises(SystemExit, match=flag):
        train(args)
    assert not (tmp_path / "runs").exists()


def test_memory_check_says_how_much_the_buffers_need(tmp_path, monkeypatch):
    # Pendulum: 3 obs + 3 x 1 action floats = 6; rollout 6 + 3 = 9 floats, each of L = 2 stored batches and
    # their concatenation 6 + 2 = 8: 4 B x (9 + 2 x 2 x 8) = 164 B per sample;
    # 10^8 x 64 x 164 B = 1.0496e12 B = 977.5 GiB
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit, match=r"need 977\.5 GiB .* lower --num-envs, --num-steps or --replay-batches"):
        train(Args(env_id="Pendulum-v1", num_envs=10**8, num_steps=64))


def test_runs_path_that_is_a_file_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").write_text("not a directory")
    with pytest.raises(SystemExit, match=r"runs cannot hold a run directory \(File exists\): move it"):
        train(Args(env_id="Pendulum-v1", total_timesteps=64, num_steps=64))
    assert (tmp_path / "runs").read_text() == "not a directory"


def test_capture_video_without_moviepy_says_so_before_any_work(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "moviepy", None)  # makes `import moviepy` fail
    with pytest.raises(SystemExit, match="--capture-video needs the moviepy package"):
        train(Args(eval_checkpoint="any.pt", capture_video=True))
    assert not (tmp_path / "runs").exists()


def read_scalars(run_dir):
    events = EventAccumulator(str(run_dir))
    events.Reload()
    return {tag: [e.value for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


@pytest.mark.parametrize("env_id, num_envs", [("Pendulum-v1", 1), ("HalfCheetah-v5", 2)])
def test_train_smoke(env_id, num_envs, tmp_path, monkeypatch):
    # two iterations of N = 128: the first trains on one batch, the second on two (one replayed)
    monkeypatch.chdir(tmp_path)
    args = Args(exp_name="smoke", env_id=env_id, num_envs=num_envs, total_timesteps=256, num_steps=128 // num_envs,
                num_minibatches=4, update_epochs=2, cuda=False)
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


# ------------------------------------------------------------- checkpoints, resume, evaluation
TINY_PENDULUM = dict(env_id="Pendulum-v1", num_envs=2, num_steps=64, num_minibatches=4, update_epochs=2, cuda=False)


def scalars_with_steps(run_dir):
    """{tag: [(step, value), ...]} as TensorBoard shows them (events after a resume point purged)."""
    events = EventAccumulator(str(run_dir))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_checkpoint_round_trip_gives_the_same_policy_value_adam_and_replay(tmp_path):
    args = Args(**TINY_PENDULUM)
    envs = make_env(args)
    envs.reset(seed=0)
    for _ in range(30):  # observation and reward statistics away from their initial values
        envs.step(np.full((2, 1), 0.5, np.float32))
    torch.manual_seed(0)
    agent = ppo_er.Agent(envs)
    optimizer = torch.optim.Adam(agent.parameters(), lr=3e-4)
    obs = torch.tensor([[0.1, -0.2, 0.3], [1.0, 0.5, -0.5]])
    (agent.get_pi(obs).chunk(2, -1)[0].sum() + agent.get_value(obs).sum()).backward()  # the mean's and V's
    optimizer.step()
    replay = [{"advantages": torch.arange(6.0).reshape(3, 2)}]
    saved = harness.Saved(models={"agent": agent}, optimizers={"optimizer": optimizer})
    checkpoint = harness.make_checkpoint(args, saved, envs, torch.zeros(2, 3), torch.zeros(2), global_step=128,
                                             iteration=1, num_iterations=4, episode_returns=[-900.0], replay=replay,
                                         script="ppo_er.py")
    path = str(tmp_path / "checkpoint.safetensors")
    harness.save_checkpoint(path, checkpoint)
    assert os.listdir(tmp_path) == ["checkpoint.safetensors"]  # the temporary file was renamed

    assert checkpoints.read(path, "--resume", ppo_er.SCRIPT)["kind"] == "checkpoint"  # the first pass takes it
    loaded = read_back(path)
    torch.manual_seed(1)
    fresh = ppo_er.Agent(envs)
    fresh_optimizer = torch.optim.Adam(fresh.parameters(), lr=3e-4)
    assert not torch.equal(fresh.get_value(obs), agent.get_value(obs))
    fresh.load_state_dict(loaded["models"]["agent"])
    fresh_optimizer.load_state_dict(loaded["optimizers"]["optimizer"])
    restored, saved = (fresh.get_pi(obs), fresh.get_value(obs)), (agent.get_pi(obs), agent.get_value(obs))
    assert all(torch.equal(r, s) for r, s in zip(restored, saved))
    saved_state, restored_state = optimizer.state_dict()["state"], fresh_optimizer.state_dict()["state"]
    assert restored_state.keys() == saved_state.keys() and len(saved_state) > 0
    assert all(torch.equal(restored_state[i]["exp_avg_sq"], saved_state[i]["exp_avg_sq"]) for i in saved_state)
    assert torch.equal(loaded["replay"][0]["advantages"], replay[0]["advantages"])
    fresh_envs = make_env(args)
    checkpoints.load_normalizers(fresh_envs, loaded["normalizers"], harness)
    for name, (_, rms) in harness.env_normalizers(envs).items():
        restored = harness.env_normalizers(fresh_envs)[name][1]
        assert np.array_equal(restored.mean, rms.mean) and np.array_equal(restored.var, rms.var), name
    assert set(loaded["normalizers"]) == {"reward", "obs_0", "obs_1"}
    envs.close()
    fresh_envs.close()


def test_no_reward_normalization_switch(tmp_path, monkeypatch):
    envs = make_env(Args(env_id="Pendulum-v1", norm_reward=False, num_envs=1))
    assert set(harness.env_normalizers(envs)) == {"obs_0"}
    # --no-norm-reward hands the raw reward on, not clipped to +-10: Pendulum at theta = pi, theta_dot = 8, torque 0
    # gives -(pi^2 + 0.1 * 8^2 + 0.001 * 0^2) = -(9.8696 + 6.4) = -16.2696
    envs.reset(seed=0)
    envs.unwrapped.envs[0].unwrapped.state = np.array([np.pi, 8.0])
    assert envs.step(np.zeros((1, 1), dtype=np.float32))[1][0] == pytest.approx(-16.2696, abs=1e-4)
    envs.close()


class Killed(Exception):
    """Stands for the process being killed."""


def test_resumed_run_logs_what_the_uninterrupted_run_logs(tmp_path, monkeypatch):
    """Pendulum, L = 2, 4 iterations. The killed run dies while writing iteration 3's checkpoint, after logging
    iteration 3; resumed from iteration 2's, with its replay memory, it must log exactly what an
    uninterrupted run logs (iteration 3's first attempt is dropped by TensorBoard)."""
    monkeypatch.chdir(tmp_path)
    config = dict(TINY_PENDULUM, total_timesteps=4 * 128)
    full = train(Args(exp_name="full", **config))

    real_save = harness.save_checkpoint

    def save_then_die_at_iteration_3(path, checkpoint, dir_fd=None):
        if checkpoint["iteration"] == 3:
            raise Killed
        real_save(path, checkpoint, dir_fd)

    monkeypatch.setattr(harness, "save_checkpoint", save_then_die_at_iteration_3)
    with pytest.raises(Killed):
        train(Args(exp_name="killed", checkpoint_every=1, **config))
    monkeypatch.setattr(harness, "save_checkpoint", real_save)
    (run_dir,) = glob.glob("runs/*__killed__*")
    assert len(read_back(f"{run_dir}/checkpoint.safetensors")["replay"]) == 2

    time.sleep(1 - time.time() % 1)  # to the next second: event files are read in name order, which starts with it
    resumed = train(Args(resume=f"{run_dir}/checkpoint.safetensors", cuda=False))
    assert resumed["run_dir"] == run_dir and resumed["global_step"] == full["global_step"] == 512
    assert resumed["mean_return"] == full["mean_return"]
    expected, got = scalars_with_steps(full["run_dir"]), scalars_with_steps(run_dir)
    del expected["charts/SPS"], got["charts/SPS"]
    assert len(got["losses/policy_loss"]) == 4 and got["charts/replay_batches"][2:] == [(384, 2.0), (512, 2.0)]
    assert got == expected


def test_evaluation_of_a_saved_pendulum_checkpoint(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    trained = train(Args(exp_name="trained", total_timesteps=128, save_model=True, **TINY_PENDULUM))
    result = train(Args(eval_checkpoint=f"{trained['run_dir']}/model.safetensors", eval_episodes=2, cuda=False))
    assert len(result["returns"]) == 2 and all(-2000 < r < 0 for r in result["returns"])  # 200-step Pendulum scores
    assert result["mean_return"] == pytest.approx(np.mean(result["returns"]))
    scalars = scalars_with_steps(result["run_dir"])
    assert scalars["eval/mean_return"] == [(128, pytest.approx(result["mean_return"]))]
    assert scalars["eval/std_return"] == [(128, pytest.approx(result["std_return"]))]
    assert f"mean return {result['mean_return']:.2f}" in capsys.readouterr().out


def test_train_output_without_a_terminal_is_the_start_up_block_and_plain_lines(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    result = train(Args(exp_name="quiet", total_timesteps=256, **TINY_PENDULUM))
    out = capsys.readouterr().out
    assert "\r" not in out
    lines = out.splitlines()
    assert lines[0].startswith("PPO with multi-batch experience replay (PPO-ER): Han & Sung")
    assert lines[1:5] == ["  env        Pendulum-v1", "  device     cpu (--no-cuda)",
                          f"  run dir    {result['run_dir']}",
                          "  steps      256 in 2 iterations of 128 (2 envs x 64 steps); N = 128, M = 32, L = 2"]
    assert lines[5] == "  saves      checkpoint.safetensors every 30 minutes and at the end, model.safetensors at the end"
    assert len(lines) == 8 and lines[6].startswith("step 256/256 (100%)")
    model = os.path.join(result["run_dir"], "model.safetensors")
    assert lines[7] == f"saved {model}; play it: python ppo_er.py --eval-checkpoint {model}"
