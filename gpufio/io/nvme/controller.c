/* gpufio's compiled software NVMe controller: the protocol of io/nvme/model.py (the same
 * shared file, registers, admin commands, PRP checks, status codes and fault injection),
 * served by N poller threads instead of one Python loop, so the controller is no longer
 * what limits a GPU or CPU driver of its queues.
 *
 * The shared file: BAR0 (BAR_BYTES), then host memory at bus address IOVA_BASE + offset.
 * Thread t serves the I/O queue pairs whose CQ id c has (c - 1) % N == t (every SQ of a CQ
 * on one thread, so a CQ has one writer); thread 0 also follows CC and serves the admin
 * queue. An admin command that changes a queue (create, delete, reset) takes the serving
 * thread's lock, which that thread holds for each of its passes.
 *
 * Backends: none (PRPs walked and checked, no data moved), ram (the backing file mapped:
 * reads copy into the landing pages, writes out of them), file (the backing file read and
 * written through an io_uring of each poller thread, at depth, with O_DIRECT where the
 * file system and the transfer's alignment allow, else buffered; a command completes
 * when its io_uring completion comes).
 *
 * Namespaces 1 to nns are backing files of their own (a table striped over drives), each
 * optionally behind a drive's rate model (drive_rate.c): a command's completion is posted
 * no earlier than the time gdr_admit gives it at fetch; until then it waits in its poller's
 * heap (its CQ entry reserved) while the poller goes on serving other commands.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define BAR_BYTES 0x2000u
#define IOVA_BASE (1ull << 36)
#define PAGE 4096ull
#define MAX_QUEUES 64
#define MQES 4095u
#define DOORBELLS 0x1000u
#define REG_CAP 0x0
#define REG_VS 0x8
#define REG_CC 0x14
#define REG_CSTS 0x1C
#define REG_AQA 0x24
#define REG_ASQ 0x28
#define REG_ACQ 0x30
#define M_ALIVE 0xF00
#define M_STOP 0xF04
#define M_ERROR 0xF08
#define M_FETCHED 0xF10
#define M_COMPLETED 0xF18
#define M_BUSY_NS 0xF20   /* ns the pollers spent in passes that did work, summed over them */
#define M_ADMITTED 0xF40  /* commands each namespace's drive model admitted, 64 bits each */
#define MAX_NS 16         /* namespaces a controller serves (M_ADMITTED's room) */
#define CSTS_RDY 1u
#define CSTS_CFS 2u
#define CSTS_SHST_DONE (2u << 2)
#define CC_EN 1u
#define CC_SHN (3u << 14)

#define SC_INVALID_OPCODE 0x01
#define SC_INVALID_FIELD 0x02
#define SC_DATA_TRANSFER 0x04
#define SC_INVALID_NS 0x0B
#define SC_PRP_OFFSET 0x13
#define SC_LBA_RANGE 0x80
#define SC_INVALID_QID 0x101
#define SC_INVALID_QSIZE 0x102
#define SC_WRITE_FAULT 0x280
#define SC_READ_ERROR 0x281
#define NO_POST (-1)
#define ASYNC (-2)      /* handed to io_uring: posted when its completion comes */

#define OP_FLUSH 0x00
#define OP_WRITE 0x01
#define OP_READ 0x02

#define IDLE_SPINS 2000
#define IDLE_MAX_NS 500000

enum { B_NONE = 0, B_RAM = 1, B_FILE = 2 };

/* io_uring's ABI (linux/io_uring.h), the few parts used, so no kernel header is needed */
#ifndef __NR_io_uring_setup
#define __NR_io_uring_setup 425
#endif
#ifndef __NR_io_uring_enter
#define __NR_io_uring_enter 426
#endif
#define OP_READV 1
#define OP_WRITEV 2
#define RING_ENTRIES 256  /* each poller's io_uring: commands in flight on the file */
#define RING_IOVS 32      /* larger transfers go synchronously (preadv/pwritev) */
#define DIRECT_ALIGN 512

struct uring_params {
    uint32_t sq_entries, cq_entries, flags, sq_thread_cpu, sq_thread_idle, features, wq_fd,
        resv[3];
    uint32_t sq_head, sq_tail, sq_mask, sq_count, sq_flags, sq_dropped, sq_array, sq_resv;
    uint64_t sq_user;
    uint32_t cq_head, cq_tail, cq_mask, cq_count, cq_overflow, cq_cqes, cq_flags, cq_resv;
    uint64_t cq_user;
};
struct uring_sqe {
    uint8_t opcode, flags;
    uint16_t ioprio;
    int32_t fd;
    uint64_t off, addr;
    uint32_t len, rw_flags;
    uint64_t user_data, pad[3];
};
struct uring_cqe {
    uint64_t user_data;
    int32_t res;
    uint32_t flags;
};

struct ring {
    int fd;
    uint32_t *sq_head, *sq_tail, *sq_mask, *sq_array, *cq_head, *cq_tail, *cq_mask;
    struct uring_sqe *sqes;
    struct uring_cqe *cqes;
    uint32_t pending;  /* entries written, not yet submitted */
};

struct inflight {  /* a command on the io_uring, until its completion posts it */
    struct iovec iov[RING_IOVS];
    int n, write, direct, fd;  /* fd: the namespace's buffered descriptor */
    uint64_t off, want;
    int64_t due;               /* its drive model's time (ns; 0: none) */
    uint32_t gen;
    uint16_t sqid, cqid, sq_head, cid;
};

struct gnc_fault {  /* io/nvme/model.Fault, every field 64 bits */
    int64_t slba, status, drop, times;
};

struct queue {
    uint64_t base;
    uint32_t size, head, tail, phase;
    uint32_t reserved;  /* CQ: entries held for commands still on an io_uring */
    uint32_t gen;       /* which creation of the queue: a late completion of an older one
                         * is dropped */
    uint16_t cqid;
    int live;
};

struct gdr_drive;  /* drive_rate.c */
int64_t gdr_admit(struct gdr_drive *d, int64_t now_ns, int64_t bytes);

struct held {  /* a completion its drive model does not let post before due */
    int64_t due;
    uint32_t gen, result;
    int status;
    uint16_t sqid, cqid, sq_head, cid;
};

struct ns {  /* a namespace: its backing file and its drive model (NULL: none) */
    int fd, dfd, writable;  /* dfd: O_DIRECT, or -1 */
    uint8_t *ram;
    uint64_t nbytes, nblocks;
    struct gdr_drive *drive;
};

struct ctl;
struct worker {
    struct ctl *c;
    int index;
    pthread_t thread;
    pthread_mutex_t lock;
    struct iovec *iov;   /* one transfer's pieces */
    uint64_t *entries;   /* its PRP entries past the first */
    size_t most;         /* how many pieces a transfer can have */
    int64_t posted;      /* completions posted since the counters were last moved */
    struct ring ring;    /* the file backend's io_uring (fd -1: none) */
    struct inflight *slots;
    uint16_t *free;
    int nfree;
    uint16_t sqid, cqid, sq_head, cid;  /* the command being executed */
    uint32_t nsid;                      /* its namespace (0: none valid) */
    uint64_t nbytes;                    /* its bytes */
    struct held *held;                  /* a binary heap by due time */
    size_t nheld, held_room;
};

struct ctl {
    uint8_t *map;
    size_t map_bytes;
    uint8_t *dma;
    uint64_t dma_bytes;
    int backend, lba_shift, nns;
    struct ns *ns;
    struct queue sq[MAX_QUEUES + 1], cq[MAX_QUEUES + 1];
    int enabled, nthreads;
    uint32_t gens;
    struct worker *workers;
    const struct gnc_fault *faults;
    int64_t *left;
    int nfaults;
    pthread_mutex_t fault_lock;
};

static inline uint32_t reg(struct ctl *c, uint32_t off) {
    return __atomic_load_n((uint32_t *)(c->map + off), __ATOMIC_ACQUIRE);
}
static inline void set_reg(struct ctl *c, uint32_t off, uint32_t v) {
    __atomic_store_n((uint32_t *)(c->map + off), v, __ATOMIC_RELEASE);
}
static inline uint64_t reg64(struct ctl *c, uint32_t off) {
    return (uint64_t)reg(c, off) | (uint64_t)reg(c, off + 4) << 32;
}
static inline uint32_t doorbell(uint32_t qid, int completion) {
    return DOORBELLS + (2 * qid + (completion ? 1 : 0)) * 4;
}
static inline int owner(struct ctl *c, uint32_t cqid) { return (int)((cqid - 1) % c->nthreads); }

/* Host memory at bus address iova, n bytes; NULL outside it (a DMA fault). */
static uint8_t *at(struct ctl *c, uint64_t iova, uint64_t n) {
    if (iova < IOVA_BASE) return NULL;
    uint64_t start = iova - IOVA_BASE;
    if (start > c->dma_bytes || n > c->dma_bytes - start) return NULL;
    return c->dma + start;
}

static void fatal(struct ctl *c) {
    set_reg(c, REG_CSTS, CSTS_RDY | CSTS_CFS);
    set_reg(c, M_ERROR, 1);
}

/* The pieces of a transfer of nbytes by PRP1, PRP2 and the PRP lists PRP2 points to (each
 * list page's last entry chains to the next when more pages follow); the model's checks, in
 * its order: every list pointer is followed first, then every entry checked. */
static int prps(struct worker *w, uint64_t prp1, uint64_t prp2, uint64_t nbytes, size_t *count) {
    struct ctl *c = w->c;
    if (prp1 % 4) return SC_PRP_OFFSET;
    uint64_t first = PAGE - prp1 % PAGE;
    if (nbytes < first) first = nbytes;
    uint8_t *p = at(c, prp1, first);
    if (!p) return SC_DATA_TRANSFER;
    w->iov[0].iov_base = p;
    w->iov[0].iov_len = first;
    uint64_t left = nbytes - first;
    size_t n = 0, need = (left + PAGE - 1) / PAGE;
    if (left == 0) { *count = 1; return 0; }
    if (need + 1 > w->most) return SC_INVALID_FIELD;
    if (left <= PAGE) {
        w->entries[n++] = prp2;
    } else {
        uint64_t list = prp2;
        while (n < need) {
            if (list % 8) return SC_PRP_OFFSET;
            uint64_t room = PAGE - list % PAGE;
            const uint64_t *page = (const uint64_t *)at(c, list, room);
            if (!page) return SC_DATA_TRANSFER;
            size_t fits = room / 8;
            if (need - n <= fits) {
                memcpy(w->entries + n, page, (need - n) * 8);
                n = need;
            } else {
                memcpy(w->entries + n, page, (fits - 1) * 8);
                n += fits - 1;
                list = page[fits - 1];
            }
        }
    }
    for (size_t i = 0; i < n; i++) {
        uint64_t addr = w->entries[i], len = left < PAGE ? left : PAGE;
        if (addr % PAGE) return SC_PRP_OFFSET;
        if (!(p = at(c, addr, len))) return SC_DATA_TRANSFER;
        w->iov[i + 1].iov_base = p;
        w->iov[i + 1].iov_len = len;
        left -= len;
    }
    *count = n + 1;
    return 0;
}

static const struct gnc_fault *fault_for(struct ctl *c, int64_t slba) {
    const struct gnc_fault *hit = NULL;
    pthread_mutex_lock(&c->fault_lock);
    for (int i = 0; i < c->nfaults; i++)
        if (c->faults[i].slba == slba && c->left[i] > 0) {
            c->left[i]--;
            hit = &c->faults[i];
            break;
        }
    pthread_mutex_unlock(&c->fault_lock);
    return hit;
}

static int flush(struct ctl *c, struct ns *ns) {
    if (c->backend == B_RAM && ns->nbytes && ns->writable)
        return msync(ns->ram, ns->nbytes, MS_SYNC) ? SC_WRITE_FAULT : 0;
    if (c->backend != B_NONE) fsync(ns->fd);  /* as the model: a read-only file's fsync may fail */
    return 0;
}

static int file_io(int fd, struct iovec *iov, size_t n, uint64_t off, int write) {
    while (n) {
        int cnt = n > 1024 ? 1024 : (int)n;
        ssize_t want = 0;
        for (int i = 0; i < cnt; i++) want += iov[i].iov_len;
        ssize_t got = write ? pwritev(fd, iov, cnt, (off_t)off)
                            : preadv(fd, iov, cnt, (off_t)off);
        if (got != want) return write ? SC_WRITE_FAULT : SC_READ_ERROR;
        off += want;
        iov += cnt;
        n -= cnt;
    }
    return 0;
}

static int ring_setup(struct ring *r) {
    struct uring_params p;
    memset(&p, 0, sizeof p);
    r->fd = (int)syscall(__NR_io_uring_setup, RING_ENTRIES, &p);
    if (r->fd < 0) return -1;
    size_t sq_bytes = p.sq_array + p.sq_entries * 4, cq_bytes = p.cq_cqes + p.cq_entries * 16;
    uint8_t *sq = mmap(NULL, sq_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE,
                       r->fd, 0);
    uint8_t *cq = mmap(NULL, cq_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE,
                       r->fd, 0x8000000);
    void *sqes = mmap(NULL, p.sq_entries * sizeof(struct uring_sqe), PROT_READ | PROT_WRITE,
                      MAP_SHARED | MAP_POPULATE, r->fd, 0x10000000);
    if (sq == MAP_FAILED || cq == MAP_FAILED || sqes == MAP_FAILED) {
        close(r->fd);
        r->fd = -1;
        return -1;
    }
    r->sq_head = (uint32_t *)(sq + p.sq_head);
    r->sq_tail = (uint32_t *)(sq + p.sq_tail);
    r->sq_mask = (uint32_t *)(sq + p.sq_mask);
    r->sq_array = (uint32_t *)(sq + p.sq_array);
    r->cq_head = (uint32_t *)(cq + p.cq_head);
    r->cq_tail = (uint32_t *)(cq + p.cq_tail);
    r->cq_mask = (uint32_t *)(cq + p.cq_mask);
    r->cqes = (struct uring_cqe *)(cq + p.cq_cqes);
    r->sqes = sqes;
    r->pending = 0;
    return 0;
}

static int aligned(const struct iovec *iov, int n, uint64_t off) {
    if (off % DIRECT_ALIGN) return 0;
    for (int i = 0; i < n; i++)
        if ((uintptr_t)iov[i].iov_base % DIRECT_ALIGN || iov[i].iov_len % DIRECT_ALIGN) return 0;
    return 1;
}

/* A read or write of the file backend: onto the poller's io_uring (ASYNC) where it has
 * room, else now (preadv/pwritev). */
static int file_command(struct worker *w, struct ns *ns, size_t n, uint64_t off,
                        uint64_t nbytes, int write) {
    struct ctl *c = w->c;
    struct ring *r = &w->ring;
    if (r->fd < 0 || !w->nfree || n > RING_IOVS)
        return file_io(ns->fd, w->iov, n, off, write);
    uint16_t s = w->free[--w->nfree];
    struct inflight *f = &w->slots[s];
    memcpy(f->iov, w->iov, n * sizeof *f->iov);
    f->n = (int)n;
    f->write = write;
    f->off = off;
    f->want = nbytes;
    f->direct = ns->dfd >= 0 && aligned(f->iov, f->n, off);
    f->fd = ns->fd;
    f->due = 0;
    f->sqid = w->sqid;
    f->cqid = w->cqid;
    f->sq_head = w->sq_head;
    f->cid = w->cid;
    f->gen = c->cq[w->cqid].gen;
    uint32_t tail = *r->sq_tail, i = tail & *r->sq_mask;
    struct uring_sqe *e = &r->sqes[i];
    memset(e, 0, sizeof *e);
    e->opcode = write ? OP_WRITEV : OP_READV;
    e->fd = f->direct ? ns->dfd : ns->fd;
    e->off = off;
    e->addr = (uint64_t)(uintptr_t)f->iov;
    e->len = (uint32_t)n;
    e->user_data = s;
    r->sq_array[i] = i;
    __atomic_store_n(r->sq_tail, tail + 1, __ATOMIC_RELEASE);
    r->pending++;
    return ASYNC;
}

static void post(struct ctl *c, struct queue *cq, uint16_t sqid, uint16_t sq_head, uint16_t cid,
                 int status, uint32_t result);

static int64_t now_ns(void) {  /* CLOCK_MONOTONIC: the clock the drive models are given */
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Keep a completion (its CQ entry already reserved) until due: onto the worker's heap.
 * -1 where there is no memory for it (the controller goes fatal). */
static int hold(struct worker *w, const struct held *h) {
    if (w->nheld == w->held_room) {
        size_t room = w->held_room ? 2 * w->held_room : 256;
        struct held *more = realloc(w->held, room * sizeof *more);
        if (!more) return -1;
        w->held = more;
        w->held_room = room;
    }
    size_t i = w->nheld++;
    while (i && w->held[(i - 1) / 2].due > h->due) {  /* sift up */
        w->held[i] = w->held[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    w->held[i] = *h;
    return 0;
}

/* Post every held completion now due whose CQ is still the one it was fetched for; the
 * completions posted. */
static int64_t release(struct worker *w) {
    struct ctl *c = w->c;
    int64_t posted = 0, now = w->nheld ? now_ns() : 0;
    while (w->nheld && w->held[0].due <= now) {
        struct held h = w->held[0], last = w->held[--w->nheld];
        size_t i = 0;
        for (;;) {  /* sift the last entry down from the top */
            size_t k = 2 * i + 1;
            if (k >= w->nheld) break;
            if (k + 1 < w->nheld && w->held[k + 1].due < w->held[k].due) k++;
            if (w->held[k].due >= last.due) break;
            w->held[i] = w->held[k];
            i = k;
        }
        if (w->nheld) w->held[i] = last;
        struct queue *cq = &c->cq[h.cqid];
        if (cq->live && cq->gen == h.gen) {  /* not deleted or reset meanwhile */
            cq->reserved--;
            post(c, cq, h.sqid, h.sq_head, h.cid, h.status, h.result);
            posted++;
        }
    }
    return posted;
}

/* Submit what the passes put on the io_uring; post what completed. The completions posted. */
static int64_t ring_pass(struct worker *w) {
    struct ctl *c = w->c;
    struct ring *r = &w->ring;
    int64_t posted = 0;
    if (r->fd < 0) return 0;
    if (r->pending) {
        long got = syscall(__NR_io_uring_enter, r->fd, r->pending, 0, 0, NULL, 0);
        if (got > 0) r->pending -= (uint32_t)got;
    }
    uint32_t head = *r->cq_head, tail = __atomic_load_n(r->cq_tail, __ATOMIC_ACQUIRE);
    for (; head != tail; head++) {
        struct uring_cqe *e = &r->cqes[head & *r->cq_mask];
        struct inflight *f = &w->slots[e->user_data];
        int64_t res = e->res;
        if (res == -EINVAL && f->direct)  /* O_DIRECT refused this one: buffered, now */
            res = file_io(f->fd, f->iov, (size_t)f->n, f->off, f->write) ? -EIO
                                                                        : (int64_t)f->want;
        struct queue *cq = &c->cq[f->cqid];
        if (cq->live && cq->gen == f->gen) {  /* not deleted or reset meanwhile */
            int status = res == (int64_t)f->want ? 0 : f->write ? SC_WRITE_FAULT : SC_READ_ERROR;
            struct held h = {f->due, f->gen, 0, status, f->sqid, f->cqid, f->sq_head, f->cid};
            if (f->due > now_ns()) {  /* its drive model's time has not come: held */
                if (hold(w, &h)) fatal(c);
            } else {
                cq->reserved--;
                post(c, cq, f->sqid, f->sq_head, f->cid, status, 0);
                posted++;
            }
        }
        w->free[w->nfree++] = (uint16_t)e->user_data;
    }
    __atomic_store_n(r->cq_head, head, __ATOMIC_RELEASE);
    return posted;
}

static int io(struct worker *w, const uint8_t *e) {
    struct ctl *c = w->c;
    uint8_t op = e[0];
    uint32_t nsid, c10, c11, c12;
    uint64_t prp1, prp2;
    memcpy(&nsid, e + 4, 4);
    memcpy(&prp1, e + 24, 8);
    memcpy(&prp2, e + 32, 8);
    memcpy(&c10, e + 40, 4);
    memcpy(&c11, e + 44, 4);
    memcpy(&c12, e + 48, 4);
    w->nsid = 0;
    w->nbytes = 0;
    if (op != OP_READ && op != OP_WRITE && op != OP_FLUSH) return SC_INVALID_OPCODE;
    if (nsid < 1 || nsid > (uint32_t)c->nns) return SC_INVALID_NS;
    struct ns *ns = &c->ns[nsid - 1];
    w->nsid = nsid;
    uint64_t slba = op == OP_FLUSH ? UINT64_MAX : ((uint64_t)c11 << 32 | c10);
    if (c->nfaults) {
        const struct gnc_fault *f = fault_for(c, (int64_t)slba);
        if (f) return f->drop ? NO_POST : (int)f->status;
    }
    if (op == OP_FLUSH) return flush(c, ns);
    uint64_t nlb = (c12 & 0xFFFF) + 1;
    uint64_t nbytes = nlb << c->lba_shift, off = slba << c->lba_shift;
    w->nbytes = nbytes;
    if (slba > ns->nblocks || nlb > ns->nblocks - slba) return SC_LBA_RANGE;
    size_t n;
    int st = prps(w, prp1, prp2, nbytes, &n);
    if (st) return st == SC_INVALID_FIELD ? SC_DATA_TRANSFER : st;
    if (c->backend == B_NONE) return 0;
    if (op == OP_WRITE && !ns->writable) return SC_WRITE_FAULT;
    if (c->backend == B_FILE) return file_command(w, ns, n, off, nbytes, op == OP_WRITE);
    for (size_t i = 0; i < n; i++) {
        if (op == OP_READ) memcpy(w->iov[i].iov_base, ns->ram + off, w->iov[i].iov_len);
        else memcpy(ns->ram + off, w->iov[i].iov_base, w->iov[i].iov_len);
        off += w->iov[i].iov_len;
    }
    return 0;
}

static void post(struct ctl *c, struct queue *cq, uint16_t sqid, uint16_t sq_head, uint16_t cid,
                 int status, uint32_t result) {
    uint8_t *slot = at(c, cq->base + (uint64_t)cq->tail * 16, 16);
    if (!slot) { fatal(c); return; }
    uint32_t zero = 0;
    memcpy(slot, &result, 4);
    memcpy(slot + 4, &zero, 4);
    memcpy(slot + 8, &sq_head, 2);
    memcpy(slot + 10, &sqid, 2);
    memcpy(slot + 12, &cid, 2);
    /* the phase tag last: the host takes the entry once it flips */
    uint16_t word = (uint16_t)((status & 0x7FF) << 1 | (cq->phase & 1));
    __atomic_store_n((uint16_t *)(slot + 14), word, __ATOMIC_RELEASE);
    if (++cq->tail == cq->size) { cq->tail = 0; cq->phase ^= 1; }
}

static int admin(struct ctl *c, struct worker *w, const uint8_t *e, uint32_t *result);

/* No CQ entry left for another command: posted ones the host has not consumed, and those
 * held for commands still on an io_uring. */
static int cq_full(const struct queue *cq) {
    uint32_t used = (cq->tail + cq->size - cq->head) % cq->size + cq->reserved;
    return used + 1 >= cq->size;
}

/* Fetch and execute what SQ qid's doorbell offers, while its CQ has room; the number of
 * commands fetched, or -1 where the controller went fatal. */
static int64_t serve_sq(struct ctl *c, struct worker *w, uint32_t qid) {
    struct queue *sq = &c->sq[qid], *cq = &c->cq[sq->cqid];
    if (!cq->live) return 0;
    uint32_t tail = reg(c, doorbell(qid, 0));
    if (tail >= sq->size) { fatal(c); return -1; }
    int64_t done = 0;
    while (sq->head != tail) {
        if (cq_full(cq)) {
            cq->head = reg(c, doorbell(sq->cqid, 1));
            if (cq_full(cq)) break;
        }
        const uint8_t *src = at(c, sq->base + (uint64_t)sq->head * 64, 64);
        if (!src) { fatal(c); return -1; }
        uint8_t e[64];
        memcpy(e, src, 64);
        sq->head = (sq->head + 1) % sq->size;
        done++;
        uint32_t result = 0;
        uint16_t cid;
        memcpy(&cid, e + 2, 2);
        w->sqid = (uint16_t)qid;
        w->cqid = sq->cqid;
        w->sq_head = (uint16_t)sq->head;
        w->cid = cid;
        int status = qid == 0 ? admin(c, w, e, &result) : io(w, e);
        struct gdr_drive *d = qid && w->nsid ? c->ns[w->nsid - 1].drive : NULL;
        int64_t due = 0;
        if (d && status != NO_POST) {
            due = gdr_admit(d, now_ns(), (int64_t)w->nbytes);
            __atomic_add_fetch((uint64_t *)(c->map + M_ADMITTED + 8 * (w->nsid - 1)), 1,
                               __ATOMIC_RELAXED);
        }
        if (status == ASYNC) {
            cq->reserved++;
            w->slots[w->free[w->nfree]].due = due;  /* the slot file_command just took */
        } else if (status != NO_POST && due > now_ns()) {
            struct held h = {due, cq->gen, result, status, (uint16_t)qid, sq->cqid,
                             (uint16_t)sq->head, cid};
            cq->reserved++;  /* its CQ entry kept until it posts */
            if (hold(w, &h)) { fatal(c); return -1; }
        } else if (status != NO_POST) {
            post(c, cq, (uint16_t)qid, (uint16_t)sq->head, cid, status, result);
            w->posted++;
        }
    }
    return done;
}

static void lock_all(struct ctl *c) {
    for (int i = 0; i < c->nthreads; i++) pthread_mutex_lock(&c->workers[i].lock);
}
static void unlock_all(struct ctl *c) {
    for (int i = c->nthreads - 1; i >= 0; i--) pthread_mutex_unlock(&c->workers[i].lock);
}

static void put(uint8_t *page, size_t off, const void *src, size_t n) { memcpy(page + off, src, n); }

static int identify(struct ctl *c, struct worker *w, const uint8_t *e, uint32_t c10) {
    uint8_t page[PAGE];
    uint32_t nsid;
    uint64_t prp1, prp2;
    memcpy(&nsid, e + 4, 4);
    memcpy(&prp1, e + 24, 8);
    memcpy(&prp2, e + 32, 8);
    memset(page, 0, sizeof page);
    uint8_t cns = c10 & 0xFF;
    if (cns == 1) {  /* controller: serial, model, one namespace */
        char sn[20], mn[40];
        memset(sn, ' ', sizeof sn);
        memset(mn, ' ', sizeof mn);
        memcpy(sn, "gpufio-compiled", 15);
        memcpy(mn, "gpufio compiled NVMe controller", 31);
        put(page, 4, sn, 20);
        put(page, 24, mn, 40);
        uint32_t nn = (uint32_t)c->nns;
        put(page, 516, &nn, 4);
    } else if (cns == 0 && nsid >= 1 && nsid <= (uint32_t)c->nns) {  /* size, one format */
        for (int i = 0; i < 3; i++) put(page, 8 * i, &c->ns[nsid - 1].nblocks, 8);
        uint32_t lbaf = (uint32_t)c->lba_shift << 16;
        put(page, 128, &lbaf, 4);
    } else if (cns == 2) {  /* the active namespace list: those past nsid */
        for (uint32_t id = nsid + 1, k = 0; id <= (uint32_t)c->nns && nsid < 0xFFFFFFFEu; id++)
            put(page, 4 * k++, &id, 4);
    } else {
        return SC_INVALID_FIELD;
    }
    size_t n;
    if (prps(w, prp1, prp2, PAGE, &n)) return SC_DATA_TRANSFER;
    size_t done = 0;
    for (size_t i = 0; i < n; i++) {
        memcpy(w->iov[i].iov_base, page + done, w->iov[i].iov_len);
        done += w->iov[i].iov_len;
    }
    return 0;
}

static int admin(struct ctl *c, struct worker *w, const uint8_t *e, uint32_t *result) {
    uint8_t op = e[0];
    uint32_t c10, c11;
    uint64_t prp1;
    memcpy(&c10, e + 40, 4);
    memcpy(&c11, e + 44, 4);
    memcpy(&prp1, e + 24, 8);
    uint32_t qid = c10 & 0xFFFF, size = (c10 >> 16) + 1;
    if (op == 0x05 || op == 0x01) {  /* create I/O CQ, SQ */
        int cqe = op == 0x05;
        uint32_t cqid = cqe ? qid : c11 >> 16;
        struct queue *table = cqe ? c->cq : c->sq;
        if (qid < 1 || qid > MAX_QUEUES || table[qid].live) return SC_INVALID_QID;
        if (!cqe && (cqid < 1 || cqid > MAX_QUEUES || !c->cq[cqid].live)) return SC_INVALID_QID;
        if (size < 2 || size > MQES + 1) return SC_INVALID_QSIZE;
        struct worker *o = &c->workers[owner(c, cqid)];
        pthread_mutex_lock(&o->lock);
        table[qid] = (struct queue){.base = prp1, .size = size, .phase = 1,
                                    .cqid = (uint16_t)cqid, .live = 1, .gen = ++c->gens};
        set_reg(c, doorbell(qid, cqe), 0);
        pthread_mutex_unlock(&o->lock);
        return 0;
    }
    if (op == 0x00 || op == 0x04) {  /* delete I/O SQ, CQ */
        struct queue *table = op == 0x04 ? c->cq : c->sq;
        if (qid < 1 || qid > MAX_QUEUES || !table[qid].live) return SC_INVALID_QID;
        struct worker *o = &c->workers[owner(c, op == 0x04 ? qid : table[qid].cqid)];
        pthread_mutex_lock(&o->lock);
        table[qid].live = 0;
        pthread_mutex_unlock(&o->lock);
        return 0;
    }
    if (op == 0x09 && (c10 & 0xFF) == 0x07) {  /* Set Features: number of queues */
        uint32_t want = (c11 & 0xFFFF) + 1, n = (want < MAX_QUEUES ? want : MAX_QUEUES) - 1;
        *result = n | n << 16;
        return 0;
    }
    if (op == 0x06) return identify(c, w, e, c10);
    return SC_INVALID_OPCODE;
}

/* CC followed (enable, reset, shutdown: *changed set) and the admin queue served; the admin
 * commands fetched. */
static int64_t control(struct ctl *c, struct worker *w, int *changed) {
    uint32_t cc = reg(c, REG_CC), csts = reg(c, REG_CSTS);
    if ((cc & CC_EN) && !c->enabled) {
        uint32_t aqa = reg(c, REG_AQA);
        c->sq[0] = (struct queue){.base = reg64(c, REG_ASQ), .size = (aqa & 0xFFF) + 1,
                                  .phase = 1, .live = 1};
        c->cq[0] = (struct queue){.base = reg64(c, REG_ACQ), .size = (aqa >> 16 & 0xFFF) + 1,
                                  .phase = 1, .live = 1};
        c->enabled = 1;
        set_reg(c, REG_CSTS, CSTS_RDY);
        *changed = 1;
        return 0;
    }
    if (!(cc & CC_EN) && c->enabled) {  /* reset: every queue and its state goes */
        lock_all(c);
        memset(c->sq, 0, sizeof c->sq);
        memset(c->cq, 0, sizeof c->cq);
        c->enabled = 0;
        for (uint32_t off = DOORBELLS; off < BAR_BYTES; off += 4) set_reg(c, off, 0);
        set_reg(c, REG_CSTS, 0);
        unlock_all(c);
        *changed = 1;
        return 0;
    }
    if (c->enabled && (cc & CC_SHN) && !(csts & CSTS_SHST_DONE)) {  /* orderly shutdown */
        set_reg(c, REG_CSTS, csts | CSTS_SHST_DONE);
        *changed = 1;
        return 0;
    }
    if (!c->enabled || (csts & CSTS_CFS)) return 0;
    c->cq[0].head = reg(c, doorbell(0, 1));
    return serve_sq(c, w, 0);
}

static void idle_wait(int64_t *idle) {
    if (++*idle <= IDLE_SPINS) return;
    int64_t ns = (*idle - IDLE_SPINS) * 1000;
    struct timespec ts = {0, ns < IDLE_MAX_NS ? ns : IDLE_MAX_NS};
    nanosleep(&ts, NULL);
}

static void *poll_loop(void *arg) {
    struct worker *w = arg;
    struct ctl *c = w->c;
    int64_t idle = 0;
    while (!reg(c, M_STOP)) {
        int64_t start = now_ns(), fetched = 0;
        int changed = 0;
        if (w->index == 0) fetched += control(c, w, &changed);
        pthread_mutex_lock(&w->lock);
        int64_t landed = release(w);
        if (c->enabled && !(reg(c, REG_CSTS) & CSTS_CFS)) {
            for (uint32_t qid = 1; qid <= MAX_QUEUES; qid++) {
                struct queue *sq = &c->sq[qid];
                if (!sq->live || owner(c, sq->cqid) != w->index) continue;
                c->cq[sq->cqid].head = reg(c, doorbell(sq->cqid, 1));
                int64_t n = serve_sq(c, w, qid);
                if (n < 0) break;
                fetched += n;
            }
        }
        landed += ring_pass(w);
        w->posted += landed;
        pthread_mutex_unlock(&w->lock);
        if (fetched > 0 || w->posted) {  /* what a stall report reads (a dropped command:
                                          * fetched only) */
            __atomic_add_fetch((uint64_t *)(c->map + M_FETCHED), fetched, __ATOMIC_RELEASE);
            __atomic_add_fetch((uint64_t *)(c->map + M_COMPLETED), w->posted, __ATOMIC_RELEASE);
            w->posted = 0;
        }
        if (fetched > 0 || changed || landed > 0) {  /* a busy pass: its time counts */
            __atomic_add_fetch((uint64_t *)(c->map + M_BUSY_NS), (uint64_t)(now_ns() - start),
                               __ATOMIC_RELAXED);
            idle = 0;
        } else if ((w->nfree < RING_ENTRIES && w->ring.fd >= 0) || w->nheld) {
            sched_yield();  /* commands on the file or held: their completions come soon */
        } else {
            idle_wait(&idle);
        }
    }
    return NULL;
}

/* Namespace ns opened on its backing file (and mapped, for the ram backend); -errno where
 * it cannot be. */
static int64_t ns_open(struct ctl *c, struct ns *ns, const char *backing) {
    struct stat st;
    ns->writable = 1;
    ns->fd = open(backing, O_RDWR);
    if (ns->fd < 0 && (errno == EACCES || errno == EROFS || errno == EPERM)) {
        ns->fd = open(backing, O_RDONLY);  /* a read-only file (a dataset's features) */
        ns->writable = 0;
    }
    if (ns->fd < 0) return -errno;
    ns->dfd = c->backend == B_FILE ? open(backing, (ns->writable ? O_RDWR : O_RDONLY) | O_DIRECT)
                                   : -1;  /* -1 where the file system has no O_DIRECT (tmpfs) */
    fstat(ns->fd, &st);
    ns->nbytes = (uint64_t)st.st_size;
    if (S_ISBLK(st.st_mode)) {
        off_t end = lseek(ns->fd, 0, SEEK_END);
        ns->nbytes = end > 0 ? (uint64_t)end : 0;
    }
    ns->nblocks = ns->nbytes >> c->lba_shift;
    if (c->backend == B_RAM && ns->nbytes) {  /* populated: no page fault in a command's copy */
        ns->ram = mmap(NULL, ns->nbytes, PROT_READ | (ns->writable ? PROT_WRITE : 0),
                       MAP_SHARED | MAP_POPULATE, ns->fd, 0);
        if (ns->ram == MAP_FAILED) {
            ns->ram = NULL;
            return -errno;
        }
    }
    return 0;
}

static void ns_close(struct ns *ns) {
    if (ns->ram) munmap(ns->ram, ns->nbytes);
    if (ns->dfd >= 0) close(ns->dfd);
    if (ns->fd >= 0) close(ns->fd);
}

/* Serve the shared file shm_path's queues from backings[0 .. nns - 1] (namespaces 1 to
 * nns; lba_shift: their block size), each behind drives[i] where that is not NULL, with
 * nthreads pollers until the stop word is set; 0, or -errno where setting up failed. */
int64_t gnc_serve(const char *shm_path, const char *const *backings, int64_t nns,
                  int64_t lba_shift, int64_t nthreads, int64_t backend,
                  const struct gnc_fault *faults, int64_t nfaults,
                  struct gdr_drive *const *drives) {
    static struct ctl ctl;  /* one controller a process */
    struct ctl *c = &ctl;
    int64_t rc = 0;
    memset(c, 0, sizeof *c);
    if (nns < 1 || nns > MAX_NS) return -E2BIG;
    c->backend = (int)backend;
    c->lba_shift = (int)lba_shift;
    c->nthreads = nthreads < 1 ? 1 : (int)nthreads;
    c->faults = faults;
    c->nfaults = (int)nfaults;
    pthread_mutex_init(&c->fault_lock, NULL);
    int sfd = open(shm_path, O_RDWR);
    if (sfd < 0) return -errno;
    struct stat st;
    fstat(sfd, &st);
    c->map_bytes = (size_t)st.st_size;
    c->map = mmap(NULL, c->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, sfd, 0);
    close(sfd);
    if (c->map == MAP_FAILED) return -errno;
    c->dma = c->map + BAR_BYTES;
    c->dma_bytes = c->map_bytes - BAR_BYTES;
    c->ns = calloc((size_t)nns, sizeof *c->ns);
    if (!c->ns) { rc = -ENOMEM; goto unmap; }
    for (int i = 0; i < nns; i++) c->ns[i].fd = c->ns[i].dfd = -1;
    for (c->nns = 0; c->nns < nns; c->nns++) {
        struct ns *ns = &c->ns[c->nns];
        ns->drive = drives ? drives[c->nns] : NULL;
        if ((rc = ns_open(c, ns, backings[c->nns]))) goto close_ns;
    }
    c->left = calloc((size_t)(nfaults > 0 ? nfaults : 1), sizeof *c->left);
    c->workers = calloc((size_t)c->nthreads, sizeof *c->workers);
    for (int i = 0; i < c->nfaults; i++) c->left[i] = faults[i].times;
    /* CAP: MQES, CQR, TO 10 s, the NVM command set; VS 1.4 */
    uint64_t cap = MQES | 1ull << 16 | 20ull << 24 | 1ull << 37;
    set_reg(c, REG_CAP, (uint32_t)cap);
    set_reg(c, REG_CAP + 4, (uint32_t)(cap >> 32));
    set_reg(c, REG_VS, 0x00010400);
    set_reg(c, REG_CSTS, 0);
    size_t most = ((size_t)0x10000 << c->lba_shift) / PAGE + 2;
    int started = 0;
    for (; started < c->nthreads; started++) {
        struct worker *w = &c->workers[started];
        w->c = c;
        w->index = started;
        w->most = most;
        w->iov = calloc(most, sizeof *w->iov);
        w->entries = calloc(most, sizeof *w->entries);
        w->ring.fd = -1;
        if (c->backend == B_FILE && ring_setup(&w->ring) == 0) {
            w->slots = calloc(RING_ENTRIES, sizeof *w->slots);
            w->free = calloc(RING_ENTRIES, sizeof *w->free);
            for (int s = 0; w->free && s < RING_ENTRIES; s++) w->free[s] = (uint16_t)s;
            w->nfree = RING_ENTRIES;
        }
        pthread_mutex_init(&w->lock, NULL);
        if (!w->iov || !w->entries || (w->ring.fd >= 0 && (!w->slots || !w->free)) ||
            pthread_create(&w->thread, NULL, poll_loop, w)) {
            rc = -ENOMEM;
            set_reg(c, M_STOP, 1);
            break;
        }
    }
    if (!rc) set_reg(c, M_ALIVE, 1);
    for (int i = 0; i < started; i++) pthread_join(c->workers[i].thread, NULL);
    for (int i = 0; i < c->nthreads; i++) {
        struct worker *w = &c->workers[i];
        if (w->ring.fd >= 0) close(w->ring.fd);  /* waits for what is still in flight */
        free(w->iov);
        free(w->entries);
        free(w->slots);
        free(w->free);
        free(w->held);
    }
    free(c->workers);
    free(c->left);
close_ns:
    for (int i = 0; i < nns; i++) ns_close(&c->ns[i]);
    free(c->ns);
unmap:
    munmap(c->map, c->map_bytes);
    return rc;
}
