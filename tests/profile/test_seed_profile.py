"""profiles/seed-bam.toml: the article's protocol and configurations, emulated by default,
and its controller = "vfio" form refused in one line (exit 2) where no drive is there."""

from pathlib import Path

from typer.testing import CliRunner

from gpufio import profile
from gpufio.cli import app

from checkout import PROFILES

PROFILE = PROFILES / "seed-bam.toml"
cli = CliRunner()


def test_the_profile_runs_every_configuration_of_the_article():
    jobs = profile.load(str(PROFILE)).jobs
    # the article's protocol for bam; the mmap baseline times 10 iterations after 2
    assert all((j.workload_settings.iterations, j.workload_settings.warmup)
               == ((12, 2) if j.engine == "mmap" else (1100, 1000)) for j in jobs)
    configs = set()
    for j in jobs:
        s, o = j.workload_settings, j.engine_options
        if j.engine == "mmap":
            assert s.memory_limit is not None and s.stripes == 1  # out of core, one drive
            configs.add(("mmap", s.batch_size))
            continue
        assert j.engine == "bam" and o["controller"] == "compiled"
        configs.add((o["drive_model"], s.stripes, bool(s.cache_size), s.batch_size))
    assert configs == {("mmap", b) for b in (1024, 4096)} | {
        (m, n, c, b) for m in ("dapustor-r5101", "dapustor-h5100") for n in (1, 2)
        for c in (False, True) for b in (1024, 4096)}


def _vfio(tmp_path, line: str) -> Path:
    path = tmp_path / "vfio.toml"
    path.write_text('[global]\nworkload = "gnn"\nnodes = 8192\nfeature_dim = 128\n'
                    'device = "cpu"\n[[job]]\nname = "bam-real"\nengine = "bam"\n'
                    f'controller = "vfio"\n{line}\n')
    return path


def test_the_vfio_form_without_a_drive_is_one_line_exit_2(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUFIO_SCRATCH", str(tmp_path))
    res = cli.invoke(app, ["run", str(_vfio(tmp_path, 'feature_file = ["/dev/nvme9n1"]'))])
    assert res.exit_code == 2 and "/dev/nvme9n1" in res.output
    assert len(res.output.strip().splitlines()) == 1
    res = cli.invoke(app, ["run", str(_vfio(tmp_path, 'drive_model = "micron-9550"'))])
    assert res.exit_code == 2 and "drive_model" in res.output
    assert len(res.output.strip().splitlines()) == 1
