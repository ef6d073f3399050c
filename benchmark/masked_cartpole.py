"""CartPole-v1 without its two velocities: a task that needs memory, for vmpo.py --lstm (benchmark/vmpo_lstm.sh).

The observation keeps the cart's position and the pole's angle, (x, theta), and drops their velocities, so a policy
of the current observation alone cannot tell which way the pole is falling; a recurrent one can, from two steps.
Everything else is CartPole-v1's: dynamics, reward 1 a step, termination, the 500-step time limit. Importing the
module registers the env, so that a script reaches it as a user's own env (docs/running.md):

    PYTHONPATH=benchmark python vmpo.py --lstm --env-id masked_cartpole:MaskedCartPole-v1 ...
"""
import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

KEPT = [0, 2]  # x and theta of CartPole's (x, x_dot, theta, theta_dot)


class MaskedCartPole(CartPoleEnv):
    def __init__(self, render_mode=None):
        super().__init__(render_mode=render_mode)
        high = self.observation_space.high[KEPT]
        self.observation_space = gym.spaces.Box(-high, high, dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed, options=options)
        return obs[KEPT], info

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return obs[KEPT], reward, terminated, truncated, info


gym.register("MaskedCartPole-v1", entry_point=MaskedCartPole, max_episode_steps=500)
