"""Disk use: ``gpufio clean`` finds everything gpufio laid out (by its pattern header, whatever
the file's name), and a layout that takes more than 10% of the free space needs consent:
--yes, the job's allow_large_layout, or a yes on a terminal; elsewhere it is one line, exit 2."""

import os
import pty
import re
import select
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from gpufio.cli import app
from gpufio.core import space
from gpufio.core.errors import BadInput

from checkout import DATA, REPO

cli = CliRunner()
EXAMPLES = DATA / "fio-examples"


def _ssd_test(tmp_path, directory):
    """fio's examples/ssd-test.fio with its directory= pointed at ``directory``."""
    text = (EXAMPLES / "ssd-test.fio").read_text()
    path = tmp_path / "ssd-test.fio"
    path.write_text(re.sub(r"(?m)^directory=.*$", f"directory={directory}", text))
    return path


def test_clean_finds_what_a_fio_job_file_laid_out(tmp_path):
    ssd = tmp_path / "ssd"
    ssd.mkdir()
    job = _ssd_test(tmp_path, ssd)
    assert cli.invoke(app, ["run", str(job), "-q", "--set", "size=1m"]).exit_code == 0
    (ssd / "notes.txt").write_text("the user's")
    (ssd / "data.bin").write_bytes(os.urandom(8192))
    res = cli.invoke(app, ["clean", "--dry-run", "--directory", str(ssd)])
    assert res.exit_code == 0, res.output
    assert f"would remove {ssd}/ssd.test.file (1.0MiB)" in res.stdout
    assert "notes.txt" not in res.stdout and "data.bin" not in res.stdout
    assert (ssd / "ssd.test.file").exists()
    res = cli.invoke(app, ["clean", "-d", str(ssd)])
    assert res.exit_code == 0 and f"removed {ssd}/ssd.test.file" in res.stdout
    assert sorted(os.listdir(ssd)) == ["data.bin", "notes.txt"]


def test_clean_finds_a_profiles_named_target_and_a_prepared_one(tmp_path, write_profile):
    target = tmp_path / "bench.img"
    prof = write_profile(f'[global]\nengine = "psync"\ntargets = ["{target}"]\nsize = "1m"\n')
    res = cli.invoke(app, ["prepare", str(prof)])
    assert res.exit_code == 0 and target.exists(), res.output
    res = cli.invoke(app, ["clean", "-d", str(tmp_path)])
    assert res.exit_code == 0 and f"removed {target} (1.0MiB)" in res.stdout
    assert "1 files gpufio laid out in" in res.stdout and not target.exists()


@pytest.fixture
def free(monkeypatch):
    """Pretend the filesystems have ``n`` bytes free."""
    def set_free(n):
        monkeypatch.setattr(space, "free_bytes", lambda path: n)
    return set_free


def test_a_small_layout_needs_no_consent(free, tmp_path):
    free(100 << 20)
    space.check_layout(str(tmp_path / "x"), 10 << 20, allowed=False)


def test_a_large_layout_is_refused_without_consent(free, tmp_path):
    free(100 << 20)
    with pytest.raises(BadInput) as err:
        space.check_layout(str(tmp_path / "x"), 11 << 20, allowed=False)
    assert str(err.value) == (
        f"target {tmp_path}/x: laying it out writes 11.0MiB, 11% of the 100.0MiB free on its "
        "filesystem (more than 10%); confirm with --yes or allow_large_layout = true, or give "
        "a smaller size")
    space.check_layout(str(tmp_path / "x"), 11 << 20, allowed=True)
    with space.answering(None, yes=True):
        space.check_layout(str(tmp_path / "x"), 11 << 20, allowed=False)
    with pytest.raises(BadInput, match="more than the 100.0MiB free on its filesystem"):
        space.check_layout(str(tmp_path / "x"), 101 << 20, allowed=True)


def test_a_large_layout_asks_with_the_display_aside(free, tmp_path):
    free(100 << 20)
    asked, paused = [], []

    class Pause:
        def __enter__(self):
            paused.append("in")

        def __exit__(self, *exc):
            paused.append("out")

    with space.aside(Pause), space.answering(lambda q: asked.append(q) or True, yes=False):
        space.check_layout(str(tmp_path / "x"), 50 << 20, allowed=False)
    assert asked == [f"gpufio: target {tmp_path}/x: laying it out writes 50.0MiB, 50% of the "
                     "100.0MiB free on its filesystem. Lay it out?"]
    assert paused == ["in", "out"]
    with space.answering(lambda q: False, yes=False), pytest.raises(BadInput, match="declined"):
        space.check_layout(str(tmp_path / "x"), 50 << 20, allowed=False)


def test_a_fio_example_of_10g_is_one_line_without_consent(free, tmp_path):
    ssd = tmp_path / "ssd"
    ssd.mkdir()
    free(50 << 30)  # 10 GiB would be 20% of it
    res = cli.invoke(app, ["run", str(_ssd_test(tmp_path, ssd)), "-q"])
    assert res.exit_code == 2, res.output
    (error,) = [line for line in res.stderr.splitlines() if not line.startswith("gpufio: note")]
    assert f"target {ssd}/ssd.test.file: laying it out writes 10.0GiB, 20% of the 50.0GiB " \
        "free" in error and "confirm with --yes" in error
    assert os.listdir(ssd) == []


@pytest.mark.parametrize("consent", [["--yes"], ["--set", "allow_large_layout=true"]])
def test_yes_or_the_profile_key_lays_it_out(consent, free, tmp_path):
    ssd = tmp_path / "ssd"
    ssd.mkdir()
    free(5 << 20)  # 1 MiB is 20% of it
    job = _ssd_test(tmp_path, ssd)
    res = cli.invoke(app, ["run", str(job), "-q", "--set", "size=1m"])
    assert res.exit_code == 2 and "confirm with --yes" in res.stderr, res.output
    res = cli.invoke(app, ["run", str(job), "-q", "--set", "size=1m", *consent])
    assert res.exit_code == 0, res.output
    assert os.listdir(ssd) == ["ssd.test.file"]


def _small_filesystem(tmp_path):
    """A 16 MiB tmpfs mounted in ``tmp_path`` (root needed, else the test is skipped)."""
    where = tmp_path / "small"
    where.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(where)],
                         capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {res.stderr.strip()}")
    return where


def _on_a_terminal(argv, answer):
    """Run gpufio with stdin and stderr on a pseudo-terminal; answer its question with
    ``answer`` once it is asked: (exit status, everything it wrote there)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "gpufio", *argv], stdin=slave,
                            stdout=subprocess.DEVNULL, stderr=slave, cwd=REPO)
    os.close(slave)
    seen = b""
    try:
        while True:
            ready, _, _ = select.select([master], [], [], 60)
            if not ready:
                break
            try:
                chunk = os.read(master, 4096)
            except OSError:  # the child has gone and closed the terminal
                break
            if not chunk:
                break
            seen += chunk
            if b"Lay it out? [y/N]" in seen and answer:
                os.write(master, answer)
                answer = b""
        return proc.wait(timeout=60), seen.decode(errors="replace")
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()


@pytest.mark.parametrize("answer,code", [(b"n\n", 2), (b"y\n", 0)])
def test_on_a_terminal_a_large_layout_is_asked_first(answer, code, tmp_path, write_profile):
    small = _small_filesystem(tmp_path)
    try:
        target = small / "t.dat"
        prof = write_profile(f'[global]\nengine = "psync"\ntargets = ["{target}"]\n'
                             'size = "4m"\nbs = "64k"\n')
        status, text = _on_a_terminal(["run", str(prof)], answer)
        assert "laying it out writes 4.0MiB, 25% of the 16.0MiB free" in text, text
        assert status == code, text
        assert target.exists() == (code == 0)
        if code == 2:
            assert "not laid out (declined)" in text
    finally:
        subprocess.run(["umount", str(small)], check=False)


def test_files_on_one_filesystem_are_judged_together(free, tmp_path):
    free(100 << 20)
    many = [(str(tmp_path / f"shard{i}"), 4 << 20) for i in range(5)]  # 4% each, 20% in all
    with pytest.raises(BadInput, match=f"target {tmp_path}/shard0 and 4 more: laying them out "
                                       "writes 20.0MiB, 20% of the 100.0MiB free"):
        space.check_layouts(many, allowed=False)
    asked = []
    with space.answering(lambda q: asked.append(q) or True, yes=False):
        space.check_layouts(many, allowed=False)
        space.check_layout(many[0][0], 50 << 20, allowed=False)  # said yes to already
    assert len(asked) == 1


def test_a_checkpoint_of_many_small_shards_needs_consent(free, tmp_path, write_profile):
    free(64 << 20)
    prof = write_profile(f'[global]\nworkload = "checkpoint"\nengine = "psync"\n'
                         f'targets = ["{tmp_path}"]\nstate_size = "16m"\nshards = ["2m"]\n'
                         'device = "cpu"\niterations = 1\n')
    res = cli.invoke(app, ["run", str(prof), "-q"])
    assert res.exit_code == 2, res.output
    assert "and 7 more: laying them out writes 16.0MiB, 25% of the 64.0MiB free" in res.stderr
    assert not list(tmp_path.glob("gpufio-ckpt*"))
