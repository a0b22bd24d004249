// Requests through the NVMe queue agent (nvme_agent.cu), for the tests and the bench: each
// thread owns request slot t and serves I/Os t, t + nthreads, ... in order. A read's bytes
// are copied from the pinned landing slot into its row of data (GPU memory), where
// io/verify.py checks them; a write sends its row; a Flush moves nothing. res[i] gets the
// request API's result (untouched if the queue was aborted first). Launched by
// gpufio/io/gio/backends/nvme.py's users.
#include "nvme_queue.cuh"

enum NvmeKind { NVME_READ = 0, NVME_WRITE = 1, NVME_FLUSH = 2 };

extern "C" __global__ void nvme_requests(const GioQueue* q, u64 n, const u64* off,
                                        const unsigned* len, const unsigned char* kind,
                                        uint4* data, u64 row16, int copy, int* res)
{
    const u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    const u64 nt = (u64)gridDim.x * blockDim.x;
    for (u64 i = t; i < n; i += nt) {
        bool claimed = false;
        while (!(claimed = gio_try_claim(q, t)) && !gio_aborted(q)) __nanosleep(200);
        if (!claimed) break;
        const unsigned k = kind[i], l = len[i];
        uint4* row = data + i * row16;
        if (k == NVME_WRITE) {
            uint4* dst = gio_writable(q, t);
            for (unsigned w = 0; w < l / 16; ++w) dst[w] = row[w];
            __threadfence_system();  // the bytes, before the controller is told to take them
        }
        gio_post(q, t, 0, off[i], k == NVME_FLUSH ? 0u : l, k != NVME_READ);
        bool done = false;
        while (!(done = gio_done(q, t)) && !gio_aborted(q)) __nanosleep(200);
        if (!done) break;
        const int r = gio_result(q, t);
        res[i] = r;
        if (k == NVME_READ && copy && r == (int)l) {
            const uint4* src = gio_landing(q, t);
            // one load at a time: four or eight in flight a thread measured 2.6x slower
            // (docs/PERFORMANCE.md: "Verified in GPU memory")
            for (unsigned w = 0; w < l / 16; ++w) row[w] = ld_sys_v4(src + w);
        }
        gio_release(q, t);
    }
    atomicSub(&q->control[C_REQUESTERS], 1);
}
