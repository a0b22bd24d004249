"""Little's law per engine beside fio: IOPS x mean latency / iodepth, one file, same minute.

    python3 -m bench.little FILE SECONDS ENGINES DEPTHS [FIO]
    python3 -m bench.little /var/tmp/f.img 4 uring,cpu-gpu,gpu-uring 32,128 fio

Each engine runs 4 KiB random reads with O_DIRECT at each depth through ``gpufio run``, then
fio's io_uring at the same depth; a line per run: ``LITTLE engine depth IOPS lat_us
product/depth``. An engine that keeps more than iodepth in flight (gpu-uring: rings x
iodepth) shows that multiple; a product under 1 is time its slots spent unstamped.
"""

import argparse
import json
import subprocess
import sys
import tempfile


def product(iops: float, lat_ns: float, depth: int) -> float:
    """IOPS x mean latency over the depth: 1.0 when every slot is always between stamps."""
    return iops * lat_ns / 1e9 / depth


def gpufio_run(path: str, secs: str, engine: str, qd: int) -> tuple:
    """One gpufio run's (engine, depth, IOPS, lat us, product), or its failure."""
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as prof:
        prof.write(f'[global]\nsize="1g"\nruntime="{secs}s"\ntime_based=true\nbs="4k"\n'
                   f'rw="randread"\ndirect=true\ntargets=["{path}"]\n[[job]]\n'
                   f'name="{engine}-qd{qd}"\nengine="{engine}"\niodepth={qd}\n')
    out = prof.name + ".json"
    r = subprocess.run([sys.executable, "-m", "gpufio", "run", prof.name, "-q", "-f", "json",
                        "-o", out, "-y"], capture_output=True, text=True)
    if r.returncode:
        return engine, qd, f"rc={r.returncode} {(r.stderr or r.stdout).strip()[-200:]}"
    rd = json.load(open(out))["jobs"][0]["read"]
    lat = rd["lat_ns"]["mean"]
    return engine, qd, rd["iops"], lat / 1e3, product(rd["iops"], lat, qd)


def fio_run(path: str, secs: str, qd: int, fio: str) -> tuple:
    """fio's io_uring on the same file and depth."""
    r = subprocess.run([fio, "--name=x", f"--filename={path}", "--rw=randread", "--bs=4k",
                        f"--iodepth={qd}", "--ioengine=io_uring", "--direct=1",
                        f"--runtime={secs}", "--time_based", "--size=1g",
                        "--output-format=json"], capture_output=True, text=True)
    try:
        rd = json.loads(r.stdout[r.stdout.index("{"):])["jobs"][0]["read"]
    except ValueError as e:
        return "fio", qd, f"failed {e} {r.stderr[-200:]}"
    lat = rd["lat_ns"]["mean"]
    return "fio", qd, rd["iops"], lat / 1e3, product(rd["iops"], lat, qd)


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file", help="the file (or device) every run reads")
    ap.add_argument("seconds", help="measured seconds per run")
    ap.add_argument("engines", help="gpufio engines, comma-separated")
    ap.add_argument("depths", help="iodepths, comma-separated")
    ap.add_argument("fio", nargs="?", default="fio", help="fio binary (default: on PATH)")
    a = ap.parse_args(argv)
    for qd in (int(d) for d in a.depths.split(",")):
        rows = [gpufio_run(a.file, a.seconds, e, qd) for e in a.engines.split(",")]
        for row in rows + [fio_run(a.file, a.seconds, qd, a.fio)]:
            print("LITTLE", *[f"{x:.4g}" if isinstance(x, float) else x for x in row])


if __name__ == "__main__":
    main(sys.argv[1:])
