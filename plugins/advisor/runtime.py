"""What the worker runtime can apply today, declared once.

`worker/distributed/parallelize.py` refuses some plans (context parallelism, fp16 without a
loss scaler, tied embeddings split by TP or PP, mixture-of-experts models). Those refusals used
to live only in the worker, so the advisor recommended plans the worker then refused inside
torchrun, after the accelerators were allocated. Now `WORKER_RUNTIME` says what the runtime
supports; the worker checks plans against it, the advisor's search never proposes anything
outside it (`search(..., runtime=WORKER_RUNTIME)`, what `plan_job` uses), and the dry run
(`plugins/validation/runtime.py`) rejects a spec that asks for more, before anything is
allocated.

Pure data and arithmetic: no torch, so config-free engines and the advisor import it cheaply.
When the runtime learns a technique (context parallelism, say), change it here and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainyard.config.spec import Precision


@dataclass(frozen=True)
class RuntimeCapabilities:
    """Limits of one training runtime; `None` means no limit."""

    name: str
    max_cp: int | None = None
    """Largest context-parallel degree the runtime applies (1: no context parallelism)."""
    max_ep: int | None = None
    """Largest expert-parallel degree (1: no expert parallelism)."""
    moe: bool = True
    """Whether mixture-of-experts models can run at all."""
    precisions: tuple[Precision, ...] = ("bf16", "fp16", "fp32")
    tied_embeddings_with_tp: bool = True
    tied_embeddings_with_pp: bool = True

    def refusals(self, *, cp: int = 1, ep: int = 1, tp: int = 1, pp: int = 1,
                 precision: str | None = None, moe: bool = False,
                 tie_embeddings: bool = False) -> list[str]:
        """Why the runtime would refuse this configuration: one sentence per reason, naming
        the value; empty when it can run."""
        out = []
        if self.max_cp is not None and cp > self.max_cp:
            out.append(f"context parallelism cp({cp}) is not supported by the {self.name} runtime "
                       f"(at most {self.max_cp})")
        if moe and not self.moe:
            out.append(f"mixture-of-experts models are not supported by the {self.name} runtime")
        elif self.max_ep is not None and ep > self.max_ep:
            out.append(f"expert parallelism ep({ep}) is not supported by the {self.name} runtime "
                       f"(at most {self.max_ep})")
        if precision is not None and precision not in self.precisions:
            out.append(f"mixedPrecision {precision} is not supported by the {self.name} runtime "
                       f"(it supports {', '.join(self.precisions)})")
        if tie_embeddings and tp > 1 and not self.tied_embeddings_with_tp:
            out.append(f"tied embeddings cannot be split by tensor parallelism tp({tp}) in the "
                       f"{self.name} runtime")
        if tie_embeddings and pp > 1 and not self.tied_embeddings_with_pp:
            out.append(f"tied embeddings cannot span pipeline stages pp({pp}) in the "
                       f"{self.name} runtime")
        return out

    def allows_degrees(self, *, cp: int, ep: int, tp: int, pp: int, tie_embeddings: bool) -> bool:
        """The search's filter: True when these degrees can run."""
        return not self.refusals(cp=cp, ep=ep, tp=tp, pp=pp, tie_embeddings=tie_embeddings)


WORKER_RUNTIME = RuntimeCapabilities(
    name="worker", max_cp=1, max_ep=1, moe=False, precisions=("bf16", "fp32"),
    tied_embeddings_with_tp=False, tied_embeddings_with_pp=False)
"""`worker/distributed/parallelize.py` as it is today: TP, PP (with interleaving), DP (DDP or
FSDP2 ZeRO 1-3), sequence parallelism and activation checkpointing; no CP, no EP or MoE, no fp16
(it would need loss scaling), no tied embeddings under TP or PP."""
