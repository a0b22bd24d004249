// GPU threads driving an NVMe controller's own queues (BaM's mechanism): the queue pair's
// descriptor, the 64-byte command builder and the completion decoder. The layout comes from
// gpufio/io/nvme/spec.py as NQ_OFF_<field> / NQ_BITS_<field> macros (nothing here knows a
// byte offset of its own); bam_agent.cu is the agent that uses them.
//
// The requesting side is the request API of gio_queue.cuh, unchanged: kernels post requests
// into a GioQueue's slots (gio_try_post / gio_post / gio_done / gio_landing ...), and one
// agent warp per NVMe queue pair turns READY slots into NVMe commands, rings the SQ tail
// doorbell, takes completions by their phase tags, hands each slot its result and rings the
// CQ head doorbell. So the block benchmark and the GNN gather run on it as on io_uring.
//
// Slot s of ring r is command identifier s (its low 12 bits; a queue is at most 4096
// entries) | the queue's start count << 12, so a completion of an earlier start is never
// taken for a current one. A ring has depth slots, depth < SQ and CQ entries: at most depth
// commands are outstanding, so neither queue can overflow and the agent never needs the
// controller's SQ head.
//
// Doorbells: sq_db / cq_db are where the agent stores the new tail / head (32-bit,
// st.release.sys). In direct mode they are BAR0's doorbell registers, mapped into the GPU
// (the BAR registered with CUDA as I/O memory); in relay mode they are words in host memory
// that one CPU thread copies into the doorbell registers (backends/nvme.py, Relay). The agent
// never reads a BAR register: it polls the CQ, which lives in host memory.
#pragma once
#include "gio_queue.cuh"

#ifndef NQ_SQE_BYTES
#error "compile through gpufio.io.cuda (module or raw_module): it defines the NVMe layout"
#endif

// Host-built descriptor of one queue pair (contract.BAM_RING, every field 8 bytes).
struct BamRing {
    u64 sqes, cqes;      // host addresses (mapped into the GPU) of the SQ and the CQ
    u64 entries;         // SQ entries | CQ entries << 32 (any size, not only powers of two)
    u64 sq_db, cq_db;    // where the SQ tail and the CQ head go (doorbells, or relay words)
    u64 delta;           // bus address - host address of the queue's landing slots
    u64 prp_lists;       // host address of slot 0's PRP list page (one page per slot)
    u64 ns;              // nsid | lba_shift << 32
    u64 progress;        // host words: submitted, completed, sq tail, cq head
};

#define NQ_MASK(S, F) (~0ull >> (64 - NQ_##S##_BITS_##F))
#define NQ_PUT(w, S, F, v) \
    ((w)[NQ_##S##_OFF_##F / 8] |= ((u64)(v) & NQ_MASK(S, F)) << (8 * (NQ_##S##_OFF_##F % 8)))
#define NQ_GET(w, S, F) \
    (((w)[NQ_##S##_OFF_##F / 8] >> (8 * (NQ_##S##_OFF_##F % 8))) & NQ_MASK(S, F))
#define NQ_CID_SLOT 0xfffu
#define NQ_CID_GEN_SHIFT 12

// The 64-byte NVMe command: a read (or write) of len bytes at byte off of namespace nsid
// (blocks of 1 << lba_shift bytes), data at PRP1/PRP2, or a Flush (flush: no data, no LBA).
// What io/nvme/spec.io_commands and flush_command make.
__host__ __device__ __forceinline__ void bam_sqe(u64 w[8], bool flush, bool write, unsigned cid,
                                                 unsigned nsid, unsigned lba_shift, u64 off,
                                                 unsigned len, u64 prp1, u64 prp2)
{
#pragma unroll
    for (int i = 0; i < 8; ++i) w[i] = 0;
    NQ_PUT(w, SQ, OPCODE, flush ? NQ_NVME_FLUSH : write ? NQ_NVME_WRITE : NQ_NVME_READ);
    NQ_PUT(w, SQ, CID, cid);
    NQ_PUT(w, SQ, NSID, nsid);
    if (flush) return;
    const u64 slba = off >> lba_shift;
    NQ_PUT(w, SQ, PRP1, prp1);
    NQ_PUT(w, SQ, PRP2, prp2);
    NQ_PUT(w, SQ, CDW10, slba & 0xffffffffull);
    NQ_PUT(w, SQ, CDW11, slba >> 32);
    NQ_PUT(w, SQ, CDW12, (len >> lba_shift) - 1u);
}

// PRP2 of a transfer of len bytes from page-aligned bus address iova: none within one page,
// the second page within two, else the bus address of the slot's PRP list (the host wrote
// the slot's pages 1.. into it once: slots never move).
__host__ __device__ __forceinline__ u64 bam_prp2(u64 iova, unsigned len, u64 list_iova)
{
    return len <= NQ_PAGE ? 0ull : len <= 2 * NQ_PAGE ? iova + NQ_PAGE : list_iova;
}

// A completion's status word (phase tag dropped) as the request API's result: len bytes
// for success, -(NQ_STATUS_BASE + status) for a status the controller returned (what
// io/nvme/spec.result gives; io/nvme/passthru.error_name names it).
__host__ __device__ __forceinline__ int bam_result(unsigned status_word, unsigned len)
{
    const unsigned st = (status_word >> 1) & NQ_STATUS_MASK;
    return st == 0 ? (int)len : -(int)(NQ_STATUS_BASE + st);
}

__device__ __forceinline__ void st_release_sys64(u64 addr, u64 v)
{
    asm volatile("st.release.sys.global.u64 [%0], %1;" :: "l"(addr), "l"(v) : "memory");
}
