"""A deterministic, resumable, reshardable distributed sampler.

Every rank sees the same infinite *sample stream*: epoch e is a permutation of the dataset
drawn from (seed, e), and the stream is epoch 0's permutation, then epoch 1's, and so on.
Training consumes the stream in order, one global batch at a time: the global batch of a step
is the next `world_size · batch_size` positions, and data-parallel rank r takes the positions
`r, r + world_size, r + 2·world_size, …` of it (strided, like `DistributedSampler`). So

- the ranks' shards of a step are disjoint and together are exactly the step's positions;
- the whole state of the data order is one integer, the *global position* (how many samples
  all ranks together have consumed), equal on every rank;
- a resume continues at that position with whatever world size it has: 4 ranks stopped at
  position p and resumed on 2 consume p, p+1, … on 2 ranks — no sample is seen twice and
  none is skipped. (torchtitan's per-rank dataloader state cannot be resharded; this one
  can, because it never records per-rank progress.)

`world_size` and `rank` here are the *data-parallel* degree and rank: tensor- and pipeline-
parallel peers of one replica must read the same samples.

Permutations come from `torch.randperm` with a CPU generator seeded with
`seed · 1_000_003 + epoch`: the same on every rank and machine for a given torch version (a
resume on another torch version could see another order; the checkpoint records the version).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch


class ResumableSampler:
    """Yields dataset indices for one data-parallel rank, resumably (see module docstring).

    Iteration is infinite (epochs follow each other); the training loop decides when to stop.
    `state_dict()` / `load_state_dict()` make it a `Stateful` for checkpoints.
    """

    def __init__(self, dataset_size: int, *, rank: int, world_size: int, seed: int = 0,
                 position: int = 0) -> None:
        if dataset_size <= 0:
            raise ValueError(f"dataset_size must be positive, got {dataset_size}")
        if world_size <= 0 or not 0 <= rank < world_size:
            raise ValueError(f"rank ({rank}) must be in [0, world_size={world_size})")
        if position < 0:
            raise ValueError(f"position must be >= 0, got {position}")
        self.dataset_size = dataset_size
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.position = position
        """Global position: samples consumed by all ranks together, the next global batch's start."""
        self._perm_epoch = -1
        self._perm: list[int] = []

    # --- the stream ---------------------------------------------------------------------

    def epoch_permutation(self, epoch: int) -> list[int]:
        if epoch != self._perm_epoch:
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._perm = torch.randperm(self.dataset_size, generator=generator).tolist()
            self._perm_epoch = epoch
        return self._perm

    def stream(self, position: int) -> int:
        """The dataset index at a global stream position."""
        epoch, offset = divmod(position, self.dataset_size)
        return self.epoch_permutation(epoch)[offset]

    @property
    def epoch(self) -> int:
        return self.position // self.dataset_size

    # --- consumption --------------------------------------------------------------------

    def next_batch(self, batch_size: int) -> list[int]:
        """This rank's `batch_size` indices of the next global batch; advances the position by
        the whole global batch (`batch_size · world_size`)."""
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        start = self.position + self.rank
        indices = [self.stream(start + k * self.world_size) for k in range(batch_size)]
        self.position += batch_size * self.world_size
        return indices

    def __iter__(self) -> Iterator[int]:
        while True:
            yield from self.next_batch(1)

    # --- checkpoint state ---------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The same on every rank: resumable with any world size."""
        return {"seed": self.seed, "position": self.position, "dataset_size": self.dataset_size}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        seed, size = int(state["seed"]), int(state["dataset_size"])
        if seed != self.seed:
            raise ValueError(f"checkpoint sampler seed ({seed}) differs from this run's seed "
                             f"({self.seed}); the data order would change")
        if size != self.dataset_size:
            raise ValueError(f"checkpoint was taken on a dataset of {size} samples; this one has "
                             f"{self.dataset_size}: the stored position would point elsewhere")
        self.position = int(state["position"])
