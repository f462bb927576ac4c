"""How a pipeline splits a model's layers over its stages — the one definition the spec rules,
the advisor's memory and time models and the worker's stage builder all use.

It lives in `config/` because it is the bottom layer every other one may import, and a spec
rule needs it to say which stage sizes an uneven `pipelineParallel` gives.

With `pp` pipeline ranks and `vpp` virtual stages per rank there are S = pp·vpp stages in
model order; rank r holds stages r, r + pp, r + 2·pp, … (loop placement, what
`ScheduleInterleaved1F1B` expects). When S does not divide the layers, the first and the last
stage — which also carry the embedding and the output head with the loss — get the fewer
layers: Llama 3 405B ran 126 layers on 16 stages as 7, 8 ×14, 7 ("we reduce one Transformer
layer each from the first and the last stages", Llama Team 2024, §3.3.2), Megatron-LM offers
the same through `--decoder-first-pipeline-num-layers` / `--decoder-last-pipeline-num-layers`.
"""

from __future__ import annotations


def stage_layer_counts(num_layers: int, num_stages: int) -> list[int]:
    """Layers per pipeline stage, in model order, as even as possible.

    With base, extra = divmod(L, S), every stage gets `base` layers and `extra` of them one more:
    the middle stages first, then the first stage (it carries only the embedding lookup, cheap),
    the last (the head and the loss) last. So 126 layers on 16 stages is [7, 8 ×14, 7], 5 on 2
    is [3, 2], 10 on 3 is [3, 4, 3]; an even split is unchanged.
    """
    if num_stages < 1:
        raise ValueError(f"pipeline stages must be >= 1, got {num_stages}")
    if num_stages > num_layers:
        raise ValueError(f"pipeline stages ({num_stages} = pp·vpp) exceed the model's "
                         f"num_layers ({num_layers}); every stage needs at least one layer")
    base, extra = divmod(num_layers, num_stages)
    counts = [base] * num_stages
    order = ([*range(1, num_stages - 1), 0, num_stages - 1] if num_stages > 2
             else list(range(num_stages)))
    for i in order[:extra]:
        counts[i] += 1
    return counts


def rank_layer_counts(num_layers: int, pp: int, vpp: int = 1) -> list[int]:
    """Layers each of the `pp` pipeline ranks holds over its `vpp` virtual stages."""
    counts = stage_layer_counts(num_layers, pp * vpp)
    return [sum(counts[r + k * pp] for k in range(vpp)) for r in range(pp)]


def split_imbalance(num_layers: int, pp: int, vpp: int = 1) -> float:
    """Busiest rank's layers over the mean (1.0 for an even split): a pipeline runs at its
    busiest stage's pace, so this is the step-time cost of the split (ignoring the embedding
    and head, which the advisor's time model adds)."""
    ranks = rank_layer_counts(num_layers, pp, vpp)
    return max(ranks) * pp / num_layers


def describe_split(num_layers: int, pp: int, vpp: int = 1) -> str:
    """`7, 8 ×14, 7` — the stage sizes (virtual stages in model order), runs compressed."""
    counts = stage_layer_counts(num_layers, pp * vpp)
    parts: list[str] = []
    i = 0
    while i < len(counts):
        j = i
        while j + 1 < len(counts) and counts[j + 1] == counts[i]:
            j += 1
        run = j - i + 1
        parts.append(f"{counts[i]} ×{run}" if run > 2 else ", ".join([str(counts[i])] * run))
        i = j + 1
    return ", ".join(parts)
