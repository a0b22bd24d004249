"""gpufio's benchmarks against its peers, each a module run as ``python3 -m bench.NAME``
from the repository root, written over ``gpufio.api`` (bench/README.md)."""
