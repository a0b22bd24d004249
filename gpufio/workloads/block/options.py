"""The block workload's own keys, typed (the rate cap, ``BlockSettings``)."""

from __future__ import annotations

from typing import Any

from gpufio.core import rate
from gpufio.core.errors import BadInput
from gpufio.core.options import settings_class
from gpufio.engines import all_engines

# a block job's own keys, typed (its workload_settings)
BlockSettings = settings_class("BlockSettings", rate.OPTIONS, __name__)


def check(where: str, engine: str, values: Any) -> None:
    """A rate cap needs an engine whose host loop spaces the I/Os."""
    if values.rate_iops and not all_engines()[engine].paced:
        raise BadInput(f"{where}key 'rate_iops': engine '{engine}' issues its I/Os from the "
                       "GPU, where no rate cap applies; use a host-driven engine")
    if values.rate_process != "linear" and not values.rate_iops:
        raise BadInput(f"{where}key 'rate_process': needs a rate_iops to space")
