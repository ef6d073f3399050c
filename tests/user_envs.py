"""A user's own envs, as docs/running.md shows them: importing this module registers them, so that
`--env-id user_envs:DictMultiDiscrete-v0` reaches them through gym.make (the project never registers them itself).

- DictMultiDiscrete-v0: Dict observations {"velocity": Box(3), "position": Box(2)}, MultiDiscrete([2, 3]) actions;
  reward 1 when the action is (1, 2), else 0; 16 steps an episode.
- Grid2D-v0: a 2x3 Box observation (a tiny grid), Discrete(2) actions; reward 1 for action 1; 16 steps an episode.
"""
import gymnasium as gym
import numpy as np


class DictMultiDiscrete(gym.Env):
    observation_space = gym.spaces.Dict({"velocity": gym.spaces.Box(-1.0, 1.0, (3,), np.float32),
                                         "position": gym.spaces.Box(-1.0, 1.0, (2,), np.float32)})
    action_space = gym.spaces.MultiDiscrete([2, 3])

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self._obs(), {}

    def _obs(self):
        return {"velocity": self.np_random.uniform(-1, 1, 3).astype(np.float32),
                "position": self.np_random.uniform(-1, 1, 2).astype(np.float32)}

    def step(self, action):
        return self._obs(), float(action[0] == 1 and action[1] == 2), False, False, {}


class Grid2D(gym.Env):
    observation_space = gym.spaces.Box(0.0, 1.0, (2, 3), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.np_random.uniform(0, 1, (2, 3)).astype(np.float32), {}

    def step(self, action):
        return self.np_random.uniform(0, 1, (2, 3)).astype(np.float32), float(action == 1), False, False, {}


gym.register("DictMultiDiscrete-v0", entry_point=DictMultiDiscrete, max_episode_steps=16)
gym.register("Grid2D-v0", entry_point=Grid2D, max_episode_steps=16)
