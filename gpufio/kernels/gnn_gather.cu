// GNN feature aggregation through the GPU request queue (gpu_uring.cu): GPU threads fetch
// the feature rows of a mini-batch's nodes themselves.
//
// Launched with one thread per request slot (rounded up to whole blocks), so every thread
// owns its slot and a post never waits for another thread. Row base + k goes to the owner
// of slot k, for base = 0, slots, 2 * slots ...: every lane posts its row's read (target
// node % ntargets, offset header + (node / ntargets) * row_bytes, the striped layout of
// gpufio/gnn/features.py), the warp waits until all its reads are done, then copies each
// landed row into dst with coalesced 16-byte system-scope loads, and frees the slots.
#include "gpu_uring.cu"

extern "C" __global__ void gio_gather(const GioQueue* q, const int* fds, u64 ntargets,
                                      u64 header, u64 row_bytes, const long long* nodes, u64 n,
                                      uint4* dst, u64 dst_row16, u64* failed)
{
    const u64 gtid = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    const unsigned lane = threadIdx.x & 31;
    const u64 slots = q->nrings * q->depth;
    const bool owner = gtid < slots;  // threads past the last slot only join the warp's votes
    for (u64 base = 0; base < n; base += slots) {  // the same trip count in every thread
        const u64 i = base + gtid;
        const bool mine = owner && i < n;
        if (mine) {
            const long long node = nodes[i];
            const u64 t = (u64)node % ntargets;
            const u64 off = header + ((u64)node / ntargets) * row_bytes;
            gio_try_post(q, gtid, fds[t], off, (unsigned)row_bytes);  // the slot is this thread's
        }
        while (!__all_sync(FULL, !mine || gio_done(q, gtid))) {
            if (__any_sync(FULL, gio_aborted(q))) {
                atomicSub(&q->control[C_REQUESTERS], 1);
                return;
            }
            __nanosleep(100);
        }
        __syncwarp();
        const int res = mine ? gio_result(q, gtid) : 0;
        unsigned m = __ballot_sync(FULL, mine && (u64)res == row_bytes);
        while (m) {
            const int l = __ffs(m) - 1;
            m &= m - 1;
            const u64 s_l = __shfl_sync(FULL, gtid, l), i_l = __shfl_sync(FULL, i, l);
            const uint4* src = gio_landing(q, s_l);
            for (u64 k = lane; k < dst_row16; k += 32) {
                dst[i_l * dst_row16 + k] = ld_sys_v4(src + k);
            }
        }
        if (mine) {
            if ((u64)res != row_bytes) {
                const u64 first = atomicAdd(&failed[0], 1ull);
                if (first == 0) {
                    failed[1] = (u64)nodes[i];
                    failed[2] = (u64)(long long)res;
                }
            }
            gio_release(q, gtid);
        }
    }
    atomicSub(&q->control[C_REQUESTERS], 1);
}
