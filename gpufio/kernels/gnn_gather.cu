// GNN feature aggregation through the GPU request queue (gio_queue.cuh): GPU threads fetch
// the feature rows of a mini-batch's nodes themselves, optionally through a software cache
// in GPU memory (gio_cache.cuh).
//
// Launched with one thread per request slot (rounded up to whole blocks), so every thread
// owns its slot and a post never waits for another thread. Row base + k goes to the owner
// of slot k, for base = 0, slots, 2 * slots ... In each round:
//  - lanes of a warp that want the same node are coalesced (__match_any_sync): the lowest
//    one fetches, the others copy its row afterwards;
//  - each fetching lane looks its row up in the cache: a hit is copied from the cache page;
//    a miss (or every row, without a cache) is read from storage (target node % ntargets,
//    offset header + (node / ntargets) * row_bytes: the striped layout of
//    gpufio/workloads/gnn/features.py) into the thread's slot, and the warp copies each landed row into
//    dst, and into its cache page, with coalesced 16-byte loads. A lane whose row another
//    thread is filling asks again in the next pass, after its warp has finished and
//    published its own fills, so no two warps can wait for each other.
// stats: [0] failed rows, [1] first failed node, [2] its result, [3] cache hits,
//        [4] rows read from storage, [5] coalesced duplicates.
#include "gio_queue.cuh"
#include "gio_cache.cuh"

// One row copied by the whole warp (warp_load16): landed bytes with system-scope loads,
// GPU-memory sources (cache pages, dst) through L2; also, when given, gets a second copy.
__device__ __forceinline__ void copy_row(uint4* dst, const uint4* src, uint4* also, u64 row16,
                                         unsigned lane, bool system)
{
    warp_load16(src, row16, lane, system, [&](u64 k, const uint4& v) {
        dst[k] = v;
        if (also) also[k] = v;
    });
}

__device__ __forceinline__ void warp_count(u64* counter, bool flag, unsigned lane)
{
    const unsigned m = __ballot_sync(FULL, flag);
    if (lane == 0 && m) atomicAdd(counter, (u64)__popc(m));
}

extern "C" __global__ void gio_gather(const GioQueue* q, const GioCache* cache, const int* fds,
                                      u64 ntargets, u64 header, u64 row_bytes,
                                      const long long* nodes, u64 n, uint4* dst, u64 dst_row16,
                                      u64* stats)
{
    const u64 gtid = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    const unsigned lane = threadIdx.x & 31;
    const u64 slots = q->nrings * q->depth;
    const bool owner = gtid < slots;  // threads past the last slot only join the warp's votes
    for (u64 base = 0; base < n; base += slots) {  // the same trip count in every thread
        const u64 i = base + gtid;
        const bool mine = owner && i < n;
        const long long node = mine ? nodes[i] : -1;
        const unsigned peers = __match_any_sync(FULL, node);
        const unsigned leader = __ffs(peers) - 1;
        bool pending = mine && leader == lane;
        while (__any_sync(FULL, pending)) {
            int look = LOOK_WAIT;
            u64 cs = 0;
            bool posted = true;
            if (pending) {
                look = cache ? cache_lookup(cache, node, &cs) : LOOK_FILL;
                if (look == LOOK_FILL) {  // the slot is this thread's, so it is free
                    const u64 t = (u64)node % ntargets;
                    posted = gio_try_post(q, gtid, fds[t],
                                          header + ((u64)node / ntargets) * row_bytes,
                                          (unsigned)row_bytes);
                }
            }
            while (!__all_sync(FULL, look != LOOK_FILL || !posted || gio_done(q, gtid))) {
                if (__any_sync(FULL, gio_aborted(q))) {
                    atomicSub(&q->control[C_REQUESTERS], 1);
                    return;
                }
                __nanosleep(100);
            }
            __syncwarp();
            // a post refused (the queue aborted) fails the row instead of waiting forever
            const int res = look != LOOK_FILL ? (int)row_bytes
                            : posted ? gio_result(q, gtid) : -GIO_EBUSY;
            const bool ok = look != LOOK_WAIT && (u64)res == row_bytes;
            unsigned m = __ballot_sync(FULL, ok);
            while (m) {
                const int l = __ffs(m) - 1;
                m &= m - 1;
                const int look_l = __shfl_sync(FULL, look, l);
                const u64 s_l = __shfl_sync(FULL, look_l == LOOK_HIT ? cs : gtid, l);
                const u64 cs_l = __shfl_sync(FULL, cs, l), i_l = __shfl_sync(FULL, i, l);
                uint4* page = cache ? cache_page(cache, cs_l) : nullptr;
                copy_row(dst + i_l * dst_row16,
                         look_l == LOOK_HIT ? page : gio_landing(q, s_l),
                         look_l == LOOK_FILL ? page : nullptr, dst_row16, lane,
                         look_l == LOOK_FILL);
            }
            __syncwarp();
            __threadfence();  // pages written before they are published
            if (look == LOOK_FILL) {
                if (cache) {
                    if (ok) cache_publish(cache, node, cs);
                    else cache_drop(cache, node, cs);
                }
                if (!ok && atomicAdd(&stats[0], 1ull) == 0) {
                    stats[1] = (u64)node;
                    stats[2] = (u64)(long long)res;
                }
                if (posted) gio_release(q, gtid);
            } else if (look == LOOK_HIT) {
                cache_unpin(cache, cs);
            }
            warp_count(&stats[3], look == LOOK_HIT, lane);
            warp_count(&stats[4], look == LOOK_FILL, lane);
            const bool moved = __any_sync(FULL, look != LOOK_WAIT);
            pending = pending && look == LOOK_WAIT;
            if (!moved) {  // every lane waits for another warp's fill
                if (__any_sync(FULL, gio_aborted(q))) {
                    atomicSub(&q->control[C_REQUESTERS], 1);
                    return;
                }
                __nanosleep(200);
            }
        }
        // duplicates copy the row their leader fetched, now complete in dst
        const bool follower = mine && leader != lane;
        warp_count(&stats[5], follower, lane);
        unsigned f = __ballot_sync(FULL, follower);
        while (f) {
            const int l = __ffs(f) - 1;
            f &= f - 1;
            const u64 i_l = __shfl_sync(FULL, i, l);
            const u64 from = i_l - (u64)l + __shfl_sync(FULL, leader, l);
            copy_row(dst + i_l * dst_row16, dst + from * dst_row16, nullptr, dst_row16, lane,
                     false);
        }
    }
    atomicSub(&q->control[C_REQUESTERS], 1);
}
