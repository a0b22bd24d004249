"""The cufile engine without a GPU (CI): availability reasons, mode labels, placement."""

import sys

import pytest

from gpufio.engines import all_engines
from gpufio.engines.base import label
from gpufio.io import gpu
from gpufio.profile import from_dict
from gpufio.workloads.block.document import summary_rows


def test_missing_kvikio_is_named_with_the_extra_to_install(monkeypatch):
    monkeypatch.setattr(gpu, "probe", lambda: (1, None))
    monkeypatch.setitem(sys.modules, "kvikio", None)  # makes "import kvikio" raise ImportError
    why = all_engines()["cufile"].unavailable()
    assert why == "KvikIO is not installed (pip install 'gpufio[gds]')"


def test_no_gpu_is_reported_before_kvikio(monkeypatch):
    monkeypatch.setattr(gpu, "probe", lambda: (0, "no GPU found"))
    assert all_engines()["cufile"].unavailable() == "no GPU found"


def test_compat_mode_is_part_of_every_label():
    assert label("cufile", {"mode": "compat"}) == "cufile (compat)"
    assert label("uring", {"page_cache": False}) == "uring"
    doc = {"jobs": [{"jobname": "j", "engine": "cufile", "engine_facts": {"mode": "compat"},
                     "read": {"iops": 1.0, "bw_bytes": 4096.0, "lat_ns": {
                         "mean": 1000.0, "percentile": {"50.000000": 1000, "99.000000": 2000,
                                                        "99.900000": 3000}}},
                     "usr_cpu": 0.0, "sys_cpu": 0.0, "cpu_us_per_io": 0.0}]}
    assert summary_rows(doc)[0]["engine"] == "cufile (compat)"


@pytest.mark.parametrize("given,expected", [
    ({"gpu": 1}, [1, 1, 1, 1]),
    ({"gpus": [0, 1]}, [0, 1, 0, 1]),
    ({"gpus": "2,0,1", "gpu": 5}, [2, 0, 1, 2]),
])
def test_gpus_are_given_to_workers_round_robin(given, expected):
    prof = from_dict({"global": {"size": "1m", "numjobs": 4, "engine": "cufile", **given}},
                     "t.toml", {})
    (job,) = prof.jobs
    assert [job.gpu_of(w) for w in range(4)] == expected
    assert job.engine_options == {"threads": 0, "require_gds": False, "api": "kvikio",
                                  "iodepth_batch": 0, "streams": 0, "register_buffers": False,
                                  "processes": False}


def test_require_gds_in_compat_mode_is_a_one_line_exit_2(monkeypatch, write_profile,
                                                         pattern_file, run_quietly):
    from gpufio.engines import cufile

    monkeypatch.setattr(cufile.CuFile, "unavailable", classmethod(lambda cls: None))
    monkeypatch.setattr(cufile, "cufile_mode", lambda api="kvikio": "compat")
    monkeypatch.setattr(gpu, "use", lambda index: None)
    path = write_profile(f'[global]\nengine = "cufile"\ntargets = ["{pattern_file}"]\n'
                         'require_gds = true\n')
    res = run_quietly(path)
    assert res.exit_code == 2
    assert res.stderr.strip().splitlines() == [
        "gpufio: error: job 'job': engine 'cufile': require_gds is set, but cuFile runs in "
        "compat mode here (no GPUDirect Storage driver, or KVIKIO_COMPAT_MODE=on)"]


def test_info_says_how_cufile_would_run(monkeypatch):
    from gpufio.engines import cufile

    monkeypatch.setattr(cufile.CuFile, "unavailable", classmethod(lambda cls: None))
    monkeypatch.setattr(cufile, "cufile_mode", lambda api="kvikio": "compat")
    assert all_engines()["cufile"].status() == "available, mode compat"
    monkeypatch.setattr(cufile.CuFile, "unavailable",
                        classmethod(lambda cls: "KvikIO is not installed"))
    assert all_engines()["cufile"].status() == "KvikIO is not installed"
    assert all_engines()["psync"].status() == "available"
