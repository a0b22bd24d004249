// The NVMe I/O command and its status, once for every GPU path: the 64-byte command (a read,
// write or Flush; nvme_cmd), its status as the request API's result (nvme_result), and the
// 128-byte io_uring passthrough entry built around the same command (nvme_uring_sqe). The
// CUDA twin of gpufio/io/nvme/spec.py's io_commands and status_result and of
// io/nvme/passthru.build; the layout comes from there as NVRTC macros (NQ_OFF_<field> /
// NQ_BITS_<field> of the command, PT_OFF_<field> / PT_BITS_<field> of the io_uring header),
// so nothing here knows a byte offset of its own. Used by the NVMe queue agent
// (nvme_agent.cu), the io_uring agent's passthrough path (gio_agent.cu) and the compiled CPU
// driver (io/nvme/driver.c).
//
// Plain C or C++ besides the qualifiers: the C compiler builds it into io/nvme/driver.c, and
// tests/io/nvme/test_encoders.py builds it with the C++ compiler and compares its bytes with
// the Python encoder's.
#pragma once

#ifndef NQ_SQE_BYTES
#error "compile through gpufio.io.cuda (module or raw_module): it defines the NVMe layout"
#endif

#if !defined(__CUDACC__) && !defined(__CUDACC_RTC__)  // a host compiler: plain inline functions
#define __host__
#define __device__
#define __forceinline__ static inline
#ifndef __cplusplus
#include <stdbool.h>
#endif
#endif

typedef unsigned long long u64;

#define NQ_MASK(S, F) (~0ull >> (64 - NQ_##S##_BITS_##F))
#define NQ_PUT(w, S, F, v) \
    ((w)[NQ_##S##_OFF_##F / 8] |= ((u64)(v) & NQ_MASK(S, F)) << (8 * (NQ_##S##_OFF_##F % 8)))
#define NQ_GET(w, S, F) \
    (((w)[NQ_##S##_OFF_##F / 8] >> (8 * (NQ_##S##_OFF_##F % 8))) & NQ_MASK(S, F))
// the io_uring header's fields (no field crosses an 8-byte word): one masked shift each
#define PT_PUT(w, F, v) \
    ((w)[PT_OFF_##F / 8] |= ((u64)(v) & (~0ull >> (64 - PT_BITS_##F))) << (8 * (PT_OFF_##F % 8)))

// The 64-byte NVMe command: a read (or write) of len bytes at byte off of namespace nsid
// (blocks of 1 << lba_shift bytes), data at PRP1/PRP2, or a Flush (flush: no data, no LBA).
// What io/nvme/spec.io_commands makes.
__host__ __device__ __forceinline__ void nvme_cmd(u64 w[8], bool flush, bool write, unsigned cid,
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
__host__ __device__ __forceinline__ u64 nvme_prp2(u64 iova, unsigned len, u64 list_iova)
{
    return len <= NQ_PAGE ? 0ull : len <= 2 * NQ_PAGE ? iova + NQ_PAGE : list_iova;
}

// An NVMe status (status code type << 8 | status code; More and DNR above, ignored) as the
// request API's result: len bytes for success, -(NQ_STATUS_BASE + status) for a status the
// controller returned (io/nvme/spec.status_result; spec.error_name names it).
__host__ __device__ __forceinline__ int nvme_result(unsigned status, unsigned len)
{
    const unsigned st = status & NQ_STATUS_MASK;
    return st == 0 ? (int)len : -(int)(NQ_STATUS_BASE + st);
}

// A completion entry's status word (the phase tag in bit 0) as the request API's result.
__host__ __device__ __forceinline__ int nvme_cqe_result(unsigned status_word, unsigned len)
{
    return nvme_result(status_word >> 1, len);
}

// The 128-byte URING_CMD SQE of an NVMe read (or write) of len bytes at byte off of namespace
// nsid (blocks of 1 << lba_shift bytes), to or from addr: the io_uring header, then
// struct nvme_uring_cmd, which is nvme_cmd's command with addr where PRP1 is, data_len in
// PRP2's upper half and the command identifier reserved. What io/nvme/passthru.build makes.
__host__ __device__ __forceinline__ void nvme_uring_sqe(u64 w[16], unsigned fd, unsigned sqe_flags,
                                                        unsigned nsid, unsigned lba_shift,
                                                        bool write, u64 off, unsigned len,
                                                        u64 addr, u64 user_data)
{
#pragma unroll
    for (int i = 0; i < 16; ++i) w[i] = 0;
    PT_PUT(w, OPCODE, PT_OP_URING_CMD);
    PT_PUT(w, FLAGS, sqe_flags);
    PT_PUT(w, FD, fd);
    PT_PUT(w, CMD_OP, PT_NVME_URING_CMD_IO);
    PT_PUT(w, USER_DATA, user_data);
    nvme_cmd(w + PT_CMD_OFFSET / 8, false, write, 0, nsid, lba_shift, off, len, addr,
             (u64)len << 32);
}

// A passthrough CQE's res as the request API's result (io/nvme/passthru.result): a -errno
// from the kernel as it is, else the NVMe status it carries.
__host__ __device__ __forceinline__ int nvme_uring_result(int res, unsigned len)
{
    return res < 0 ? res : nvme_result((unsigned)res, len);
}
