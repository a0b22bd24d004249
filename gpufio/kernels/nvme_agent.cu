// The NVMe queue agent: one warp per I/O queue pair turns READY request slots into NVMe
// commands in the controller's SQ and its completions into results (nvme_queue.cuh describes
// the protocol, gio_agent_loop.cuh the loop; this file, the queue pair's side of it). The
// pair's tail, head and phase carry over from one start to the next in its progress words
// (word 3: head | the phase tag not expected next << 32, so zeroed words are a fresh pair).
// Launched by io/gio/backends/nvme.py. A request of write with length 0 is a Flush.
#include "gio_agent_loop.cuh"
#include "nvme_queue.cuh"

struct NvmeAgent : AgentSlots {
    const NvmeRing R;
    const unsigned sq_n, cq_n, nsid, shift;
    u64* const progress;
    const unsigned gen;
    // where the last start left the queue pair (the host zeroes these for a new pair, phase 1)
    unsigned tail, cqh, phase;

    __device__ __forceinline__ NvmeAgent(const GioQueue* queue, const NvmeRing* rings)
        : AgentSlots(queue), R(rings[r]), sq_n((unsigned)(R.entries & 0xffffffffu)),
          cq_n((unsigned)(R.entries >> 32)), nsid((unsigned)R.ns), shift((unsigned)(R.ns >> 32)),
          progress((u64*)R.progress), gen((unsigned)warp_control(queue, C_GEN) & 0xfu),
          tail(warp_acquire_sys(R.progress + 16)), cqh(warp_acquire_sys(R.progress + 24)),
          phase(warp_acquire_sys(R.progress + 28) ^ 1u) {}

    __device__ __forceinline__ AgentCounts start()
    {
        u64 submitted = 0, completed = 0;
        if (lane == 0) {
            submitted = progress[0];
            completed = progress[1];
        }
        return {__shfl_sync(FULL, submitted, 0), __shfl_sync(FULL, completed, 0)};
    }

    // depth < SQ entries: the SQ always has room for every slot's command
    __device__ __forceinline__ unsigned room(unsigned, unsigned n) { return n; }

    __device__ __forceinline__ void build(unsigned s, u64 g, unsigned pos)
    {
        const u64 lf = q->len_fd[g];
        const unsigned len = (unsigned)(lf & (GIO_WRITE_BIT - 1ull));
        const bool write = (lf & GIO_WRITE_BIT) != 0;
        const u64 host = q->landing + g * q->slot_bytes;
        const u64 iova = host + R.delta;
        u64 w[8];
        // the request's file, where it names one, is its namespace (a table striped over the
        // namespaces of the controller); else the pair's
        const unsigned ns = (unsigned)(lf >> 32) ? (unsigned)(lf >> 32) : nsid;
        nvme_cmd(w, write && len == 0, write, s | gen << NQ_CID_GEN_SHIFT, ns, shift, q->off[g],
                 len, iova, nvme_prp2(iova, len, R.prp_lists + (u64)s * NQ_PAGE + R.delta));
        u64* sqe = (u64*)(R.sqes + (u64)((tail + pos) % sq_n) * NQ_SQE_BYTES);
#pragma unroll
        for (int i = 0; i < 8; i += 2) st_sys_v2(sqe + i, w[i], w[i + 1]);
    }

    __device__ __forceinline__ void publish(unsigned batch)
    {
        tail = (tail + batch) % sq_n;
        if (lane == 0) {
            st_release_sys(R.sq_db, tail);
            st_release_sys64((u64)(progress + 2), tail);
        }
    }

    // Completions: lane i looks at the i-th entry past the head; the new ones are those whose
    // phase tag is the one this pass of the CQ expects, up to the first that is not. Every
    // one counts as this start's (the progress words carry the counts across starts).
    __device__ __forceinline__ AgentReaped reap(unsigned inflight)
    {
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
        return {got, got};
    }

    __device__ __forceinline__ void reaped(unsigned got, u64 submitted, u64 completed)
    {
        if (cqh + got >= cq_n) phase ^= 1u;
        cqh = (cqh + got) % cq_n;
        if (lane == 0) {
            st_release_sys(R.cq_db, cqh);
            st_release_sys64((u64)(progress + 3), cqh | (u64)(phase ^ 1u) << 32);
            st_release_sys64((u64)progress, submitted);
            st_release_sys64((u64)(progress + 1), completed);
        }
    }

    __device__ __forceinline__ void unreaped(u64 submitted)
    {
        if (lane == 0) st_release_sys64((u64)progress, submitted);
    }

    // lane 0: the counts for the next start
    __device__ __forceinline__ void end(u64 submitted, u64 completed)
    {
        st_release_sys64((u64)(progress + 1), completed);
        st_release_sys64((u64)progress, submitted);
    }
};

extern "C" __global__ void nvme_agent(const GioQueue* q, const NvmeRing* rings)
{
    if (agent_ring() >= q->nrings) return;
    NvmeAgent ring(q, rings);
    agent_loop(ring);
}
