"""Accelerator prices for chargeback: `config/rates.yaml`, overridable per cluster.

The same H100 costs $3.50 an hour on demand and $1.91 amortised on-premise (seed §11), so a
cluster file may set `accelerators.<type>.hourlyRateUsd`; that price wins for jobs on that
cluster, and `config/rates.yaml` prices everything else.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import yaml
from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, PositiveFloat
from pydantic.alias_generators import to_camel

if TYPE_CHECKING:
    from trainyard.config.cluster import Cluster

RATES_FILE = Path(__file__).resolve().parents[2] / "config" / "rates.yaml"


class Rates(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)

    currency: str = "USD"
    gpu_hour_usd: dict[str, PositiveFloat] = Field(min_length=1)
    """Price of one device-hour by accelerator type."""
    storage_gb_month_usd: NonNegativeFloat = 0.023
    """Object storage, per GB-month (checkpoints)."""

    def rate_for(self, gpu_type: str, cluster: Cluster | None = None) -> float:
        """$/device-hour: the cluster's own price for the type if it sets one, else ours."""
        if cluster is not None:
            acc = cluster.spec.accelerators.get(gpu_type)
            if acc is not None and acc.hourly_rate_usd is not None:
                return float(acc.hourly_rate_usd)
        if gpu_type not in self.gpu_hour_usd:
            raise ValueError(f"no hourly rate for accelerator type {gpu_type!r}; config/rates.yaml has "
                             f"{', '.join(sorted(self.gpu_hour_usd))} (add it there or set "
                             "hourlyRateUsd in the cluster's accelerators)")
        return float(self.gpu_hour_usd[gpu_type])


def load_rates(path: str | Path | None = None) -> Rates:
    """Read a rates file (default `config/rates.yaml`)."""
    source = Path(path) if path is not None else RATES_FILE
    data = yaml.safe_load(source.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{source} must hold a mapping with gpuHourUsd, got {type(data).__name__}")
    return Rates.model_validate(data)
