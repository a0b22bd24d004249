// GNN feature aggregation through the GPU request queue (gio_queue.cuh): GPU threads fetch
// the feature rows of a mini-batch's nodes themselves, optionally through a software cache
// in GPU memory (gio_cache.cuh).
//
// Launched with one thread per request slot (rounded up to whole blocks), so every thread
// owns its slot and a post never waits for another thread. Row k goes first to the owner of
// slot k; after that each lane claims its next row from a counter every thread shares
// (stats[6], claimed a warp at a time), as soon as its own has landed and been copied, as
// the block benchmark's requesters claim their I/Os. So a warp never waits for its slowest
// read before posting again (waiting for all 32 held a warp's reads in flight to a fraction
// of its slots), and a thread whose reads land sooner takes more rows: the kernel ends about
// one read after the last row is claimed, not when the unluckiest thread's fixed share of
// the rows is done. In each pass of the warp:
//  - lanes that take up a new row in the same pass and want the same node are coalesced
//    (__match_any_sync): the lowest one fetches, the others copy its row once it is in dst;
//  - each fetching lane looks its row up in the cache: a hit is copied from the cache page;
//    a miss (or every row, without a cache) is read from storage (stripe s = node /
//    stripe_rows on target s % ntargets, offset header + ((s / ntargets) * stripe_rows +
//    node % stripe_rows) * row_bytes: the striped layout of gpufio/core/rows.py) into the
//    thread's slot;
//  - the warp copies the rows of every lane whose hit or read is ready into dst (and a fill
//    into its cache page) with coalesced 16-byte loads, then those lanes take their next rows.
// A lane whose row another thread is filling asks again in a later pass, while its warp goes
// on with its other lanes and publishes their fills, so no two warps can wait for each other.
// stats: [0] failed rows, [1] first failed node, [2] its result, [3] cache hits,
//        [4] rows read from storage, [5] coalesced duplicates, [6] rows claimed past the
//        first `slots` (zero at each launch).
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
                                      u64 ntargets, u64 stripe_rows, u64 header,
                                      u64 row_bytes,
                                      const long long* nodes, u64 n, uint4* dst, u64 dst_row16,
                                      u64* stats)
{
    const u64 gtid = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    const unsigned lane = threadIdx.x & 31;
    const u64 slots = q->nrings * q->depth;
    // a lane's row: ROW_LOOKUP (asked of the cache, or to be read), ROW_POSTED while its read
    // is in flight, ROW_READY once its hit or read can be copied, ROW_FOLLOW while its leader
    // fetches the same node; ROW_DONE once the lane is out of rows (threads past the last
    // slot start there) and then only joins the warp's votes
    enum { ROW_DONE, ROW_LOOKUP, ROW_POSTED, ROW_READY, ROW_FOLLOW };
    u64 i = gtid;
    int phase = gtid < slots && i < n ? ROW_LOOKUP : ROW_DONE;
    long long node = phase == ROW_LOOKUP ? nodes[i] : -1;
    bool fresh = true;       // took this row up this pass: joins the coalescing vote
    int look = LOOK_WAIT;    // the cache's answer for a fetching lane's row
    bool posted = false;     // a read of the row is in this thread's slot
    int res = 0;             // the ready row's result: row_bytes, or -errno
    u64 cs = 0;              // cache slot of a hit or a fill
    unsigned followers = 0;  // a leader's lanes waiting for its row
    unsigned leader = lane;  // a follower's leader
    while (__any_sync(FULL, phase != ROW_DONE)) {
        if (__any_sync(FULL, gio_aborted(q))) {
            atomicSub(&q->control[C_REQUESTERS], 1);
            return;
        }
        const bool entering = phase == ROW_LOOKUP && fresh;
        const unsigned peers = __match_any_sync(FULL, entering ? node : -2ll - (long long)lane);
        if (entering) {
            fresh = false;
            leader = __ffs(peers) - 1;
            followers = leader == lane ? peers & ~(1u << lane) : 0u;
            if (leader != lane) phase = ROW_FOLLOW;
        }
        if (phase == ROW_LOOKUP) {
            look = cache ? cache_lookup(cache, node, &cs) : LOOK_FILL;
            if (look == LOOK_HIT) {
                res = (int)row_bytes;
                phase = ROW_READY;
            } else if (look == LOOK_FILL) {  // the slot is this thread's, so it is free
                const u64 s = (u64)node / stripe_rows, t = s % ntargets;
                posted = gio_try_post(q, gtid, fds[t],
                                      header + ((s / ntargets) * stripe_rows +
                                                (u64)node % stripe_rows) * row_bytes,
                                      (unsigned)row_bytes);
                // a post refused (the queue aborted) fails the row instead of waiting forever
                res = -GIO_EBUSY;
                phase = posted ? ROW_POSTED : ROW_READY;
            }  // LOOK_WAIT: asks again next pass
        }
        if (phase == ROW_POSTED && gio_done(q, gtid)) {
            res = gio_result(q, gtid);
            phase = ROW_READY;
        }
        const bool ready = phase == ROW_READY;
        unsigned m = __ballot_sync(FULL, ready);
        if (!m) {
            __nanosleep(100);
            continue;
        }
        __syncwarp();
        const bool ok = ready && (u64)res == row_bytes;
        unsigned c = __ballot_sync(FULL, ok);
        while (c) {
            const int l = __ffs(c) - 1;
            c &= c - 1;
            const int look_l = __shfl_sync(FULL, look, l);
            const u64 s_l = __shfl_sync(FULL, look_l == LOOK_HIT ? cs : gtid, l);
            const u64 cs_l = __shfl_sync(FULL, cs, l), i_l = __shfl_sync(FULL, i, l);
            uint4* page = cache ? cache_page(cache, cs_l) : nullptr;
            copy_row(dst + i_l * dst_row16, look_l == LOOK_HIT ? page : gio_landing(q, s_l),
                     look_l == LOOK_FILL ? page : nullptr, dst_row16, lane, look_l == LOOK_FILL);
        }
        __syncwarp();
        __threadfence();  // pages written before they are published
        if (ready) {
            if (look == LOOK_FILL) {
                if (cache) {
                    if (ok) cache_publish(cache, node, cs);
                    else cache_drop(cache, node, cs);
                }
                // a failed row fails its followers too: they would copy it out of dst
                if (!ok && atomicAdd(&stats[0], 1ull + __popc(followers)) == 0) {
                    stats[1] = (u64)node;
                    stats[2] = (u64)(long long)res;
                }
                if (posted) gio_release(q, gtid);
            } else {
                cache_unpin(cache, cs);
            }
        }
        warp_count(&stats[3], ready && look == LOOK_HIT, lane);
        warp_count(&stats[4], ready && look == LOOK_FILL, lane);
        // the followers of ready leaders copy the row their leader fetched, now in dst
        unsigned lead = __ballot_sync(FULL, ok && followers != 0u);
        while (lead) {
            const int l = __ffs(lead) - 1;
            lead &= lead - 1;
            unsigned f = __shfl_sync(FULL, followers, l);
            const u64 from = __shfl_sync(FULL, i, l);
            while (f) {
                const int fl = __ffs(f) - 1;
                f &= f - 1;
                copy_row(dst + __shfl_sync(FULL, i, fl) * dst_row16, dst + from * dst_row16,
                         nullptr, dst_row16, lane, false);
            }
        }
        // every lane joins the shuffle (a *_sync(FULL) that only some lanes reach hangs the
        // warp), so it is not behind the && that picks the followers
        const bool leader_ready = __shfl_sync(FULL, ready ? 1 : 0, leader) != 0;
        const bool freed = phase == ROW_FOLLOW && leader_ready;
        warp_count(&stats[5], freed, lane);
        // the next rows, claimed for the warp's moving lanes with one atomic
        const bool moving = ready || freed;
        const unsigned want = __ballot_sync(FULL, moving);
        // with no lane moving, first is -1: nothing is claimed and the shuffle's value unused
        const int first = __ffs(want) - 1;
        u64 claimed = 0;
        if (lane == first) claimed = atomicAdd(&stats[6], (u64)__popc(want));
        claimed = __shfl_sync(FULL, claimed, first);
        if (moving) {
            i = slots + claimed + __popc(want & ((1u << lane) - 1u));
            followers = 0u;
            leader = lane;
            posted = false;
            fresh = true;
            phase = i < n ? ROW_LOOKUP : ROW_DONE;
            node = phase == ROW_LOOKUP ? nodes[i] : -1;
        }
    }
    atomicSub(&q->control[C_REQUESTERS], 1);
}
