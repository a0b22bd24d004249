// The request queue's io_uring agent: one warp per ring turns READY request slots into SQEs
// and CQEs into results (gio_queue.cuh describes the protocol). Launched by
// gpufio/io/gio/backends/uring.py.
#include "gio_queue.cuh"
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

// ---- 2. The agent: one warp per ring ----------------------------------------------------

extern "C" __global__ void gio_agent(const GioQueue* q, const UringRing* rings)
{
    const unsigned r = blockIdx.x, lane = threadIdx.x;
    const UringRing R = rings[r];
    const unsigned sq_n = (unsigned)(R.entries & 0xffffffffu), cq_n = (unsigned)(R.entries >> 32);
    const unsigned depth = (unsigned)q->depth;
    const u64 first = (u64)r * depth, nslots = q->nrings * q->depth;
    // NVMe passthrough (R.ns): 128-byte SQEs carrying the NVMe command, 32-byte CQEs
    const u64* ns_table = (const u64*)R.ns;
    const bool passthrough = ns_table != nullptr;
    const u64 sqe_bytes = passthrough ? PT_SQE_BYTES : 64;
    const u64 cqe_bytes = passthrough ? PT_CQE_BYTES : 16;
    int* state = q->state + first;
    // every lane takes lane 0's reading of the ring words and control words: the agent's
    // batch, tail and exit must be the same in all 32 lanes
    unsigned tail = warp_word(lane == 0 ? ld_acquire_sys(R.sq_tail) : 0u);
    unsigned head = warp_word(lane == 0 ? ld_acquire_sys(R.sq_head) : 0u);
    unsigned cqh = warp_word(lane == 0 ? ld_acquire_sys(R.cq_head) : 0u);
    const u64 gen = (u64)(unsigned)warp_word(lane == 0 ? ld_flag(&q->control[C_GEN]) : 0);
    unsigned inflight = 0, idle_ns = AGENT_IDLE_MIN_NS;
    u64 submitted = 0, completed = 0;
    agent_started(q);
    while (agent_running(q)) {
        unsigned batch = 0;
        for (unsigned base = 0; base < depth; base += 32) {
            const unsigned s = base + lane;
            bool ready;
            const unsigned m = agent_ready(state, s, depth, &ready);
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
                u64* sqe = (u64*)(R.sqes + (u64)((tail + batch + rank) & (sq_n - 1)) * sqe_bytes);
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
            // the kernel writes, which costs the kernel's side of a busy ring
            __nanosleep(idle_ns);
            idle_ns = min(idle_ns * 2, AGENT_IDLE_MAX_NS);
        }
    }
    if (lane == 0) {
        q->ring_stats[2 * r] = submitted;
        q->ring_stats[2 * r + 1] = completed;
    }
}
