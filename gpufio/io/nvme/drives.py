"""Drive models: a drive's published rates (drives.toml, each figure with its source) and
the rate model a software controller holds its completions to (drive_rate.c).

``model(name)`` reads a drive; ``DriveRate(model)`` is its rate model, whose
``admit(now_ns, nbytes)`` gives the earliest time a command fetched at ``now_ns`` may
complete: no faster than the drive's IOPS, sequential read or link bandwidth, no sooner
than its latency. A figure no public source gave is left out of the model, never guessed.
Every result of a modelled drive carries ``label(model)``.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from gpufio.core.errors import BadInput
from gpufio.native import nvme as native

DATA = Path(__file__).with_name("drives.toml")
SOURCES = (Path(__file__).with_name("drive_rate.c"),)


@dataclass(frozen=True)
class DriveModel:
    """A drive's published figures (None: not modelled) and where each is from."""

    key: str
    name: str
    link: str
    link_bw: float
    iops: float | None
    read_bw: float | None
    latency_ns: int | None
    sources: dict[str, str]  # figure -> URL
    unpublished: str = ""

    @property
    def source(self) -> str:
        """The rates' source: the first of iops, read_bw, latency, link that has one."""
        for figure in ("iops", "read_bw", "latency", "link"):
            if figure in self.sources:
                return self.sources[figure]
        return ""


@lru_cache(maxsize=1)
def _data() -> dict:
    with open(DATA, "rb") as f:
        return tomllib.load(f)


def names() -> tuple[str, ...]:
    """The models' keys (the profile's ``drive_model`` choices)."""
    return tuple(_data()["drives"])


def model(key: str) -> DriveModel:
    """The drive ``key`` of drives.toml; BadInput naming the known ones for another."""
    data = _data()
    d = data["drives"].get(key)
    if d is None:
        raise BadInput(f"drive_model '{key}': no such drive model (models: "
                       f"{', '.join(names())})")
    link = data["links"][d["link"]]
    sources = {"link": d["link_source"], "link_bandwidth": link["source"]}
    for figure in ("iops", "read_bw", "latency"):
        if f"{figure}_source" in d:
            sources[figure] = d[f"{figure}_source"]
    latency = d.get("latency_us")
    return DriveModel(key, d["name"], d["link"], float(link["bandwidth"]),
                      float(d["iops"]) if "iops" in d else None,
                      float(d["read_bw"]) if "read_bw" in d else None,
                      None if latency is None else int(latency * 1000), sources,
                      d.get("unpublished", ""))


def label(m: DriveModel) -> str:
    """What every result of a job on a modelled drive says beside its numbers."""
    return f"emulated: {m.key}, rates from {m.source}"


def describe(m: DriveModel) -> dict:
    """The model as a result document records it: its figures, sources and gaps."""
    return {"model": m.key, "name": m.name, "link": m.link, "link_bw": m.link_bw,
            "iops": m.iops, "read_bw": m.read_bw, "latency_ns": m.latency_ns,
            "sources": dict(m.sources), "unmodelled": m.unpublished, "label": label(m)}


def _library() -> Any:
    return native.drive_library(SOURCES)


def available() -> bool:
    """Whether the rate model is built (now, where it was not) and loads."""
    return _library() is not None


class DriveRate:
    """The rate model of ``m`` (drive_rate.c through native/nvme.py), idle:
    ``admit(now_ns, nbytes)`` -> the earliest completion time in ns. ``state`` is the C
    state a compiled controller may be handed (native/nvme.serve takes it)."""

    def __init__(self, m: DriveModel) -> None:
        lib = _library()
        if lib is None:
            raise RuntimeError("the drive rate model needs a C compiler (cc)")
        self.state = native.DriveState(lib, m.iops or 0.0, m.read_bw or 0.0, m.link_bw,
                                       m.latency_ns or 0)
        self._admit = self.state.admit

    def admit(self, now_ns: int, nbytes: int) -> int:
        return int(self._admit(now_ns, nbytes))

    @property
    def admitted(self) -> int:
        return self.state.admitted
