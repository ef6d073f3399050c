"""Worked examples for ppo_ewma_rnn.py, PPO-EWMA with a recurrent policy: the core by hand, the replay of a rollout's
unrolls, the state at truncations and episode starts, resume, and what it refuses. What it shares with ppo_ewma.py
(the losses, GAE, the EWMA, the normalizers) is tested there and held identical by tests/test_copies.py."""
import dataclasses
import glob
import math
import time

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import harness
import ppo_ewma_rnn
from ppo_ewma_rnn import Args

TINY_CARTPOLE = dict(env_id="CartPole-v1", num_envs=2, num_steps=32, num_minibatches=2, gamma=0.99, cuda=False)


def scalars_with_steps(run_dir):
    """{tag: [(step, value), ...]} as TensorBoard shows them (events after a resume point purged)."""
    events = EventAccumulator(str(run_dir))
    events.Reload()
    return {tag: [(e.step, "nan" if math.isnan(e.value) else e.value) for e in events.Scalars(tag)]
            for tag in events.Tags()["scalars"]}


@pytest.mark.parametrize("cell", ["gru", "rnn"])
def test_a_one_unit_gru_and_rnn_core_by_hand_at_a_reset(cell):
    # One unit, every bias 0; from the features x = 0.5 weights (GRU rows r, z, n) 0.5, 1 and 2, (RNN) 2; the one-hot
    # action and the reward weigh 1 but are zeroed where an episode starts, as is the state h = 0.7:
    #   GRU: z = sigmoid(1 * 0.5) = 0.6224593, n = tanh(2 * 0.5 + r * 0) = 0.7615942, h' = (1 - z) n + z * 0 = 0.2875323
    #   RNN: h' = tanh(2 * 0.5) = 0.7615942
    # Within an episode (done 0) the GRU's action, reward and state enter: a different h'
    core = ppo_ewma_rnn.RecurrentCore(1, ppo_ewma_rnn.gym.spaces.Discrete(2), 1, cell)
    with torch.no_grad():
        for param in core.parameters():
            param.zero_()
        weights = core.gru.weight_ih if cell == "gru" else core.rnn.weight_ih
        weights[:, 0] = torch.tensor([0.5, 1.0, 2.0] if cell == "gru" else [2.0])
        weights[:, 2:] = 1.0  # action 1's one-hot and the reward
    h, state = core(torch.tensor([[0.5], [0.5]]), torch.tensor([1.0, 0.0]), torch.full((2, 1, 1), 0.7),
                    torch.tensor([1, 1]), torch.tensor([1.0, 1.0]))
    assert h[0].item() == pytest.approx(0.2875323 if cell == "gru" else 0.7615942, abs=1e-6)
    assert h[1].item() != pytest.approx(h[0].item(), abs=1e-3) and state.shape == (2, 1, 1) and torch.equal(state[:, 0], h)


@pytest.mark.parametrize("cell", ["lstm", "gru", "rnn"])
def test_the_replay_of_a_rollout_gives_its_pi_and_values_bit_for_bit(cell):
    # 3 envs stepped 5 times as the rollout steps them (env 1 starts an episode at step 2), then unrolled from the state
    # stored at the start: the same numbers, bit for bit, on the rollout's shapes
    torch.manual_seed(0)
    envs = ppo_ewma_rnn.make_env(ppo_ewma_rnn.with_defaults(Args(env_id="CartPole-v1", num_envs=3)))
    agent, obs, dones = ppo_ewma_rnn.Agent(envs, rnn=cell), torch.randn(5, 3, 4), torch.zeros(5, 3)
    dones[2, 1] = 1.0
    memory = {**agent.core.initial_memory(3), "core_state": torch.randn(3, 2 if cell == "lstm" else 1, 64)}
    start, stepped, prev_actions, prev_rewards = memory["core_state"], [], torch.zeros(5, 3, dtype=torch.long), \
        torch.zeros(5, 3)
    with torch.no_grad():
        for t in range(5):
            prev_actions[t], prev_rewards[t] = memory["prev_action"], memory["prev_reward"]
            pi, value, state = agent.step(obs[t], dones[t], **memory)
            stepped.append((pi, value))
            memory = {"core_state": state, "prev_action": pi.argmax(-1), "prev_reward": torch.randn(3)}
        pi, value, last = agent.unroll(obs, dones, start, prev_actions, prev_rewards)
    assert torch.equal(pi, torch.cat([p for p, _ in stepped])) and torch.equal(value, torch.cat([v for _, v in stepped]))
    assert torch.equal(last, memory["core_state"])
    envs.close()


def test_the_minibatches_are_whole_unrolls_of_the_official_layouts_envs():
    # T = 2, N = 4, M = 2 with the envs shuffled as minibatch_indices shuffles them (seed 0: 0, 1, 3, 2): its first
    # minibatch [0, 4, 1, 5] is env 0's two steps, then env 1's: the envs 0 and 1, each one's whole unroll
    torch.manual_seed(0)
    layout = ppo_ewma_rnn.minibatch_indices(2, 4, 2)
    torch.manual_seed(0)
    envs = ppo_ewma_rnn.minibatch_envs(2, 4, 2)
    assert [inds.tolist() for inds in layout] == [[0, 4, 1, 5], [3, 7, 2, 6]]
    assert [group.tolist() for group in envs] == [[0, 1], [3, 2]]


def rnn_run(tmp_path, monkeypatch, **flags):
    monkeypatch.chdir(tmp_path)
    return ppo_ewma_rnn.train(Args(**dict(TINY_CARTPOLE, total_timesteps=3 * 64, **flags)))


def test_without_the_ewma_it_is_ppo_with_a_recurrent_policy(tmp_path, monkeypatch):
    seen, real_loss = [], ppo_ewma_rnn.decoupled_clip_loss
    monkeypatch.setattr(ppo_ewma_rnn, "decoupled_clip_loss", lambda new, prox, behav, *rest: seen.append(
        torch.equal(prox, behav)) or real_loss(new, prox, behav, *rest))
    rnn_run(tmp_path, monkeypatch, rnn="gru", ewma=False, norm_value=True, exp_name="no_ewma")
    assert seen and all(seen)  # pi_prox is pi_behav: PPO's loss
    seen.clear()
    rnn_run(tmp_path, monkeypatch, rnn="gru", exp_name="ewma")
    assert seen and not all(seen)  # the EWMA network's replayed policy, once it has moved


def test_a_recurrent_model_plays_with_its_memory_reset_at_each_episode(tmp_path, monkeypatch):
    trained = rnn_run(tmp_path, monkeypatch, rnn="lstm", exp_name="played")
    steps, real_step = [], ppo_ewma_rnn.Agent.step

    def spy(self, obs, done, core_state, prev_action, prev_reward):
        steps.append((done.item(), core_state.abs().sum().item(), prev_action.item(), prev_reward.item()))
        return real_step(self, obs, done, core_state, prev_action, prev_reward)
    monkeypatch.setattr(ppo_ewma_rnn.Agent, "step", spy)
    played = ppo_ewma_rnn.train(Args(eval_checkpoint=f"{trained['run_dir']}/model.safetensors", eval_episodes=2,
                                     cuda=False))
    assert len(steps) == sum(played["returns"])  # one env, CartPole's reward 1 a step: a core step per env step
    starts = [i for i, (done, *_) in enumerate(steps) if done == 1.0]
    assert starts == [0, played["returns"][0]]  # done 1 at each episode's first step, which the core zeroes
    inside = [step for i, step in enumerate(steps) if i not in starts]
    assert all(state > 0 and reward == 1.0 for _, state, _, reward in inside)  # the state and the reward carried
    assert {action for _, _, action, _ in inside} == {0, 1}  # and the action the step before took


def test_truncation_bootstraps_from_the_core_state_before_the_reset(tmp_path, monkeypatch):
    # Pendulum truncates at step 200: the bootstrap's one step starts from the state the step before left, fed that
    # step's action and reward, with done 0 (the next step starts from zero state, done 1)
    calls, real_step = [], ppo_ewma_rnn.Agent.step

    def spy(self, obs, done, core_state, prev_action, prev_reward):
        out = real_step(self, obs, done, core_state, prev_action, prev_reward)
        calls.append((len(obs), done.clone(), core_state.clone(), prev_action.clone(), out[2].clone(),
                      torch.is_grad_enabled()))
        return out
    monkeypatch.setattr(ppo_ewma_rnn.Agent, "step", spy)
    monkeypatch.chdir(tmp_path)
    ppo_ewma_rnn.train(Args(env_id="Pendulum-v1", num_envs=1, num_steps=64, num_minibatches=1, update_epochs=1,
                            total_timesteps=256, rnn="lstm", ewma=False, cuda=False, exp_name="truncated"))
    # the acting network's no-grad steps: each rollout step, the bootstrap, and the value of the rollout's last obs.
    # A bootstrap or last value steps from the state the step before left and leaves the memory as it was: the next
    # step starts from that state too. At the truncation (step 200 = iteration 4's step 8) that next step starts an
    # episode (done 1); at a rollout's end (steps 64, 128, 192) it does not
    rollout = [call for call in calls if not call[5]]
    (index,) = [i for i, call in enumerate(rollout[:-1]) if i > 0 and call[1].item() == 0
                and torch.equal(call[2], rollout[i - 1][4]) and torch.equal(rollout[i + 1][2], call[2])
                and rollout[i + 1][1].item() == 1]
    assert torch.equal(rollout[index][3], rollout[index + 1][3])  # this step's action: the one the step before took


class Killed(Exception):
    """Stands for the process being killed."""


@pytest.mark.parametrize("config", [
    {"rnn": "lstm", "norm_value": True},  # the core's memory and the value normalizer's statistics
    {"rnn": "gru", "env_id": "Pendulum-v1", "num_envs": 1, "num_steps": 64, "num_minibatches": 1},  # Box actions
])
def test_resumed_run_logs_what_the_uninterrupted_run_logs(tmp_path, monkeypatch, config):
    """4 iterations. The killed run writes checkpoints every iteration and dies while writing iteration 3's, after
    iteration 3 was logged; resumed from iteration 2's, with each env's core state, last action and reward, it must log
    exactly what an uninterrupted run logs."""
    monkeypatch.chdir(tmp_path)
    config = dict(TINY_CARTPOLE, **config)
    config["total_timesteps"] = 4 * config["num_envs"] * config["num_steps"]
    full = ppo_ewma_rnn.train(Args(exp_name="full", **config))
    real_save = harness.save_checkpoint

    def save_then_die_at_iteration_3(path, checkpoint, dir_fd=None):
        if checkpoint["iteration"] == 3:
            raise Killed
        real_save(path, checkpoint, dir_fd)

    monkeypatch.setattr(harness, "save_checkpoint", save_then_die_at_iteration_3)
    with pytest.raises(Killed):
        ppo_ewma_rnn.train(Args(exp_name="killed", checkpoint_every=1, **config))
    monkeypatch.setattr(harness, "save_checkpoint", real_save)
    (run_dir,) = glob.glob("runs/*__killed__*")
    time.sleep(1 - time.time() % 1)  # to the next second: event files are read in name order, which starts with it
    resumed = ppo_ewma_rnn.train(Args(resume=f"{run_dir}/checkpoint.safetensors", cuda=False))
    assert resumed["global_step"] == full["global_step"] and resumed["mean_return"] == full["mean_return"]
    expected, got = scalars_with_steps(full["run_dir"]), scalars_with_steps(run_dir)
    del expected["charts/SPS"], got["charts/SPS"]
    assert len(got["losses/policy_loss"]) == 4 and got == expected


@pytest.mark.parametrize("change, message", [
    ({"num_minibatches": 4}, r"^--num-minibatches 4 must divide --num-envs 2: each minibatch replays whole env "
                             r"unrolls from their stored states\.$"),  # M > N would cut unrolls into time chunks
    ({"num_envs": 3}, r"^--num-minibatches 2 must divide --num-envs 3"),
    ({"env_id": "user_envs:DictMultiDiscrete-v0"}, r"has MultiDiscrete\(\[2 3\]\) actions; ppo_ewma_rnn\.py needs "
                                                   r"Discrete actions counted from 0, or Box ones\.$"),
])
def test_what_the_replay_cannot_take_is_refused_before_any_work(tmp_path, monkeypatch, change, message):
    import user_envs  # noqa: F401, registers the envs

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit, match=message):
        ppo_ewma_rnn.train(dataclasses.replace(Args(**TINY_CARTPOLE, total_timesteps=64), **change))
    assert not (tmp_path / "runs").exists()
