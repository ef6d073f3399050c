"""Answers a learner might hand in for docs/exercises.md, which tests/test_exercises.py hands in through each
exercise's check, keyed by the exercise's first piece: right answers that order the same float operations otherwise
(each check must pass them; a list where there are several), and wrong ones, each a change to the script's own source
of the exercise's pieces (each check must fail them). The wrong answers marked "issue 79" passed the checks before the
checks compared each piece with the script's own on random inputs (tests/test_exercise_checks.py); those marked
"comparison" passed that comparison (only a hand-worked test, or nothing, caught them) until it was tightened."""

REORDERED = {
    "compute_gae": '''
import torch


def compute_gae(rewards, values, dones, next_value, next_done, gamma, gae_lambda):
    # on float64 tensors, the TD errors first and grouped otherwise
    rewards, values64, dones = rewards.double(), values.double(), dones.double()
    next_values = torch.cat([values64[1:], next_value.double()[None]])
    next_nonterminal = 1.0 - torch.cat([dones[1:], next_done.double()[None]])
    deltas = (rewards - values64) + gamma * (next_nonterminal * next_values)
    advantages = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[0])
    for t in range(len(rewards) - 1, -1, -1):
        running = deltas[t] + (gamma * gae_lambda) * (next_nonterminal[t] * running)
        advantages[t] = running
    advantages = advantages.float()
    return advantages, values + advantages
''',
    "decoupled_clip_loss": '''
import math

import torch


def decoupled_clip_loss(new_logp, prox_logp, behav_logp, advantages, clip_coef, max_is_ratio=100.0):
    prox_logp, behav_logp = prox_logp.detach(), behav_logp.detach()
    behav_logp = torch.where(new_logp.detach() - behav_logp > math.log(max_is_ratio),
                             new_logp.detach() - math.log(max_is_ratio), behav_logp)
    log_ratio = new_logp - prox_logp
    log_clipped = log_ratio.clamp(math.log(1 - clip_coef), math.log(1 + clip_coef))
    unclipped = advantages * torch.exp(log_ratio + (prox_logp - behav_logp))
    clipped = advantages * torch.exp(log_clipped - (behav_logp - prox_logp))
    return -torch.minimum(unclipped, clipped).sum() / len(advantages)
''',
    "update_ewma": '''
import torch


@torch.no_grad()
def update_ewma(ewma_model, model, weight, decay):
    new_weight = decay * weight + 1.0
    for mine, theirs in zip(ewma_model.parameters(), model.parameters()):
        mine.mul_(decay * weight).add_(theirs).div_(new_weight)
    return new_weight


def com_to_decay(com):
    return 1.0 - 1.0 / (1.0 + com)
''',
    "RewardNormalizer": '''
import torch


class RewardNormalizer:
    def __init__(self, num_envs, gamma, clip=10.0):
        self.gamma, self.clip = gamma, clip
        self.returns = torch.zeros(num_envs)
        self.mean, self.var, self.count = 0.0, 1.0, 1e-4

    def __call__(self, rewards, dones, gather=None):
        rollout_returns = []
        for reward, done in zip(rewards, dones):  # on tensors
            self.returns = reward + self.gamma * self.returns * (1.0 - done)
            rollout_returns.append(self.returns)
        flat = torch.stack(rollout_returns).reshape(-1)
        flat = (flat if gather is None else gather(flat)).double()
        n, batch_mean = flat.numel(), flat.mean()
        batch_var = ((flat - batch_mean) ** 2).mean()
        total, delta = self.count + n, batch_mean.item() - self.mean
        self.var = (self.count * self.var + n * batch_var.item()) / total + delta * delta * self.count * n / total**2
        self.mean = (self.count * self.mean + n * batch_mean.item()) / total
        self.count = total
        return (rewards * (self.var + 1e-8) ** -0.5).clamp(-self.clip, self.clip)
''',
    "minibatch_indices": ['''
import torch


def minibatch_indices(num_steps, num_envs, num_minibatches, generator=None):
    envs = torch.randperm(num_envs, generator=generator).tolist()
    minibatches = []
    if num_minibatches <= num_envs:
        per_minibatch = num_envs // num_minibatches
        for i in range(num_minibatches):
            group = envs[i * per_minibatch:(i + 1) * per_minibatch]
            minibatches.append(torch.tensor([t * num_envs + n for n in group for t in range(num_steps)]))
    else:
        chunks = num_minibatches // num_envs
        length = num_steps // chunks
        for n in envs:
            for c in range(chunks):
                minibatches.append(torch.tensor([t * num_envs + n for t in range(c * length, (c + 1) * length)]))
    return minibatches
''', '''
import torch


def minibatch_indices(num_steps, num_envs, num_minibatches, generator=None):
    # one layout for both cases: the [T, N] grid's columns shuffled, read env by env, cut into M equal pieces
    envs = torch.randperm(num_envs, generator=generator)
    grid = torch.arange(num_steps * num_envs).reshape(num_steps, num_envs)
    return list(grid[:, envs].T.reshape(num_minibatches, -1))
''', '''
import torch


def minibatch_indices(num_steps, num_envs, num_minibatches, generator=None):
    # groups of envs, and for each group its trajectories' time chunks (one chunk when M <= N), by tensor_split
    envs = torch.randperm(num_envs, generator=generator).tolist()
    per_minibatch, chunks = max(1, num_envs // num_minibatches), max(1, num_minibatches // num_envs)
    minibatches = []
    for start in range(0, num_envs, per_minibatch):
        for steps in torch.arange(num_steps).tensor_split(chunks):
            minibatches.append(torch.cat([steps * num_envs + n for n in envs[start:start + per_minibatch]]))
    return minibatches
'''],
    "StaleQueue": '''
class StaleQueue:
    def __init__(self, staleness):
        self.staleness = staleness
        self.rollouts = []

    def push(self, rollout):
        self.rollouts.append(rollout)
        if len(self.rollouts) <= self.staleness:
            return None
        return self.rollouts.pop(0)


def select_logps(objective, behav_logp, recent_logp):
    panels = {"recent": (recent_logp, recent_logp), "decoupled": (recent_logp, behav_logp),
              "behavior": (behav_logp, behav_logp)}
    if objective not in panels:
        raise ValueError(f"unknown objective {objective}")
    return panels[objective]
''',
    "aux_loss": '''
import torch
import torch.nn.functional as F


def categorical_kl(logits_p, logits_q):
    p = torch.softmax(logits_p, dim=-1)
    return torch.sum(p * (F.log_softmax(logits_p, dim=-1) - F.log_softmax(logits_q, dim=-1)), dim=-1)


def aux_loss(new_logits, old_logits, aux_values, values, returns, beta_clone):
    value_terms = 0.5 * F.mse_loss(values, returns) + 0.5 * F.mse_loss(aux_values, returns)
    return value_terms + beta_clone * categorical_kl(old_logits.detach(), new_logits).mean()
''',
    "vmpo_e_step": '''
import math

import torch


def vmpo_e_step(advantages, temperature, eps_eta, top_k_fraction=0.5):
    advantages = advantages.detach()
    k = max(1, int(top_k_fraction * len(advantages)))
    kept = torch.sort(advantages, descending=True, stable=True).indices[:k]  # of tied A, other ones than topk's
    scaled = advantages[kept] / temperature
    temperature_loss = temperature * (eps_eta + torch.logsumexp(scaled, 0) - math.log(k))
    weights = torch.zeros_like(advantages).index_put((kept,), torch.softmax(scaled.detach(), 0))
    return weights, temperature_loss
''',
    "gaussian_kl_decoupled": ['''
import torch


def gaussian_kl_decoupled(mean_old, std_old, mean, std):
    kl_mean = 0.5 * (((mean - mean_old) / std_old) ** 2).sum(-1)
    kl_std = 0.5 * ((std_old / std) ** 2 + 2.0 * (torch.log(std) - torch.log(std_old)) - 1.0).sum(-1)
    return kl_mean, kl_std


def vmpo_kl_loss(kl, alpha, eps_alpha):
    return alpha * (eps_alpha - kl.detach()).mean() + alpha.detach() * kl.mean()
''', '''
import torch
from torch.distributions import Normal, kl_divergence


def gaussian_kl_decoupled(mean_old, std_old, mean, std):
    # torch's exact KLs of the two decoupled pairs, per action dim, summed
    old = Normal(mean_old, std_old)
    return kl_divergence(old, Normal(mean, std_old)).sum(-1), kl_divergence(old, Normal(mean_old, std)).sum(-1)


def vmpo_kl_loss(kl, alpha, eps_alpha):
    # alpha eps_alpha taken out of the mean; .item() is a stop-gradient too
    return alpha * eps_alpha - (alpha * kl.detach()).mean() + alpha.item() * kl.mean()
''', '''
import torch


def gaussian_kl_decoupled(mean_old, std_old, mean, std):
    # the std's KL through the variance ratio r = var_old / var: 1/2 (r - 1 - log r)
    ratio = (std_old / std) ** 2
    z = (mean - mean_old) / std_old
    return 0.5 * (z * z).sum(-1), 0.5 * (ratio - 1.0 - torch.log(ratio)).sum(-1)


def vmpo_kl_loss(kl, alpha, eps_alpha):
    # the batch's mean KL first, one stop-gradient on each side of it
    mean_kl = kl.mean()
    return alpha * (eps_alpha - mean_kl.detach()) + alpha.detach() * mean_kl
'''],
    "ReplayMemory": '''
from collections import deque

import torch


class ReplayMemory:
    def __init__(self, num_batches):
        self.batches = deque(maxlen=num_batches)

    def __len__(self):
        return len(self.batches)

    def push(self, batch):
        self.batches.append(batch)

    def data(self):
        num_steps, num_actors = self.batches[0]["advantages"].shape
        rows = len(self) * num_steps * num_actors
        data = {key: torch.stack([batch[key] for batch in self.batches]).reshape(rows, *value.shape[2:])
                for key, value in self.batches[0].items()}
        data["age"] = (len(self) - 1 - torch.arange(len(self))).repeat_interleave(num_steps * num_actors)
        return data

    def minibatch_indices(self, minibatch_size):
        # a randperm per actor, where the script sorts uniform numbers: the same distribution, other draws
        num_steps, num_actors = self.batches[0]["advantages"].shape
        rows, per_actor = len(self) * num_steps, minibatch_size // num_actors
        columns = [torch.randperm(rows) * num_actors + actor for actor in range(num_actors)]
        return [torch.cat([column[i:i + per_actor] for column in columns]) for i in range(0, rows, per_actor)]


def ppo_er_loss(new_logp, behav_logp, advantages, clip_coef):
    ratio = (new_logp - behav_logp.detach()).exp()
    surrogate = torch.where(advantages >= 0, torch.minimum(ratio, torch.tensor(1 + clip_coef)) * advantages,
                            torch.maximum(ratio, torch.tensor(1 - clip_coef)) * advantages)
    return -surrogate.mean()
''',
}

# (what it gets wrong, where it comes from, [(the script's text, the wrong answer's)])
WRONG = {
    "compute_gae": [
        ("the episode boundary forgotten in the recursion", "",
         [("gamma * gae_lambda * next_nonterminals[t] * last_gae",
           "gamma * gae_lambda * last_gae")]),
        ("next_done ignored at the last step", "",
         [("step_dones[1:], next_done.cpu().numpy()[None]",
           "step_dones[1:], 0.0 * next_done.cpu().numpy()[None]")]),
        ("dones[t] in place of dones[t + 1]", "",
         [("np.concatenate([step_dones[1:],",
           "np.concatenate([step_dones[:-1],")]),
    ],
    "decoupled_clip_loss": [
        ("the lower clip 1 / (1 + eps) in place of 1 - eps", "",
         [("math.log(1 - clip_coef)",
           "-math.log(1 + clip_coef)")]),
        ("the cap in the first term only", "",
         [("behav_logp = torch.maximum(behav_logp.detach(), new_logp.detach() - math.log(max_is_ratio))\n"
           "    log_is_ratio = new_logp - behav_logp",
           "capped = torch.maximum(behav_logp.detach(), new_logp.detach() - math.log(max_is_ratio))\n"
           "    behav_logp = behav_logp.detach()\n"
           "    log_is_ratio = new_logp - capped")]),
    ],
    "update_ewma": [
        ("the old average weighted by decay / w_new, without w", "",
         [("ewma_param.mul_(decay * weight / new_weight)",
           "ewma_param.mul_(decay / new_weight)")]),
        ("the centre of mass taken as 1 / (1 - decay)", "",
         [("return com / (com + 1.0)",
           "return 1.0 - 1.0 / max(com, 1.0)")]),
    ],
    "RewardNormalizer": [
        ("the return reset only after a step that ends an episode", "issue 79",
         [("            ret = returns[t] = raw_rewards[t] + self.gamma * (1.0 - raw_dones[t]) * ret\n",
           "            ret = returns[t] = raw_rewards[t] + self.gamma * ret\n"
           "            if t + 1 < len(raw_rewards):\n"
           "                ret = ret * (1.0 - raw_dones[t + 1])\n")]),
        ("the clip from above only", "issue 79",
         [("torch.clamp(rewards / math.sqrt(self.var + 1e-8), -self.clip, self.clip)",
           "torch.clamp(rewards / math.sqrt(self.var + 1e-8), max=self.clip)")]),
        ("Chan's merge with the wrong weight: the prior's count for the running one", "issue 79",
         [("self.var = (self.var * self.count + batch_var * n",
           "self.var = (self.var * 1e-4 + batch_var * n")]),
        ("Chan's merge with the shift's weight count / total for count n / total", "",
         [("delta**2 * self.count * n / total",
           "delta**2 * self.count / total")]),
        ("the epsilon outside the square root", "",
         [("rewards / math.sqrt(self.var + 1e-8)",
           "rewards / (math.sqrt(self.var) + 1e-8)")]),
    ],
    "minibatch_indices": [
        ("time chunks in time order across envs", "",
         [("inds = steps[None, :, None, :] * num_envs + groups[:, None, :, None]",
           "inds = (steps[:, None, None, :] * num_envs + groups[None, :, :, None]).transpose(0, 1).flip(1)"
           ".transpose(0, 1)")]),
        ("each minibatch step by step", "",
         [("inds = steps[None, :, None, :] * num_envs + groups[:, None, :, None]",
           "inds = steps[None, :, :, None] * num_envs + groups[:, None, None, :]")]),
        # torch.randperm draws the same from the global random state as from a generator seeded alike: the comparison
        # seeded both with the same number, so only the hand-worked tests caught this one
        ("the generator ignored", "comparison",
         [("envs = torch.randperm(num_envs, generator=generator)",
           "envs = torch.randperm(num_envs)")]),
        ("one [M, T N / M] tensor, not a list", "comparison",
         [("return list(inds.reshape(num_minibatches, -1))",
           "return inds.reshape(num_minibatches, -1)")]),
        ("a tuple, not a list", "comparison",
         [("return list(inds.reshape(num_minibatches, -1))",
           "return tuple(inds.reshape(num_minibatches, -1))")]),
    ],
    "StaleQueue": [
        ("one rollout too few held back", "",
         [("if len(self.rollouts) > self.staleness",
           "if len(self.rollouts) >= self.staleness")]),
        ("decoupled clipping by the behaviour policy and sampling by the recent one", "",
         [('    if objective == "decoupled":\n        return recent_logp, behav_logp',
           '    if objective == "decoupled":\n        return behav_logp, recent_logp')]),
    ],
    "aux_loss": [
        ("aux_values detached", "issue 79",
         [("((aux_values - returns) ** 2)",
           "((aux_values.detach() - returns) ** 2)")]),
        ("values detached", "issue 79",
         [("((values - returns) ** 2)",
           "((values.detach() - returns) ** 2)")]),
        ("log(p + 1e-8) in the KL", "issue 79",
         [("log_p, log_q = torch.log_softmax(logits_p, -1), torch.log_softmax(logits_q, -1)",
           "log_p = torch.log(torch.softmax(logits_p, -1) + 1e-8)\n"
           "    log_q = torch.log(torch.softmax(logits_q, -1) + 1e-8)")]),
        ("both value terms detached", "issue 79",
         [("((aux_values - returns) ** 2)",
           "((aux_values.detach() - returns) ** 2)"),
          ("((values - returns) ** 2)",
           "((values.detach() - returns) ** 2)")]),
    ],
    "vmpo_e_step": [
        ("the top half chosen by |A|", "issue 79",
         [("top_advantages, top_inds = torch.topk(advantages, k)",
           "top_inds = torch.topk(advantages.abs(), k).indices\n"
           "    top_advantages = advantages[top_inds]")]),
        ("the dropped samples masked with -1e4", "issue 79",
         [("    weights = torch.zeros_like(advantages)\n"
           "    weights[top_inds] = torch.softmax(scaled.detach(), dim=0)",
           "    masked = torch.full_like(advantages, -1e4)\n"
           "    masked[top_inds] = top_advantages\n"
           "    weights = torch.softmax(masked / temperature.detach(), dim=0)")]),
        ("k rounded, not truncated", "",
         [("k = max(1, int(top_k_fraction * advantages.numel()))",
           "k = max(1, round(top_k_fraction * advantages.numel()))")]),
    ],
    "gaussian_kl_decoupled": [
        ("the mean's KL over the new variance", "",
         [("kl_mean = 0.5 * ((mean - mean_old) ** 2 / var_old).sum(-1)",
           "kl_mean = 0.5 * ((mean - mean_old) ** 2 / var).sum(-1)")]),
        ("the KL reaching alpha's term with its gradient", "",
         [("(alpha * (eps_alpha - kl.detach())).mean()",
           "(alpha * (eps_alpha - kl)).mean()")]),
        # the hand-worked test's first std pair is a permutation of the other, where both directions agree
        ("the std's KL the other way round, KL[N(mu_old, S) || N(mu_old, S_old)]", "",
         [("kl_std = 0.5 * (var_old / var - 1.0 + torch.log(var / var_old)).sum(-1)",
           "kl_std = 0.5 * (var / var_old - 1.0 + torch.log(var_old / var)).sum(-1)")]),
        # the loss's value is alpha eps_alpha either way: only the gradients tell
        ("the two stop-gradients swapped", "",
         [("return (alpha * (eps_alpha - kl.detach())).mean() + (alpha.detach() * kl).mean()",
           "return (alpha.detach() * (eps_alpha - kl)).mean() + (alpha * kl.detach()).mean()")]),
    ],
    "ReplayMemory": [
        ("one shuffle for every actor", "",
         [("torch.argsort(torch.rand(rows, num_envs, device=device), dim=0)",
           "torch.argsort(torch.rand(rows, 1, device=device), dim=0).expand(-1, num_envs)")]),
        ("age 0 for the oldest batch", "",
         [('ages = torch.arange(len(self) - 1, -1, -1, device=data["advantages"].device)',
           'ages = torch.arange(len(self), device=data["advantages"].device)')]),
        ("the clipped ratio detached", "",
         [("torch.clamp(ratio, 1 - clip_coef, 1 + clip_coef) * advantages",
           "torch.clamp(ratio, 1 - clip_coef, 1 + clip_coef).detach() * advantages")]),
    ],
}
