import pytest

from gpufio import profile
from gpufio.core.errors import BadInput

from checkout import PROFILES


def load(text, write_profile, overrides=None):
    return profile.load(str(write_profile(text)), overrides or {})


def test_global_defaults_and_job_overrides(write_profile):
    p = load("""
[global]
bs = "8k"
size = "1g"
runtime = 10
[[job]]
name = "a"
[[job]]
name = "b"
bs = "1m"
rw = "read"
""", write_profile)
    a, b = p.jobs
    assert (a.name, a.bs, a.rw, a.size, a.runtime) == ("a", 8192, "randread", 1 << 30, 10 ** 10)
    assert (b.name, b.bs, b.rw) == ("b", 1 << 20, "read")
    assert a.direct is True and a.iodepth == 1 and a.engine == "psync" and not p.concurrent
    assert a.options_as_given["bs"] == "8k"


def test_defaults_without_jobs(write_profile):
    p = load('[global]\nsize = "4k"\n', write_profile)
    assert [j.name for j in p.jobs] == ["job"]
    j = p.jobs[0]
    assert (j.ramp_time, j.randseed, j.file_service, str(j.random_distribution)) == \
        (0, 0x89, "roundrobin", "random")
    assert j.sample_interval == 500_000_000


def test_sweep_is_a_cross_product(write_profile):
    p = load("""
[global]
size = "1m"
[[job]]
name = "q"
[sweep]
iodepth = [1, 8, 32]
bs = ["4k", "64k"]
""", write_profile)
    assert len(p.jobs) == 6
    assert {(j.iodepth, j.bs) for j in p.jobs} == {(d, b) for d in (1, 8, 32) for b in (4096, 65536)}
    assert p.jobs[0].name == "q[iodepth=1,bs=4k]"


def test_set_overrides_profile_and_sweep(write_profile):
    text = '[global]\nsize = "1m"\nnumjobs = 2\n[sweep]\nnumjobs = [1, 2, 4]\n'
    p = load(text, write_profile, profile.parse_set(["numjobs=3", "direct=false", "bs=64k",
                                                     "targets=/a,/b", "concurrent=true"]))
    assert len(p.jobs) == 1
    j = p.jobs[0]
    assert (j.numjobs, j.direct, j.bs, j.targets) == (3, False, 65536, ("/a", "/b"))
    assert p.concurrent


def test_file_service_alias_and_distribution(write_profile):
    p = load('[global]\nsize = "1m"\nfile_service = "round-robin"\n'
             'random_distribution = "zipf:1.1"\n', write_profile)
    assert p.jobs[0].file_service == "roundrobin"
    assert str(p.jobs[0].random_distribution) == "zipf:1.1"


BAD = [
    ("[global\nbs = 1", r"malformed TOML: .*line 1"),
    ('[global]\nbs = "4k"\nbs = "8k"\n', r"malformed TOML: .*line 3"),
    ("[global]\niodeph = 4\n", r"unknown key 'iodeph' \(did you mean 'iodepth'\?\)"),
    ("[global]\nxyzzy = 4\n", r"unknown key 'xyzzy'$"),
    ("[globl]\n", r"top level: unknown key 'globl' \(did you mean 'global'\?\)"),
    ('[global]\nengine = "psyncc"\n', r"unknown engine 'psyncc' \(did you mean 'psync'\?\)"),
    ('[global]\niodepth = "deep"\n', r"key 'iodepth': expected a whole number"),
    ("[global]\ndirect = 3\n", r"key 'direct': expected true or false"),
    ("[global]\nsize = 0\n", r"key 'size': must be greater than 0"),
    ('[global]\nsize = "-4k"\n', r"key 'size': cannot read size"),
    ("[global]\nbs = 0\n", r"key 'bs': must be at least 512"),
    ("[global]\nbs = 1000\n", r"key 'bs': 1000 is not a multiple of 512"),
    ("[global]\nnumjobs = 0\n", r"key 'numjobs': must be greater than 0"),
    ('[global]\nruntime = "0s"\n', r"key 'runtime': must be greater than 0"),
    ('[global]\nrw = "trim"\n', r"key 'rw': 'trim' is not one of read, randread, write"),
    ('[global]\nrw = "read"\nrwmixread = 30\n', r"key 'rwmixread': needs a mixed job"),
    ('[global]\nrw = "randrw"\nrwmixread = 30\nrwmixwrite = 30\n', r"must add up to 100"),
    ('[global]\nrw = "randrw"\nrwmixwrite = 130\n', r"key 'rwmixwrite': a percentage"),
    ('[global]\nfsync = 4\n', r"key 'fsync': the job does not write \(rw = randread\)"),
    ('[global]\nrw = "write"\nfsync = 4\nfdatasync = 4\n', r"give one of them"),
    ('[global]\nsteadystate = "iops:5%"\nruntime = "5s"\n', r"needs a steadystate_duration"),
    ('[global]\nsteadystate = "iops:5%"\nsteadystate_duration = "2s"\n', r"needs a runtime"),
    ('[global]\nsteadystate = "lat:5%"\n', r"is not KIND:LIMIT"),
    ('[global]\nsteadystate = "iops_slope:x%"\n', r"limit 'x%' is not a number"),
    ('[global]\nsteadystate_duration = "2s"\n', r"needs a steadystate criterion"),
    ('[global]\nprecondition = "once"\n', r"key 'precondition': 'once' is not one of"),
    ("[global]\ntime_based = true\n", r"key 'time_based': needs a runtime"),
    ('[global]\nrandom_distribution = "zipf:0"\n', r"key 'random_distribution': .*out of range"),
    ('[global]\nfile_service = "hash"\n', r"key 'file_service'"),
    ("[sweep]\niodeph = [1, 2]\n", r"\[sweep\]: unknown key 'iodeph' \(did you mean 'iodepth'\?\)"),
    ("[sweep]\niodepth = 4\n", r"\[sweep\] key 'iodepth': expected a non-empty list"),
    ("[sweep]\niodepth = [1, 0]\n", r"key 'iodepth': must be greater than 0"),
    ("job = 3\n", r"jobs must be \[\[job\]\] tables"),
]


@pytest.mark.parametrize("text,message", BAD)
def test_bad_profiles_name_file_and_key(text, message, write_profile):
    path = write_profile(text)
    with pytest.raises(BadInput, match=message) as err:
        profile.load(str(path))
    assert str(err.value).startswith(str(path))
    assert "\n" not in str(err.value)


def test_bad_set_values():
    with pytest.raises(BadInput, match="expected KEY=VALUE"):
        profile.parse_set(["iodepth"])
    with pytest.raises(BadInput, match=r"--set: unknown key 'iodept' \(did you mean 'iodepth'\?\)"):
        profile.from_dict({}, "p.toml", {"iodept": "3"})
    with pytest.raises(BadInput, match="key 'bs': cannot read size"):
        profile.from_dict({}, "p.toml", {"bs": "big"})


def test_missing_profile_and_directory(tmp_path):
    with pytest.raises(BadInput, match="no such profile"):
        profile.load(str(tmp_path / "nope.toml"))
    with pytest.raises(BadInput, match="is a directory"):
        profile.load(str(tmp_path))


@pytest.mark.parametrize("path", sorted(PROFILES.glob("*.toml")),
                         ids=lambda p: p.name)
def test_every_shipped_profile_loads(path):
    """Each [[job]] table gives its jobs (a sweep one per point, named NAME[key=value]),
    every job's name is its own, and its engine and workload are registered ones."""
    import tomllib

    from gpufio.engines import all_engines
    from gpufio.workloads import all_workloads

    prof = profile.load(str(path))
    tables = tomllib.loads(path.read_text()).get("job", [{}])
    names = [job.name for job in prof.jobs]
    assert len(names) >= len(tables) and len(set(names)) == len(names)
    for table in tables:
        if "name" in table:
            assert any(n == table["name"] or n.startswith(f"{table['name']}[") for n in names)
    assert {job.engine for job in prof.jobs} <= set(all_engines())
    assert {job.workload for job in prof.jobs} <= set(all_workloads())


@pytest.mark.parametrize("workload,extra", [
    ("gnn", {}), ("checkpoint", {"state_size": "1m", "device": "cpu"})])
@pytest.mark.parametrize("key,value", [("rw", "randwrite"), ("numjobs", 4), ("runtime", "10s"),
                                       ("fsync", 1), ("verify", True)])
def test_a_block_key_in_another_workloads_job_is_refused_in_one_line(workload, extra, key,
                                                                     value):
    """A key that does nothing in the job's workload is an error, as an unknown key is:
    never silently accepted."""
    with pytest.raises(BadInput) as e:
        profile.from_dict({"global": {"workload": workload, **extra, key: value}}, "p.toml", {})
    assert str(e.value) == (f"p.toml: job 'p': key '{key}' does nothing in a job of workload "
                            f"'{workload}' (it is a key of block jobs)")
    with pytest.raises(BadInput, match=f"key '{key}' does nothing"):  # from --set too
        profile.from_dict({"global": {"workload": workload, **extra}}, "p.toml", {key: value})


def test_the_write_guards_keys_belong_to_the_workloads_that_write():
    glob = {"workload": "checkpoint", "state_size": "1m", "device": "cpu", "overwrite": True}
    job = profile.from_dict({"global": glob}, "p.toml", {}).jobs[0]
    assert job.overwrite
    with pytest.raises(BadInput, match="it is a key of block and checkpoint jobs"):
        profile.from_dict({"global": {"workload": "gnn", "overwrite": True}}, "p.toml", {})
