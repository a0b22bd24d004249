# Source on the GPU machine before python3 -m bench.gpu or the gpu tests: libcuda/libcufile where
# fio's libcufile engine and KvikIO look for them, and KvikIO, mpi4py and MPICH from wheels
# brought in .whl/.
# (That machine reaches no package registry, hence the wheels.)
mkdir -p /tmp/lk
ln -sf /usr/local/nvidia/lib64/libcuda.so.1 /tmp/lk/libcuda.so
ln -sf /usr/local/cuda-13.0/targets/x86_64-linux/lib/libcufile.so /tmp/lk/libcufile.so
export LD_LIBRARY_PATH=/tmp/lk:/usr/local/cuda-13.0/targets/x86_64-linux/lib
# .whl/ holds wheels for more than one Python: pip takes the ones this Python can use
if [ -d .whl ] && [ ! -d /tmp/site/kvikio ]; then
    python3 -m pip install -q --no-index --no-deps --find-links .whl --target /tmp/site \
        kvikio-cu13 libkvikio-cu13 rapids-logger
fi
# MPICH's wheel keeps its libmpi in the prefix's lib/, which --target has no place for
if [ -d .whl ] && [ ! -d /tmp/mpi ]; then
    python3 -m pip install -q --no-index --no-deps --find-links .whl --prefix /tmp/mpi mpi4py mpich
fi
MPI_SITE=$(dirname "$(find /tmp/mpi -maxdepth 6 -type d -name mpi4py 2>/dev/null | head -1)")
export PYTHONPATH=/tmp/site:$MPI_SITE
export MPI4PY_LIBMPI=$(find /tmp/mpi -maxdepth 4 -name libmpi.so.12 2>/dev/null | head -1)
export PATH=/tmp/mpi/bin:$PATH  # MPICH's mpirun, beside the libmpi mpi4py loads
# cuFile's own APIs (cufile api = "batch" | "async") run in compat mode here only when
# cufile.json allows it: /etc/cufile.json does not, so use a copy that does.
if [ -z "$CUFILE_ENV_PATH_JSON" ]; then
    python3 - <<'PY'
import json, re
text = open("/etc/cufile.json").read()
conf = json.loads(re.sub(r"(?m)^\s*//.*$", "", text))
conf.setdefault("properties", {})["allow_compat_mode"] = True
json.dump(conf, open("/tmp/cufile-compat.json", "w"))
PY
    export CUFILE_ENV_PATH_JSON=/tmp/cufile-compat.json
fi
# cuFileHandleRegister asks udev's database what filesystem a block device holds; this
# sandbox runs no udevd, so record each mounted block device's filesystem the way udev would
# (no record: error 5027, "file descriptor is not registered"). Run again after new mounts.
gpufio_udev_records() {
    mkdir -p /run/udev/data
    while read -r dev mnt fstype _; do
        case "$dev" in /dev/*) ;; *) continue ;; esac
        [ -b "$dev" ] || continue
        majmin=$(printf '%d:%d' "0x$(stat -L -c %t "$dev")" "0x$(stat -L -c %T "$dev")")
        [ -e "/run/udev/data/b$majmin" ] || \
            printf 'E:ID_FS_USAGE=filesystem\nE:ID_FS_TYPE=%s\n' "$fstype" > "/run/udev/data/b$majmin"
    done < /proc/mounts
}
gpufio_udev_records
