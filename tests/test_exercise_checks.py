"""docs/exercises.md: besides the hand-worked tests, which teach with a few numbers, each exercise's check holds the
piece under test (the student's, under --impl) to the script's own on many random inputs: every output, and the
gradient to every input the algorithm differentiates, across the branches the piece has. Small cases come first, so
that the first difference a student sees is one that can be worked by hand.

The script's own piece comes from a fresh copy of the script, loaded from its file under another module name: --impl
replaces names in the imported scripts, and a script's function calls the others through its module's globals (PPG's
aux_loss calls categorical_kl), so only a copy of its own is still the script's everywhere. Without --impl both sides
are the script's, and every test here passes. The tests take no fixtures: tests/test_exercises.py calls them directly
with answers put in place.

Tolerance: another order of the same float32 operations is a right answer. It moves a result by a few ulps (1.2e-7)
of the largest number the result passes through, so each comparison allows 1e-5 of that size (about 80 ulps), sized
per case from its inputs; the mistakes the comparison is there for move results by far more (tests/exercise_answers.py
holds such mistakes, and right answers in another order; tests/test_exercises.py checks that each fails or passes)."""
import copy
import functools
import importlib
import importlib.util
import math
import os

import torch
import torch.nn as nn

from conftest import SCRIPTS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EPS = 1e-5  # allowed error, as a fraction of the size of the numbers a result passes through


@functools.cache
def own_copy(script):
    spec = importlib.util.spec_from_file_location(f"own_{script}", os.path.join(ROOT, f"{script}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def pieces(name):
    """[(script, the piece under test, the script's own)] for each script that has `name`."""
    found = [(script, getattr(importlib.import_module(script), name), getattr(own_copy(script), name))
             for script in SCRIPTS if hasattr(importlib.import_module(script), name)]
    assert found, f"no script has {name}"
    return found


def rounded(values, digits):
    """A tensor's numbers as nested lists, each to `digits` significant digits."""
    if isinstance(values, list):
        return [rounded(value, digits) for value in values]
    return float(f"{values:.{digits}g}") if isinstance(values, float) else values


def shown(value):
    """A case's input as a learner can redo it by hand: small tensors in full (to 4 digits), large ones by shape."""
    if isinstance(value, torch.Tensor):
        return f"tensor({rounded(value.tolist(), 4)})" if value.numel() <= 12 else f"a {list(value.shape)} tensor"
    return repr(value)


def case_of(inputs):
    return ", ".join(f"{name}={shown(value)}" for name, value in inputs.items())


def assert_close(what, tested, own, atol, case, rtol=EPS):
    """tested within atol + rtol |own| of own, elementwise (atol a number or a tensor of own's shape); equal
    infinities and NaN where the script's is NaN count as equal."""
    where = f"{what} differs from the script's own for {case}"
    if not isinstance(own, torch.Tensor):
        tested = tested.item() if isinstance(tested, torch.Tensor) and tested.numel() == 1 else tested
        assert isinstance(tested, (int, float)), f"{where}: yours is {tested!r}, the script's the number {own!r}"
        assert tested == own or abs(tested - own) <= atol + rtol * abs(own), \
            f"{where}: yours {tested!r}, the script's {own!r} (allowed difference {atol + rtol * abs(own):.3g})"
        return
    assert isinstance(tested, torch.Tensor), f"{where}: yours is {type(tested).__name__}, the script's a tensor"
    assert tested.shape == own.shape and tested.dtype == own.dtype, \
        f"{where}: yours is {tested.dtype} of shape {list(tested.shape)}, the script's {own.dtype} {list(own.shape)}"
    tested, own = tested.detach().double(), own.detach().double()
    allowed = atol + rtol * own.abs()
    good = (tested == own) | ((tested - own).abs() <= allowed) | (tested.isnan() & own.isnan())
    if not good.all():
        index = tuple((~good).nonzero()[0].tolist())
        values = (f"yours {rounded(tested.tolist(), 7)}, the script's {rounded(own.tolist(), 7)}"
                  if own.numel() <= 12 else
                  f"at {list(index)} yours {tested[index].item():.7g}, the script's {own[index].item():.7g}")
        allowed_there = allowed if isinstance(allowed, float) else allowed.expand_as(own)[index].item()
        raise AssertionError(f"{where}: {values} (allowed difference {allowed_there:.3g})")


def run(piece, inputs, differentiated=(), stopped=()):
    """piece(*inputs) on fresh copies of the inputs, the tensors named in `differentiated` (the algorithm sends them a
    gradient) and `stopped` (the contract says none reaches them) as leaves that require grad (an nn.Parameter stays
    one). Returns (outputs as a tuple, {name: gradient of sum(c * output) over the outputs that carry a gradient, c
    fixed random numbers, zeros where none arrived})."""
    def fresh(name, value):
        if not isinstance(value, torch.Tensor):
            return value
        if isinstance(value, nn.Parameter):
            return nn.Parameter(value.detach().clone())
        return value.detach().clone().requires_grad_(name in differentiated or name in stopped)
    args = {name: fresh(name, value) for name, value in inputs.items()}
    result = piece(*args.values())
    outputs = result if isinstance(result, tuple) else (result,)
    generator = torch.Generator().manual_seed(0)
    weights = [torch.randn(output.shape, generator=generator) if isinstance(output, torch.Tensor) else None
               for output in outputs]
    terms = [(weight * output).sum() for weight, output in zip(weights, outputs)
             if isinstance(output, torch.Tensor) and output.requires_grad]
    if terms:
        sum(terms).backward()
    return outputs, {name: torch.zeros_like(args[name]) if args[name].grad is None else args[name].grad
                     for name in (*differentiated, *stopped)}


def compare(name, cases, differentiated=(), stopped=(), tolerances=None):
    """Each case (a dict of inputs, in the signature's order) through every script's `name`: the outputs and the
    gradients equal the script's own within tolerances(inputs, own outputs, own gradients) -> (output atols,
    {input: gradient atol})."""
    for script, tested, own in pieces(name):
        for inputs in cases:
            case = case_of(inputs)
            own_outputs, own_grads = run(own, inputs, differentiated, stopped)
            tested_outputs, tested_grads = run(tested, inputs, differentiated, stopped)
            output_atols, grad_atols = tolerances(inputs, own_outputs, own_grads)
            assert len(tested_outputs) == len(own_outputs), \
                f"{script}.{name} returns {len(own_outputs)} values; yours {len(tested_outputs)}, for {case}"
            for number, (tested_output, own_output, atol) in enumerate(zip(tested_outputs, own_outputs, output_atols)):
                what = f"{script}.{name}'s output {number}" if len(own_outputs) > 1 else f"{script}.{name}"
                assert_close(what, tested_output, own_output, atol, case)
                assert tested_output.requires_grad == own_output.requires_grad, \
                    f"{what} {'carries' if tested_output.requires_grad else 'carries no'} gradient, the script's " \
                    f"{'does' if own_output.requires_grad else 'does not'}, for {case}"
            for input_name in (*differentiated, *stopped):
                what = f"{script}.{name}: the gradient to {input_name}"
                assert_close(what, tested_grads[input_name], own_grads[input_name],
                             grad_atols.get(input_name, 0.0), case)


def biggest(*tensors):
    return max(tensor.detach().abs().max().item() for tensor in tensors)


# ------------------------------------------------------------------------------------- 1. compute_gae
def gae_cases():
    generator = torch.Generator().manual_seed(1)
    cases = []
    for num_steps, num_envs in ((1, 1), (2, 3), (4, 2), (5, 4), (16, 3), (33, 8)):
        for gamma, gae_lambda in ((0.99, 0.95), (1.0, 1.0), (0.9, 0.0), (0.5, 1.0), (0.0, 0.7)):
            scale = 30.0 if len(cases) % 3 == 2 else 1.0
            dones = (torch.rand(num_steps, num_envs, generator=generator) < 0.3).float()
            next_done = (torch.rand(num_envs, generator=generator) < 0.5).float()
            # an episode that starts at the rollout's first obs, one that runs through it, and both at the last step
            dones[0, 0], dones[0, -1] = 1.0, 0.0 if num_envs > 1 else 1.0
            next_done[0], next_done[-1] = 1.0, 0.0 if num_envs > 1 else 1.0
            cases.append({"rewards": torch.randn(num_steps, num_envs, generator=generator) * scale,
                          "values": torch.randn(num_steps, num_envs, generator=generator) * scale,
                          "dones": dones, "next_value": torch.randn(num_envs, generator=generator) * scale,
                          "next_done": next_done, "gamma": gamma, "gae_lambda": gae_lambda})
    return cases


def gae_tolerances(inputs, own_outputs, own_grads):
    # each TD error is at most |r| + (1 + gamma) |V|, and the advantage sums them over gamma lambda's horizon
    decay, steps = inputs["gamma"] * inputs["gae_lambda"], len(inputs["rewards"])
    horizon = steps if decay == 1.0 else min(steps, 1.0 / (1.0 - decay))
    size = biggest(inputs["rewards"]) + (1.0 + inputs["gamma"]) * biggest(inputs["values"], inputs["next_value"])
    return (EPS * size * horizon, EPS * size * horizon + EPS * biggest(inputs["values"])), {}


def test_compute_gae_equals_the_scripts_own_on_random_rollouts():
    # GAE takes tensors without gradient (its loop runs on NumPy copies in the scripts), so only values are compared
    compare("compute_gae", gae_cases(), tolerances=gae_tolerances)


# ----------------------------------------------------------------------------- 2. decoupled_clip_loss
def clip_loss_cases():
    generator = torch.Generator().manual_seed(2)
    cases = []
    for batch in (1, 4, 64):
        for spread, clip_coef, max_is_ratio in ((0.05, 0.2, 100.0), (0.5, 0.1, 2.0), (3.0, 0.3, 1.2), (0.5, 0.2, 1e4)):
            behav_logp = -5.0 * torch.rand(batch, generator=generator)
            prox_logp = behav_logp + 0.5 * spread * torch.randn(batch, generator=generator)
            new_logp = prox_logp + spread * torch.randn(batch, generator=generator)
            advantages = torch.randn(batch, generator=generator) * (10.0 if batch == 64 else 1.0)
            cases.append({"new_logp": new_logp, "prox_logp": prox_logp, "behav_logp": behav_logp,
                          "advantages": advantages, "clip_coef": clip_coef, "max_is_ratio": max_is_ratio})
            # prox == behav is PPO's loss
            cases.append({**cases[-1], "prox_logp": behav_logp})
    # r alone would overflow: pi/pi_prox = e^100 against a tiny pi_prox/pi_behav
    cases.append({"new_logp": torch.tensor([-1.0, -2.0, -50.0]), "prox_logp": torch.tensor([-101.0, -102.0, -1.0]),
                  "behav_logp": torch.tensor([-1.5, -2.0, -49.0]), "advantages": torch.tensor([1.0, -2.0, 0.5]),
                  "clip_coef": 0.2, "max_is_ratio": 100.0})
    return cases


def clip_loss_tolerances(inputs, own_outputs, own_grads):
    # each sample's two terms, whose exponents (sums of log-probabilities) are off by ulps of the log-probabilities
    new_logp, prox_logp, behav_logp, advantages = (inputs[name].double() for name in (
        "new_logp", "prox_logp", "behav_logp", "advantages"))
    behav_logp = torch.maximum(behav_logp, new_logp - math.log(inputs["max_is_ratio"]))
    terms = torch.maximum((new_logp - behav_logp).exp(), (1 + inputs["clip_coef"]) * (prox_logp - behav_logp).exp())
    size = terms * advantages.abs() * (1.0 + torch.stack([new_logp, prox_logp, behav_logp]).abs().max(0).values)
    return (EPS * size.mean().item(),), {"new_logp": EPS * size / len(size)}


def test_decoupled_clip_loss_equals_the_scripts_own_on_random_batches():
    cases = clip_loss_cases()
    # the cases reach each branch: the cap, and r clipped above with A > 0 and below with A < 0
    def reached(branch):
        return any(branch(case["new_logp"] - case["prox_logp"], case["advantages"], case).any() for case in cases)
    assert reached(lambda r, a, case: case["new_logp"] - case["behav_logp"] > math.log(case["max_is_ratio"]))
    assert reached(lambda r, a, case: (r > math.log(1 + case["clip_coef"])) & (a > 0))
    assert reached(lambda r, a, case: (r < math.log(1 - case["clip_coef"])) & (a < 0))
    compare("decoupled_clip_loss", cases, differentiated=("new_logp",), stopped=("prox_logp", "behav_logp"),
            tolerances=clip_loss_tolerances)


# -------------------------------------------------------------------------------- 3. update_ewma, com_to_decay
def test_update_ewma_equals_the_scripts_own_over_a_sequence_of_updates():
    # theta moves between updates; the decays include 0 (a reset to a copy), and the total weight is carried from call
    # to call as train() carries it, from 1 (and from 0, PPG's reset before an auxiliary phase)
    for script, tested, own in pieces("update_ewma"):
        torch.manual_seed(3)
        model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
        ewma = {"yours": copy.deepcopy(model), "own": copy.deepcopy(model)}  # theta_prox starts at theta, as in train()
        weights = {"yours": 1.0, "own": 1.0}
        for step, decay in enumerate((0.9, 0.9, 0.5, 0.0, 0.99, 0.99, 0.7, 0.0, 0.3)):
            with torch.no_grad():
                for param in model.parameters():
                    param.add_(torch.randn_like(param) * (3.0 if step == 4 else 0.5))
            if step == 7:
                weights = {"yours": 0.0, "own": 0.0}
            before = [param.detach().clone() for param in model.parameters()]
            params = {side: list(ewma[side].parameters()) for side in ewma}
            case = f"update {step + 1} of a sequence (decay {decay}, weight before it {weights['own']})"
            weights = {"yours": tested(ewma["yours"], model, weights["yours"], decay),
                       "own": own(ewma["own"], model, weights["own"], decay)}
            assert_close(f"{script}.update_ewma's returned weight", weights["yours"], weights["own"], 0.0, case,
                         rtol=1e-6)
            weights["yours"] = float(weights["yours"])
            assert all(a is b for a, b in zip(params["yours"], ewma["yours"].parameters())), \
                f"{script}.update_ewma: the EWMA model's parameters are new objects; update them in place ({case})"
            for number, (tested_param, own_param) in enumerate(zip(ewma["yours"].parameters(),
                                                                   ewma["own"].parameters())):
                assert_close(f"{script}.update_ewma: EWMA parameter {number}", tested_param, own_param,
                             EPS * biggest(own_param, *model.parameters()), case)
                assert tested_param.requires_grad and tested_param.grad is None, \
                    f"{script}.update_ewma: EWMA parameter {number} no longer a leaf that requires grad ({case})"
            for param, old in zip(model.parameters(), before):
                assert torch.equal(param, old), f"{script}.update_ewma changed the model's own parameters ({case})"


def test_com_to_decay_equals_the_scripts_own():
    for script, tested, own in pieces("com_to_decay"):
        for com in (0.0, 1e-3, 0.5, 1.0, 3.0, 7.5, 31.0, 1e3, 1e6):
            assert_close(f"{script}.com_to_decay", tested(com), own(com), 1e-12, f"com={com}", rtol=1e-9)


# ------------------------------------------------------------------------------------ 4. RewardNormalizer
def reward_rollouts(num_envs, generator, scale, offset, rollouts=5):
    """Rollouts of [T, N] rewards of both signs, with spikes that the clip cuts on both sides, and episode starts at a
    rollout's first obs (after a rollout before it) and later."""
    found = []
    for number in range(rollouts):
        steps = (1, 5, 16, 3, 8)[number % 5]
        rewards = torch.randn(steps, num_envs, generator=generator) * (1.0 + 4.0 * (number % 2))
        spikes = torch.rand(steps, num_envs, generator=generator) < 0.1
        rewards = torch.where(spikes, 40.0 * torch.sign(torch.randn(steps, num_envs, generator=generator)), rewards)
        dones = (torch.rand(steps, num_envs, generator=generator) < 0.2).float()
        dones[0, number % num_envs] = 1.0
        found.append((offset + scale * rewards, dones))
    return found


def test_reward_normalizer_equals_the_scripts_own_over_sequences_of_rollouts():
    generator = torch.Generator().manual_seed(4)
    setups = [(1, 0.99, 10.0, 1.0, 0.0), (3, 0.99, 1.0, 1.0, 0.0), (4, 0.5, 0.5, 1.0, 0.0), (8, 0.9, 2.0, 1.0, 0.0),
              (2, 0.0, 5.0, 1.0, 0.0),
              (4, 0.99, 10.0, 1e-3, 0.0),  # tiny returns, whose variance the 1e-8 inside the square root moves
              (8, 0.0, 10.0, 1e-3, 1000.0)]  # returns far from 0 for their spread: E[R^2] - E[R]^2 loses it
    hit_both_clips = False
    for script, tested, own in pieces("RewardNormalizer"):
        for num_envs, gamma, clip, scale, offset in setups:
            yours, ours = tested(num_envs, gamma, clip), own(num_envs, gamma, clip)
            other_workers = offset + scale * torch.randn(7, generator=generator) * 3.0  # a gather adds other workers'
            for number, (rewards, dones) in enumerate(reward_rollouts(num_envs, generator, scale, offset)):
                case = (f"RewardNormalizer({num_envs}, {gamma}, {clip}), call {number + 1} of a sequence with "
                        f"rewards={shown(rewards)}, dones={shown(dones)}" + (", and a gather" if number % 2 else ""))
                gathered, mean_before, count_before = {}, ours.mean, ours.count

                def gather_for(side):  # as torchrun's: this worker's returns, then other workers'
                    def gather(returns):
                        gathered[side] = returns
                        return torch.cat([returns, other_workers])
                    return gather if number % 2 else None
                scaled, own_scaled = yours(rewards.clone(), dones.clone(), gather_for("yours")), \
                    ours(rewards.clone(), dones.clone(), gather_for("own"))
                hit_both_clips = hit_both_clips or (own_scaled.max() == clip and own_scaled.min() == -clip)
                if number % 2:
                    assert "yours" in gathered, f"{script}.RewardNormalizer did not call gather, for {case}"
                    # the order of the returns (t * N + n) does not change the statistics: compared sorted
                    assert_close(f"{script}.RewardNormalizer: the returns given to gather",
                                 gathered["yours"].sort().values, gathered["own"].sort().values,
                                 EPS * biggest(ours.returns, gathered["own"]), case)
                # the moments: float32 returns of this size, whose mean is off by ulps of it; the variance by that
                # times the spread and the batch mean's distance from the estimate's (Chan's delta)
                size = biggest(gathered.get("own", ours.returns), ours.returns)
                delta = (ours.mean - mean_before) * ours.count / (ours.count - count_before)
                assert_close(f"{script}.RewardNormalizer's scaled rewards", scaled, own_scaled, 0.0, case)
                assert_close(f"{script}.RewardNormalizer.returns", yours.returns, ours.returns,
                             EPS * biggest(ours.returns, rewards) / max(1.0 - gamma, 0.01), case)
                assert_close(f"{script}.RewardNormalizer.mean", yours.mean, ours.mean, EPS * size, case)
                assert_close(f"{script}.RewardNormalizer.var", yours.var, ours.var,
                             EPS * size * (math.sqrt(ours.var) + abs(delta)), case)
                assert_close(f"{script}.RewardNormalizer.count", yours.count, ours.count, 0.0, case, rtol=1e-6)
    assert hit_both_clips  # the cases reach both sides of the clip


# ---------------------------------------------------------------------------------- 5. minibatch_indices
def test_minibatch_indices_equals_the_scripts_own_with_the_same_random_numbers():
    # the envs are permuted by torch.randperm(num_envs, generator=generator): the same generator (or the same global
    # seed) gives the same minibatches, twice in a row as in two epochs. With a generator the global random state is
    # seeded otherwise, so that an answer that ignores the generator draws other envs (randperm draws the same from a
    # generator and from the global state seeded alike)
    layouts = [(3, 4, 1), (5, 4, 2), (2, 4, 4), (4, 8, 2), (6, 6, 3), (1, 5, 5),  # M <= N
               (4, 2, 4), (6, 2, 6), (8, 4, 8), (6, 3, 6), (4, 1, 4), (12, 2, 8)]  # M > N: time chunks
    for script, tested, own in pieces("minibatch_indices"):
        for num_steps, num_envs, num_minibatches in layouts:
            for seed in (0, 1, 2):
                for global_rng in (False, True):
                    drawn = {}
                    for side, piece in (("yours", tested), ("own", own)):
                        torch.manual_seed(seed if global_rng else 1000 + seed)
                        generator = None if global_rng else torch.Generator().manual_seed(seed)
                        drawn[side] = [piece(num_steps, num_envs, num_minibatches, generator) for _ in range(2)]
                    case = (f"num_steps={num_steps}, num_envs={num_envs}, num_minibatches={num_minibatches}, "
                            + (f"no generator after torch.manual_seed({seed})" if global_rng else
                               f"torch.Generator().manual_seed({seed}) after torch.manual_seed({1000 + seed})"))
                    for epoch in range(2):
                        yours, ours = drawn["yours"][epoch], drawn["own"][epoch]
                        assert isinstance(yours, list), \
                            f"{script}.minibatch_indices returns a list of {len(ours)} index tensors; yours is " \
                            f"{type(yours).__name__}, for {case}"
                        assert len(yours) == len(ours) and all(
                            isinstance(a, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
                            for a, b in zip(yours, ours)), \
                            f"{script}.minibatch_indices differs from the script's own in call {epoch + 1} for " \
                            f"{case}: yours {[a.tolist() if isinstance(a, torch.Tensor) else a for a in yours]}, " \
                            f"the script's {[b.tolist() for b in ours]}"


# ------------------------------------------------------------------------------ 6. StaleQueue, select_logps
def test_stale_queue_equals_the_scripts_own_over_a_sequence_of_pushes():
    for script, tested, own in pieces("StaleQueue"):
        for staleness in (0, 1, 2, 3):
            yours, ours = tested(staleness), own(staleness)
            rollouts = [object() for _ in range(8)]

            def which(rollout):
                pushed = [number for number, each in enumerate(rollouts) if each is rollout]
                return f"push {pushed[0] + 1}'s rollout" if pushed else repr(rollout)
            for number, rollout in enumerate(rollouts):
                case = f"StaleQueue({staleness}), push {number + 1} of a sequence"
                got, expected = yours.push(rollout), ours.push(rollout)
                assert got is expected, \
                    f"{script}.StaleQueue.push returns {which(got)}, the script's {which(expected)} ({case})"
                assert list(yours.rollouts) == list(ours.rollouts), \
                    f"{script}.StaleQueue.rollouts holds {len(yours.rollouts)} rollouts, the script's " \
                    f"{len(ours.rollouts)} ({case})"


def test_select_logps_equals_the_scripts_own():
    generator = torch.Generator().manual_seed(6)
    for script, tested, own in pieces("select_logps"):
        behav_logp, recent_logp = -torch.rand(5, generator=generator), -torch.rand(5, generator=generator)
        for objective in ("recent", "decoupled", "behavior", "old", "Recent"):
            case = f'objective "{objective}", behav_logp={shown(behav_logp)}, recent_logp={shown(recent_logp)}'
            results = {}
            for side, piece in (("yours", tested), ("own", own)):
                try:
                    results[side] = piece(objective, behav_logp, recent_logp)
                except ValueError as error:
                    results[side] = error
            if isinstance(results["own"], ValueError):
                assert isinstance(results["yours"], ValueError) and str(results["yours"]).startswith(
                    "unknown objective"), f"{script}.select_logps raises ValueError('unknown objective ...') for " \
                                          f"{case}; yours gives {results['yours']!r}"
                continue
            assert isinstance(results["yours"], tuple) and len(results["yours"]) == 2, \
                f"{script}.select_logps returns (prox_logp, is_logp); yours {results['yours']!r} for {case}"
            for what, tested_logp, own_logp in zip(("prox_logp", "is_logp"), results["yours"], results["own"]):
                assert_close(f"{script}.select_logps' {what}", tested_logp, own_logp, 0.0, case, rtol=0.0)


# --------------------------------------------------------------------------------- 7. aux_loss, categorical_kl
def logits_cases(seed):
    """(logits_p, logits_q) pairs: mild, peaked (log-probabilities near -30) and the issue's near-certain old policy."""
    generator = torch.Generator().manual_seed(seed)
    cases = [(torch.tensor([[0.0, 0.0]]), torch.tensor([[0.0, -30.0]])),
             (torch.tensor([[0.0, -30.0]]), torch.tensor([[0.0, 0.0]]))]
    for batch, actions, scale in ((1, 2, 1.0), (3, 3, 0.5), (5, 4, 5.0), (8, 15, 15.0), (32, 6, 3.0)):
        cases.append(tuple((torch.randn(batch, actions, generator=generator) * scale).clamp(-40.0, 40.0)
                           for _ in range(2)))
    return cases


def logits_size(*logits):
    """How far apart a row's logits are: the log-probabilities a KL passes through are that large."""
    return 1.0 + max((row.max(-1).values - row.min(-1).values).max().item() for row in logits)


def test_categorical_kl_equals_the_scripts_own():
    cases = [{"logits_p": p, "logits_q": q} for p, q in logits_cases(7)]

    def tolerances(inputs, own_outputs, own_grads):
        size = logits_size(inputs["logits_p"], inputs["logits_q"])
        return (EPS * size,), {"logits_p": EPS * size, "logits_q": EPS * size}
    compare("categorical_kl", cases, differentiated=("logits_p", "logits_q"), tolerances=tolerances)


def test_aux_loss_equals_the_scripts_own():
    generator = torch.Generator().manual_seed(8)
    cases = []
    for number, (old_logits, new_logits) in enumerate(logits_cases(9)):
        batch, scale = len(old_logits), (1.0, 20.0)[number % 2]
        cases.append({"new_logits": new_logits, "old_logits": old_logits,
                      "aux_values": torch.randn(batch, generator=generator) * scale,
                      "values": torch.randn(batch, generator=generator) * scale,
                      "returns": torch.randn(batch, generator=generator) * scale,
                      "beta_clone": (1.0, 0.3, 0.0, 2.0)[number % 4]})

    def tolerances(inputs, own_outputs, own_grads):
        batch, size = len(inputs["returns"]), inputs["beta_clone"] * logits_size(inputs["new_logits"],
                                                                                  inputs["old_logits"])
        errors = [biggest(inputs[name] - inputs["returns"]) for name in ("aux_values", "values")]
        return (EPS * (size + errors[0] ** 2 + errors[1] ** 2),), {
            "new_logits": EPS * size / batch, "aux_values": EPS * errors[0] / batch, "values": EPS * errors[1] / batch}
    compare("aux_loss", cases, differentiated=("new_logits", "aux_values", "values"), stopped=("old_logits",),
            tolerances=tolerances)


# -------------------------------------------------------------------------------------------- 8. vmpo_e_step
def e_step_cases():
    generator = torch.Generator().manual_seed(10)
    cases = [{"advantages": torch.tensor([-5.0, 1.0, 0.0, 2.0]), "temperature": nn.Parameter(torch.tensor(1.0)),
              "eps_eta": 0.01, "top_k_fraction": 0.5}]
    for batch, fraction in ((1, 0.5), (3, 0.5), (4, 0.5), (5, 0.1), (7, 0.5), (8, 1.0), (10, 0.25), (64, 0.5)):
        for temperature in (1e-3, 0.1, 1.0, 10.0, 1e3, 1e5):
            advantages = torch.randn(batch, generator=generator) * (3.0 if batch % 2 else 1.0)
            if batch >= 4:  # ties, at the edge of the top k among them
                advantages = torch.round(advantages * 2.0) / 2.0
            cases.append({"advantages": advantages, "temperature": nn.Parameter(torch.tensor(temperature)),
                          "eps_eta": (0.01, 0.1)[len(cases) % 2], "top_k_fraction": fraction})
    cases.append({**cases[-1], "advantages": torch.full((6,), 2.0)})  # all tied
    return cases


def test_vmpo_e_step_equals_the_scripts_own():
    # which of tied advantages topk keeps depends on torch's implementation, so the weights are compared sorted and
    # summed over each value of A (which catches a weight on a sample outside the top k)
    cases = e_step_cases()
    kept_and_dropped_tie = [case["advantages"].sort(descending=True).values for case in cases]
    assert any(len(a) > (k := max(1, int(case["top_k_fraction"] * len(a)))) and a[k - 1] == a[k]
               for a, case in zip(kept_and_dropped_tie, cases))  # a tie across the edge of the top k
    for script, tested, own in pieces("vmpo_e_step"):
        for inputs in cases:
            case = case_of(inputs)
            (own_weights, own_loss), own_grads = run(own, inputs, ("temperature",), ("advantages",))
            outputs, grads = run(tested, inputs, ("temperature",), ("advantages",))
            assert len(outputs) == 2, f"{script}.vmpo_e_step returns (weights, temperature_loss), for {case}"
            weights, loss = outputs
            advantages, eta = inputs["advantages"], inputs["temperature"].item()
            scaled = biggest(advantages) / eta  # A / eta, whose ulps an exponent carries
            k = max(1, int(inputs["top_k_fraction"] * len(advantages)))
            assert_close(f"{script}.vmpo_e_step's temperature loss", loss, own_loss,
                         EPS * (biggest(advantages) + eta * (inputs["eps_eta"] + math.log(k) + 1.0)), case)
            # dL/deta = eps + log-mean-exp(A/eta) - sum psi A/eta: psi's rounding (ulps of A/eta) times A/eta
            assert_close(f"{script}.vmpo_e_step: the gradient to the temperature", grads["temperature"],
                         own_grads["temperature"], EPS * (inputs["eps_eta"] + math.log(k) + (1.0 + scaled) ** 2), case)
            assert_close(f"{script}.vmpo_e_step: the gradient to the advantages", grads["advantages"],
                         own_grads["advantages"], 0.0, case)
            assert isinstance(weights, torch.Tensor) and not weights.requires_grad, \
                f"{script}.vmpo_e_step's weights carry no gradient; yours {weights!r} for {case}"
            assert_close(f"{script}.vmpo_e_step's weights, sorted", weights.sort().values, own_weights.sort().values,
                         EPS * (1.0 + scaled), case)
            values = advantages.unique()
            per_value = [torch.stack([each[advantages == value].sum() for value in values])
                         for each in (weights, own_weights)]
            assert_close(f"{script}.vmpo_e_step's weights summed over each value of A ({shown(values)})", *per_value,
                         EPS * (1.0 + scaled), case)


# ----------------------------------------------------------------------- 9. gaussian_kl_decoupled, vmpo_kl_loss
def test_gaussian_kl_decoupled_equals_the_scripts_own():
    generator = torch.Generator().manual_seed(11)
    cases = []
    for batch, dims, spread in ((1, 1, 0.1), (2, 3, 1.0), (7, 6, 3.0), (16, 2, 0.5)):
        def std():
            return torch.exp(torch.empty(batch, dims).uniform_(math.log(0.05), math.log(5.0), generator=generator))
        mean_old = torch.randn(batch, dims, generator=generator)
        cases.append({"mean_old": mean_old, "std_old": std(),
                      "mean": mean_old + spread * torch.randn(batch, dims, generator=generator), "std": std()})
    cases.append({**cases[1], "mean": cases[1]["mean_old"], "std": cases[1]["std_old"]})  # the same policy: both 0

    def tolerances(inputs, own_outputs, own_grads):
        ratio = (inputs["std_old"] / inputs["std"]) ** 2  # var_old / var
        mean_size = ((inputs["mean"] - inputs["mean_old"]) ** 2 / inputs["std_old"] ** 2).sum(-1)
        std_size = (ratio + 1.0 + ratio.log().abs()).sum(-1)
        return (EPS * (1.0 + mean_size), EPS * std_size), {
            "mean": EPS * (1.0 + (inputs["mean"] - inputs["mean_old"]).abs() / inputs["std_old"] ** 2),
            "std": EPS * (1.0 + ratio) / inputs["std"]}
    compare("gaussian_kl_decoupled", cases, differentiated=("mean", "std"), tolerances=tolerances)


def test_vmpo_kl_loss_equals_the_scripts_own():
    generator = torch.Generator().manual_seed(12)
    cases = []
    for batch in (1, 3, 9, 64):
        for alpha, eps_alpha in ((1e-8, 0.01), (0.5, 0.1), (5.0, 5.0)):
            kl = torch.rand(batch, generator=generator) * (0.05 if eps_alpha < 1 else 10.0)
            cases.append({"kl": kl, "alpha": nn.Parameter(torch.tensor(alpha)), "eps_alpha": eps_alpha})

    def tolerances(inputs, own_outputs, own_grads):
        alpha = inputs["alpha"].item()
        size = inputs["eps_alpha"] + biggest(inputs["kl"])
        return (EPS * alpha * size,), {"kl": EPS * alpha / len(inputs["kl"]), "alpha": EPS * size}
    compare("vmpo_kl_loss", cases, differentiated=("kl", "alpha"), tolerances=tolerances)


# ------------------------------------------------------------------------------- 10. ReplayMemory, ppo_er_loss
def replay_batch(generator, num_steps, num_actors):
    def draw(*shape):
        return torch.randn(num_steps, num_actors, *shape, generator=generator)
    return {"obs": draw(3), "actions": draw(2), "advantages": draw(), "returns": draw(), "behav_mean": draw(2),
            "behav_log_std": draw(2)}


def epoch_statistics(memory, minibatch_size, epochs):
    """Over `epochs` calls of minibatch_indices: how often each sample lands in each minibatch [S, M], how often two
    samples share one [S, S], and how often a sample's minibatch is the same in the next epoch [S]; and the first
    epoch whose layout is not one of every stored sample once, with minibatch_size / K samples of each actor."""
    rows = len(memory.data()["age"])  # stored samples
    num_actors = memory.batches[0]["advantages"].shape[1]
    count, per_actor = rows // minibatch_size, minibatch_size // num_actors
    epochs_drawn = [list(memory.minibatch_indices(minibatch_size)) for _ in range(epochs)]
    for minibatches in epochs_drawn:
        if len(minibatches) != count or any(len(each) != minibatch_size for each in minibatches):
            return None, [each.tolist() for each in minibatches]
    indices = torch.stack([torch.cat(minibatches) for minibatches in epochs_drawn])  # [epochs, S]
    expected = torch.arange(count).repeat_interleave(minibatch_size).expand(epochs, -1)  # each index's minibatch
    # per epoch, minibatch and actor: how many samples (index % K is the actor)
    cells = (torch.arange(epochs)[:, None] * count + expected) * num_actors + indices % num_actors
    per_cell = torch.bincount(cells.flatten(), minlength=epochs * count * num_actors).view(epochs, -1)
    right = (indices.sort(1).values == torch.arange(rows)).all(1) & (per_cell == per_actor).all(1)
    if not right.all():
        return None, [each.tolist() for each in epochs_drawn[int((~right).nonzero()[0])]]
    places = torch.empty(epochs, rows, dtype=torch.long).scatter_(1, indices, expected)  # each sample's minibatch
    in_minibatch = torch.stack([(places == number).double().mean(0) for number in range(count)], 1)
    together = (places[:, :, None] == places[:, None, :]).double().mean(0)
    kept = (places[1:] == places[:-1]).double().mean(0)
    return (in_minibatch, together, kept), None


def test_replay_memory_equals_the_scripts_own_over_pushes_and_epochs():
    # what a push keeps and data() gives are compared exactly; minibatch_indices draws from torch's global random
    # numbers, which a right answer may draw otherwise, so its epochs are compared by their distribution: each
    # sample's minibatch, each pair's sharing one (each actor's rows shuffled on their own), each sample's next epoch
    # (a shuffle anew each epoch), over 1,000 epochs, within 6 standard deviations of the difference of two frequencies
    generator = torch.Generator().manual_seed(13)
    epochs = 1000
    for script, tested, own in pieces("ReplayMemory"):
        for num_batches, num_steps, num_actors, sizes in ((1, 4, 2, (4, 8)), (2, 3, 2, (2, 6)), (3, 2, 3, (3, 6))):
            yours, ours = tested(num_batches), own(num_batches)
            for push in range(num_batches + 2):
                batch = replay_batch(generator, num_steps, num_actors)
                yours.push(batch), ours.push(batch)
                case = f"ReplayMemory({num_batches}) after push {push + 1} of [{num_steps}, {num_actors}] batches"
                assert len(yours) == len(ours) and len(yours.batches) == len(ours.batches), \
                    f"{script}.ReplayMemory holds {len(yours)} batches (.batches {len(yours.batches)}), " \
                    f"the script's {len(ours)}, {case}"
                for stored, own_stored in zip(yours.batches, ours.batches):
                    assert stored.keys() == own_stored.keys() and all(
                        torch.equal(stored[key], own_stored[key]) for key in stored), \
                        f"{script}.ReplayMemory.batches holds other batches than the script's, oldest first, {case}"
                data, own_data = yours.data(), ours.data()
                assert sorted(data) == sorted(own_data), \
                    f"{script}.ReplayMemory.data() has the keys {sorted(data)}, the script's {sorted(own_data)}, {case}"
                for key in own_data:
                    assert_close(f"{script}.ReplayMemory.data()[{key!r}]", data[key], own_data[key], 0.0, case,
                                 rtol=0.0)
                if push not in (0, num_batches):  # one warm-up memory and one full one
                    continue
                for minibatch_size in sizes:
                    torch.manual_seed(push)
                    statistics, broken = epoch_statistics(yours, minibatch_size, epochs)
                    torch.manual_seed(push)
                    own_statistics, own_broken = epoch_statistics(ours, minibatch_size, epochs)
                    assert own_broken is None
                    assert broken is None, \
                        f"{script}.ReplayMemory.minibatch_indices({minibatch_size}), {case}: an epoch visits each " \
                        f"stored sample once, with {minibatch_size // num_actors} of each actor per minibatch; " \
                        f"yours gave {broken}"
                    for what, frequency, own_frequency in zip(
                            ("how often each sample lands in each minibatch", "how often two samples share one",
                             "how often a sample's minibatch is the same in the next epoch"),
                            statistics, own_statistics):
                        pooled = (frequency + own_frequency) / 2
                        allowed = 6.0 * (pooled * (1.0 - pooled) * 2.0 / epochs).sqrt() + 1e-9
                        if not ((frequency - own_frequency).abs() <= allowed).all():
                            index = tuple(((frequency - own_frequency).abs() > allowed).nonzero()[0].tolist())
                            raise AssertionError(
                                f"{script}.ReplayMemory.minibatch_indices({minibatch_size}), {case}: {what} differs "
                                f"from the script's own beyond chance: at {list(index)} yours {frequency[index]:.3f}, "
                                f"the script's {own_frequency[index]:.3f} over {epochs} epochs")


def test_ppo_er_loss_equals_the_scripts_own_on_random_batches():
    generator = torch.Generator().manual_seed(14)
    cases = []
    for batch in (1, 4, 64):
        for spread, clip_coef in ((0.05, 0.2), (0.5, 0.1), (3.0, 0.3)):
            behav_logp = -5.0 * torch.rand(batch, generator=generator)
            cases.append({"new_logp": behav_logp + spread * torch.randn(batch, generator=generator),
                          "behav_logp": behav_logp,
                          "advantages": torch.randn(batch, generator=generator) * (10.0 if batch == 64 else 1.0),
                          "clip_coef": clip_coef})
    # log-probabilities far below float32's exp range: their ratio is still about 1
    cases.append({"new_logp": torch.tensor([-120.0, -200.5]), "behav_logp": torch.tensor([-120.1, -200.0]),
                  "advantages": torch.tensor([1.0, -1.0]), "clip_coef": 0.2})

    def tolerances(inputs, own_outputs, own_grads):
        # each sample's terms, whose exponent is off by ulps of the log-probabilities
        new_logp, behav_logp = inputs["new_logp"].double(), inputs["behav_logp"].double()
        terms = torch.maximum((new_logp - behav_logp).exp(), torch.tensor(1.0 + inputs["clip_coef"]))
        size = terms * inputs["advantages"].abs() * (1.0 + torch.maximum(new_logp.abs(), behav_logp.abs()))
        return (EPS * size.mean().item(),), {"new_logp": EPS * size / len(size)}
    compare("ppo_er_loss", cases, differentiated=("new_logp",), stopped=("behav_logp",), tolerances=tolerances)
