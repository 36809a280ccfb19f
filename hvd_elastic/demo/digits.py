"""The demo's data: scikit-learn's bundled ``digits`` images (no download), one fixed train/test split.

Light to import (torch and scikit-learn are imported by :func:`load_split` only),
so the demo command can size its schedule without loading them.
"""

from __future__ import annotations

import json
import os

#: Images in scikit-learn's digits data set.
DIGITS = 1797
#: Held out for the accuracy test; the rest is the training split.
TEST_SAMPLES = 360
TRAIN_SAMPLES = DIGITS - TEST_SAMPLES
#: Samples per step at every world size.
GLOBAL_BATCH = 32
SPLIT_SEED = 0
RESULT = "result.json"


def load_split():
    """((train images, labels), (test images, labels)) as tensors (N x 1 x 8 x 8 in [0, 1]); the same everywhere."""
    import numpy as np
    import torch
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = torch.tensor(digits.images / 16.0, dtype=torch.float32).unsqueeze(1)
    labels = torch.tensor(digits.target, dtype=torch.int64)
    if len(labels) != DIGITS:
        raise RuntimeError(f"scikit-learn's digits has {len(labels)} images, expected {DIGITS}")
    order = torch.from_numpy(np.random.default_rng(SPLIT_SEED).permutation(len(labels)))
    test, train = order[:TEST_SAMPLES], order[TEST_SAMPLES:]
    return (images[train], labels[train]), (images[test], labels[test])


def steps_per_epoch(samples: int = TRAIN_SAMPLES) -> int:
    """Steps of one epoch (the sampler's last step absorbs a remainder smaller than the world size)."""
    return max(1, -(-samples // GLOBAL_BATCH))


def read_result(run_dir: str | os.PathLike) -> dict | None:
    """A run's ``result.json`` (written by rank 0 when training finished), None when there is none."""
    try:
        with open(os.path.join(run_dir, RESULT)) as f:
            return json.load(f)
    except FileNotFoundError:
        return None
