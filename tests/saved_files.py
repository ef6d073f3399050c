"""The tests' way into a run's files: read_back(path) gives what a checkpoint or model file holds as a dict of plain
values and tensors (each read), write_back(path, tree) writes a checkpoint as a run would (harness.save_checkpoint),
so that a test can edit one as an attacker would."""
import safetensors
import torch

import checkpoints
import harness


def read_back(path) -> dict:
    """A checkpoint's content, or a model's ("weights": its tensors, and its metadata's keys), every tensor read."""
    file = safetensors.safe_open(str(path), "pt")
    (kind, text), = file.metadata().items()
    names = set(file.keys()) if kind == "checkpoint" else set()
    tree = read_all(checkpoints.decoded(checkpoints.parsed(text), file, names, set()))
    if kind == "model":
        tree["weights"] = {name: file.get_tensor(name).clone() for name in file.keys()}
    return tree


def read_all(value):
    if isinstance(value, checkpoints.Stored):
        return value.read().clone()
    if isinstance(value, (list, tuple)):
        return type(value)(read_all(item) for item in value)
    if isinstance(value, dict):
        return {key: read_all(item) for key, item in value.items()}
    return value


def write_back(path, tree: dict) -> None:
    harness.save_checkpoint(str(path), tree)


def tensors_equal(a, b) -> bool:
    """Two read_back trees hold the same values, tensors compared whole."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(tensors_equal, a, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(tensors_equal(a[k], b[k]) for k in a)
    return a == b or a != a and b != b
