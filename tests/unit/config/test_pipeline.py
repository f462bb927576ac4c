"""The one uneven pipeline split (`config/pipeline.py`) the rules, the advisor and the worker
share."""

from __future__ import annotations

import pytest

from trainyard.config.pipeline import (
    describe_split,
    rank_layer_counts,
    split_imbalance,
    stage_layer_counts,
)


@pytest.mark.parametrize("layers", range(1, 40))
@pytest.mark.parametrize("stages", range(1, 12))
def test_every_split_covers_the_layers_and_differs_by_at_most_one(layers: int, stages: int) -> None:
    if stages > layers:
        with pytest.raises(ValueError, match="every stage needs at least one layer"):
            stage_layer_counts(layers, stages)
        return
    counts = stage_layer_counts(layers, stages)
    assert sum(counts) == layers and len(counts) == stages
    assert max(counts) - min(counts) <= 1 and min(counts) >= 1
    if stages > 2 and layers % stages:
        # the ends (embedding; head and loss) are never heavier than a middle stage
        assert counts[0] <= max(counts[1:-1]) and counts[-1] <= max(counts[1:-1])


def test_published_uneven_splits() -> None:
    assert stage_layer_counts(126, 16) == [7] + [8] * 14 + [7]  # Llama 3 405B
    assert stage_layer_counts(70, 12) == [5] + [6] * 10 + [5]  # BLOOM-176B
    assert describe_split(126, 16) == "7, 8 ×14, 7"
    assert describe_split(5, 2) == "3, 2"
    assert split_imbalance(126, 16) == pytest.approx(8 * 16 / 126)
    assert split_imbalance(32, 4) == 1.0


def test_interleaved_ranks_hold_their_loop_placed_stages() -> None:
    # 5 layers on 2 ranks × 2 virtual stages: stages 1, 2, 1, 1; rank 0 holds 0 and 2.
    assert stage_layer_counts(5, 4) == [1, 2, 1, 1]
    assert rank_layer_counts(5, 2, 2) == [2, 3]
    assert rank_layer_counts(126, 16, 4) == [7] + [8] * 14 + [7]
