# Source on the GPU machine before bench/gpu.py or the gpu tests: libcuda/libcufile where
# fio's libcufile engine and KvikIO look for them, and KvikIO from wheels brought in .whl/.
# (The machine has no package registry; see ../shared/DESIGN.md section 6.)
mkdir -p /tmp/lk
ln -sf /usr/local/nvidia/lib64/libcuda.so.1 /tmp/lk/libcuda.so
ln -sf /usr/local/cuda-13.0/targets/x86_64-linux/lib/libcufile.so /tmp/lk/libcufile.so
export LD_LIBRARY_PATH=/tmp/lk:/usr/local/cuda-13.0/targets/x86_64-linux/lib
if [ -d .whl ] && [ ! -d /tmp/site/kvikio ]; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
fi
export PYTHONPATH=/tmp/site
