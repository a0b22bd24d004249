// GPU-initiated I/O, the backend-neutral side: the request queue's structs and device API
// (this header), which any kernel includes. A backend's agent (gio_agent.cu: io_uring rings
// in CUDA-registered host memory; nvme_agent.cu: NVMe queue pairs) takes its own ring
// descriptors as a second argument and runs the one agent loop (gio_agent_loop.cuh) over
// them; nothing of a backend is in this header.
//
// Three layers, each usable alone:
//  1. The request API (gio_try_post / gio_done / gio_result / gio_landing / gio_release, and
//     the blocking gio_read): any GPU thread posts (file, offset, length) into a request slot
//     in device memory (file: the queue's reference for a target, UringQueue.file_refs:
//     its index among the rings' registered files, or the descriptor itself) and later
//     polls or waits for its completion. Slots, tickets and states live in device memory
//     only: atomics on host-mapped memory are not atomic here.
//  2. An agent, e.g. gio_agent (gio_agent.cu): one warp per ring. It gathers READY slots into SQEs (one
//     lane per SQE, 16-byte system-scope stores), publishes the SQ tail once per batch,
//     drains CQEs (one lane each) and posts each result to its slot. Only agent warps touch host memory's
//     ring words, with ld.acquire.sys / st.release.sys: plain volatile loads go stale. The
//     CQ can never overflow: a ring has at most `depth` slots, depth <= SQ entries <= CQ
//     entries, and the agent frees SQ space only as the kernel's sq head moves.
//  3. gio_bench (gio_bench.cu): the block benchmark built on the API. Each requester thread
//     claims I/O numbers from a device counter, turns them into (target, offset) itself, posts them,
//     and when its read is done the whole warp copies the landed block into GPU memory with
//     coalesced 16-byte accesses (checking the pattern on the way when asked), then bins the
//     latency (issue -> bytes in GPU memory, %globaltimer ns) into fio's histogram layout.
#pragma once
#include "pattern.cuh"

// The constants both sides share (PLAT_NR, ERRNO_SLOTS, BAD_KEEP, GIO_EINVAL, GIO_EBUSY and
// the enums' members) come from gpufio/io/gio/contract.py as NVRTC macros.
#ifndef GIO_CONTROL_WORDS
#error "compile through gpufio.io.cuda (module or raw_module): it defines the shared constants"
#endif

typedef unsigned long long u64;

#define FULL 0xffffffffu
#define LAND_UNROLL 8

enum SlotState { GIO_SLOT_STATES };
// C_GEN: the queue's start count, carried in each SQE's user_data so that a completion of an
// earlier start (a read abandoned by an abort) is never taken for a current one.
// C_BAD_SLOT: 1 + the first out-of-range slot a kernel posted to (the queue aborts).
enum Control { GIO_CONTROL_WORDS };
enum BenchFlags { GIO_BENCH_FLAGS };

// Host-built request queue (every field 8 bytes, in contract.GIO_QUEUE's order).
struct GioQueue {
    u64 nrings, depth;
    int* state;          // nrings * depth slot states
    int* res;            // CQE result per slot
    u64* off;            // file offset per slot
    u64* len_fd;         // length | GIO_WRITE_BIT for a write | fd << 32, per slot
    u64 landing;         // host address of slot 0's landing buffer (mapped into the GPU)
    u64 slot_bytes;
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

// Take slot s (false while another thread holds it). A slot past the queue's end aborts the
// queue (the host names it).
__device__ __forceinline__ bool gio_try_claim(const GioQueue* q, u64 s)
{
    if (s >= q->nrings * q->depth) {
        atomicCAS(&q->control[C_BAD_SLOT], 0, (int)min(s + 1, (u64)0x7fffffff));
        atomicExch(&q->control[C_ABORT], 1);
        return false;
    }
    if (atomicCAS(&q->state[s], FREE, CLAIMED) != FREE) {
        return false;
    }
    __threadfence();  // acquire: the previous owner's use of the slot comes before ours
    return true;
}

// Post the claimed slot s: a read of len bytes at off of file fd (a UringQueue.file_refs
// entry) into its landing bytes, or with write, a write of its bytes there (the caller filled
// gio_writable(q, s) and fenced at system scope, so the kernel sees them). A request longer
// than a slot completes at once with -EINVAL instead of overrunning the neighbouring slots.
__device__ __forceinline__ void gio_post(const GioQueue* q, u64 s, int fd, u64 off, unsigned len,
                                         bool write)
{
    if ((u64)len > q->slot_bytes || len >= GIO_WRITE_BIT) {
        q->res[s] = -GIO_EINVAL;
        st_release_gpu(&q->state[s], DONE);
        return;
    }
    q->off[s] = off;
    q->len_fd[s] = (u64)len | (write ? (u64)GIO_WRITE_BIT : 0ull) | ((u64)(unsigned)fd << 32);
    st_release_gpu(&q->state[s], READY);  // the request's fields are visible before READY
}

// Take slot s for a read of len bytes at off of file fd; false while another thread holds it.
__device__ __forceinline__ bool gio_try_post(const GioQueue* q, u64 s, int fd, u64 off, unsigned len)
{
    if (!gio_try_claim(q, s)) return false;
    gio_post(q, s, fd, off, len, false);
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

// Where a write's bytes go before gio_post(..., true): the same slot, written by its claimer.
__device__ __forceinline__ uint4* gio_writable(const GioQueue* q, u64 s)
{
    return (uint4*)(q->landing + s * q->slot_bytes);
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
