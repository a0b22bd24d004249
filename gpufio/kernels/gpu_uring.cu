// GPU-initiated reads through io_uring rings that live in CUDA-registered host memory.
//
// Three layers, each usable alone:
//  1. The request API (gio_try_post / gio_done / gio_result / gio_landing / gio_release, and
//     the blocking gio_read): any GPU thread posts (file, offset, length) into a request slot
//     in device memory (file: the queue's reference for a target, DeviceQueue.file_refs:
//     its index among the rings' registered files, or the descriptor itself) and later
//     polls or waits for its completion. Slots, tickets and states live in device memory
//     only: atomics on host-mapped memory are not atomic here.
//  2. gio_agent: one warp per ring. It gathers READY slots into SQEs (one lane per SQE,
//     16-byte system-scope stores), publishes the SQ tail once per batch, drains CQEs (one
//     lane each) and posts each result to its slot. Only agent warps touch host memory's
//     ring words, with ld.acquire.sys / st.release.sys: plain volatile loads go stale. The
//     CQ can never overflow: a ring has at most `depth` slots, depth <= SQ entries <= CQ
//     entries, and the agent frees SQ space only as the kernel's sq head moves.
//  3. gio_bench: the block benchmark built on the API. Each requester thread claims I/O
//     numbers from a device counter, turns them into (target, offset) itself, posts them,
//     and when its read is done the whole warp copies the landed block into GPU memory with
//     coalesced 16-byte accesses (checking the pattern on the way when asked), then bins the
//     latency (issue -> bytes in GPU memory, %globaltimer ns) into fio's histogram layout.
#include "pattern.cuh"

typedef unsigned long long u64;

#define FULL 0xffffffffu
#define PLAT_NR 1856
#define ERRNO_SLOTS 256
#define BAD_KEEP 8
#define LAND_UNROLL 8
#define AGENT_IDLE_MIN_NS 64u
#define AGENT_IDLE_MAX_NS 2048u

enum SlotState { FREE = 0, CLAIMED = 1, READY = 2, SUBMITTED = 3, DONE = 4 };
// C_GEN: the queue's start count, carried in each SQE's user_data so that a completion of an
// earlier start (a read abandoned by an abort) is never taken for a current one.
// C_BAD_SLOT: 1 + the first out-of-range slot a kernel posted to (the queue aborts).
enum Control { C_STOP = 0, C_ABORT = 1, C_MEASURING = 2, C_REQUESTERS = 3, C_AGENTS = 4,
               C_GEN = 5, C_BAD_SLOT = 6 };
#define GIO_EINVAL 22
#define GIO_EBUSY 16
enum BenchFlags { B_RANDOM = 1, B_FILE_RANDOM = 2, B_LAND_GPU = 4, B_VERIFY = 8, B_CONTINUE = 16 };

// Host-built descriptor of one ring: addresses of its words in registered host memory.
struct GioRing {
    u64 sqes, sq_head, sq_tail, sq_flags, cqes, cq_head, cq_tail, entries;  // sq | cq << 32
};

// Host-built request queue (every field 8 bytes; gpufio/io/gio/queue.py writes the same order).
struct GioQueue {
    const GioRing* rings;
    u64 nrings, depth;
    int* state;          // nrings * depth slot states
    int* res;            // CQE result per slot
    u64* off;            // file offset per slot
    u64* len_fd;         // length | fd << 32 per slot
    u64 landing;         // host address of slot 0's landing buffer (mapped into the GPU)
    u64 slot_bytes;
    u64 sqe_head;        // SQE byte 0 and 1: opcode (READ, or READ_FIXED on registered slots)
                         // | flags << 8 (IOSQE_ASYNC, IOSQE_FIXED_FILE)
    int* control;        // C_* words in device memory
    u64* ring_stats;     // per ring: submitted, completed
};

__device__ __forceinline__ unsigned ld_acquire_sys(u64 addr)
{
    unsigned v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(addr) : "memory");
    return v;
}

__device__ __forceinline__ void st_release_sys(u64 addr, unsigned v)
{
    asm volatile("st.release.sys.global.u32 [%0], %1;" :: "l"(addr), "r"(v) : "memory");
}

__device__ __forceinline__ void st_sys_v2(u64* p, u64 a, u64 b)
{
    asm volatile("st.relaxed.sys.global.v2.u64 [%0], {%1,%2};" :: "l"(p), "l"(a), "l"(b) : "memory");
}

__device__ __forceinline__ int ld_acquire_gpu(const int* p)
{
    int v;
    asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void st_release_gpu(int* p, int v)
{
    asm volatile("st.release.gpu.global.s32 [%0], %1;" :: "l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ void st_relaxed_gpu(int* p, int v)
{
    asm volatile("st.relaxed.gpu.global.s32 [%0], %1;" :: "l"(p), "r"(v) : "memory");
}

// System-scope loads of landed bytes: never served from a stale cached copy of the slot's
// previous read. No "memory" clobber, so a lane can have several in flight.
__device__ __forceinline__ uint4 ld_sys_v4(const uint4* p)
{
    uint4 v;
    asm volatile("ld.relaxed.sys.global.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

// The warp's copy loop: lane-strided 16-byte words of src, LAND_UNROLL loads per lane in
// flight before any is used (a load from landed host memory is a PCIe round trip), each
// loaded word handed to use(i, v). system: src is host memory another agent (the kernel)
// wrote, read at system scope; otherwise GPU memory another SM may have written, read
// through L2.
template <typename Use>
__device__ __forceinline__ void warp_load16(const uint4* src, u64 n16, unsigned lane, bool system,
                                            Use use)
{
    for (u64 base = 0; base < n16; base += 32 * LAND_UNROLL) {
        uint4 v[LAND_UNROLL];
#pragma unroll
        for (int u = 0; u < LAND_UNROLL; ++u) {
            const u64 i = base + 32 * u + lane;
            if (i < n16) v[u] = system ? ld_sys_v4(src + i) : __ldcg(src + i);
        }
#pragma unroll
        for (int u = 0; u < LAND_UNROLL; ++u) {
            const u64 i = base + 32 * u + lane;
            if (i < n16) use(i, v[u]);
        }
    }
}

__device__ __forceinline__ int ld_flag(const int* p) { return *(volatile const int*)p; }

// Lane 0's value of a word, in every lane: warp-uniform decisions (loop exits, ring indexes)
// must come from one load, or lanes that read different values diverge inside *_sync(FULL).
__device__ __forceinline__ unsigned warp_word(unsigned v) { return __shfl_sync(FULL, v, 0); }

__device__ __forceinline__ u64 now_ns()
{
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// ---- 1. The request API ---------------------------------------------------------------

// Take slot s for a read of len bytes at off of file fd (a DeviceQueue.file_refs entry); false
// while another thread holds it. A slot past the queue's end aborts the queue (the host names
// it); a read longer than a slot completes at once with -EINVAL instead of overrunning the
// neighbouring slots' landing bytes.
__device__ __forceinline__ bool gio_try_post(const GioQueue* q, u64 s, int fd, u64 off, unsigned len)
{
    if (s >= q->nrings * q->depth) {
        atomicCAS(&q->control[C_BAD_SLOT], 0, (int)min(s + 1, (u64)0x7fffffff));
        atomicExch(&q->control[C_ABORT], 1);
        return false;
    }
    if (atomicCAS(&q->state[s], FREE, CLAIMED) != FREE) {
        return false;
    }
    __threadfence();  // acquire: the previous owner's reads of the slot come before ours
    if ((u64)len > q->slot_bytes) {
        q->res[s] = -GIO_EINVAL;
        st_release_gpu(&q->state[s], DONE);
        return true;
    }
    q->off[s] = off;
    q->len_fd[s] = (u64)len | ((u64)(unsigned)fd << 32);
    st_release_gpu(&q->state[s], READY);  // the request's fields are visible before READY
    return true;
}

__device__ __forceinline__ bool gio_done(const GioQueue* q, u64 s)
{
    return ld_acquire_gpu(&q->state[s]) == DONE;
}

// The read's result (bytes, or -errno); valid once gio_done.
__device__ __forceinline__ int gio_result(const GioQueue* q, u64 s) { return q->res[s]; }

// Where slot s's bytes landed: pinned host memory mapped into the GPU.
__device__ __forceinline__ const uint4* gio_landing(const GioQueue* q, u64 s)
{
    return (const uint4*)(q->landing + s * q->slot_bytes);
}

__device__ __forceinline__ void gio_release(const GioQueue* q, u64 s) { st_release_gpu(&q->state[s], FREE); }

__device__ __forceinline__ bool gio_aborted(const GioQueue* q) { return ld_flag(&q->control[C_ABORT]) != 0; }

// Blocking form for one thread: post, wait, return the result (INT_MIN if aborted).
// The caller reads gio_landing(q, s) and then calls gio_release(q, s).
__device__ int gio_read(const GioQueue* q, u64 s, int fd, u64 off, unsigned len)
{
    while (!gio_try_post(q, s, fd, off, len)) {
        if (gio_aborted(q)) return (int)0x80000000;
        __nanosleep(200);
    }
    while (!gio_done(q, s)) {
        if (gio_aborted(q)) return (int)0x80000000;
        __nanosleep(200);
    }
    return gio_result(q, s);
}

// ---- 2. The agent: one warp per ring ----------------------------------------------------

extern "C" __global__ void gio_agent(const GioQueue* q)
{
    const unsigned r = blockIdx.x, lane = threadIdx.x;
    const GioRing R = q->rings[r];
    const unsigned sq_n = (unsigned)(R.entries & 0xffffffffu), cq_n = (unsigned)(R.entries >> 32);
    const unsigned depth = (unsigned)q->depth;
    const u64 first = (u64)r * depth, nslots = q->nrings * q->depth;
    int* state = q->state + first;
    // every lane takes lane 0's reading of the ring words and control words: the agent's
    // batch, tail and exit must be the same in all 32 lanes
    unsigned tail = warp_word(lane == 0 ? ld_acquire_sys(R.sq_tail) : 0u);
    unsigned head = warp_word(lane == 0 ? ld_acquire_sys(R.sq_head) : 0u);
    unsigned cqh = warp_word(lane == 0 ? ld_acquire_sys(R.cq_head) : 0u);
    const u64 gen = (u64)(unsigned)warp_word(lane == 0 ? ld_flag(&q->control[C_GEN]) : 0);
    unsigned inflight = 0, idle_ns = AGENT_IDLE_MIN_NS;
    u64 submitted = 0, completed = 0;
    if (lane == 0) atomicAdd(&q->control[C_AGENTS], 1);
    while (!warp_word(lane == 0 ? (unsigned)gio_aborted(q) : 0u)) {
        unsigned batch = 0;
        for (unsigned base = 0; base < depth; base += 32) {
            const unsigned s = base + lane;
            const bool ready = s < depth && ld_acquire_gpu(&state[s]) == READY;
            const unsigned m = __ballot_sync(FULL, ready);
            if (!m) continue;
            unsigned room = sq_n - (tail + batch - head);
            if (room < (unsigned)__popc(m)) {
                head = warp_word(lane == 0 ? ld_acquire_sys(R.sq_head) : 0u);
                room = sq_n - (tail + batch - head);
            }
            const unsigned rank = __popc(m & ((1u << lane) - 1u));
            if (ready && rank < room) {
                const u64 g = first + s;
                const u64 lf = q->len_fd[g];
                u64* sqe = (u64*)(R.sqes + (u64)((tail + batch + rank) & (sq_n - 1)) * 64);
                // opcode | flags | ioprio 0 | fd (or file index); off; addr; len | rw_flags 0;
                // user_data = slot | generation << 32; buf_index 0 (the ring's own slots),
                // personality, splice_fd_in, addr3, pad = 0
                st_sys_v2(sqe, q->sqe_head | ((lf >> 32) << 32), q->off[g]);
                st_sys_v2(sqe + 2, q->landing + g * q->slot_bytes, lf & 0xffffffffu);
                st_sys_v2(sqe + 4, g | gen << 32, 0ull);
                st_sys_v2(sqe + 6, 0ull, 0ull);
                st_relaxed_gpu(&state[s], SUBMITTED);
            }
            batch += min((unsigned)__popc(m), room);
        }
        if (batch) {
            __threadfence_system();  // each lane's SQE stores, before the barrier and the tail
            __syncwarp();
            if (lane == 0) st_release_sys(R.sq_tail, tail + batch);
            tail += batch;
            inflight += batch;
            submitted += batch;
        }
        const unsigned t = warp_word(lane == 0 ? ld_acquire_sys(R.cq_tail) : 0u);
        __syncwarp();
        const unsigned got = t - cqh;
        unsigned mine = 0;  // completions of this start's reads (stale ones are only reaped)
        for (unsigned base = 0; base < got; base += 32) {
            const unsigned i = base + lane;
            bool current = false;
            if (i < got) {
                const u64* c = (const u64*)(R.cqes + (u64)((cqh + i) & (cq_n - 1)) * 16);
                u64 w0, w1;
                asm volatile("ld.relaxed.sys.global.v2.u64 {%0,%1}, [%2];" : "=l"(w0), "=l"(w1) : "l"(c) : "memory");
                const u64 slot = w0 & 0xffffffffu;
                current = (w0 >> 32) == gen && slot < nslots;
                if (current) {
                    q->res[slot] = (int)(unsigned)(w1 & 0xffffffffu);
                    st_release_gpu(&q->state[slot], DONE);
                }
            }
            mine += __popc(__ballot_sync(FULL, current));
        }
        if (got) {
            __syncwarp();
            if (lane == 0) st_release_sys(R.cq_head, t);
            cqh = t;
            inflight -= mine;
            completed += mine;
            idle_ns = AGENT_IDLE_MIN_NS;
        } else if (!batch) {
            if (inflight == 0 && warp_word(lane == 0 ? ld_flag(&q->control[C_REQUESTERS]) : 1) == 0) break;
            // back off while the ring is quiet: every CQ-tail poll is a PCIe read of a line
            // the kernel writes (docs/PERFORMANCE.md has what it gained)
            __nanosleep(idle_ns);
            idle_ns = min(idle_ns * 2, AGENT_IDLE_MAX_NS);
        }
    }
    if (lane == 0) {
        q->ring_stats[2 * r] = submitted;
        q->ring_stats[2 * r + 1] = completed;
    }
}

// ---- 3. The block benchmark -------------------------------------------------------------

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
    u64* live;               // completed (any phase), measured ios, measured bytes
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

extern "C" __global__ void gio_bench(const GioQueue* q, const GioBench* b)
{
    const u64 gtid = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    const unsigned lane = threadIdx.x & 31;
    const bool mine = gtid < b->nthreads;
    // thread k uses ring k % nrings, and there slot (k / nrings) % depth
    const u64 s = (gtid % q->nrings) * q->depth + (gtid / q->nrings) % q->depth;
    bool active = mine, have = false, pending = false;
    u64 off = 0, t0 = 0;
    int tgt = 0;
    while (__any_sync(FULL, active || have)) {
        if (__any_sync(FULL, gio_aborted(q))) break;
        if (active && !have) {
            const bool stop = ld_flag(&q->control[C_STOP]) != 0;
            if (stop) {
                active = pending = false;
            } else if (!pending) {
                const u64 g = atomicAdd(b->claim, 1ull);
                if (g >= b->budget) {
                    active = false;
                } else {
                    pick(b, g, &tgt, &off);
                    pending = true;
                }
            }
            if (pending && gio_try_post(q, s, b->fds[tgt], off, (unsigned)b->bs)) {
                pending = false;
                have = true;
                t0 = now_ns();
            }
        }
        const bool done = have && gio_done(q, s);
        unsigned m = __ballot_sync(FULL, done);
        if (!m) {
            __nanosleep(100);
            continue;
        }
        __syncwarp();
        const int my_res = done ? gio_result(q, s) : 0;
        bool my_bad = false;
        while (m) {
            const int l = __ffs(m) - 1;
            m &= m - 1;
            const int res_l = __shfl_sync(FULL, my_res, l);
            const u64 s_l = __shfl_sync(FULL, s, l), off_l = __shfl_sync(FULL, off, l);
            const u64 g_l = __shfl_sync(FULL, gtid, l);
            const int tgt_l = __shfl_sync(FULL, tgt, l);
            if ((u64)res_l == b->bs) {
                const bool bad = land_block(b, gio_landing(q, s_l), g_l, tgt_l, off_l, lane);
                if (lane == (unsigned)l) my_bad = bad;
            }
        }
        if (done) {
            record(b, q, tgt, off, my_res, my_bad, now_ns() - t0);
            gio_release(q, s);
            have = false;
        }
    }
    atomicSub(&q->control[C_REQUESTERS], 1);
}
