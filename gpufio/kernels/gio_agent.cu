// The request queue's io_uring agent: one warp per ring turns READY request slots into SQEs
// and CQEs into results (gio_queue.cuh describes the protocol, gio_agent_loop.cuh the loop;
// this file, the ring's side of it). Launched by gpufio/io/gio/backends/uring.py.
#include "gio_agent_loop.cuh"
#include "nvme_cmd.cuh"

// Host-built descriptor of one ring (contract.URING_RING): its words in registered host
// memory, and what the agent writes into every SQE of it.
struct UringRing {
    u64 sqes, sq_head, sq_tail, sq_flags, cqes, cq_head, cq_tail, entries;  // sq | cq << 32
    u64 sqe_head;        // SQE byte 0 and 1: opcode (READ, or READ_FIXED on registered slots;
                         // a write's is one more: WRITE, WRITE_FIXED)
                         // | flags << 8 (IOSQE_ASYNC, IOSQE_FIXED_FILE)
    u64 ns;              // NVMe passthrough: device address of, per registered file,
                         // nsid | lba_shift << 32, and the ring takes 128-byte SQEs and
                         // 32-byte CQEs; 0: plain reads and writes
};

// ---- 2. The agent: one warp per ring, gio_agent_loop.cuh's loop over an io_uring ---------

struct UringAgent : AgentSlots {
    const UringRing R;
    const unsigned sq_n, cq_n;
    const u64 nslots;
    // NVMe passthrough (R.ns): 128-byte SQEs carrying the NVMe command, 32-byte CQEs
    const u64* const ns_table;
    const bool passthrough;
    const u64 sqe_bytes, cqe_bytes;
    // every lane takes lane 0's reading of the ring words and control words: the agent's
    // batch, tail and exit must be the same in all 32 lanes
    unsigned tail, head, cqh;
    const u64 gen;

    __device__ __forceinline__ UringAgent(const GioQueue* queue, const UringRing* rings)
        : AgentSlots(queue), R(rings[r]), sq_n((unsigned)(R.entries & 0xffffffffu)),
          cq_n((unsigned)(R.entries >> 32)), nslots(queue->nrings * queue->depth),
          ns_table((const u64*)R.ns), passthrough(ns_table != nullptr),
          sqe_bytes(passthrough ? PT_SQE_BYTES : 64), cqe_bytes(passthrough ? PT_CQE_BYTES : 16),
          tail(warp_acquire_sys(R.sq_tail)), head(warp_acquire_sys(R.sq_head)),
          cqh(warp_acquire_sys(R.cq_head)), gen((u64)(unsigned)warp_control(queue, C_GEN)) {}

    __device__ __forceinline__ AgentCounts start() { return {0, 0}; }

    // The SQ's free entries past the batch, its head read again only when they look too few.
    __device__ __forceinline__ unsigned room(unsigned batch, unsigned n)
    {
        unsigned left = sq_n - (tail + batch - head);
        if (left < n) {
            head = warp_acquire_sys(R.sq_head);
            left = sq_n - (tail + batch - head);
        }
        return min(n, left);
    }

    __device__ __forceinline__ void build(unsigned, u64 g, unsigned pos)
    {
        const u64 lf = q->len_fd[g];
        u64* sqe = (u64*)(R.sqes + (u64)((tail + pos) & (sq_n - 1)) * sqe_bytes);
        const u64 write = (lf & GIO_WRITE_BIT) ? 1ull : 0ull;  // WRITE = READ + 1
        if (passthrough) {
            // the NVMe command itself; the file's entry says its namespace and blocks
            const unsigned ref = (unsigned)(lf >> 32);
            const u64 ns = ns_table[ref];
            u64 w[16];
            nvme_uring_sqe(w, ref, (unsigned)(R.sqe_head >> 8) & 0xffu, (unsigned)ns,
                           (unsigned)(ns >> 32), write != 0, q->off[g],
                           (unsigned)(lf & (GIO_WRITE_BIT - 1ull)),
                           q->landing + g * q->slot_bytes, g | gen << 32);
#pragma unroll
            for (int i = 0; i < 16; i += 2) st_sys_v2(sqe + i, w[i], w[i + 1]);
        } else {
            // opcode | flags | ioprio 0 | fd (or file index); off; addr; len |
            // rw_flags 0; user_data = slot | generation << 32; buf_index 0 (the
            // ring's own slots), personality, splice_fd_in, addr3, pad = 0
            st_sys_v2(sqe, (R.sqe_head + write) | ((lf >> 32) << 32), q->off[g]);
            st_sys_v2(sqe + 2, q->landing + g * q->slot_bytes, lf & (GIO_WRITE_BIT - 1ull));
            st_sys_v2(sqe + 4, g | gen << 32, 0ull);
            st_sys_v2(sqe + 6, 0ull, 0ull);
        }
    }

    __device__ __forceinline__ void publish(unsigned batch)
    {
        if (lane == 0) st_release_sys(R.sq_tail, tail + batch);
        tail += batch;
    }

    // The CQEs up to the kernel's CQ tail, one lane each; a CQE of an earlier start (a read
    // abandoned by an abort) is only reaped.
    __device__ __forceinline__ AgentReaped reap(unsigned)
    {
        const unsigned t = warp_acquire_sys(R.cq_tail);
        __syncwarp();
        const unsigned got = t - cqh;
        unsigned mine = 0;
        for (unsigned base = 0; base < got; base += 32) {
            const unsigned i = base + lane;
            bool current = false;
            if (i < got) {
                const u64* c = (const u64*)(R.cqes + (u64)((cqh + i) & (cq_n - 1)) * cqe_bytes);
                u64 w0, w1;
                asm volatile("ld.relaxed.sys.global.v2.u64 {%0,%1}, [%2];" : "=l"(w0), "=l"(w1) : "l"(c) : "memory");
                const u64 slot = w0 & 0xffffffffu;
                current = (w0 >> 32) == gen && slot < nslots;
                if (current) {
                    const int res = (int)(unsigned)(w1 & 0xffffffffu);
                    q->res[slot] = !passthrough ? res : nvme_uring_result(
                        res, (unsigned)(q->len_fd[slot] & (GIO_WRITE_BIT - 1ull)));
                    st_release_gpu(&q->state[slot], DONE);
                }
            }
            mine += __popc(__ballot_sync(FULL, current));
        }
        return {got, mine};
    }

    __device__ __forceinline__ void reaped(unsigned got, u64, u64)
    {
        cqh += got;
        if (lane == 0) st_release_sys(R.cq_head, cqh);
    }

    __device__ __forceinline__ void unreaped(u64) {}
    __device__ __forceinline__ void end(u64, u64) {}
};

extern "C" __global__ void gio_agent(const GioQueue* q, const UringRing* rings)
{
    if (agent_ring() >= q->nrings) return;
    UringAgent ring(q, rings);
    agent_loop(ring);
}
