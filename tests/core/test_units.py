import pytest

from gpufio.core.errors import BadInput
from gpufio.core.units import format_size, parse_size, parse_time_ns, size_spec


@pytest.mark.parametrize("text,expected", [
    ("4k", 4096), ("4K", 4096), ("4kib", 4096), ("1m", 1 << 20), ("2g", 2 << 30),
    ("1t", 1 << 40), ("512", 512), (8192, 8192), ("1.5k", 1536), ("64KiB", 65536),
])
def test_sizes_follow_fio_units(text, expected):
    assert parse_size(text, "bs") == expected


@pytest.mark.parametrize("bad", ["4x", "", "k", "-4k", "1.3k", True, 4.0, None])
def test_bad_sizes_name_the_key(bad):
    with pytest.raises(BadInput, match="^bs: "):
        parse_size(bad, "bs")


@pytest.mark.parametrize("text,ns", [
    ("10s", 10_000_000_000), ("500ms", 500_000_000), ("2m", 120_000_000_000),
    ("250us", 250_000), (3, 3_000_000_000), (0.5, 500_000_000), ("1h", 3_600_000_000_000),
    ("7", 7_000_000_000),
])
def test_times_default_to_seconds_like_fio(text, ns):
    assert parse_time_ns(text, "runtime") == ns


@pytest.mark.parametrize("bad", ["10 sec", "fast", "", False, [1]])
def test_bad_times_name_the_key(bad):
    with pytest.raises(BadInput, match="^runtime: "):
        parse_time_ns(bad, "runtime")


def test_format_size_is_binary():
    assert format_size(512) == "512B"
    assert format_size(1 << 30) == "1.0GiB"
    assert format_size(1536) == "1.5KiB"


@pytest.mark.parametrize("nbytes,spec", [(512 << 20, "512m"), (3072, "3k"), (3 << 30, "3g"),
                                         (1 << 40, "1t"), (1536, "1536"), (1 << 20, "1m")])
def test_size_spec_reads_back_as_the_same_bytes(nbytes, spec):
    assert size_spec(nbytes) == spec and parse_size(spec, "size") == nbytes
