"""How far ppo_ewma_rnn.py's pi_prox is from the one an EWMA network with a state of its own would give.

ppo_ewma_rnn.py replays the EWMA network (theta_prox) over each minibatch's unrolls from the behaviour network's
stored states: the EWMA network never acts, so it has no state of its own at a rollout's start. The alternative is to
carry its own state through every rollout (one more forward pass per env step). This script takes a
checkpoint's two networks, plays `--rollouts` rollouts with the behaviour network acting, carries the EWMA network's
own state alongside, and on the last rollout compares the EWMA policy replayed from the behaviour's stored state with
the one from its own carried state: KL between them and the largest change of an action's probability ratio, next
to the KL between pi_prox and pi_behav that the update sees (the size the clip works on).

    PYTHONPATH=.:benchmark python benchmark/prox_state.py \
        runs/masked_cartpole-MaskedCartPole-v1__lstm__1__.../checkpoint.safetensors
"""
import argparse
import dataclasses

import torch

import checkpoints
import ppo_ewma_rnn


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("checkpoint")
    parser.add_argument("--rollouts", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1_000)
    flags = parser.parse_args()
    checkpoint = checkpoints.read(flags.checkpoint, "checkpoint", ppo_ewma_rnn.SCRIPT, kinds=("checkpoint",))
    args = checkpoints.checkpoint_args(checkpoint, ppo_ewma_rnn.SCRIPT, flags.checkpoint)
    args = dataclasses.replace(args, seed=flags.seed)
    envs = ppo_ewma_rnn.make_env(args)
    behaviour, ewma = (ppo_ewma_rnn.Agent(envs, rnn=args.rnn) for _ in range(2))
    for network, name in ((behaviour, "agent"), (ewma, "ewma_agent")):
        checkpoints.load_weights(network, checkpoint["models"], name, flags.checkpoint)
    torch.manual_seed(flags.seed)
    obs, _ = envs.reset(seed=flags.seed)
    obs, done = torch.as_tensor(obs), torch.ones(args.num_envs)
    memory, own = behaviour.core.initial_memory(args.num_envs), behaviour.core.initial_memory(args.num_envs)
    with torch.no_grad():
        for rollout in range(flags.rollouts):
            start, stored, carried, behav_pis, actions = memory["core_state"], [], [], [], []
            for step in range(args.num_steps):
                stored.append((obs, done, memory["prev_action"], memory["prev_reward"]))
                pi, _, state = behaviour.step(obs, done, **memory)
                own_pi, _, own_state = ewma.step(obs, done, **own)  # the EWMA network's own state, carried
                action = ppo_ewma_rnn.sample_actions(pi, behaviour.continuous)
                next_obs, reward, terminated, truncated, _ = envs.step(action.numpy())
                reward = torch.as_tensor(reward, dtype=torch.float32)
                memory = {"core_state": state, "prev_action": action, "prev_reward": reward}
                own = {"core_state": own_state, "prev_action": action, "prev_reward": reward}
                carried.append(own_pi)
                behav_pis.append(pi)
                actions.append(action)
                obs, done = torch.as_tensor(next_obs), torch.as_tensor(terminated | truncated, dtype=torch.float32)
        obs_t, dones_t, actions_t, rewards_t = (torch.stack(inputs) for inputs in zip(*stored))  # [T, N] each
        replayed = ewma.unroll(obs_t, dones_t, start, actions_t, rewards_t)[0]  # ppo_ewma_rnn.py's pi_prox
    carried, behav, actions = torch.cat(carried), torch.cat(behav_pis), torch.cat(actions)
    logp = lambda pi: ppo_ewma_rnn.policy_log_prob_and_entropy(pi, actions)[0]  # noqa: E731
    kl = ppo_ewma_rnn.policy_kl(carried, replayed)
    ratio_change = (logp(replayed) - logp(carried)).exp().sub(1).abs()
    print(f"{flags.checkpoint}: the last of {flags.rollouts} rollouts, {len(actions)} samples")
    print(f"KL[pi_prox carried || pi_prox replayed]: mean {kl.mean():.2e}, max {kl.max():.2e}")
    print(f"|pi_prox replayed / pi_prox carried - 1| of the action taken: mean {ratio_change.mean():.2e}, "
          f"max {ratio_change.max():.2e} (the clip's eps: {args.clip_coef})")
    print(f"KL[pi_prox carried || pi_behav], for scale: mean {ppo_ewma_rnn.policy_kl(carried, behav).mean():.2e}")


if __name__ == "__main__":
    main()
