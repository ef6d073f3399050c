"""The intended copies hold: the project keeps the pieces several scripts share (GAE, the IMPALA CNN and its init, the
shared losses, the minibatch layout, the reward normalizer, layer_init, the gradient step, the gradient noise scale,
the recurrent core, all that ppo_ewma_rnn.py takes from ppo_ewma.py) written the same way in every script that has
them, so that a diff of two scripts shows only their algorithmic difference and each still copies out alone."""
import difflib
import importlib
import inspect
import re

import pytest

BSI = ("ppo_ewma", "ppo_ewma_rnn", "ppg_ewma", "ppo_staleness")  # the batch size-invariance scripts
IMAGES = (*BSI, "vmpo")  # the scripts with the IMPALA CNN
EWMA = ("ppo_ewma", "ppo_ewma_rnn", "ppg_ewma")  # the scripts with the proximal policy's EWMA
COPIES = {  # a function or class -> the scripts that hold a copy of it
    "compute_gae": (*IMAGES, "ppo_er"), "layer_init": (*IMAGES, "ppo_er"), "gradient_step": (*IMAGES, "ppo_er"),
    "explained_variance": (*IMAGES, "ppo_er"),
    **{name: IMAGES for name in ("normed_init", "ResidualBlock", "ConvSequence", "ImpalaCNN",
                                 "categorical_log_prob_and_entropy",
                                 "categorical_kl")},
    **{name: BSI for name in ("decoupled_clip_loss", "value_loss", "RewardNormalizer", "minibatch_indices")},
    "epoch_minibatches": ("ppo_ewma", "ppg_ewma", "ppo_staleness"),
    **{name: EWMA for name in ("decoupled_kl_loss", "update_ewma", "com_to_decay", "span_to_decay", "EwmaMoments")},
    **{name: ("ppo_ewma", "ppg_ewma") for name in ("noise_scale_estimates", "GradientNoiseScale")},
    **{name: ("ppo_ewma", "ppo_ewma_rnn", "ppo_er") for name in ("gaussian_log_prob", "gaussian_entropy")},
    "mlp": ("ppo_ewma", "ppo_er"), "clip_observations": ("vmpo", "ppo_er"), "RecurrentCore": ("ppo_ewma_rnn", "vmpo"),
    # ppo_ewma_rnn.py is ppo_ewma.py with a recurrent policy: all but its network, its loop and what they touch
    **{name: ("ppo_ewma", "ppo_ewma_rnn") for name in (
        "with_defaults", "apply_batch_divisor", "decay_to_com", "make_env", "NormalizeObservationPerEnv", "gaussian_kl",
        "env_actions", "clipped_value_loss", "raw_value", "past_target_kl", "linear_schedule", "kl_adaptive_lr",
        "add_statistics", "option_scalars", "warn_about_settings")},
}
RENAMES = {}  # script -> {its name for a concept: the name the other scripts give it}, applied before comparing


def source(script: str, name: str) -> str:
    """The source of `name` in `script`, with the script's own names for shared concepts made the common ones."""
    text = inspect.getsource(getattr(importlib.import_module(script), name))
    for own, common in RENAMES.get(script, {}).items():
        text = re.sub(rf"\b{own}\b", common, text)
    return text


def differences(sources: dict) -> str:
    """{script: source} -> a unified diff of every copy that differs from the first one's ("" if all agree)."""
    (first, reference), *others = sources.items()
    return "".join("".join(difflib.unified_diff(reference.splitlines(True), text.splitlines(True), first, script))
                   for script, text in others if text != reference)


@pytest.mark.parametrize("name", COPIES)
def test_each_copy_is_the_same_text_in_every_script(name):
    diff = differences({script: source(script, name) for script in COPIES[name]})
    assert not diff, f"the copies of {name} differ; make them agree:\n{diff}"


def test_a_changed_copy_is_caught_and_shown():
    sources = {script: source(script, "compute_gae") for script in COPIES["compute_gae"]}
    sources["vmpo"] = sources["vmpo"].replace("gamma * gae_lambda", "gae_lambda * gamma")  # the same number, but not
    diff = differences(sources)  # the same text: exactly what a diff of two scripts would show
    assert diff.startswith("--- ppo_ewma\n+++ vmpo\n")
    assert "+        last_gae = advantages[t] = delta + gae_lambda * gamma" in diff
