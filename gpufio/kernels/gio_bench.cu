// The block benchmark on the request queue (gio_queue.cuh): requester threads claim I/O
// numbers, post reads, copy (and check) what landed, and bin the latency; with B_WRITE they
// write the pattern of their block's offset into their slot and post a write instead.
// Launched by gpufio/io/gio/bench.py.
#include "gio_queue.cuh"

// ---- 3. The block benchmark -------------------------------------------------------------

// Host-built (contract.GIO_BENCH's order, every field 8 bytes).
struct GioBench {
    const int* fds;
    const u64* starts;       // first byte of each target's region
    const u64* nblocks;      // bs blocks in each target's region
    u64 ntargets, bs, flags, seed, budget;
    u64* claim;              // next I/O number
    unsigned char* dst;      // nthreads * bs bytes of GPU memory
    u64 nthreads;
    const u64* pat_seed;     // per target
    u64 magic, block_bytes, header_words;
    u64* live;               // completed (any phase), measured ios, measured bytes, then
                             // idle ns and idle spells (an I/O's end to its thread's next start)
    u64* hist;               // PLAT_NR buckets
    u64* lat;                // sum, min, max of measured latencies (ns)
    double* lat_sq;          // sum of squares
    u64* tstats;             // per target: ios, bytes, short, verify failures
    u64* errs;               // per target: ERRNO_SLOTS counters by errno
    u64* bad;                // count, then (target, offset) pairs
};

__device__ __forceinline__ unsigned plat_index(u64 v)
{
    if (v < 128) return (unsigned)v;
    const int msb = 63 - __clzll((long long)v);
    const int eb = msb - 6;
    const unsigned idx = ((unsigned)(eb + 1) << 6) + (unsigned)((v >> eb) & 63);
    return idx < PLAT_NR ? idx : PLAT_NR - 1;
}

__device__ __forceinline__ void pick(const GioBench* b, u64 g, int* tgt, u64* off)
{
    const u64 nt = b->ntargets;
    u64 t = g % nt, blk;
    if (b->flags & B_RANDOM) {
        const u64 h = splitmix64(b->seed ^ (g * 0x9E3779B97F4A7C15ULL));
        if (b->flags & B_FILE_RANDOM) t = splitmix64(h) % nt;
        blk = h % b->nblocks[t];
    } else {
        if (b->flags & B_FILE_RANDOM) t = splitmix64(b->seed ^ g) % nt;
        blk = (g / nt) % b->nblocks[t];
    }
    *tgt = (int)t;
    *off = b->starts[t] + blk * b->bs;
}

// The next I/O number's target and offset; false once the budget is spent.
__device__ __forceinline__ bool draw(const GioBench* b, int* tgt, u64* off)
{
    const u64 g = atomicAdd(b->claim, 1ull);
    if (g >= b->budget) return false;
    pick(b, g, tgt, off);
    return true;
}

__device__ void record(const GioBench* b, const GioQueue* q, int tgt, u64 off, int res, bool bad, u64 lat)
{
    u64* ts = b->tstats + 4 * tgt;
    atomicAdd(&b->live[0], 1ull);
    if (res < 0) {
        const int e = -res < ERRNO_SLOTS ? -res : ERRNO_SLOTS - 1;
        atomicAdd(&b->errs[(u64)tgt * ERRNO_SLOTS + e], 1ull);
    } else if ((u64)res != b->bs) {
        atomicAdd(&ts[2], 1ull);
    }
    if (bad) {
        atomicAdd(&ts[3], 1ull);
        const u64 i = atomicAdd(&b->bad[0], 1ull);
        if (i < BAD_KEEP) {
            b->bad[1 + 2 * i] = (u64)tgt;
            b->bad[2 + 2 * i] = off;
        }
    }
    if (!(b->flags & B_CONTINUE) && (res < 0 || (u64)res != b->bs)) {
        atomicExch(&q->control[C_STOP], 1);
    }
    if (!ld_flag(&q->control[C_MEASURING])) return;
    if (res > 0) {
        atomicAdd(&b->live[2], (u64)res);
        atomicAdd(&ts[1], (u64)res);
    }
    if ((u64)res != b->bs) return;
    atomicAdd(&b->live[1], 1ull);
    atomicAdd(&ts[0], 1ull);
    atomicAdd(&b->hist[plat_index(lat)], 1ull);
    atomicAdd(&b->lat[0], lat);
    atomicMin(&b->lat[1], lat);
    atomicMax(&b->lat[2], lat);
    atomicAdd(b->lat_sq, (double)lat * (double)lat);
}

// The warp copies (and checks) lane l's landed block; true if any word differed.
__device__ bool land_block(const GioBench* b, const uint4* src, u64 gthread, int tgt, u64 off, unsigned lane)
{
    uint4* d = (uint4*)(b->dst + gthread * b->bs);
    const bool to_gpu = b->flags & B_LAND_GPU, verify = b->flags & B_VERIFY;
    const u64 seed = verify ? b->pat_seed[tgt] : 0;
    const u64 n16 = b->bs / 16;
    unsigned bad = 0;
    warp_load16(src, n16, lane, true, [&](u64 i, const uint4& v) {
        if (to_gpu) d[i] = v;
        if (verify) {
            const u64 x = off + 16 * i;
            const u64 w0 = (u64)v.x | ((u64)v.y << 32), w1 = (u64)v.z | ((u64)v.w << 32);
            bad += w0 != pattern_word(x, seed, b->magic, b->block_bytes, b->header_words);
            bad += w1 != pattern_word(x + 8, seed, b->magic, b->block_bytes, b->header_words);
        }
    });
    return __any_sync(FULL, bad != 0);
}

// The warp writes lane l's block: the pattern of (tgt, off), 16 bytes a lane at a time,
// straight into the slot's host memory (the kernel reads it from there).
__device__ void fill_block(const GioBench* b, uint4* dst, int tgt, u64 off, unsigned lane)
{
    const u64 seed = b->pat_seed[tgt], n16 = b->bs / 16;
    for (u64 i = lane; i < n16; i += 32) {
        const u64 x = off + 16 * i;
        const u64 w0 = pattern_word(x, seed, b->magic, b->block_bytes, b->header_words);
        const u64 w1 = pattern_word(x + 8, seed, b->magic, b->block_bytes, b->header_words);
        dst[i] = make_uint4((unsigned)w0, (unsigned)(w0 >> 32), (unsigned)w1, (unsigned)(w1 >> 32));
    }
}

extern "C" __global__ void gio_bench(const GioQueue* q, const GioBench* b)
{
    const u64 gtid = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    const unsigned lane = threadIdx.x & 31;
    const bool mine = gtid < b->nthreads;
    // thread k uses ring k % nrings, and there slot (k / nrings) % depth
    const u64 s = (gtid % q->nrings) * q->depth + (gtid / q->nrings) % q->depth;
    const bool writes = b->flags & B_WRITE;
    bool active = mine, have = false, pending = false, ahead = false;
    u64 off = 0, t0 = 0, ended = 0, idle = 0, spells = 0, next_off = 0;
    int tgt = 0, next_tgt = 0;
    while (__any_sync(FULL, active || have)) {
        if (__any_sync(FULL, gio_aborted(q))) break;
        bool claimed = false;  // a write's slot, taken: the warp fills it below
        if (active && !have) {
            const bool stop = ld_flag(&q->control[C_STOP]) != 0;
            if (stop) {
                active = pending = false;
            } else if (!pending) {
                if (ahead) {
                    tgt = next_tgt;
                    off = next_off;
                    ahead = false;
                    pending = true;
                } else {
                    pending = draw(b, &tgt, &off);
                    active = pending;
                }
            }
            // a start stamped just before the call that submits it (a write's: before its
            // slot is filled), the idle spell since this thread's last I/O ended noted
            const u64 t = pending ? now_ns() : 0;
            if (pending && writes) {
                claimed = gio_try_claim(q, s);
            } else if (pending && gio_try_post(q, s, b->fds[tgt], off, (unsigned)b->bs)) {
                pending = false;
                have = true;
            }
            if (claimed || (have && t)) {
                t0 = t;
                if (ended) {
                    idle += t - ended;
                    ++spells;
                }
            }
        }
        if (writes) {
            unsigned cm = __ballot_sync(FULL, claimed);
            if (cm) {
                while (cm) {
                    const int l = __ffs(cm) - 1;
                    cm &= cm - 1;
                    const u64 s_l = __shfl_sync(FULL, s, l), off_l = __shfl_sync(FULL, off, l);
                    const int tgt_l = __shfl_sync(FULL, tgt, l);
                    fill_block(b, gio_writable(q, s_l), tgt_l, off_l, lane);
                }
                __threadfence_system();  // the slots' bytes, before their READY
                __syncwarp();
                if (claimed) {
                    gio_post(q, s, b->fds[tgt], off, (unsigned)b->bs, true);
                    pending = false;
                    have = true;
                }
            }
        }
        const bool done = have && gio_done(q, s);
        unsigned m = __ballot_sync(FULL, done);
        if (!m) {
            // the next I/O drawn while this one is in flight (a pass that waits anyway),
            // not between its end and the post; none once the job is stopping
            if (have && active && !ahead && !ld_flag(&q->control[C_STOP])) {
                ahead = draw(b, &next_tgt, &next_off);
                active = ahead;
            }
            __nanosleep(100);
            continue;
        }
        __syncwarp();
        int my_res = done ? gio_result(q, s) : 0;
        // a NOP completes with 0, all a NOP does: it counts as one block, like uring's op nop
        if (done && (b->flags & B_NOP) && my_res == 0) my_res = (int)b->bs;
        bool my_bad = false;
        while (m) {
            const int l = __ffs(m) - 1;
            m &= m - 1;
            const int res_l = __shfl_sync(FULL, my_res, l);
            const u64 s_l = __shfl_sync(FULL, s, l), off_l = __shfl_sync(FULL, off, l);
            const u64 g_l = __shfl_sync(FULL, gtid, l);
            const int tgt_l = __shfl_sync(FULL, tgt, l);
            if ((u64)res_l == b->bs && !writes && !(b->flags & B_NOP)) {
                const bool bad = land_block(b, gio_landing(q, s_l), g_l, tgt_l, off_l, lane);
                if (lane == (unsigned)l) my_bad = bad;
            }
        }
        if (done) {
            ended = now_ns();
            record(b, q, tgt, off, my_res, my_bad, ended - t0);
            gio_release(q, s);
            have = false;
        }
    }
    if (spells) {  // what Little's law misses: time a thread held no I/O between two
        atomicAdd(&b->live[3], idle);
        atomicAdd(&b->live[4], spells);
    }
    atomicSub(&q->control[C_REQUESTERS], 1);
}
