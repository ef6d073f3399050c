"""Weights & Biases, loaded only with --track: a W&B run that syncs the TensorBoard scalars. It imports none of the
project's modules; harness.py and evaluation.py call it."""
import dataclasses
import importlib.util
import os


def check() -> None:
    """Before any work: wandb is installed."""
    if importlib.util.find_spec("wandb") is None:
        raise SystemExit("--track needs the wandb package, which is not installed: pip install wandb==0.31.0.")


def start(args, run_dir: str, run_id=None) -> str:
    """A W&B run syncing the TensorBoard scalars (before the writer opens), the flags its config, named after the run
    directory; its id returned (for checkpoints); run_id continues a resumed one. Steps a resume replays appear twice
    in W&B's history, once in TensorBoard's."""
    import wandb

    # TensorBoard's scalars synced with the run directory named as their root: sync_tensorboard=True guesses the root,
    # which held wandb.finish() 9.9 s here; an earlier run's patch in this process (the tests start several) goes
    wandb.tensorboard.unpatch()
    wandb.tensorboard.patch(root_logdir=run_dir)
    try:
        run = wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, config=dataclasses.asdict(args),
                         name=os.path.basename(os.path.normpath(run_dir)), id=run_id,
                         resume="must" if run_id else None)
    except Exception as error:  # W&B's own errors (a project it cannot reach, a run it does not know) in one line
        raise SystemExit(f"--track: W&B could not {'continue run ' + run_id if run_id else 'start a run'} "
                         f"({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}).") from None
    return run.id


def finish() -> None:
    import wandb

    wandb.finish()
    wandb.tensorboard.unpatch()
