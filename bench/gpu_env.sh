# Source on the GPU machine before bench/gpu.py or the gpu tests: libcuda/libcufile where
# fio's libcufile engine and KvikIO look for them, and KvikIO, mpi4py and MPICH from wheels
# brought in .whl/.
# (The machine has no package registry; see ../shared/DESIGN.md section 6.)
mkdir -p /tmp/lk
ln -sf /usr/local/nvidia/lib64/libcuda.so.1 /tmp/lk/libcuda.so
ln -sf /usr/local/cuda-13.0/targets/x86_64-linux/lib/libcufile.so /tmp/lk/libcufile.so
export LD_LIBRARY_PATH=/tmp/lk:/usr/local/cuda-13.0/targets/x86_64-linux/lib
# .whl/ holds wheels for more than one Python: pip takes the ones this Python can use
if [ -d .whl ] && [ ! -d /tmp/site/kvikio ]; then
    python3 -m pip install -q --no-index --no-deps --find-links .whl --target /tmp/site \
        kvikio-cu13 libkvikio-cu13 rapids-logger mpi4py mpich
fi
export PYTHONPATH=/tmp/site
export PATH=/tmp/site/bin:$PATH  # MPICH's mpirun, beside the mpi4py it serves
