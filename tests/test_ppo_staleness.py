"""Worked examples for ppo_staleness.py: the queue, the three objectives of Fig. 1, the cap, smoke runs."""
import dataclasses
import glob
import math
import os
import time
from typing import Optional

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import checkpoints
import harness
import ppo_staleness
import resume
from ppo_staleness import Args, StaleQueue, decoupled_clip_loss, queue_bytes, select_logps, train

log = math.log


# ------------------------------------------------------------------------------------ StaleQueue
def test_queue_returns_the_rollout_pushed_k_iterations_earlier():
    queue = StaleQueue(2)
    rollouts = [object() for _ in range(5)]
    # iterations 1 and 2 only collect (warm-up); iteration i >= 3 trains on the rollout of i - 2
    got = [queue.push(r) for r in rollouts]
    assert got[0] is None and got[1] is None
    assert got[2] is rollouts[0] and got[3] is rollouts[1] and got[4] is rollouts[2]


def test_queue_with_staleness_zero_returns_the_rollout_just_pushed():
    queue = StaleQueue(0)
    for _ in range(3):
        rollout = object()
        assert queue.push(rollout) is rollout


# ----------------------------------------------------------------------------------- objectives
def test_select_logps_for_the_three_panels_of_fig_1():
    behav, recent = torch.tensor([-1.0, -2.0]), torch.tensor([-0.5, -0.7])
    prox, is_ = select_logps("recent", behav, recent)  # (a)
    assert prox is recent and is_ is recent
    prox, is_ = select_logps("decoupled", behav, recent)  # (b)
    assert prox is recent and is_ is behav
    prox, is_ = select_logps("behavior", behav, recent)  # (c)
    assert prox is behav and is_ is behav
    with pytest.raises(ValueError, match="unknown objective"):
        select_logps("old", behav, recent)


@pytest.mark.parametrize("objective, expected_loss, expected_grad", [
    # pi_behav = 0.2, pi_recent = 0.4, pi = 0.44, A = 1, eps = 0.2
    ("recent", -1.1, -1.1),     # r = 0.44/0.4 = 1.1 (unclipped), weight 1: -1.1; d/dlogp = -r A = -1.1
    ("behavior", -1.2, 0.0),    # r = 0.44/0.2 = 2.2 -> clipped to 1.2: -1.2, no gradient
    ("decoupled", -2.2, -2.2),  # r = 1.1 against pi_recent, weight pi_recent/pi_behav = 2: -2.2
])
def test_loss_and_gradient_of_each_objective(objective, expected_loss, expected_grad):
    behav_logp, recent_logp = torch.tensor([log(0.2)]), torch.tensor([log(0.4)])
    new_logp = torch.tensor([log(0.44)], requires_grad=True)
    prox_logp, is_logp = select_logps(objective, behav_logp, recent_logp)
    loss = decoupled_clip_loss(new_logp, prox_logp, is_logp, torch.tensor([1.0]), clip_coef=0.2)
    loss.backward()
    assert loss.item() == pytest.approx(expected_loss, rel=1e-5)
    assert new_logp.grad.item() == pytest.approx(expected_grad, abs=1e-5)


def test_decoupled_clip_loss_with_the_importance_weight_cap_active():
    # sample 1: pi = 0.5, pi_prox = 0.45, pi_behav = 0.001, A = 1: pi/pi_behav = 500 > 100, so pi_behav
    #   is raised to 0.5/100 = 0.005; r = 0.5/0.45 = 1.111 (unclipped); weight 0.45/0.005 = 90;
    #   term = -90 * 1.111 = -100 (uncapped: -450 * 1.111 = -500)
    # sample 2: pi = 0.3, pi_prox = 0.2, pi_behav = 0.0001, A = 2: pi_behav raised to 0.003;
    #   r = 1.5 -> min(1.5*2, 1.2*2) = 2.4; weight 0.2/0.003 = 66.67; term = -160 (uncapped: -4800)
    new_logp = torch.tensor([log(0.5), log(0.3)], requires_grad=True)
    prox_logp = torch.tensor([log(0.45), log(0.2)])
    behav_logp = torch.tensor([log(0.001), log(0.0001)])
    advantages = torch.tensor([1.0, 2.0])
    loss = decoupled_clip_loss(new_logp, prox_logp, behav_logp, advantages, clip_coef=0.2, max_is_ratio=100.0)
    assert loss.item() == pytest.approx((-100 - 160) / 2, rel=1e-5)
    uncapped = decoupled_clip_loss(new_logp, prox_logp, behav_logp, advantages, clip_coef=0.2, max_is_ratio=1e9)
    assert uncapped.item() == pytest.approx((-500 - 4800) / 2, rel=1e-5)
    # The cap is a stop-gradient: the weight 90 stays a constant, so d term1/d logp = -90 * r * A = -100
    # (divided by the batch of 2). Had the raised pi_behav (= pi/100) kept its gradient, term 1 would be
    # -100 * A for every pi and its gradient would be 0. Sample 2 is clipped: no gradient.
    loss.backward()
    assert new_logp.grad.tolist() == pytest.approx([-50.0, 0.0], abs=1e-4)


@pytest.mark.parametrize("objective", ["recent", "decoupled", "behavior"])
def test_select_logps_with_staleness_zero_makes_every_objective_ppo(objective):
    # k = 0: pi_recent = pi_behav. pi_behav = [0.5, 0.25], pi = [0.7, 0.15], A = [1, -1], eps = 0.2
    # PPO: r = [1.4, 0.6]; sample 1: min(1.4, 1.2) * 1 = 1.2; sample 2: min(-0.6, -0.8) = -0.8
    # loss = -(1.2 - 0.8) / 2 = -0.2
    behav_logp = torch.tensor([log(0.5), log(0.25)])
    new_logp = torch.tensor([log(0.7), log(0.15)])
    advantages = torch.tensor([1.0, -1.0])
    prox_logp, is_logp = select_logps(objective, behav_logp, behav_logp.clone())
    loss = decoupled_clip_loss(new_logp, prox_logp, is_logp, advantages, clip_coef=0.2)
    ratio = (new_logp - behav_logp).exp()  # PPO as usually written (Schulman et al., 2017)
    ppo = torch.max(-advantages * ratio, -advantages * ratio.clamp(0.8, 1.2)).mean()
    assert loss.item() == pytest.approx(ppo.item()) == pytest.approx(-0.2)


# ----------------------------------------------------------------------------------- check_args
def test_queue_memory_at_paper_scale():
    # per step: 64*64*3 = 12288 obs bytes + 8 (int64 action) + 4*(15 logits + logp, value, reward, done)
    #   = 12372; per rollout 65536 * 12372 + 256 * (12288 + 4) = 813,958,144 bytes; k = 32 keeps 33
    assert queue_bytes(32, 256, 256, 12288, 15) == 33 * 813_958_144  # 26.9 GB


def test_check_args_rejects_a_queue_larger_than_the_available_memory(monkeypatch):
    # k = 32 at the paper's scale: 33 x 813,958,144 B = 26,860,618,752 B = 25.0 GiB > 16 GiB available;
    # k = 16: 17 x 813,958,144 B = 12.9 GiB fits. Available memory, not the machine's total RAM, is what counts.
    monkeypatch.setattr(harness, "available_memory", lambda cuda: {"memory": 16 * 2**30})
    with pytest.raises(SystemExit, match=r"The 33 rollouts that --staleness 32 keeps \(host memory\) need 25\.0 GiB "
                                         r"but only 16\.0 GiB of memory is available; lower --staleness"):
        harness.check_args(Args(staleness=32), ppo_staleness.SCRIPT)
    harness.check_args(Args(staleness=16), ppo_staleness.SCRIPT)


def test_every_numeric_flag_has_a_range():
    numeric = {f.name for f in dataclasses.fields(Args) if f.type in (int, float, Optional[int], Optional[float])}
    assert numeric == set(harness.COMMON_FLAG_RANGES) | set(ppo_staleness.FLAG_RANGES)


@pytest.mark.parametrize("change, flag", [
    ({"staleness": -1}, "--staleness"),
    ({"num_envs": 0}, "--num-envs"),  # not --num-minibatches, and no division by zero
    ({"num_envs": -3}, "--num-envs"),
    ({"num_steps": 0}, "--num-steps"),
    ({"num_minibatches": 3}, "--num-minibatches 3"),
    ({"gae_lambda": 2.0}, "--gae-lambda"),
    ({"gamma": 1.5}, "--gamma"),
    ({"learning_rate": -1.0}, "--learning-rate"),
    ({"clip_coef": -0.1}, "--clip-coef"),
    ({"clip_coef": 1.0}, "--clip-coef"),  # log(1 - eps) of the clip would be log 0
    ({"ent_coef": -5.0}, "--ent-coef"),
    ({"max_grad_norm": -1.0}, "--max-grad-norm"),
    ({"update_epochs": 0}, "--update-epochs"),
    ({"adam_beta2": 1.0}, "--adam-beta2"),
    ({"max_is_ratio": 1.0}, "--max-is-ratio"),
    ({"seed": -1}, "--seed"),
    ({"total_timesteps": 0}, "--total-timesteps"),
    ({"checkpoint_every": -1}, "--checkpoint-every"),
    ({"env_id": "NoSuchEnv-v0"}, "--env-id"),
    ({"env_id": "Pendulum-v1"}, "--env-id Pendulum-v1 has Box"),
    ({"staleness": 10**9}, "--staleness, --num-envs or --num-steps"),  # the queue cannot fit in memory
    ({"resume": "missing.pt"}, "--resume"),
    ({"eval_checkpoint": "missing.pt"}, "--eval-checkpoint"),
])
def test_bad_input_names_the_flag_and_leaves_no_run_dir(tmp_path, monkeypatch, change, flag):
    monkeypatch.chdir(tmp_path)
    args = dataclasses.replace(Args(env_id="CartPole-v1", num_envs=2, num_steps=8, num_minibatches=2), **change)
    with pytest.raises(SystemExit, match=flag):
        train(args)
    assert not (tmp_path / "runs").exists()


# ------------------------------------------------------------------------------------ smoke runs
def scalars(run_dir):
    events = EventAccumulator(run_dir)
    events.Reload()
    return {tag: [e.value for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


TRAIN_TAGS = ("losses/policy_loss", "losses/value_loss", "losses/entropy", "losses/approx_kl", "losses/clipfrac",
              "losses/is_capped_frac", "losses/kl_behav", "losses/kl_recent", "losses/explained_variance")


def test_smoke_cartpole_staleness_2(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # 8 envs x 16 steps = 128 per iteration; 512 steps = 4 trained iterations. The official code does not
    # count the k = 2 warm-up rollouts, so the run collects 2 more: 6 x 128 = 768 env steps, 4 x 128 = 512 trained
    args = Args(env_id="CartPole-v1", num_envs=8, num_steps=16, num_minibatches=2, update_epochs=2,
                gamma=0.99, total_timesteps=512, staleness=2, objective="decoupled", exp_name="smoke")
    result = train(args)
    assert result["trained_steps"] == 512
    assert result["global_step"] == 768
    assert "decoupled_k2" in result["run_dir"]
    logged = scalars(result["run_dir"])
    assert len(logged["charts/SPS"]) == 6
    for tag in TRAIN_TAGS:
        assert len(logged[tag]) == 4 and all(math.isfinite(v) for v in logged[tag]), tag
    assert logged["charts/episodic_return"]


def test_smoke_procgen(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # 2 envs x 16 steps = 32 per iteration, 4 iterations: 2 of warm-up, then 2 trained on
    args = Args(env_id="starpilot", num_envs=2, num_steps=16, num_minibatches=2, update_epochs=1,
                total_timesteps=64, staleness=2, objective="recent", exp_name="smoke", save_model=True)
    result = train(args)
    logged = scalars(result["run_dir"])
    for tag in TRAIN_TAGS:
        assert len(logged[tag]) == 2 and all(math.isfinite(v) for v in logged[tag]), tag
    assert (tmp_path / result["run_dir"] / "model.safetensors").exists()


def test_staleness_zero_trains_identically_under_every_objective(tmp_path, monkeypatch):
    # k = 0: pi_recent = pi_behav, so the three objectives are the same loss and, seeded alike, the
    # same run: identical policy losses at every iteration
    monkeypatch.chdir(tmp_path)
    losses = {}
    for objective in ("recent", "decoupled", "behavior"):
        args = Args(env_id="CartPole-v1", num_envs=4, num_steps=16, num_minibatches=2, update_epochs=2,
                    gamma=0.99, total_timesteps=192, staleness=0, objective=objective, exp_name="k0")
        losses[objective] = scalars(train(args)["run_dir"])["losses/policy_loss"]
    assert len(losses["recent"]) == 3
    assert losses["recent"] == losses["decoupled"] == losses["behavior"]


def test_official_init_of_the_procgen_network():
    # first conv of a stack 1.0, residual convs 6^(-1/4) = 0.6389, dense 1.4, heads 0.1; biases 0
    class ProcgenLike:
        single_observation_space = ppo_staleness.gym.spaces.Box(0, 255, (64, 64, 3), dtype="uint8")
        single_action_space = ppo_staleness.gym.spaces.Discrete(15)

    torch.manual_seed(0)
    seen = set()
    for name, module in ppo_staleness.Agent(ProcgenLike()).named_modules():
        if isinstance(module, (torch.nn.Conv2d, torch.nn.Linear)):
            scale = (6 ** -0.25 if ".res" in name else 1.0 if name.endswith(".conv")
                     else 1.4 if name.endswith("fc") else 0.1)
            norms = torch.linalg.vector_norm(module.weight.flatten(1), dim=1)
            torch.testing.assert_close(norms, torch.full_like(norms, scale), atol=1e-6, rtol=0)
            assert torch.all(module.bias == 0), name
            seen.add((type(module).__name__, round(scale, 4)))
    assert seen == {("Conv2d", 1.0), ("Conv2d", 0.6389), ("Linear", 1.4), ("Linear", 0.1)}


# ------------------------------------------------------------- checkpoints, resume, evaluation
TINY_CARTPOLE = dict(env_id="CartPole-v1", num_envs=2, num_steps=32, num_minibatches=2, update_epochs=2,
                     gamma=0.99, total_timesteps=4 * 64, cuda=False)


def scalars_with_steps(run_dir):
    """{tag: [(step, value), ...]} as TensorBoard shows them (events after a resume point purged)."""
    events = EventAccumulator(str(run_dir))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


class Killed(Exception):
    """Stands for the process being killed."""


def killed_then_resumed(monkeypatch, args, die_at):
    """Run `args` with a checkpoint every iteration, die while writing the one of iteration `die_at`
    (after logging it), resume from the one before: (the resumed run's result, its run directory)."""
    real_save = harness.save_checkpoint

    def save_then_die(path, checkpoint, dir_fd=None):
        if checkpoint["iteration"] == die_at:
            raise Killed
        real_save(path, checkpoint, dir_fd)

    monkeypatch.setattr(harness, "save_checkpoint", save_then_die)
    with pytest.raises(Killed):
        train(dataclasses.replace(args, checkpoint_every=1))
    monkeypatch.setattr(harness, "save_checkpoint", real_save)
    (run_dir,) = glob.glob(f"runs/*__{args.exp_name}_*")
    time.sleep(1 - time.time() % 1)  # to the next second: event files are read in name order, which starts with it
    return train(Args(resume=f"{run_dir}/checkpoint.safetensors", cuda=False)), run_dir


def test_resume_with_staleness_0_logs_what_the_uninterrupted_run_logs(tmp_path, monkeypatch):
    # k = 0: the queue is empty between iterations, so nothing is lost and the resumed run is exact
    monkeypatch.chdir(tmp_path)
    full = train(Args(exp_name="full", staleness=0, **TINY_CARTPOLE))
    resumed, run_dir = killed_then_resumed(monkeypatch, Args(exp_name="killed", staleness=0, **TINY_CARTPOLE), 3)
    assert resumed["global_step"] == full["global_step"] == 256 and resumed["trained_steps"] == 256
    expected, got = scalars_with_steps(full["run_dir"]), scalars_with_steps(run_dir)
    del expected["charts/SPS"], got["charts/SPS"]
    assert len(got["losses/policy_loss"]) == 4
    assert got == expected


def test_resume_with_staleness_2_warms_the_queue_up_again(tmp_path, monkeypatch):
    # k = 2, 4 trained iterations of 64 steps: iterations 1-2 warm up, 3-6 train. Killed while writing the
    # checkpoint of iteration 5 and resumed from iteration 4's (queue of 2 lost): iterations 5-6 warm up
    # again, 7-8 train. Trained: 3, 4, 7, 8 = 4 iterations; collected: 8 x 64 = 512 steps instead of 384.
    monkeypatch.chdir(tmp_path)
    resumed, run_dir = killed_then_resumed(monkeypatch, Args(exp_name="killed", staleness=2, **TINY_CARTPOLE), 5)
    assert resumed["trained_steps"] == 256 and resumed["global_step"] == 512
    assert [step for step, _ in scalars_with_steps(run_dir)["losses/policy_loss"]] == [192, 256, 448, 512]


def test_checkpoint_round_trip_gives_the_same_network_and_reward_normalizer(tmp_path):
    args = Args(**TINY_CARTPOLE)
    envs = ppo_staleness.make_env(args)
    torch.manual_seed(0)
    agent = ppo_staleness.Agent(envs)
    optimizer = torch.optim.Adam(agent.parameters(), lr=5e-4)
    reward_normalizer = ppo_staleness.RewardNormalizer(2, 0.99)
    reward_normalizer(torch.tensor([[1.0, 0.0], [1.0, 1.0]]), torch.zeros(2, 2))
    saved = harness.Saved(models={"agent": agent}, optimizers={"optimizer": optimizer},
                              normalizers={"reward": reward_normalizer})
    checkpoint = harness.make_checkpoint(args, saved, envs, torch.zeros(2, 4), torch.zeros(2), global_step=96,
                                             iteration=3, num_iterations=6, episode_returns=[], queued=2,
                                             trained_steps=64, script="ppo_staleness.py")
    harness.save_checkpoint(str(tmp_path / "checkpoint.safetensors"), checkpoint)
    loaded = checkpoints.read(str(tmp_path / "checkpoint.safetensors"), "--resume", ppo_staleness.SCRIPT)
    torch.manual_seed(1)
    fresh, fresh_normalizer = ppo_staleness.Agent(envs), ppo_staleness.RewardNormalizer(2, 0.99)
    fresh_saved = harness.Saved({"agent": fresh}, {"optimizer": torch.optim.Adam(fresh.parameters(), lr=5e-4)},
                                    {"reward": fresh_normalizer}, keys={"queued": 0, "trained_steps": 0})
    keys = resume.restore_run(loaded, fresh_saved, envs, torch.ones(2, 4), torch.ones(2), "--resume", 32, 8,
                              harness)[-1]
    obs = torch.tensor([[0.1, -0.2, 0.03, 0.4]])
    assert torch.equal(fresh.get_pi(obs), agent.get_pi(obs))
    # R: [1, 0], then [1 + 0.99, 1 + 0] = [1.99, 1]
    assert fresh_normalizer.returns.tolist() == pytest.approx([1.99, 1.0])
    assert (fresh_normalizer.mean, fresh_normalizer.var) == (reward_normalizer.mean, reward_normalizer.var)
    assert (keys["queued"], keys["trained_steps"], loaded["num_iterations"]) == (2, 64, 6)
    envs.close()


def test_evaluation_of_a_saved_cartpole_checkpoint(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    trained = train(Args(exp_name="trained", staleness=1, save_model=True, **dict(TINY_CARTPOLE, total_timesteps=128)))
    result = train(Args(eval_checkpoint=f"{trained['run_dir']}/model.safetensors", eval_episodes=3, cuda=False))
    assert len(result["returns"]) == 3 and all(r >= 1 for r in result["returns"])
    scalars = scalars_with_steps(result["run_dir"])
    assert scalars["eval/mean_return"] == [(192, pytest.approx(result["mean_return"]))]  # 1 warm-up + 2 trained
    assert f"mean return {result['mean_return']:.2f}" in capsys.readouterr().out


def test_train_output_without_a_terminal_is_the_start_up_block_and_plain_lines(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    result = train(Args(exp_name="quiet", staleness=2, **TINY_CARTPOLE))
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("PPO on artificially stale data") and "Sec. 5.1" in lines[0]
    assert lines[4] == "  steps      384 in 6 iterations of 64 (2 envs x 32 steps), 4 of them trained on"
    assert lines[5] == "  saves      checkpoint.safetensors every 30 minutes and at the end, model.safetensors at the end"
    assert len(lines) == 8 and lines[6].startswith("step 384/384 (100%)")
    model = os.path.join(result["run_dir"], "model.safetensors")
    assert lines[7] == f"saved {model}; play it: python ppo_staleness.py --eval-checkpoint {model}"
