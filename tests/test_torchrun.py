"""torchrun workers of every script: two CPU processes joined with Gloo.

The two processes get the environment torchrun gives its workers (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT on a free local port), so harness.start() joins them (workers.py), as under
`torchrun --standalone --nproc_per_node 2`. They are forked from a forkserver, never from the pytest process: on a
machine with a GPU, a process that has run a backward pass (autograd's device threads start even for CPU tensors)
or touched CUDA cannot fork a working child, and pytest's process has done both by then. The forkserver is a fresh
interpreter that imports the scripts once and does neither, so each test still pays only a fork, not 2 new
interpreters (measured on 2 busy cores: see run_two_workers).
"""
import copy
import glob
import importlib
import math
import multiprocessing
import os
import re
import signal
import socket
import time

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import harness
import ppg_ewma
import ppo_ewma
import workers
from saved_files import read_back, write_back

SCRIPTS = ("ppo_ewma", "ppo_ewma_rnn", "ppg_ewma", "ppo_staleness", "vmpo", "ppo_er")
# CartPole, 8 envs in total (2 workers x 4), one trained iteration of 8 x 32 steps; 4 minibatches per worker
TINY = dict(env_id="CartPole-v1", num_envs=8, num_steps=32, num_minibatches=4, gamma=0.99, total_timesteps=256,
            cuda=False)
CONFIGS = {
    "ppo_ewma": TINY,
    "ppo_ewma_rnn": TINY,  # each worker's 4 envs in 4 minibatches: one env's whole unroll each
    "ppg_ewma": dict(TINY, n_pi=1, aux_minibatch_size=64),  # the aux phase runs after the one iteration
    "ppo_staleness": dict(TINY, staleness=1),  # one warm-up rollout, then one trained iteration
    "vmpo": TINY,
    "ppo_er": dict(TINY, env_id="Pendulum-v1", num_steps=200, total_timesteps=1600),  # Box actions; 200-step episodes
}


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def as_torchrun_worker(rank, port, fn, args):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE="2", LOCAL_WORLD_SIZE="2")
    torch.set_num_threads(1)
    fn(rank, *args)


def run_two_workers(fn, *args, timeout=120):
    """fn(rank, *args) in 2 processes forked by the forkserver; an assertion that fails in either fails the test."""
    multiprocessing.set_forkserver_preload(["torch", "gymnasium", "harness", *SCRIPTS, __name__])  # once, at its start
    context = mp.start_processes(as_torchrun_worker, args=(free_port(), fn, args), nprocs=2, join=False,
                                 start_method="forkserver")
    deadline = time.time() + timeout
    while not context.join(timeout=1.0):  # raises if a worker failed
        if time.time() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail(f"the two workers did not finish within {timeout} s")


# -------------------------------------------------------------------------- one iteration, two workers
def train_and_save_networks(rank, name, out_dir):
    """Train with the script's own train(); save every network it trained (and the EWMA) to rank{rank}.pt."""
    module = importlib.import_module(name)
    os.chdir(out_dir)
    seen = {"local_episodes": 0, "gathered_episodes": 0}
    broadcast, update_ewma = harness.broadcast_weights, getattr(module, "update_ewma", None)
    gather_episodes, global_batch = harness.gather_episodes, harness.global_batch

    def remember_networks(*modules):
        seen["networks"] = modules
        broadcast(*modules)

    def remember_ewma(ewma_model, model, weight, decay):
        seen["ewma"] = ewma_model
        return update_ewma(ewma_model, model, weight, decay)

    def count_episodes(episodes):
        gathered = gather_episodes(episodes)
        seen["local_episodes"] += len(episodes)
        seen["gathered_episodes"] += len(gathered)
        return gathered

    def remember_advantages(advantages):
        seen["advantages"], seen["global_advantages"] = advantages.clone(), global_batch(advantages)
        return seen["global_advantages"]

    harness.broadcast_weights, harness.gather_episodes = remember_networks, count_episodes
    harness.global_batch = remember_advantages
    if update_ewma is not None:
        module.update_ewma = remember_ewma
    result = module.train(module.Args(exp_name=name, **CONFIGS[name]))
    weights = {f"{i}.{k}": v for i, net in enumerate(seen["networks"]) for k, v in net.state_dict().items()}
    if "ewma" in seen:
        weights.update({f"ewma.{k}": v for k, v in seen["ewma"].state_dict().items()})
    counts = {k: v for k, v in seen.items() if k not in ("networks", "ewma")}
    torch.save({"weights": weights, "result": result, **counts}, os.path.join(out_dir, f"rank{rank}.pt"))


@pytest.mark.parametrize("name", SCRIPTS)
def test_two_workers_keep_identical_weights_and_ewma(tmp_path, name):
    run_two_workers(train_and_save_networks, name, str(tmp_path))
    rank0, rank1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1))
    assert rank0["weights"].keys() == rank1["weights"].keys()
    assert any(k.startswith("ewma.") for k in rank0["weights"]) == (name in ("ppo_ewma", "ppo_ewma_rnn", "ppg_ewma"))
    for key, value in rank0["weights"].items():  # bit for bit: the averaged gradients are the same on both
        assert torch.equal(value, rank1["weights"][key]), key
    # global steps count both workers' envs: 8 envs x 32 steps (+ the warm-up rollout of ppo_staleness; x 200: ppo_er)
    steps = {"ppo_staleness": 512, "ppo_er": 1600}.get(name, 256)
    assert rank0["result"]["global_step"] == rank1["result"]["global_step"] == steps
    # both workers' episodes reach both workers' statistics, and rank 0's TensorBoard
    assert rank0["gathered_episodes"] == rank1["gathered_episodes"] == rank0["local_episodes"] + rank1["local_episodes"]
    assert rank0["local_episodes"] > 0 and rank1["local_episodes"] > 0
    np.testing.assert_equal(rank0["result"]["mean_return"], rank1["result"]["mean_return"])
    # every global_batch is both workers' values, concatenated in rank order (the advantages' moments; vmpo's
    # E-step, ppo_er's minibatch statistics)
    both = torch.cat([rank0["advantages"], rank1["advantages"]])
    assert torch.equal(rank0["global_advantages"], both) and torch.equal(rank1["global_advantages"], both)
    runs = glob.glob(str(tmp_path / "runs" / "*"))
    assert runs == [os.path.join(str(tmp_path), rank0["result"]["run_dir"])]  # only rank 0 writes a run dir
    events = EventAccumulator(runs[0])
    events.Reload()
    assert len(events.Scalars("charts/episodic_return")) == rank0["gathered_episodes"]
    table = events.Tensors("hyperparameters/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "\n|num_envs|8|\n" in table  # the whole run's flags, not rank 0's share of 4 envs
    if name in ("ppo_ewma", "ppo_ewma_rnn", "ppg_ewma"):  # span 1: the logged EWMA moments are this batch's
        assert events.Scalars("charts/adv_mean")[-1].value == pytest.approx(both.mean().item(), abs=1e-6)
        assert events.Scalars("charts/adv_std")[-1].value == pytest.approx(both.std(unbiased=False).item(), rel=1e-5)


# --------------------------------------------------------------- decisions taken from data, on every worker
def train_and_save_weights(rank, config, out_dir, average=True):
    """ppo_ewma's train() with `config`; the trained weights to rank{rank}.pt. average=False: each worker decides
    from its own shard's KL, as before the workers averaged it."""
    os.chdir(out_dir)
    seen, real_broadcast = {}, harness.broadcast_weights
    harness.broadcast_weights = lambda agent: (seen.update(agent=agent), real_broadcast(agent))
    if not average:
        harness.mean_over_workers = lambda x: x
    result = ppo_ewma.train(ppo_ewma.Args(**config))
    torch.save({"weights": seen["agent"].state_dict(), "run_dir": result["run_dir"]}, f"{out_dir}/rank{rank}.pt")


# 4 iterations of 4 epochs at a large step size: the KL grows past both options' bounds, and the two workers' shards
# give different KLs (e.g. 0.0104 and 0.0082 in the same epoch)
DECIDING = dict(TINY, update_epochs=4, learning_rate=0.005, total_timesteps=4 * 256)


@pytest.mark.parametrize("option", [dict(target_kl=0.002), dict(lr_schedule="kl-adaptive")])
def test_target_kl_and_the_kl_adaptive_step_size_decide_alike_on_every_worker(tmp_path, option):
    run_two_workers(train_and_save_weights, dict(DECIDING, **option), str(tmp_path))
    rank0, rank1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    for key, value in rank0["weights"].items():  # bit for bit, as without the option
        assert torch.equal(value, rank1["weights"][key]), key
    scalars = logged(str(tmp_path / rank0["run_dir"]))
    if "target_kl" in option:  # the option acted: an iteration stopped early (without the average, Gloo aborts)
        assert min(value for _, value in scalars["charts/update_epochs_run"]) < 4
    else:  # the step size moved (5e-3 x 1.5^k / 1.5^j)
        assert len({round(value, 8) for _, value in scalars["charts/learning_rate"]}) > 1


def test_without_the_averaged_kl_the_kl_adaptive_workers_drift_apart(tmp_path):
    # what the test above guards against: each worker adapts its step size to its own shard's KL
    run_two_workers(train_and_save_weights, dict(DECIDING, lr_schedule="kl-adaptive"), str(tmp_path), False)
    rank0, rank1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    assert not all(torch.equal(value, rank1["weights"][key]) for key, value in rank0["weights"].items())


def nan_on_one_worker(rank, out_dir):
    os.chdir(out_dir)
    if rank == 1:  # only worker 1's value loss is nan
        real_value_loss = ppo_ewma.value_loss
        ppo_ewma.value_loss = lambda values, returns: real_value_loss(values, returns) * float("nan")
    with pytest.raises(SystemExit) as error:
        ppo_ewma.train(ppo_ewma.Args(**TINY))
    torch.save(str(error.value), f"{out_dir}/rank{rank}.pt")


def test_a_loss_that_is_not_finite_on_one_worker_stops_both_with_one_sentence(tmp_path):
    run_two_workers(nan_on_one_worker, str(tmp_path))  # before, worker 0 went on to wait in the gradient all-reduce
    assert [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)] == [
        "value_loss is not finite at iteration 1: the run stops before this step; its last checkpoint, if one was "
        "written, is the last good one."] * 2


# ------------------------------------------------------------------ gradient and moment equivalences
class CartPoleSpaces:
    single_observation_space = ppo_ewma.gym.spaces.Box(-5.0, 5.0, (4,), dtype=np.float32)
    single_action_space = ppo_ewma.gym.spaces.Discrete(2)


# a hand-made batch of 8 samples: worker 0 gets the first 4, worker 1 the last 4
OBS = torch.tensor([[0.1, 0.0, -0.2, 0.3], [-0.4, 0.5, 0.1, 0.0], [0.2, -0.3, 0.0, 0.6], [0.0, 0.1, 0.3, -0.5],
                    [0.7, -0.1, -0.4, 0.2], [-0.2, -0.6, 0.2, 0.1], [0.3, 0.4, -0.1, -0.3], [-0.5, 0.2, 0.5, 0.4]])
ACTIONS = torch.tensor([0, 1, 1, 0, 1, 0, 0, 1])
ADVANTAGES = torch.tensor([1.0, -0.5, 2.0, 0.3, -1.2, 0.7, -0.1, 1.5])
RETURNS = torch.tensor([0.5, 1.0, -0.3, 2.0, 0.0, 1.5, -1.0, 0.8])
BEHAV_LOGP = torch.log(torch.tensor([0.5, 0.45, 0.55, 0.5, 0.6, 0.4, 0.5, 0.52]))
PROX_LOGP = torch.log(torch.tensor([0.52, 0.44, 0.56, 0.49, 0.58, 0.42, 0.51, 0.5]))


def ppo_ewma_loss(agent, inds):
    """PPO-EWMA's total loss (decoupled clip, entropy, c_VF * MSE) on the samples inds: a mean over them."""
    logits, values = agent(OBS[inds])
    logp, entropy = ppo_ewma.categorical_log_prob_and_entropy(logits, ACTIONS[inds])
    pg_loss = ppo_ewma.decoupled_clip_loss(logp, PROX_LOGP[inds], BEHAV_LOGP[inds], ADVANTAGES[inds], 0.2)
    return pg_loss - 0.01 * entropy.mean() + 0.5 * ppo_ewma.value_loss(values, RETURNS[inds])


def compare_half_batch_updates(rank):
    dist.init_process_group("gloo")
    harness.WORKERS = workers  # as harness.start sets it under torchrun
    torch.manual_seed(0)
    agent = ppo_ewma.Agent(CartPoleSpaces())
    one_process = copy.deepcopy(agent)  # one process, the whole batch
    ppo_ewma_loss(one_process, torch.arange(8)).backward()
    worker = copy.deepcopy(agent)  # this worker's half of the batch
    ppo_ewma_loss(worker, torch.arange(4 * rank, 4 * rank + 4)).backward()
    harness.average_gradients(worker)
    # the mean over 8 samples is the average of the two means over 4
    for p, q in zip(one_process.parameters(), worker.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-7)
    # so one SGD step (the update is proportional to the gradient) lands on the same weights
    single_step, worker_step = copy.deepcopy(one_process), copy.deepcopy(worker)
    for net in (single_step, worker_step):
        torch.optim.SGD(net.parameters(), lr=0.1).step()
    for p, q in zip(single_step.parameters(), worker_step.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-7)
    dist.destroy_process_group()


def test_averaged_gradient_of_two_halves_is_the_whole_batch_gradient():
    run_two_workers(compare_half_batch_updates)


def compare_global_moments(rank):
    dist.init_process_group("gloo")
    harness.WORKERS = workers  # as harness.start sets it under torchrun
    # worker 0 and worker 1 hold different halves of each iteration's advantages
    first = {0: torch.tensor([1.0, 2.0, 3.0, 4.0]), 1: torch.tensor([-2.0, 0.0, 6.0, 8.0])}[rank]
    second = {0: torch.tensor([0.0, 0.0, 1.0, 1.0]), 1: torch.tensor([2.0, 2.0, 3.0, 3.0])}[rank]
    assert harness.global_batch(first).tolist() == [1.0, 2.0, 3.0, 4.0, -2.0, 0.0, 6.0, 8.0]  # rank order
    moments = ppo_ewma.EwmaMoments(ppo_ewma.span_to_decay(3.0))  # decay 1 - 2/4 = 0.5
    moments.update(harness.global_batch(first))
    # concatenation [1, 2, 3, 4, -2, 0, 6, 8]: mean 22/8 = 2.75; E[x^2] = 134/8 = 16.75, var = 16.75 - 2.75^2 = 9.1875
    assert moments.mean == pytest.approx(2.75) and moments.std == pytest.approx(math.sqrt(9.1875))
    moments.update(harness.global_batch(second))
    # [0, 0, 1, 1, 2, 2, 3, 3]: mean 1.5, E[x^2] 3.5. w = 0.5*8 + 8 = 12, s = 0.5*8*2.75 + 8*1.5 = 23,
    # q = 0.5*8*16.75 + 8*3.5 = 95: mean 23/12, var 95/12 - (23/12)^2 = 4.2431
    assert moments.mean == pytest.approx(23 / 12) and moments.std == pytest.approx(math.sqrt(95 / 12 - (23 / 12) ** 2))
    reference = ppo_ewma.EwmaMoments(0.5)  # one process, the concatenated batches
    for batch in ([1.0, 2.0, 3.0, 4.0, -2.0, 0.0, 6.0, 8.0], [0.0, 0.0, 1.0, 1.0, 2.0, 2.0, 3.0, 3.0]):
        reference.update(torch.tensor(batch))
    assert (moments.mean, moments.std) == pytest.approx((reference.mean, reference.std))
    # ppo_staleness normalizes with the batch's own mean and std: those of all 8 advantages
    all_advantages = harness.global_batch(first)
    assert all_advantages.mean().item() == pytest.approx(2.75)
    assert all_advantages.std(unbiased=False).item() == pytest.approx(math.sqrt(9.1875))
    dist.destroy_process_group()


def test_advantage_moments_are_those_of_the_concatenated_batch():
    run_two_workers(compare_global_moments)


# ------------------------------------------------------------------------ the split over workers
@pytest.mark.parametrize("name", SCRIPTS)
def test_workers_that_do_not_divide_num_envs_stop_with_one_sentence(tmp_path, monkeypatch, name):
    module = importlib.import_module(name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(SystemExit, match=r"^--num-envs 8 is the total over all workers, so it must be a multiple "
                                         r"of the 3 torchrun workers\.$"):
        module.train(module.Args(**CONFIGS[name]))
    # 6 envs, 2 minibatches of whole trajectories: fine in one process, but 3 envs per worker do not split in 2
    monkeypatch.setenv("WORLD_SIZE", "2")
    if name in ("ppo_ewma", "ppg_ewma", "ppo_staleness"):  # vmpo and ppo_er split samples, not trajectories
        with pytest.raises(SystemExit, match="With 2 torchrun workers each one runs 3 of the --num-envs 6 envs.*"
                                             "--num-minibatches 2 must divide --num-envs 3"):
            module.train(module.Args(**dict(CONFIGS[name], num_envs=6, num_minibatches=2)))
    assert not os.path.exists("runs")  # stopped before any work


def test_workers_of_a_divided_batch_must_divide_the_divided_num_envs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "4")
    # --batch-divisor 2 leaves 4 of the 8 envs, 2 per worker: fine; --batch-divisor 4 leaves 2 envs for 4 workers
    with pytest.raises(SystemExit, match=r"^--num-envs 8, adjusted to 2, is the total over all workers, so it must be "
                                         r"a multiple of the 4 torchrun workers\.$"):
        ppo_ewma.train(ppo_ewma.Args(**dict(CONFIGS["ppo_ewma"], batch_divisor=4, num_minibatches=1)))
    assert not os.path.exists("runs")


def test_a_seed_that_the_last_worker_would_push_beyond_numpys_is_refused_before_the_workers_join(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    # worker 1 seeds with seed + 4 (its 4 envs follow worker 0's): 4294967291 + 4 is NumPy's largest seed, + 5 not
    with pytest.raises(SystemExit, match=r"^--seed 4294967292: torchrun worker 1 seeds with --seed \+ 4, beyond "
                                         r"4294967295: lower --seed\.$"):
        ppo_ewma.train(ppo_ewma.Args(**dict(CONFIGS["ppo_ewma"], seed=4294967292)))
    assert not os.path.exists("runs")


def test_ppg_aux_minibatch_is_split_over_the_workers(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    args = ppg_ewma.Args(**CONFIGS["ppg_ewma"])
    # 64 samples per aux minibatch in total: 32 from each worker's own phase buffer (one trajectory of 32 steps)
    assert ppg_ewma.SCRIPT.worker_share(args, 1, 2).aux_minibatch_size == 32
    # 3 samples divide the phase of 3 x 8 x 32 = 768 (one process is fine) but not the 2 workers
    with pytest.raises(SystemExit, match=r"^--aux-minibatch-size 3 is the total over all workers, so it must be a "
                                         r"multiple of the 2 torchrun workers\.$"):
        ppg_ewma.train(ppg_ewma.Args(**dict(CONFIGS["ppg_ewma"], n_pi=3, aux_minibatch_size=3, shuffle_samples=True)))
    assert not os.path.exists("runs")


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_workers_step_the_envs_of_one_process(monkeypatch, name):
    module = importlib.import_module(name)
    args = module.Args(**CONFIGS[name])
    monkeypatch.setenv("WORLD_SIZE", "1")  # without torchrun's LOCAL_RANK: one process, no group
    assert harness.WORKERS is None and not dist.is_initialized()
    # worker r gets 4 envs and seed 1 + 4 r; Gymnasium seeds env i with seed + i: envs 1-4 and 5-8, as one process
    shares = [module.SCRIPT.worker_share(args, rank, 2) for rank in (0, 1)]
    assert [(share.num_envs, share.seed) for share in shares] == [(4, 1), (4, 5)]
    one_process = module.make_env(args).reset(seed=args.seed)[0]
    workers = np.concatenate([module.make_env(share).reset(seed=share.seed)[0] for share in shares])
    np.testing.assert_array_equal(workers, one_process)


def logged(run_dir):
    events = EventAccumulator(run_dir)
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]
            if tag != "charts/SPS"}


def test_one_torchrun_worker_joins_a_group_of_one_and_learns_as_one_process(tmp_path, monkeypatch):
    # torchrun --nproc_per_node 1 (e.g. NCCL on one GPU): the collectives run, and change nothing
    monkeypatch.chdir(tmp_path)
    plain = logged(ppo_ewma.train(ppo_ewma.Args(exp_name="plain", **CONFIGS["ppo_ewma"]))["run_dir"])
    for name, value in dict(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", LOCAL_RANK="0",
                            WORLD_SIZE="1", LOCAL_WORLD_SIZE="1").items():
        monkeypatch.setenv(name, value)
    groups = []
    real_all_reduce = dist.all_reduce
    monkeypatch.setattr(dist, "all_reduce", lambda *a, **k: groups.append(dist.get_world_size()) or
                        real_all_reduce(*a, **k))
    one_worker = logged(ppo_ewma.train(ppo_ewma.Args(exp_name="worker", **CONFIGS["ppo_ewma"]))["run_dir"])
    assert not dist.is_initialized()  # the run left its group
    assert groups and set(groups) == {1}  # gradients and the stop flag went through the group of one
    assert one_worker == plain


# ------------------------------------------------------------------------------------------ stopping
def stop_on_a_signal_to_one_worker(rank, out_dir):
    os.chdir(out_dir)
    real_after_step, real_stop = harness.Run.after_step, harness.Run.stop
    stopped = {}

    def after_step(self, global_step, info):
        real_after_step(self, global_step, info)
        if rank == 1 and global_step == 2 * 256 + 8:  # the first step of iteration 3, on worker 1 only
            os.kill(os.getpid(), signal.SIGINT)

    def stop(self, iteration, global_step):
        stopped.update(iteration=iteration, global_step=global_step)
        real_stop(self, iteration, global_step)

    harness.Run.after_step, harness.Run.stop = after_step, stop
    try:
        ppo_ewma.train(ppo_ewma.Args(**dict(TINY, total_timesteps=10 * 256)))
    except SystemExit as exit_:
        torch.save({"code": exit_.code, **stopped}, os.path.join(out_dir, f"rank{rank}.pt"))


def test_a_signal_to_one_worker_stops_both_at_the_same_iteration_end(tmp_path):
    run_two_workers(stop_on_a_signal_to_one_worker, str(tmp_path))
    rank0, rank1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    # both leave after iteration 3 with 128 + SIGINT, and rank 0 writes the checkpoint of both
    assert rank0 == rank1 == {"code": 130, "iteration": 3, "global_step": 3 * 256}
    (path,) = glob.glob(str(tmp_path / "runs" / "*" / "checkpoint.safetensors"))
    checkpoint = read_back(path)
    assert checkpoint["iteration"] == 3 and len(checkpoint["workers"]) == 1


# ------------------------------------------------------ two workers take one process's update on the same data
# Deterministic actions (the categorical's mode; a Gaussian's noise a function of its mean) on seeded envs: 2 workers
# and 1 process collect the very same samples (worker r steps envs 4 r + 1 ... 4 r + 4 of the 8), and one minibatch per update (M = 1) holds all of them,
# each worker's half. Raw rewards: Gymnasium's reward scaling is each worker's own (docs/torchrun.md).
EQUAL = {
    "vmpo_discrete": ("vmpo", dict(env_id="CartPole-v1", num_steps=16, total_timesteps=2 * 128)),
    "vmpo_box": ("vmpo", dict(env_id="Pendulum-v1", num_steps=16, total_timesteps=2 * 128)),
    "vmpo_lstm": ("vmpo", dict(env_id="CartPole-v1", num_steps=16, total_timesteps=2 * 128, lstm=True)),
    # one iteration: with two stored batches M = 1 gives two minibatches, which each worker fills from its own shuffle
    "ppo_er": ("ppo_er", dict(env_id="Pendulum-v1", num_steps=16, total_timesteps=128, update_epochs=2)),
}


def deterministic_run(name, out_dir, tag):
    """The script's train() on EQUAL[name] with every action the policy's mode; its trained state_dicts, saved."""
    script, config = EQUAL[name]
    module = importlib.import_module(script)
    os.chdir(out_dir)
    noise = lambda mean: torch.sin(7.0 * mean + 1.0)  # noqa: E731  a function of the state, not of a worker's RNG
    torch.distributions.Categorical.sample = lambda self, sample_shape=torch.Size(): self.logits.argmax(-1)
    torch.distributions.Normal.sample = lambda self, sample_shape=torch.Size(): self.loc + self.scale * noise(self.loc)
    module.torch.randn_like = noise  # ppo_er samples a = mu + sigma * noise
    seen, broadcast = {}, harness.broadcast_weights
    harness.broadcast_weights = lambda *modules: (seen.update(networks=modules), broadcast(*modules))
    average = harness.average_gradients
    harness.average_gradients = lambda *modules: (seen.update(trained=modules), average(*modules))
    module.train(module.Args(**config, num_envs=8, num_minibatches=1, norm_reward=False, exp_name=tag, cuda=False))
    state = {f"{i}.{k}": v for i, net in enumerate(seen["trained"]) for k, v in net.state_dict().items()}
    torch.save(state, os.path.join(out_dir, f"{tag}.pt"))


def deterministic_worker(rank, name, out_dir):
    deterministic_run(name, out_dir, f"rank{rank}")


@pytest.mark.parametrize("name", EQUAL)
def test_two_workers_each_with_half_of_a_minibatch_take_one_processs_update(tmp_path, monkeypatch, name):
    # vmpo: the E-step's top half and psi's normalizer over both halves, L_pi's sum x W, eta, the alphas and PopArt's
    # statistics; ppo_er: the minibatch's advantage statistics over both halves. Without any of these the two
    # differ (checked by hand: each change below fails this test by 1e-2 or more)
    run_two_workers(deterministic_worker, name, str(tmp_path))
    with monkeypatch.context() as patched:  # the same patches, undone after: one process, the whole minibatch
        for target, attr in ((torch.distributions.Categorical, "sample"), (torch.distributions.Normal, "sample"),
                             (importlib.import_module(EQUAL[name][0]).torch, "randn_like"),
                             (harness, "broadcast_weights"), (harness, "average_gradients")):
            patched.setattr(target, attr, getattr(target, attr))
        deterministic_run(name, str(tmp_path), "single")
    rank0, rank1, single = (torch.load(tmp_path / f"{tag}.pt") for tag in ("rank0", "rank1", "single"))
    for key, value in single.items():
        assert torch.equal(rank0[key], rank1[key]), key  # the workers agree bit for bit
        torch.testing.assert_close(rank0[key], value, rtol=1e-4, atol=1e-5, msg=key)
    if name.startswith("vmpo"):  # eta and the alphas moved, and so did PopArt's statistics
        assert any(key.startswith("1.") for key in single) and any(key.endswith("critic.mu") for key in single)


# ----------------------------------------------------------------------------------- checkpoints of workers
class Killed(Exception):
    """Stands for the workers being killed."""


def resumed_run(rank, name, config, out_dir, port):
    """Under 2 workers: a run killed as it would write iteration 3's checkpoint, then resumed from iteration 2's (the
    resumed workers join on a port of their own, as a new torchrun would)."""
    module = importlib.import_module(name)
    os.chdir(out_dir)
    real_save = harness.Run.save

    def save_then_die_at_iteration_3(self, file_name, iteration, *args, **kwargs):
        if iteration == 3:
            raise Killed
        real_save(self, file_name, iteration, *args, **kwargs)
    harness.Run.save = save_then_die_at_iteration_3
    try:
        module.train(module.Args(**config, exp_name="killed", checkpoint_every=1))
    except Killed:
        pass
    harness.Run.save = real_save
    if dist.is_initialized():
        dist.destroy_process_group()
    (run_dir,) = glob.glob("runs/*__killed__*")
    time.sleep(1 - time.time() % 1)  # to the next second: event files are read in name order, which starts with it
    os.environ["MASTER_PORT"] = str(port)
    module.train(module.Args(resume=f"{run_dir}/checkpoint.safetensors", cuda=False))


def full_run(rank, name, config, out_dir):
    module = importlib.import_module(name)
    os.chdir(out_dir)
    module.train(module.Args(**config, exp_name="full"))


@pytest.mark.parametrize("name, extra", [("ppo_ewma", {}), ("ppo_ewma_rnn", {"rnn": "gru"}), ("vmpo", {})])
def test_a_resumed_run_of_two_workers_logs_what_the_uninterrupted_one_logs(tmp_path, name, extra):
    config = dict(CONFIGS[name], total_timesteps=4 * 256, **extra)  # 4 iterations of 8 envs x 32 steps; --rnn: each
    # worker's memory of its envs is in its part
    run_two_workers(full_run, name, config, str(tmp_path))
    run_two_workers(resumed_run, name, config, str(tmp_path), free_port())
    (full,), (killed,) = (glob.glob(str(tmp_path / "runs" / f"*__{tag}__*")) for tag in ("full", "killed"))
    checkpoint = read_back(f"{killed}/checkpoint.safetensors")
    assert len(checkpoint["workers"]) == 1 and checkpoint["iteration"] == 4  # worker 1's envs, RNG and statistics
    expected, got = logged(full), logged(killed)
    assert len(got["losses/policy_loss"]) == 4 and got == expected  # both workers went on where they stopped


def test_a_checkpoint_resumes_only_with_as_many_workers_as_wrote_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = ppo_ewma.train(ppo_ewma.Args(**dict(TINY, total_timesteps=2 * 256), checkpoint_every=1))
    path = f"{result['run_dir']}/checkpoint.safetensors"
    checkpoint = read_back(path)
    os.remove(f"{result['run_dir']}/model.safetensors")
    write_back(path, {**checkpoint, "iteration": 1, "global_step": 256})
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    with pytest.raises(SystemExit, match=r"its checkpoint holds the envs of 1 worker, not 2: resume it with python, "
                                         r"in one process\.$"):
        ppo_ewma.train(ppo_ewma.Args(resume=path))
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name)
    write_back(path, {**checkpoint, "iteration": 1, "global_step": 256, "workers": [workers.worker_part(checkpoint)]})
    with pytest.raises(SystemExit, match=r"its checkpoint holds the envs of 2 workers, not 1: resume it with torchrun "
                                         r"--nproc_per_node 2\.$"):
        ppo_ewma.train(ppo_ewma.Args(resume=path))


def resume_refused_on_worker_1(rank, out_dir):
    os.chdir(out_dir)
    (path,) = glob.glob("runs/*__full__*/checkpoint.safetensors")
    with pytest.raises(SystemExit) as error:
        ppo_ewma.train(ppo_ewma.Args(resume=path))
    torch.save(str(error.value), f"{out_dir}/rank{rank}.pt")


def test_a_refusal_on_one_worker_is_every_workers(tmp_path):
    # worker 1's own part (its reward statistics) does not fit: before, worker 1 stopped alone and worker 0 trained
    # on into a gloo error; now the first refusal is agreed, and both say it before either trains
    run_two_workers(full_run, "ppo_ewma", dict(TINY, total_timesteps=2 * 256), str(tmp_path))
    (path,) = glob.glob(str(tmp_path / "runs" / "*__full__*" / "checkpoint.safetensors"))
    checkpoint = read_back(path)
    checkpoint["workers"][0]["normalizers"]["reward"]["mean"] = float("nan")
    write_back(path, {**checkpoint, "iteration": 1, "global_step": 256})
    os.remove(os.path.join(os.path.dirname(path), "model.safetensors"))
    run_two_workers(resume_refused_on_worker_1, str(tmp_path))
    messages = [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
    assert messages[0] == messages[1] and re.fullmatch(r"--resume \S+checkpoint\.safetensors: its reward statistics"
                                                       r"\['mean'\] is nan, beyond any run's \(nan, inf or over "
                                                       r"1e\+30\): it is not this run's\.", messages[0]), messages
    assert len(logged(os.path.dirname(path))["losses/policy_loss"]) == 2  # its 2 iterations, none trained since
