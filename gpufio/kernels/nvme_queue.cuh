// GPU threads driving an NVMe controller's own queues (BaM's mechanism): the queue pair's
// descriptor and the command identifiers; the command and its status are nvme_cmd.cuh's.
// nvme_agent.cu is the agent that uses them.
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
#include "nvme_cmd.cuh"

// Host-built descriptor of one queue pair (contract.NVME_RING, every field 8 bytes).
struct NvmeRing {
    u64 sqes, cqes;      // host addresses (mapped into the GPU) of the SQ and the CQ
    u64 entries;         // SQ entries | CQ entries << 32 (any size, not only powers of two)
    u64 sq_db, cq_db;    // where the SQ tail and the CQ head go (doorbells, or relay words)
    u64 delta;           // bus address - host address of the queue's landing slots
    u64 prp_lists;       // host address of slot 0's PRP list page (one page per slot)
    u64 ns;              // nsid | lba_shift << 32
    u64 progress;        // host words: submitted, completed, sq tail, cq head
};

#define NQ_CID_SLOT 0xfffu
#define NQ_CID_GEN_SHIFT 12

__device__ __forceinline__ void st_release_sys64(u64 addr, u64 v)
{
    asm volatile("st.release.sys.global.u64 [%0], %1;" :: "l"(addr), "l"(v) : "memory");
}
