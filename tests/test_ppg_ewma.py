"""Worked examples for ppg_ewma.py: small tensors, the arithmetic in comments, the expected numbers."""
import dataclasses
import glob
import math
import os
import time
from typing import Optional

import numpy as np
import pytest
import torch
import torch.nn as nn
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import checkpoints
import harness
import ppg_ewma
import resume
from ppg_ewma import (
    Args, EwmaMoments, apply_batch_divisor, aux_loss, com_to_decay, compute_gae,
    decoupled_clip_loss, span_to_decay, train, update_ewma,
)

LN = math.log


# ------------------------------------------------------------------------------------ aux_loss
def aux_example():
    # sample 1: old uniform p = (1/3, 1/3, 1/3); new logits (ln 2, 0, 0) give q = (1/2, 1/4, 1/4)
    # sample 2: the other way round, old p = (1/2, 1/4, 1/4), new q uniform
    old_logits = torch.tensor([[0.0, 0.0, 0.0], [LN(2), 0.0, 0.0]])
    new_logits = torch.tensor([[LN(2), 0.0, 0.0], [0.0, 0.0, 0.0]], requires_grad=True)
    aux_values = torch.tensor([1.0, 2.0])
    values = torch.tensor([0.5, 3.0])
    returns = torch.tensor([1.5, 2.0])
    return old_logits, new_logits, aux_values, values, returns


def test_aux_loss_by_hand():
    old_logits, new_logits, aux_values, values, returns = aux_example()
    # KL_1 = 1/3 ln((1/3)/(1/2)) + 2/3 ln((1/3)/(1/4)) = 1/3 ln(32/27) = 0.0566330
    # KL_2 = 1/2 ln((1/2)/(1/3)) + 1/2 ln((1/4)/(1/3)) = 1/2 ln(9/8)   = 0.0588915  (KL is not symmetric)
    mean_kl = (LN(32 / 27) / 3 + LN(9 / 8) / 2) / 2  # 0.0577622
    # aux head: 0.5 * mean((1 - 1.5)^2, (2 - 2)^2) = 0.5 * 0.125 = 0.0625
    # value net: 0.5 * mean((0.5 - 1.5)^2, (3 - 2)^2) = 0.5 * 1 = 0.5
    loss = aux_loss(new_logits, old_logits, aux_values, values, returns, beta_clone=2.0)
    assert loss.item() == pytest.approx(2 * mean_kl + 0.0625 + 0.5)  # 0.6780244
    assert loss.item() == pytest.approx(0.6780244, abs=1e-6)


def test_aux_loss_gradient_clones_towards_old_policy_only():
    old_logits, new_logits, aux_values, values, returns = aux_example()
    old_logits.requires_grad_(True)
    aux_loss(new_logits, old_logits, aux_values, values, returns, beta_clone=2.0).backward()
    # d KL[p || softmax(z)] / dz = q - p; times beta_clone / B = 2 / 2 = 1
    # sample 1: q - p = (1/2 - 1/3, 1/4 - 1/3, 1/4 - 1/3) = (1/6, -1/12, -1/12)
    # sample 2: q - p = (1/3 - 1/2, 1/3 - 1/4, 1/3 - 1/4) = (-1/6, 1/12, 1/12)
    expected = torch.tensor([[1 / 6, -1 / 12, -1 / 12], [-1 / 6, 1 / 12, 1 / 12]])
    assert torch.allclose(new_logits.grad, expected, atol=1e-6)
    assert old_logits.grad is None  # pi_old is a fixed target: no gradient flows into it


def test_aux_loss_stays_finite_where_the_old_policy_is_near_certain():
    # old logits [0, -200]: p = (1, e^-200), which log(softmax(.)) rounds to log(0) = -inf; log_softmax keeps it.
    # New logits [0, 0]: q = (1/2, 1/2). KL[p || q] = 1 * log(1 / 0.5) + e^-200 * (-200 - log 0.5) = log 2 = 0.693147
    loss = aux_loss(torch.zeros(1, 2), torch.tensor([[0.0, -200.0]]), torch.zeros(1), torch.zeros(1), torch.zeros(1),
                    1.0)
    assert loss.item() == pytest.approx(math.log(2), rel=1e-6)


def test_aux_loss_without_cloning_is_the_two_value_losses():
    old_logits, new_logits, aux_values, values, returns = aux_example()
    assert aux_loss(new_logits, old_logits, aux_values, values, returns, 0.0).item() == pytest.approx(0.5625)


# --------------------------------------------------------------- decoupled loss and EWMA helpers
def test_decoupled_clip_loss_by_hand():
    # sample 1: r = 0.6/0.4 = 1.5 -> clip 1.2, A = +1: min(1.5, 1.2) = 1.2; pi_prox/pi_behav = 0.4/0.5 = 0.8 -> 0.96
    # sample 2: r = 0.3/0.4 = 0.75, A = +2: min(1.5, 0.8 * 2 = 1.6) = 1.5; pi_prox/pi_behav = 0.4/0.2 = 2 -> 3.0
    new_logp = torch.tensor([LN(0.6), LN(0.3)], requires_grad=True)
    prox_logp = torch.tensor([LN(0.4), LN(0.4)])
    behav_logp = torch.tensor([LN(0.5), LN(0.2)])
    loss = decoupled_clip_loss(new_logp, prox_logp, behav_logp, torch.tensor([1.0, 2.0]), 0.2)
    assert loss.item() == pytest.approx(-(0.96 + 3.0) / 2)  # -1.98
    loss.backward()
    # sample 1 is clipped: no gradient. sample 2: d/dlogp of -(2 * r * 2) / 2 = -2 r = -1.5
    assert new_logp.grad.tolist() == pytest.approx([0.0, -1.5])


def test_decoupled_clip_loss_with_prox_equal_behav_is_ppo():
    new_logp = torch.tensor([LN(0.6), LN(0.3), LN(0.5)])
    old_logp = torch.tensor([LN(0.4), LN(0.4), LN(0.5)])
    advantages = torch.tensor([1.0, -2.0, 0.5])
    ratio = torch.exp(new_logp - old_logp)
    ppo = -torch.min(ratio * advantages, torch.clamp(ratio, 0.8, 1.2) * advantages).mean()
    loss = decoupled_clip_loss(new_logp, old_logp, old_logp, advantages, 0.2)
    assert loss.item() == pytest.approx(ppo.item(), abs=1e-6)  # log space: the same up to float rounding
    # min(1.5 * 1, 1.2 * 1) = 1.2;  min(0.75 * -2, 0.8 * -2) = -1.6;  min(1 * 0.5, 1 * 0.5) = 0.5
    assert ppo.item() == pytest.approx(-(1.2 - 1.6 + 0.5) / 3)


def test_decoupled_clip_loss_caps_the_importance_weight():
    # pi/pi_behav = 0.5/0.001 = 500 > 100: behav is raised to 0.5/100 = 0.005, r = pi/pi_prox = 1,
    # so the loss is -(pi_prox/pi_behav') * A = -(0.5/0.005) * 1 = -100 instead of -500
    new_logp, prox_logp = torch.tensor([LN(0.5)]), torch.tensor([LN(0.5)])
    loss = decoupled_clip_loss(new_logp, prox_logp, torch.tensor([LN(0.001)]), torch.tensor([1.0]), 0.2, 100.0)
    assert loss.item() == pytest.approx(-100.0)


def scalar_net(value):
    net = nn.Linear(1, 1, bias=False)
    nn.init.constant_(net.weight, value)
    return net


def test_update_ewma_matches_the_weighted_average_of_appendix_a():
    ewma, model, beta = scalar_net(0.0), scalar_net(1.0), 0.5  # theta_0 = 0, w = 1
    w = update_ewma(ewma, model, 1.0, beta)  # w = 1 + 0.5 * 1 = 1.5; theta_prox = 1/1.5 + 0 = 0.6667
    assert w == pytest.approx(1.5) and ewma.weight.item() == pytest.approx(2 / 3)
    nn.init.constant_(model.weight, 4.0)
    w = update_ewma(ewma, model, w, beta)  # w = 1.75; theta_prox = 4/1.75 + 0.5 * 1.5/1.75 * 2/3 = 2.5714
    # Appendix A's closed form: (theta_2 + beta theta_1 + beta^2 theta_0) / (1 + beta + beta^2) = 4.5 / 1.75
    assert w == pytest.approx(1.75) and ewma.weight.item() == pytest.approx(4.5 / 1.75)


def test_update_ewma_with_decay_zero_resets_to_a_copy():
    ewma, model = scalar_net(-3.0), scalar_net(7.0)
    assert update_ewma(ewma, model, 5.0, 0.0) == 1.0  # theta_prox <- theta, w <- 1
    assert ewma.weight.item() == 7.0


def test_decay_conversions():
    assert com_to_decay(8.0) == pytest.approx(8 / 9)  # 0.889, Table 4
    assert com_to_decay(32.0) == pytest.approx(32 / 33)  # centre of mass x4 under --batch-divisor 4
    assert span_to_decay(1.0) == 0.0  # span 1: this iteration's batch only
    assert span_to_decay(3.0) == pytest.approx(0.5)  # 2/(1 - 0.5) - 1 = 3


def test_ewma_moments_by_hand():
    moments = EwmaMoments(0.5)
    moments.update(torch.tensor([1.0, 3.0]))  # n 2, mean 2, var 1: w = 2, s = 4, q = 2 * (1 + 4) = 10
    moments.update(torch.tensor([6.0]))  # w = 1 + 1 = 2, s = 2 + 6 = 8, q = 5 + 36 = 41
    assert moments.mean == pytest.approx(4.0)  # 8 / 2
    assert moments.std == pytest.approx(math.sqrt(4.5))  # 41 / 2 - 4^2 = 4.5
    assert moments.normalize(torch.tensor([4.0 + math.sqrt(4.5)])).item() == pytest.approx(1.0)


def test_compute_gae_by_hand():
    rewards, values = torch.tensor([[1.0], [1.0]]), torch.tensor([[0.5], [0.5]])
    next_value, next_done = torch.tensor([2.0]), torch.tensor([0.0])
    # t=1: delta = 1 + 0.9 * 2 - 0.5 = 2.3 -> A_1 = 2.3
    # t=0, no episode end: delta = 1 + 0.9 * 0.5 - 0.5 = 0.95 -> A_0 = 0.95 + 0.9 * 0.8 * 2.3 = 2.606
    adv, ret = compute_gae(rewards, values, torch.zeros(2, 1), next_value, next_done, 0.9, 0.8)
    assert adv.flatten().tolist() == pytest.approx([2.606, 2.3])
    assert ret.flatten().tolist() == pytest.approx([3.106, 2.8])
    # dones[1] = 1: the step from obs 0 ended an episode, so A_0 = delta_0 = 1 - 0.5 = 0.5
    adv, _ = compute_gae(rewards, values, torch.tensor([[0.0], [1.0]]), next_value, next_done, 0.9, 0.8)
    assert adv.flatten().tolist() == pytest.approx([0.5, 2.3])


# ------------------------------------------------------------------- batch divisor and arguments
def test_apply_batch_divisor_multiplies_n_pi_and_keeps_the_phase_batch():
    args = Args()
    new = apply_batch_divisor(dataclasses.replace(args, batch_divisor=4))
    assert (new.num_envs, new.n_pi) == (64, 128)  # 256 / 4 envs, 32 * 4 iterations per phase
    assert new.learning_rate == pytest.approx(2.5e-4)  # 5e-4 / sqrt(4)
    assert (new.ewma_com, new.adv_norm_span) == (32.0, 4.0)
    # the phase batch size N_pi x T x N is unchanged: 128 * 256 * 64 = 32 * 256 * 256 = 2,097,152
    assert new.n_pi * new.num_steps * new.num_envs == args.n_pi * args.num_steps * args.num_envs == 2_097_152
    for name in ("aux_epochs", "beta_clone", "num_steps"):
        assert getattr(new, name) == getattr(args, name)
    off = apply_batch_divisor(dataclasses.replace(args, batch_divisor=4, adjust_n_pi=False))
    assert off.n_pi == 32 and off.num_envs == 64
    with pytest.raises(SystemExit, match="--batch-divisor"):
        apply_batch_divisor(dataclasses.replace(args, batch_divisor=3))


# Appendix B: the first factor a = min(c, 4) of c cut the paper's 4 workers to 1, with the aux minibatch per worker
# kept, so the total aux minibatch (4096) is divided by a and the aux step size (5e-4) by sqrt(a):
# c = 1: a = 1, 4096, 5e-4; c = 2: a = 2, 2048, 5e-4 / 1.414214 = 3.535534e-4; c = 4, 16, 64: a = 4, 1024, 2.5e-4
@pytest.mark.parametrize("c, aux_minibatch_size, aux_learning_rate", [
    (1, 4096, 5e-4), (2, 2048, 3.535534e-4), (4, 1024, 2.5e-4), (16, 1024, 2.5e-4), (64, 1024, 2.5e-4)])
def test_the_auxiliary_phase_follows_appendix_b(c, aux_minibatch_size, aux_learning_rate):
    new = apply_batch_divisor(Args(batch_divisor=c))
    assert new.aux_minibatch_size == aux_minibatch_size
    assert new.aux_learning_rate == pytest.approx(aux_learning_rate, rel=1e-6)
    off = apply_batch_divisor(Args(batch_divisor=c, adjust_aux=False))  # --no-adjust-aux: left as at c = 1
    assert (off.aux_minibatch_size, off.aux_learning_rate) == (4096, 5e-4)
    linear = apply_batch_divisor(Args(batch_divisor=c, lr_rule="linear"))  # 5e-4 / a: 5e-4, 2.5e-4, 1.25e-4
    assert linear.aux_learning_rate == pytest.approx(5e-4 / min(c, 4), rel=1e-6)


def test_an_aux_minibatch_that_the_worker_factor_does_not_divide_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit, match=r"^--aux-minibatch-size 6 must be a multiple of min\(--batch-divisor, 4\) = "
                                         r"4, which --adjust-aux divides it by \(Appendix B\)\.$"):
        ppg_ewma.train(Args(env_id="CartPole-v1", num_envs=8, num_steps=32, batch_divisor=8, aux_minibatch_size=6,
                            cuda=False))
    assert not os.path.exists("runs")


def test_a_checkpoint_from_before_adjust_aux_resumes_with_the_aux_phase_it_trained_with():
    args = {k: v for k, v in dataclasses.asdict(Args(batch_divisor=4)).items() if k != "adjust_aux"}
    resumed = apply_batch_divisor(checkpoints.checkpoint_args({"args": args}, ppg_ewma.SCRIPT, "--resume"))
    assert (resumed.adjust_aux, resumed.aux_minibatch_size, resumed.aux_learning_rate) == (False, 4096, 5e-4)


def test_check_args_stops_when_the_auxiliary_buffer_does_not_fit(monkeypatch):
    monkeypatch.setattr(harness, "available_memory", lambda cuda: {"memory": 2**30})
    # 32 * 256 * 256 samples * (12288 obs + 4 target + 15 * 4 logits bytes) = 25,904,021,504 B = 24.1 GiB
    with pytest.raises(SystemExit, match=r"24\.1 GiB.*1\.0 GiB.*--n-pi, --num-envs or --num-steps"):
        harness.check_args(Args(), ppg_ewma.SCRIPT)
    # 2048 * 12352 B = 24 MiB fits
    harness.check_args(Args(n_pi=2, num_envs=16, num_steps=64, aux_minibatch_size=64), ppg_ewma.SCRIPT)


def test_every_numeric_flag_has_a_range():
    numeric = {f.name for f in dataclasses.fields(Args) if f.type in (int, float, Optional[int], Optional[float])}
    assert numeric == set(harness.COMMON_FLAG_RANGES) | set(harness.COMMON_FLAG_RANGES) | set(ppg_ewma.FLAG_RANGES)


@pytest.mark.parametrize("change, flag", [
    ({"ewma_com": -2.0}, "--ewma-com"),
    ({"beta_clone": -1.0}, "--beta-clone"),
    ({"adam_beta1": 1.5}, "--adam-beta1"),
    ({"gae_lambda": 2.0}, "--gae-lambda"),
    ({"gamma": 1.5}, "--gamma"),
    ({"learning_rate": -1.0}, "--learning-rate"),
    ({"aux_learning_rate": 0.0}, "--aux-learning-rate"),
    ({"clip_coef": -0.1}, "--clip-coef"),
    ({"clip_coef": 1.0}, "--clip-coef"),  # log(1 - eps) of the clip would be log 0
    ({"ent_coef": -5.0}, "--ent-coef"),
    ({"max_grad_norm": -1.0}, "--max-grad-norm"),
    ({"update_epochs": 0}, "--update-epochs"),
    ({"value_epochs": -1}, "--value-epochs"),
    ({"aux_epochs": -1}, "--aux-epochs"),
    ({"n_pi": 0}, "--n-pi"),
    ({"aux_minibatch_size": 0}, "--aux-minibatch-size"),
    ({"aux_minibatch_size": 48}, "--aux-minibatch-size 48"),  # 32-step trajectories: neither whole nor pieces
    ({"seed": -1}, "--seed"),
    ({"num_envs": 0}, "--num-envs"),
    ({"num_envs": -3}, "--num-envs"),
    ({"num_minibatches": 3}, "--num-minibatches 3"),
    ({"batch_divisor": 3}, "--batch-divisor 3"),
    ({"max_is_ratio": 0.5}, "--max-is-ratio"),
    ({"checkpoint_every": -1}, "--checkpoint-every"),
    ({"env_id": "NoSuchEnv-v0"}, "--env-id"),
    ({"env_id": "Pendulum-v1"}, "--env-id Pendulum-v1 has Box"),
    ({"n_pi": 10**8}, "--n-pi, --num-envs or --num-steps"),  # the auxiliary buffer cannot fit in memory
    ({"resume": "missing.pt"}, "--resume"),
    ({"eval_checkpoint": "missing.pt"}, "--eval-checkpoint"),
])
def test_bad_input_names_the_flag_and_leaves_no_run_dir(tmp_path, monkeypatch, change, flag):
    monkeypatch.chdir(tmp_path)
    args = dataclasses.replace(tiny_args(env_id="CartPole-v1"), **change)
    with pytest.raises(SystemExit, match=flag):
        ppg_ewma.train(args)
    assert not (tmp_path / "runs").exists()


def test_check_args_rejects_an_aux_minibatch_size_that_does_not_divide_the_phase():
    with pytest.raises(SystemExit, match="--aux-minibatch-size"):
        harness.check_args(Args(env_id="CartPole-v1", num_envs=4, num_steps=32, n_pi=2, aux_minibatch_size=48),
                           ppg_ewma.SCRIPT)
    with pytest.raises(SystemExit, match="--env-id"):
        harness.check_args(Args(env_id="NoSuchEnv-v0"), ppg_ewma.SCRIPT)


# ------------------------------------------------------------------------------------ training
def tiny_args(**kw):
    config = dict(exp_name="test", num_envs=4, num_steps=32, num_minibatches=2, n_pi=2, aux_minibatch_size=64,
                  gamma=0.99, cuda=False)
    return Args(**{**config, **kw})


def scalars(run_dir):
    acc = EventAccumulator(glob.glob(f"{run_dir}/events.out.tfevents.*")[0])
    acc.Reload()
    return {tag: [e.value for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


AUX_TAGS = ("losses/aux_clone_kl", "losses/aux_value_loss", "losses/aux_true_value_loss", "losses/aux_kl_moved")


def test_ewma_equals_the_policy_at_the_first_step_after_an_auxiliary_phase(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    nets, events = {}, []
    real_update, real_aux, real_loss = ppg_ewma.update_ewma, ppg_ewma.auxiliary_phase, ppg_ewma.decoupled_clip_loss

    def same_weights():
        return all(torch.equal(p, q) for p, q in zip(nets["ewma"].parameters(), nets["policy"].parameters()))

    def update(ewma_model, model, weight, decay):
        nets["ewma"], nets["policy"] = ewma_model, model
        return real_update(ewma_model, model, weight, decay)

    def aux(*a, **k):
        out = real_aux(*a, **k)
        events.append(("aux", same_weights()))
        return out

    def loss(new_logp, prox_logp, *a, **k):
        events.append(("step", same_weights(), torch.equal(new_logp.detach(), prox_logp)))
        return real_loss(new_logp, prox_logp, *a, **k)

    monkeypatch.setattr(ppg_ewma, "update_ewma", update)
    monkeypatch.setattr(ppg_ewma, "auxiliary_phase", aux)
    monkeypatch.setattr(ppg_ewma, "decoupled_clip_loss", loss)
    # 3 iterations of 128 steps, 2 policy steps each, N_pi 2: phase 1 = iterations 1-2, aux phase, phase 2
    train(tiny_args(env_id="CartPole-v1", total_timesteps=3 * 128))
    assert [e[0] for e in events] == ["step"] * 4 + ["aux"] + ["step"] * 2
    assert events[4] == ("aux", False)  # the auxiliary phase moved the policy away from the EWMA ...
    assert events[5] == ("step", True, True)  # ... and the next phase starts with theta_prox = theta, pi_prox = pi
    assert events[6] == ("step", False, False)  # after one step theta_prox = (theta_1 + beta theta_0)/(1 + beta)
    assert events[0] == ("step", True, True)  # the first phase starts the same way


@pytest.mark.parametrize("args", [
    tiny_args(env_id="CartPole-v1", total_timesteps=2 * 4 * 32),  # 2 iterations = one phase, then aux
    tiny_args(env_id="coinrun", distribution_mode="easy", num_steps=16, aux_minibatch_size=32, aux_epochs=1,
              total_timesteps=2 * 4 * 16),  # the IMPALA CNN runs at ~100-400 samples/s here: one aux epoch
], ids=["CartPole-v1", "coinrun"])
def test_train_smoke_passes_an_auxiliary_phase(tmp_path, monkeypatch, args):
    monkeypatch.chdir(tmp_path)
    result = train(args)
    assert result["global_step"] == 2 * args.num_envs * args.num_steps
    logged = scalars(result["run_dir"])
    for tag in AUX_TAGS + ("charts/policy_phase_time", "charts/aux_phase_time"):
        assert len(logged[tag]) == 1 and np.isfinite(logged[tag][0]), tag
    assert logged["losses/aux_clone_kl"][0] >= 0.0  # a KL
    for tag in ("losses/policy_loss", "losses/value_loss", "losses/entropy", "losses/approx_kl", "charts/SPS"):
        assert len(logged[tag]) == 2 and np.all(np.isfinite(logged[tag])), tag


# ------------------------------------------------------------------------- the official code's setup
def test_aux_minibatches_are_whole_trajectories_of_the_phase():
    # N_pi = 2 iterations x N = 2 envs = 4 trajectories of T = 3 steps, 2 aux minibatches of 2 trajectories.
    # Trajectory j = env j % 2 of iteration j // 2; the seed-1 permutation of 4 is [1, 3, 2, 0].
    # The buffer is [N_pi, T, N]: flat index (i*T + t)*N + n = 6i + 2t + n.
    #   j = 1: i 0, n 1 -> 1, 3, 5      j = 3: i 1, n 1 -> 7, 9, 11
    #   j = 2: i 1, n 0 -> 6, 8, 10     j = 0: i 0, n 0 -> 0, 2, 4
    # (in minibatch_indices' env-major order: j's steps t = 0, 1, 2 one after another)
    assert torch.randperm(4, generator=torch.Generator().manual_seed(1)).tolist() == [1, 3, 2, 0]
    minibatches = ppg_ewma.phase_minibatch_indices(2, 3, 2, 2, generator=torch.Generator().manual_seed(1))
    assert [mb.tolist() for mb in minibatches] == [[1, 3, 5, 7, 9, 11], [6, 8, 10, 0, 2, 4]]


def test_aux_minibatch_size_in_whole_trajectories_or_equal_pieces():
    # phase = N_pi 2 x N 4 x T 24 = 192 samples. 48 = 2 trajectories and 12 = half of one are fine.
    # 64 divides the phase (3 minibatches) but is neither a multiple nor a divisor of 24 steps: refused,
    # although the old sample-shuffling aux phase accepted it (and --shuffle-samples still does).
    config = dict(env_id="CartPole-v1", num_envs=4, num_steps=24, n_pi=2)
    harness.check_args(Args(**config, aux_minibatch_size=48), ppg_ewma.SCRIPT)
    harness.check_args(Args(**config, aux_minibatch_size=12), ppg_ewma.SCRIPT)
    with pytest.raises(SystemExit, match="--aux-minibatch-size 64 must divide the phase of 192 samples"):
        harness.check_args(Args(**config, aux_minibatch_size=64), ppg_ewma.SCRIPT)
    harness.check_args(Args(**config, aux_minibatch_size=64, shuffle_samples=True), ppg_ewma.SCRIPT)
    with pytest.raises(SystemExit, match="--aux-minibatch-size 40"):  # 192 / 40 is not whole
        harness.check_args(Args(**config, aux_minibatch_size=40, shuffle_samples=True), ppg_ewma.SCRIPT)


class ProcgenLike:
    single_observation_space = ppg_ewma.gym.spaces.Box(0, 255, (64, 64, 3), dtype="uint8")
    single_action_space = ppg_ewma.gym.spaces.Discrete(15)


def test_official_init_of_both_procgen_networks():
    # norms of each output unit's weights: first conv of a stack 1.0, residual convs 6^(-1/4) = 0.6389, dense 1.4,
    # policy head, auxiliary value head and value head 0.1; all biases 0
    torch.manual_seed(0)
    for net in (ppg_ewma.PolicyNetwork(ProcgenLike()), ppg_ewma.ValueNetwork(ProcgenLike())):
        seen = set()
        for name, module in net.named_modules():
            if isinstance(module, (nn.Conv2d, nn.Linear)):
                scale = (6 ** -0.25 if ".res" in name else 1.0 if name.endswith(".conv")
                         else 1.4 if name.endswith("fc") else 0.1)
                norms = torch.linalg.vector_norm(module.weight.flatten(1), dim=1)
                torch.testing.assert_close(norms, torch.full_like(norms, scale), atol=1e-6, rtol=0)
                assert torch.all(module.bias == 0), name
                seen.add((type(module).__name__, round(scale, 4)))
        assert seen == {("Conv2d", 1.0), ("Conv2d", 0.6389), ("Linear", 1.4), ("Linear", 0.1)}


def test_value_phase_weight_is_half_the_mse():
    # V = (3, 1), V_targ = (1, 1): mean((2, 0)^2) = 2; the value phase minimizes c_VF * 2 = 1.0 (c_VF = 0.5)
    assert (Args().vf_coef * ppg_ewma.value_loss(torch.tensor([3.0, 1.0]), torch.tensor([1.0, 1.0]))).item() == 1.0


def test_kl_objective_runs_for_the_fig_2_reference_line(tmp_path, monkeypatch):
    # PPG with the KL penalty at beta = 1/256 (Fig. 2's reference line). Without the EWMA pi_prox is the behaviour
    # policy, so on an iteration's first minibatch pi = pi_prox and KL[pi_prox || pi] = 0. The spy records what
    # reaches decoupled_kl_loss.
    monkeypatch.chdir(tmp_path)
    seen = []
    real = ppg_ewma.decoupled_kl_loss

    def spy(new_logp, behav_logp, advantages, kl, kl_coef, max_is_ratio=100.0):
        seen.append((kl_coef, kl.detach().abs().max().item()))
        return real(new_logp, behav_logp, advantages, kl, kl_coef, max_is_ratio)

    monkeypatch.setattr(ppg_ewma, "decoupled_kl_loss", spy)
    result = train(tiny_args(env_id="CartPole-v1", total_timesteps=2 * 4 * 32, objective="kl", kl_coef=1 / 256,
                             ewma=False))
    assert len(seen) == 4  # 2 iterations x 2 minibatches
    assert all(coef == 1 / 256 for coef, _ in seen)
    assert seen[0][1] < 1e-6  # the first step of an iteration: pi = pi_prox = pi_behav, so KL = 0
    assert np.all(np.isfinite(scalars(result["run_dir"])["losses/policy_loss"]))


# ------------------------------------------------------------- checkpoints, resume, evaluation
def scalars_with_steps(run_dir):
    """{tag: [(step, value), ...]} as TensorBoard shows them (events after a resume point purged)."""
    events = EventAccumulator(str(run_dir))
    events.Reload()
    # nan (e.g. a noise scale not measurable yet) as the string "nan", so that equal logs compare equal
    return {tag: [(e.step, "nan" if math.isnan(e.value) else e.value) for e in events.Scalars(tag)]
            for tag in events.Tags()["scalars"]}


def test_checkpoint_round_trip_gives_both_networks_the_ewma_and_both_optimizers(tmp_path):
    args = tiny_args(env_id="CartPole-v1")
    envs = ppg_ewma.make_env(args)
    torch.manual_seed(0)
    policy, value_net = ppg_ewma.PolicyNetwork(envs), ppg_ewma.ValueNetwork(envs)
    ewma_policy = ppg_ewma.PolicyNetwork(envs)
    optimizer = torch.optim.Adam([*policy.parameters(), *value_net.parameters()], lr=5e-4)
    aux_optimizer = torch.optim.Adam([*policy.parameters(), *value_net.parameters()], lr=5e-4)
    obs = torch.tensor([[0.1, -0.2, 0.03, 0.4], [1.0, 0.5, -0.5, 0.0]])
    (policy.get_pi(obs).sum() + value_net(obs).sum()).backward()
    aux_optimizer.step()  # only the auxiliary Adam has state
    models = {"policy": policy, "value_net": value_net, "ewma_policy": ewma_policy}
    optimizers = {"optimizer": optimizer, "aux_optimizer": aux_optimizer}
    checkpoint = harness.make_checkpoint(args, harness.Saved(models, optimizers), envs, torch.zeros(4, 4),
                                             torch.zeros(4), global_step=128, iteration=2, num_iterations=6,
                                             episode_returns=[], ewma_weight=1.9, script="ppg_ewma.py")
    harness.save_checkpoint(str(tmp_path / "checkpoint.safetensors"), checkpoint)
    loaded = checkpoints.read(str(tmp_path / "checkpoint.safetensors"), "--resume", ppg_ewma.SCRIPT)

    torch.manual_seed(1)
    fresh = {"policy": ppg_ewma.PolicyNetwork(envs), "value_net": ppg_ewma.ValueNetwork(envs),
             "ewma_policy": ppg_ewma.PolicyNetwork(envs)}
    params = [*fresh["policy"].parameters(), *fresh["value_net"].parameters()]
    fresh_optimizers = {"optimizer": torch.optim.Adam(params, lr=5e-4), "aux_optimizer": torch.optim.Adam(params)}
    assert not torch.equal(fresh["value_net"](obs), value_net(obs))
    resume.restore_run(loaded, harness.Saved(fresh, fresh_optimizers, keys={"ewma_weight": 1.0}), envs,
                       torch.ones(4, 4), torch.ones(4), "--resume", 64, 6, harness)
    assert torch.equal(fresh["policy"].get_pi(obs), policy.get_pi(obs))
    assert torch.equal(fresh["value_net"](obs), value_net(obs))
    assert torch.equal(fresh["ewma_policy"].get_pi(obs), ewma_policy.get_pi(obs))
    assert fresh_optimizers["optimizer"].state_dict()["state"] == {}
    assert fresh_optimizers["aux_optimizer"].state_dict()["state"][0]["step"].item() == 1
    assert fresh_optimizers["aux_optimizer"].param_groups[0]["lr"] == 5e-4  # the saved one, not Adam's default
    assert loaded["ewma_weight"] == 1.9
    envs.close()


def test_checkpoints_are_written_at_the_first_phase_end_after_every_k_iterations(tmp_path, monkeypatch):
    # N_pi = 2, 6 iterations, --checkpoint-every 3: phases end at 2, 4, 6; the phase 3-4 reaches 3, 5-6 reaches 6
    monkeypatch.chdir(tmp_path)
    saved = []
    monkeypatch.setattr(harness, "save_checkpoint",
                        lambda path, checkpoint, dir_fd: saved.append((os.path.basename(path), checkpoint["iteration"])))
    result = ppg_ewma.train(tiny_args(env_id="CartPole-v1", total_timesteps=6 * 128, checkpoint_every=3))
    assert saved == [("checkpoint.safetensors", 4), ("checkpoint.safetensors", 6)]  # the last iteration: both
    assert os.path.exists(os.path.join(result["run_dir"], "model.safetensors"))


class Killed(Exception):
    """Stands for the process being killed."""


def test_resumed_run_logs_what_the_uninterrupted_run_logs(tmp_path, monkeypatch):
    """3 phases of N_pi = 2 on CartPole. The killed run checkpoints at every phase end and dies while
    writing the one of iteration 4 (after iterations 3-4 and their auxiliary phase were logged); resumed
    from iteration 2's, it starts phase 2 afresh and must log exactly what an uninterrupted run logs."""
    monkeypatch.chdir(tmp_path)
    config = dict(env_id="CartPole-v1", total_timesteps=6 * 128)
    full = ppg_ewma.train(tiny_args(exp_name="full", **config))

    real_save = harness.save_checkpoint

    def save_then_die_at_iteration_4(path, checkpoint, dir_fd=None):
        if checkpoint["iteration"] == 4:
            raise Killed
        real_save(path, checkpoint, dir_fd)

    monkeypatch.setattr(harness, "save_checkpoint", save_then_die_at_iteration_4)
    with pytest.raises(Killed):
        ppg_ewma.train(tiny_args(exp_name="killed", checkpoint_every=1, **config))
    monkeypatch.setattr(harness, "save_checkpoint", real_save)
    (run_dir,) = glob.glob("runs/*__killed__*")

    time.sleep(1 - time.time() % 1)  # to the next second: event files are read in name order, which starts with it
    resumed = ppg_ewma.train(Args(resume=f"{run_dir}/checkpoint.safetensors", cuda=False))
    assert resumed["global_step"] == full["global_step"] == 768
    assert resumed["mean_return"] == full["mean_return"]
    expected, got = scalars_with_steps(full["run_dir"]), scalars_with_steps(run_dir)
    for logged in (expected, got):
        for timing in ("charts/SPS", "charts/policy_phase_time", "charts/aux_phase_time"):
            del logged[timing]
    assert len(got["losses/policy_loss"]) == 6 and len(got["losses/aux_clone_kl"]) == 3
    assert got == expected


def test_evaluation_of_a_saved_cartpole_checkpoint(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    trained = ppg_ewma.train(tiny_args(env_id="CartPole-v1", exp_name="trained", total_timesteps=256, save_model=True))
    result = ppg_ewma.train(Args(eval_checkpoint=f"{trained['run_dir']}/model.safetensors", eval_episodes=3, cuda=False))
    assert len(result["returns"]) == 3 and all(r >= 1 for r in result["returns"])
    scalars = scalars_with_steps(result["run_dir"])
    assert scalars["eval/mean_return"] == [(256, pytest.approx(result["mean_return"]))]
    assert scalars["eval/std_return"] == [(256, pytest.approx(result["std_return"]))]
    assert f"mean return {result['mean_return']:.2f}" in capsys.readouterr().out


def test_train_output_without_a_terminal_is_the_start_up_block_and_plain_lines(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    result = ppg_ewma.train(tiny_args(env_id="CartPole-v1", exp_name="quiet", total_timesteps=512))
    out = capsys.readouterr().out
    assert "\r" not in out
    lines = out.splitlines()
    assert lines[0].startswith("PPG and PPG-EWMA") and "Phasic policy gradient" in lines[0]
    assert lines[4] == "  steps      512 in 4 iterations of 128 (4 envs x 32 steps), phases of 2"
    assert lines[5] == "  saves      checkpoint.safetensors every 30 minutes and at the end, model.safetensors at the end"
    assert len(lines) == 8 and lines[6].startswith("step 512/512 (100%)")
    model = os.path.join(result["run_dir"], "model.safetensors")
    assert lines[7] == f"saved {model}; play it: python ppg_ewma.py --eval-checkpoint {model}"


def test_noise_scale_estimates_by_hand():
    # as in ppo_ewma.py: |G|^2 = (8 * 4 - 2 * 10) / 6 = 2, tr(Sigma) = (10 - 4) / (1/2 - 1/8) = 16
    assert ppg_ewma.noise_scale_estimates(10.0, 2, 4.0, 8) == pytest.approx((2.0, 16.0))


def test_noise_scale_changes_nothing_that_is_learned(tmp_path, monkeypatch):
    # it only reads the policy phase's gradients after backward(): with it off, every other logged value is the same
    monkeypatch.chdir(tmp_path)
    short = dict(env_id="CartPole-v1", total_timesteps=2 * 4 * 4 * 32)  # 2 phases of n_pi = 2 iterations
    on = scalars_with_steps(train(tiny_args(exp_name="on", noise_scale=True, **short))["run_dir"])
    off = scalars_with_steps(train(tiny_args(exp_name="off", noise_scale=False, **short))["run_dir"])
    learned = [tag for tag in off if tag.startswith(("losses/", "charts/episodic_return"))]
    assert "losses/policy_loss" in learned and "losses/aux_clone_kl" in learned
    assert all(on[tag] == off[tag] for tag in learned)
