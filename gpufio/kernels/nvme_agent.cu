// The NVMe queue agent: one warp per I/O queue pair turns READY request slots into NVMe
// commands in the controller's SQ and its completions into results (nvme_queue.cuh describes
// the protocol). The pair's tail, head and phase carry over from one start to the next in
// its progress words (word 3: head | the phase tag not expected next << 32, so zeroed words
// are a fresh pair). Launched by io/gio/backends/nvme.py. A request of write with length 0
// is a Flush.
#include "nvme_queue.cuh"

extern "C" __global__ void nvme_agent(const GioQueue* q, const NvmeRing* rings)
{
    const unsigned r = blockIdx.x, lane = threadIdx.x;
    const NvmeRing R = rings[r];
    const unsigned sq_n = (unsigned)(R.entries & 0xffffffffu), cq_n = (unsigned)(R.entries >> 32);
    const unsigned depth = (unsigned)q->depth;
    const u64 first = (u64)r * depth;
    const unsigned nsid = (unsigned)R.ns, shift = (unsigned)(R.ns >> 32);
    int* state = q->state + first;
    u64* progress = (u64*)R.progress;
    const unsigned gen = (unsigned)warp_word(lane == 0 ? ld_flag(&q->control[C_GEN]) : 0) & 0xfu;
    // where the last start left the queue pair (the host zeroes these for a new pair, phase 1)
    unsigned tail = warp_word(lane == 0 ? ld_acquire_sys(R.progress + 16) : 0u);
    unsigned cqh = warp_word(lane == 0 ? ld_acquire_sys(R.progress + 24) : 0u);
    unsigned phase = warp_word(lane == 0 ? ld_acquire_sys(R.progress + 28) : 0u) ^ 1u;
    unsigned inflight = 0, idle_ns = AGENT_IDLE_MIN_NS;
    u64 submitted = 0, completed = 0;
    if (lane == 0) {
        submitted = progress[0];
        completed = progress[1];
    }
    submitted = __shfl_sync(FULL, submitted, 0);
    completed = __shfl_sync(FULL, completed, 0);
    agent_started(q);
    while (agent_running(q)) {
        unsigned batch = 0;
        for (unsigned s = lane; s - lane < depth; s += 32) {  // lane's slot of each 32
            bool ready;
            const unsigned m = agent_ready(state, s, depth, &ready);
            if (m && ready) {
                const unsigned rank = __popc(m & ((1u << lane) - 1u));
                const u64 g = first + s;
                const u64 lf = q->len_fd[g];
                const unsigned len = (unsigned)(lf & (GIO_WRITE_BIT - 1ull));
                const bool write = (lf & GIO_WRITE_BIT) != 0;
                const u64 host = q->landing + g * q->slot_bytes;
                const u64 iova = host + R.delta;
                u64 w[8];
                // the request's file, where it names one, is its namespace (a table striped
                // over the namespaces of the controller); else the pair's
                const unsigned ns = (unsigned)(lf >> 32) ? (unsigned)(lf >> 32) : nsid;
                nvme_cmd(w, write && len == 0, write, s | gen << NQ_CID_GEN_SHIFT, ns, shift,
                         q->off[g], len, iova,
                         nvme_prp2(iova, len, R.prp_lists + (u64)s * NQ_PAGE + R.delta));
                u64* sqe = (u64*)(R.sqes + (u64)((tail + batch + rank) % sq_n) * NQ_SQE_BYTES);
#pragma unroll
                for (int i = 0; i < 8; i += 2) st_sys_v2(sqe + i, w[i], w[i + 1]);
                st_relaxed_gpu(&state[s], SUBMITTED);
            }
            batch += __popc(m);
        }
        if (batch) {
            __threadfence_system();  // every lane's command, before the barrier and the doorbell
            __syncwarp();
            tail = (tail + batch) % sq_n;
            if (lane == 0) {
                st_release_sys(R.sq_db, tail);
                st_release_sys64((u64)(progress + 2), tail);
            }
            inflight += batch;
            submitted += batch;
        }
        // completions: lane i looks at the i-th entry past the head; the new ones are those
        // whose phase tag is the one this pass of the CQ expects, up to the first that is not
        unsigned got = 0;
        while (inflight) {  // nothing outstanding: no completion can come, no PCIe read
            const unsigned i = (cqh + got + lane) % cq_n;
            const unsigned expect = phase ^ (cqh + got + lane >= cq_n ? 1u : 0u);
            u64 c[2];
            asm volatile("ld.relaxed.sys.global.v2.u64 {%0,%1}, [%2];"
                         : "=l"(c[0]), "=l"(c[1]) : "l"(R.cqes + (u64)i * NQ_CQE_BYTES) : "memory");
            const unsigned status = (unsigned)NQ_GET(c, CQ, STATUS);
            const unsigned fresh = __ballot_sync(FULL, (status & 1u) == expect);
            const unsigned n = fresh == FULL ? 32u : (unsigned)__ffs(~fresh) - 1u;
            __threadfence_system();  // acquire: the data the controller wrote before its CQE
            if (lane < n) {
                const unsigned cid = (unsigned)NQ_GET(c, CQ, CID);
                const unsigned s = cid & NQ_CID_SLOT;
                if ((cid >> NQ_CID_GEN_SHIFT) == gen && s < depth) {
                    const u64 g = first + s;
                    const unsigned len = (unsigned)(q->len_fd[g] & (GIO_WRITE_BIT - 1ull));
                    q->res[g] = nvme_cqe_result(status, len);
                    st_release_gpu(&state[s], DONE);
                }
            }
            got += n;
            if (n < 32) break;
        }
        if (got) {
            if (cqh + got >= cq_n) phase ^= 1u;
            cqh = (cqh + got) % cq_n;
            __syncwarp();
            completed += got;
            if (lane == 0) {
                st_release_sys(R.cq_db, cqh);
                st_release_sys64((u64)(progress + 3), cqh | (u64)(phase ^ 1u) << 32);
                st_release_sys64((u64)progress, submitted);
                st_release_sys64((u64)(progress + 1), completed);
            }
            inflight -= got;
            idle_ns = AGENT_IDLE_MIN_NS;
        } else if (!batch) {
            if (inflight == 0 && warp_word(lane == 0 ? ld_flag(&q->control[C_REQUESTERS]) : 1) == 0) break;
            __nanosleep(idle_ns);  // every CQ poll is a PCIe read of host memory
            idle_ns = min(idle_ns * 2, AGENT_IDLE_MAX_NS);
        } else if (lane == 0) {
            st_release_sys64((u64)progress, submitted);
        }
    }
    if (lane == 0) {
        q->ring_stats[2 * r] = submitted;
        q->ring_stats[2 * r + 1] = completed;
        st_release_sys64((u64)(progress + 1), completed);
        st_release_sys64((u64)progress, submitted);
    }
}
