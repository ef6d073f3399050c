"""Teaching figures for docs/, each drawn from the scripts' own functions (CPU, a few seconds):

    python benchmark/figures.py        # writes docs/img/algo_*.png

algo_ppo_ewma.png       how much theta_prox puts on the parameters of each past gradient step, at centre of mass 8
                        (the paper's, for discrete actions) and 32 (--batch-divisor 4), where pi, pi_prox and pi_behav
                        sit on that axis, and what each does in the loss: ppo_ewma.update_ewma run on one-hot
                        parameters, com_to_decay, apply_batch_divisor, Args
algo_ppg_ewma.png       PPG's policy phase of N_pi iterations and its auxiliary phase on a timeline, with PPG-EWMA's
                        reset of theta_prox at each phase's start: ppg_ewma.Args defaults
algo_ppo_staleness.png  which rollout each iteration collects and which it trains on at staleness k = 2, and which
                        policy clips and which importance-samples under the three objectives: ppo_staleness.StaleQueue,
                        select_logps
algo_vmpo.png           V-MPO's E-step on 16 advantages: the kept top half and the weights psi at eta = 1 and 0.3:
                        vmpo.vmpo_e_step, Args
algo_ppo_er.png         the batches PPO-ER's replay memory holds at each iteration (L = 3) and each one's age:
                        ppo_er.ReplayMemory.push, data()

Print-safe: black and greys plus one accent colour, and every distinction also made by hatching, markers, line
styles or words.
"""
import copy
import os
import sys

import matplotlib

matplotlib.use("Agg")  # files only, no display; the same pixels everywhere
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from matplotlib.patches import FancyArrowPatch, Rectangle  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # the scripts are modules at the repository root

import ppg_ewma  # noqa: E402
import ppo_er  # noqa: E402
import ppo_ewma  # noqa: E402
import ppo_staleness  # noqa: E402
import vmpo  # noqa: E402

OUT_DIR = os.path.join(ROOT, "docs", "img")
FIGSIZE, DPI = (9, 4.5), 110
ACCENT = "#1f5fa8"  # the one colour: a dark blue that still prints as a distinct grey
LIGHT, MID, DARK = "0.88", "0.65", "0.35"

plt.rcParams.update({"font.size": 10, "axes.titlesize": 11, "hatch.linewidth": 0.6,
                     "axes.spines.top": False, "axes.spines.right": False})


def save(fig, name):
    path = os.path.join(OUT_DIR, name)
    # no Software tag: the file does not change with the matplotlib version
    fig.savefig(path, dpi=DPI, metadata={"Software": None})
    plt.close(fig)
    print(f"{path}: {os.path.getsize(path) / 1024:.0f} KB")


def box(ax, x, y, width, height, text, hatch=None, face="white", edge="black", fontsize=9, **text_kw):
    """A labelled rectangle; the text sits on a white pad so that hatching never hides it."""
    ax.add_patch(Rectangle((x, y), width, height, facecolor=face, edgecolor=edge, hatch=hatch, lw=1))
    if text:
        ax.text(x + width / 2, y + height / 2, text, ha="center", va="center", fontsize=fontsize,
                bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none") if hatch else None, **text_kw)


# ---------------------------------------------------------------------------------------------------- PPO-EWMA
def ewma_step_weights(com, num_steps):
    """[num_steps + 1]: the weight theta_prox puts on theta after each gradient step, index k = k steps ago.

    ppo_ewma.update_ewma runs as in train() (theta_prox = theta and w = 1 at the start) on parameters that are the
    unit vector e_s after step s, so entry s of theta_prox is exactly its weight on step s's parameters."""
    model = torch.nn.Linear(num_steps + 1, 1, bias=False)
    with torch.no_grad():
        model.weight.zero_()[0, 0] = 1.0
    ewma_model = copy.deepcopy(model)
    decay, weight = ppo_ewma.com_to_decay(com), 1.0
    for step in range(1, num_steps + 1):
        with torch.no_grad():
            model.weight.zero_()[0, step] = 1.0
        weight = ppo_ewma.update_ewma(ewma_model, model, weight, decay)
    return ewma_model.weight[0].detach().flip(0)


def figure_ppo_ewma():
    # the discrete-action defaults (the paper's, com 8) without needing Procgen installed to read them
    args = ppo_ewma.Args(env_id="CartPole-v1")
    short, long = (ppo_ewma.apply_batch_divisor(ppo_ewma.Args(env_id="CartPole-v1", batch_divisor=c)).ewma_com
                   for c in (1, 4))
    steps_per_iteration = args.update_epochs * args.num_minibatches
    num_steps, shown = 400, 80  # after 400 steps the start's weight, beta^400, has decayed away (steady state)
    ages = torch.arange(num_steps + 1)
    weights = {com: ewma_step_weights(com, num_steps) for com in (short, long)}
    measured = {com: float((ages * w).sum()) for com, w in weights.items()}  # the weights' own centre of mass
    newest, top = float(weights[short][0]), 0.155

    fig, ax = plt.subplots(figsize=FIGSIZE)
    ax.bar(ages[:shown + 1], weights[long][:shown + 1], width=0.85, color=LIGHT, edgecolor=MID, lw=0.4,
           label=f"centre of mass {long:g} (--batch-divisor 4), decay {ppo_ewma.com_to_decay(long):.3f}")
    markerline, stemlines, _ = ax.stem(ages[:shown + 1], weights[short][:shown + 1], linefmt="k-", markerfmt="ko",
                                       basefmt=" ", label=f"centre of mass {short:g} (discrete actions' "
                                                          f"default), decay {ppo_ewma.com_to_decay(short):.3f}")
    markerline.set_markersize(3.5)
    stemlines.set_linewidth(1.0)

    # lines stop below the labels above them, so no text is crossed
    for com, style in ((short, "-"), (long, "--")):
        ax.axvline(com, ymax=0.68 if com == short else 0.8, color="0.2", ls=style, lw=0.9)
        ax.text(com + 0.7, 0.078, f"centre of mass {com:g}\n(measured {measured[com]:.2f})", fontsize=9)
    ax.text(1.0, newest, f"\u2190 π: the current θ, weight 1/(com+1) = {newest:.3f}", fontsize=9, va="center")
    ax.axvline(steps_per_iteration, color=ACCENT, ls=":", lw=1.6)
    ax.text(steps_per_iteration + 0.7, 0.14,
            f"π_behav: the θ that collected the rollout: 0 steps ago as the update starts,\n"
            f"{steps_per_iteration} at its end (E = {args.update_epochs} epochs × "
            f"M = {args.num_minibatches} minibatches)",
            fontsize=9, color=ACCENT, va="center")
    ax.text(0.99, 0.3, "the loss: -(π_prox / π_behav) · min(r A, clip(r, 1 - ε, 1 + ε) A),  r = π / π_prox\n"
            "π carries the gradient, π_prox clips, π_behav importance-samples\n"
            "π_prox: the policy of θ_prox = Σ_k weight_k · θ(k steps ago), the weights\n"
            "summing to 1 (bias correction: w starts at 1); Box actions: com 3 × E × M",
            transform=ax.transAxes, ha="right", va="center", multialignment="left", fontsize=9,
            bbox=dict(boxstyle="round,pad=0.3", fc="white", ec="0.5"))

    ax.set_xlim(-1, shown + 0.5)
    ax.set_ylim(0, top)
    ax.set_xlabel(f"gradient steps ago (0 = the current parameters); steady state, after {num_steps} steps")
    ax.set_ylabel("weight of that step's θ in θ_prox")
    ax.set_title("PPO-EWMA: the proximal policy is an EWMA of past parameters (update_ewma)")
    ax.legend(loc="center right", bbox_to_anchor=(1.0, 0.73), fontsize=9, frameon=False)
    fig.tight_layout()
    save(fig, "algo_ppo_ewma.png")


# ---------------------------------------------------------------------------------------------------- PPG-EWMA
def figure_ppg_ewma():
    args = ppg_ewma.Args()
    aux_minibatches = args.n_pi * args.num_envs * args.num_steps // args.aux_minibatch_size
    lanes = {"environment:\nrollout i": 2.0,
             f"policy net θ_π:\nE_pi = {args.update_epochs} epoch of L^CLIP": 1.0,
             f"value net θ_V:\nE_V = {args.value_epochs} epoch of L^V": 0.0}
    env_y, policy_y, value_y = lanes.values()
    height, block, gap = 0.62, 1.5, 0.3  # schematic widths: an aux epoch takes far longer than drawn

    fig, ax = plt.subplots(figsize=FIGSIZE)

    def iteration(x, i):
        """Policy iteration i from x: its rollout, then E_pi policy epochs, then E_V value epochs."""
        box(ax, x, env_y, block, height, str(i), face=LIGHT)
        x += block
        for _ in range(args.update_epochs):
            box(ax, x, policy_y, block, height, str(i), hatch="///")
            x += block
        for _ in range(args.value_epochs):
            box(ax, x, value_y, block, height, str(i), hatch="...")
            x += block
        return x + gap

    def reset_marker(x, label):
        ax.plot([x, x], [-0.15, 2.8], color=ACCENT, ls="--", lw=1.2)
        ax.plot(x, 2.8, marker="v", color=ACCENT, ms=8)
        ax.text(x + 0.4, 2.8, label, color=ACCENT, fontsize=9, va="center")

    x = 0.0
    reset_marker(x, "PPG-EWMA: θ_prox ← θ, w ← 1")
    for i in range(1, 4):
        x = iteration(x, i)
    ax.text(x + 0.6, policy_y + height / 2, "· · ·", fontsize=16, ha="center", va="center")
    x = iteration(x + 1.2, args.n_pi)
    phase_end, aux_w = x, 9.0
    box(ax, x, policy_y, aux_w, height, "L^aux (aux value head)\n+ β_clone KL[π_old ‖ π]", hatch="xx", fontsize=9)
    box(ax, x, value_y, aux_w, height, "L^V on the phase's V_targ", hatch="xx", fontsize=9)
    ax.text(x + aux_w / 2, env_y + height / 2,
            f"no rollouts: epochs over the\n{args.n_pi} stored rollouts' observations;\n"
            "π_old = the policy as the phase left it", ha="center", va="center", fontsize=9)
    x += aux_w + gap
    reset_marker(x, "reset")
    ax.text(x + 0.4, policy_y + height / 2, "next policy\nphase ...", fontsize=9, va="center")

    brace_y = -0.35
    for start, end, label in ((0, phase_end - gap, f"policy phase: N_pi = {args.n_pi} iterations\n"
                                                   f"(each epoch: M = {args.num_minibatches} minibatches)"),
                              (phase_end, phase_end + aux_w, f"auxiliary phase: E_aux = {args.aux_epochs} epochs\n"
                                                             f"({aux_minibatches} minibatches each)")):
        ax.annotate("", xy=(start, brace_y), xytext=(end, brace_y), arrowprops=dict(arrowstyle="<->", lw=0.8))
        ax.text((start + end) / 2, brace_y - 0.1, label, ha="center", va="top", fontsize=9)

    ax.set_yticks([y + height / 2 for y in lanes.values()], list(lanes))
    ax.tick_params(length=0)
    ax.set_xticks([])
    for side in ("left", "bottom"):
        ax.spines[side].set_visible(False)
    ax.set_xlim(-0.3, x + 4.2)
    ax.set_ylim(-1.1, 3.05)
    ax.set_xlabel("time (schematic; PPG-EWMA: θ_prox follows θ after each L^CLIP step, untouched in the aux phase)")
    ax.set_title(f"PPG-EWMA with ppg_ewma.Args() defaults: {args.n_pi} policy iterations, then an auxiliary phase")
    fig.tight_layout()
    save(fig, "algo_ppg_ewma.png")


# ---------------------------------------------------------------------------------------------------- PPO staleness
def figure_ppo_staleness():
    staleness, iterations = 2, 7
    queue = ppo_staleness.StaleQueue(staleness)
    trained = {i: queue.push(i) for i in range(1, iterations + 1)}  # iteration -> rollout trained on, None: warm-up

    fig, (ax, table_ax) = plt.subplots(1, 2, figsize=FIGSIZE, gridspec_kw=dict(width_ratios=[1.8, 1.2]))
    w, h, collect_y, train_y = 0.7, 0.5, 1.3, 0.0
    for i in range(1, iterations + 1):
        box(ax, i - w / 2, collect_y, w, h, f"R{i}", face=LIGHT)
        if trained[i] is None:
            box(ax, i - w / 2, train_y, w, h, "warm-\nup", hatch="\\\\\\", face="white", edge=MID, fontsize=8.5)
        else:
            box(ax, i - w / 2, train_y, w, h, f"R{trained[i]}", hatch="///")
            ax.add_patch(FancyArrowPatch((trained[i], collect_y), (i, train_y + h), arrowstyle="-|>",
                                         mutation_scale=10, lw=0.9, color=DARK))
    example = 5
    ax.annotate(f"iteration {example} trains on R{trained[example]}:\n"
                f"π_behav = θ of iteration {trained[example]} (collected it)\n"
                f"π_recent = θ at the start of iteration {example}",
                xy=(example, train_y), xytext=(example - 1.2, -1.15), fontsize=9, ha="left",
                arrowprops=dict(arrowstyle="->", lw=0.8))
    ax.text(1.5, train_y - 0.15, f"nothing trained\nwhile the queue\nfills (k = {staleness})", ha="center", va="top",
            fontsize=9)
    ax.set_xlim(0.4, iterations + 0.6)
    ax.set_ylim(-1.35, 2.0)
    ax.set_xticks(range(1, iterations + 1))
    ax.set_yticks([train_y + h / 2, collect_y + h / 2], ["trains on", "collects"])
    ax.tick_params(axis="y", length=0)
    ax.spines["left"].set_visible(False)
    ax.set_xlabel("iteration")
    ax.set_title(f"StaleQueue({staleness}): rollout Rj is trained on k = {staleness} iterations later")

    names = {1.0: "π_behav", 2.0: "π_recent"}  # the dummy log-probs that select_logps passes through
    rows = []
    for objective, panel in (("recent", "1a"), ("decoupled", "1b"), ("behavior", "1c")):
        prox_logp, is_logp = ppo_staleness.select_logps(objective, torch.tensor([1.0]), torch.tensor([2.0]))
        rows.append([f"{objective}\n(Fig. {panel})", names[prox_logp.item()], names[is_logp.item()]])
    table_ax.axis("off")
    headers = ["--objective", "clips with", "importance-\nsamples with"]
    table = table_ax.table(cellText=rows, colLabels=headers, loc="center", cellLoc="center", bbox=[0.0, 0.2, 1.0, 0.65])
    table.auto_set_font_size(False)
    table.set_fontsize(9)
    for (row, col), cell in table.get_celld().items():
        cell.set_edgecolor(MID)
        if row == 0:
            cell.set_facecolor(LIGHT)
        elif rows[row - 1][col] == "π_recent" and col > 0:
            cell.get_text().set_fontweight("bold")
    table_ax.set_title("Fig. 1's three objectives", fontsize=11)
    table_ax.text(0.5, 0.08, "decoupled: clipped near the recent policy,\nyet unbiased (IS against π_behav)",
                  ha="center", va="center", fontsize=9, transform=table_ax.transAxes)
    fig.tight_layout()
    save(fig, "algo_ppo_staleness.png")


# ---------------------------------------------------------------------------------------------------- V-MPO
def figure_vmpo():
    generator = torch.Generator().manual_seed(0)
    advantages = torch.randn(16, generator=generator)
    eps_eta = vmpo.Args().eps_eta
    temperatures = (1.0, 0.3)
    weights = {eta: vmpo.vmpo_e_step(advantages, torch.tensor(eta), eps_eta)[0] for eta in temperatures}

    order = torch.argsort(advantages, descending=True)
    sorted_advantages = advantages[order]
    kept = weights[temperatures[0]][order] > 0  # the top-k vmpo_e_step kept: psi > 0 exactly there
    rank = torch.arange(1, len(advantages) + 1)

    fig, (ax_a, ax_b) = plt.subplots(1, 2, figsize=FIGSIZE)
    ax_a.bar(rank[kept], sorted_advantages[kept], color="white", edgecolor="black", hatch="///",
             label=f"kept: top-k, k = {int(kept.sum())} of {len(advantages)}")
    ax_a.bar(rank[~kept], sorted_advantages[~kept], color="white", edgecolor=MID, label="discarded (ψ = 0)")
    ax_a.axhline(0, color="black", lw=0.6)
    ax_a.set_xlabel("sample, sorted by advantage")
    ax_a.set_ylabel("advantage A")
    ax_a.set_title("(a) the E-step keeps the top half of the batch")
    ax_a.set_xticks(rank[::3])
    ax_a.legend(loc="upper right", fontsize=9, frameon=False)

    kept_rank = rank[kept]
    for eta, style in zip(temperatures, (dict(color="black", ls="-", marker="o"),
                                         dict(color=ACCENT, ls="--", marker="s"))):
        ax_b.plot(kept_rank, weights[eta][order][kept], ms=6, label=f"η = {eta:g}", **style)
    ax_b.axhline(1 / int(kept.sum()), color=MID, ls=":", lw=1.2, label=f"uniform 1/k = {1 / int(kept.sum()):.3f}")
    ax_b.set_xticks(kept_rank)
    ax_b.set_xlabel("kept sample, sorted by advantage")
    ax_b.set_ylabel("E-step weight ψ = softmax(A/η) over the kept")
    ax_b.set_title("(b) lower temperature η concentrates ψ")
    ax_b.legend(loc="upper right", fontsize=9, frameon=False)
    ax_b.text(0.97, 0.52, "M-step: fit π to ψ by weighted max.\nlikelihood, within a KL bound to the\n"
              "target policy (Gaussians: one bound\nfor the mean, one for the std)",
              transform=ax_b.transAxes, ha="right", va="center", multialignment="left", fontsize=8.5,
              bbox=dict(boxstyle="round,pad=0.3", fc="white", ec="0.5"))
    fig.suptitle("V-MPO's E-step (vmpo_e_step) on 16 advantages, torch.randn with seed 0", fontsize=11)
    fig.tight_layout()
    save(fig, "algo_vmpo.png")


# ---------------------------------------------------------------------------------------------------- PPO-ER
def figure_ppo_er():
    num_batches, iterations = 3, 6
    replay = ppo_er.ReplayMemory(num_batches)
    held = {}  # iteration -> [(batch, age)], oldest first
    for i in range(1, iterations + 1):
        # a batch of N/K = 2 steps of K = 1 actor, each entry holding its batch's number
        replay.push({"advantages": torch.full((2, 1), float(i)), "batch": torch.full((2, 1), i)})
        data = replay.data()
        pairs = torch.stack([data["batch"], data["age"]], dim=1).unique_consecutive(dim=0)
        held[i] = [tuple(pair.tolist()) for pair in pairs]

    fig, (ax, note_ax) = plt.subplots(1, 2, figsize=FIGSIZE, gridspec_kw=dict(width_ratios=[1.25, 1]))
    age_styles = (("white", None), (LIGHT, "..."), (MID, "///"))  # (face, hatch) for age 0, 1, 2
    for i, pairs in held.items():
        y = iterations - i
        slots = [None] * (num_batches - len(pairs)) + pairs  # newest in the last slot, as data() orders them
        for slot, pair in enumerate(slots):
            if pair is None:
                box(ax, slot, y, 0.92, 0.84, "empty", edge=MID, fontsize=9, color=DARK)
            else:
                batch, age = pair
                face, hatch = age_styles[age]
                box(ax, slot, y, 0.92, 0.84, f"batch {batch}\nage {age}", face=face, hatch=hatch, fontsize=9)
        evicted = i - num_batches
        if evicted >= 1:
            ax.text(-0.1, y + 0.42, f"batch {evicted} dropped", ha="right", va="center", fontsize=8.5, color=DARK)
    ax.set_xlim(-1.25, num_batches)
    ax.set_ylim(-0.1, iterations)
    ax.set_xticks([s + 0.46 for s in range(num_batches)],
                  ["oldest" if s == 0 else "newest" if s == num_batches - 1 else "" for s in range(num_batches)])
    ax.set_yticks([iterations - i + 0.42 for i in held], [f"iteration {i}" for i in held])
    ax.tick_params(length=0)
    for side in ("left", "bottom"):
        ax.spines[side].set_visible(False)
    ax.set_xlabel("what the memory holds in iteration i's update (data())")
    ax.set_title(f"ReplayMemory(L = {num_batches}): push a batch, the oldest drops out")

    note_ax.axis("off")
    note_ax.text(0.0, 0.95,
                 "age = data()[\"age\"]: iterations since the batch\nwas collected (0 = this iteration's)\n\n"
                 "each sample's ratio is against the policy\nthat collected it (ppo_er_loss, eq. 13):\n\n"
                 "    R = π_θ(a|s) / π_behav(a|s),\n    π_behav = the policy of iteration i − age\n\n"
                 "its μ and log σ are stored with the batch;\nadvantages and targets are computed once,\n"
                 "when the batch is pushed, never again\n\n"
                 "the update draws minibatches from all\nN × L stored samples; L = 1 is PPO",
                 ha="left", va="top", fontsize=9, transform=note_ax.transAxes)
    fig.tight_layout()
    save(fig, "algo_ppo_er.png")


def main():
    torch.manual_seed(0)
    os.makedirs(OUT_DIR, exist_ok=True)
    figure_ppo_ewma()
    figure_ppg_ewma()
    figure_ppo_staleness()
    figure_vmpo()
    figure_ppo_er()


if __name__ == "__main__":
    main()
