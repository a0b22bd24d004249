/* The per-I/O loops of the CPU-driven paths, compiled (gpufio/io/loops.py builds and binds
 * this file with native/build.py). Python hands a loop a batch of (target, offset) pairs from
 * the job's offset stream and gets back one (latency, target, result, direction) row per
 * completed I/O: the stream, the checks and the recording stay in Python, and no Python runs
 * between an I/O's taking and its reaping, so a latency is what fio's `lat` is: from the
 * moment the I/O is taken and prepared into its slot (fio's start_time, before the call that
 * submits it) to just after the call that reaped it.
 *
 * Three loops share one state struct: a null loop (each I/O completes as it is issued),
 * pread/pwrite one at a time, and io_uring with `depth` I/Os in flight. The io_uring loop
 * also drives a passthrough ring (SQE128|CQE32, `nvme` set: NVMe passthrough, as fio's
 * io_uring_cmd engine): each SQE is then the NVMe command nvme_cmd.cuh's nvme_uring_sqe
 * builds, and each completion's status goes through its decoder. A loop returns when
 * its batch is all issued (io_uring: submitted, the I/Os in flight stay in flight), when its
 * deadline passes, or, once the job's stop word is set, when nothing is in flight any more.
 * A call that begins in ramp_time also returns once the job's measuring word is set, I/Os
 * still in flight, so that its completions are all the ramp's and the next call's all the
 * measured window's (a batch of 4096 at a slow rate spans tens of ms, which would otherwise
 * all count). The call reports whether it began in the ramp (GF_RAMP), and the caller
 * counts by that: one reading of the word, the loop's.
 *
 * A rate-capped job (rate_iops) hands each I/O's due time with it (`due`, ns on
 * CLOCK_MONOTONIC, which is Python's monotonic_ns; NULL: no cap): no I/O is issued before
 * its due time. While none is due the io_uring loop reaps what is in flight, its wait ending
 * at the next due time; a loop sleeps only with nothing in flight, as the Python loops. */
#define _GNU_SOURCE
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>

#include "nvme_cmd.cuh"  /* the one NVMe command encoder (gpufio/kernels), layout as -D */

#ifndef __NR_io_uring_enter
#define __NR_io_uring_enter 426
#endif

#define ENTER_GETEVENTS (1U << 0)
#define ENTER_SQ_WAKEUP (1U << 1)
#define ENTER_EXT_ARG (1U << 3)
#define SQ_NEED_WAKEUP (1U << 0)
#define SQ_TASKRUN (1U << 2)
/* the longest sleep for a due time before the stop word is looked at again (core/rate.py's) */
#define NAP_NS 20000000LL
/* a wait's look for a completion (spin_for_completion): the misses in a row that cost
 * nothing more, and after them at most one look in 2^SPIN_SKIP_SHIFT_MAX waits */
#define SPIN_FREE_MISSES 3
#define SPIN_SKIP_SHIFT_MAX 6

/* what a call reports beside its completions (struct gf_loop.status) */
#define GF_TIMED_OUT 1 /* a timed wait (after the stop) saw no completion */
#define GF_STOPPED 2   /* the job's stop was seen: nothing more is issued */
#define GF_RAMP 4      /* the call began in ramp_time: its completions are the ramp's */

void gpufio_fill(uint64_t *out, size_t stride, size_t n, size_t words,
                 const uint64_t *offsets, const uint64_t *seeds, uint64_t magic);

/* Every field is 64 bits wide, in the order of loops.py's ctypes Structure. */
struct gf_loop {
    /* set once by the caller */
    int64_t depth;                  /* slots (I/Os in flight at most) */
    int64_t bs;
    volatile int64_t *stop;         /* the job's control words: [0] stop (nonzero: issue
                                     * nothing more), [1] measuring (nonzero: ramp over) */
    const int64_t *fds;             /* per target: descriptor (or registered index) */
    uint8_t *bufs;                  /* depth slots of bs bytes */
    const uint64_t *seeds;          /* per target: the pattern seed a write writes */
    uint64_t magic;
    int64_t halt_on_error;          /* a failed or short I/O stops issuing */
    int64_t nop;                    /* NOPs: a result of 0 is a whole block */
    int64_t ring_fd;
    volatile uint32_t *sq_head, *sq_tail, *sq_array, *sq_flags, *cq_head, *cq_tail;
    uint64_t *sqes;                 /* 8 words per SQE, row s belongs to slot s */
    const uint64_t *cqes;           /* 2 words per CQE */
    int64_t sq_entries, cq_mask;
    int64_t sqpoll;
    uint64_t word0[2];              /* first SQE word without its descriptor: read, write */
    uint64_t stop_ud;               /* user_data of the stop poll's completion */
    int64_t wait_ns;                /* a wait's limit once the stop was seen (0: none) */
    int64_t batch_submit;           /* I/Os one io_uring_enter submits at most (0: all free) */
    int64_t spin_ns;                /* before a wait, look this long for a completion */
    int64_t nvme;                   /* nonzero: a passthrough ring (SQE128|CQE32) */
    const uint64_t *nsids, *lba_shifts;  /* nvme: per target, its namespace, log2 LBA */
    uint64_t sqe_flags;             /* nvme: every SQE's flags (e.g. a fixed file) */
    uint64_t cmd_flags;             /* nvme: uring_cmd_flags (IORING_URING_CMD_FIXED: bufs
                                     * lie in registered buffer 0) */
    /* state kept across calls */
    int64_t sq_tail_local, cq_head_local;
    int64_t inflight, nfree, status, unsubmitted;  /* taken, not reaped; free slots; ...;
                                                    * taken, in the SQ, not yet submitted */
    int64_t spin_skip, spin_misses;  /* waits that sleep at once; looks in a row that missed */
    int64_t slat_sum, slat_n;       /* fio's slat: ns from stamp to submitting call, I/Os */
    int64_t unsubmitted_stamps;     /* the sum of the unsubmitted I/Os' stamps */
    int64_t *free_slots;            /* depth */
    int64_t *t_issue;               /* depth: when each slot's I/O was taken */
    int64_t *slot_tgt;              /* depth */
    int64_t *slot_write;            /* depth */
};

struct gf_out {
    int64_t *lat;
    int32_t *tgt;
    int32_t *res;
    uint8_t *write;
};

struct timespec_k { int64_t tv_sec, tv_nsec; };
struct getevents_arg { uint64_t sigmask; uint32_t sigmask_sz, min_wait_usec; uint64_t ts; };

static inline int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);  /* Python's perf_counter_ns */
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Sleep until `due` (nothing is in flight), at most until the deadline and NAP_NS; returns
 * nonzero once the deadline has passed, for the caller to hand its completions back. */
static int pause_until(int64_t due, int64_t deadline)
{
    int64_t now = now_ns(), until = due < deadline ? due : deadline;
    if (until > now + NAP_NS)
        until = now + NAP_NS;
    if (until > now) {
        struct timespec ts = { (time_t)(until / 1000000000LL), (long)(until % 1000000000LL) };
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
            ;
        now = now_ns();
    }
    return now > deadline;
}

static inline int stopping(const struct gf_loop *L)
{
    return (L->status & GF_STOPPED) || L->stop[0];
}

/* Whether the call begins in ramp_time, noted in the status for the caller. */
static inline int ramp_begins(struct gf_loop *L)
{
    const int ramp = !L->stop[1];
    L->status = ramp ? L->status | GF_RAMP : L->status & ~GF_RAMP;
    return ramp;
}

/* Whether this call, begun in ramp_time (`ramp`), must return: the measured window began. */
static inline int ramp_ended(const struct gf_loop *L, int ramp)
{
    return ramp && L->stop[1];
}

static inline void fill_slot(struct gf_loop *L, int64_t slot, int64_t tgt, uint64_t off)
{
    gpufio_fill((uint64_t *)(L->bufs + slot * L->bs), 0, 1, (size_t)L->bs / 8, &off,
                &L->seeds[tgt], L->magic);
}

static inline void record(struct gf_out *o, int64_t k, int64_t lat, int64_t tgt, int32_t res,
                          int64_t write)
{
    o->lat[k] = lat;
    o->tgt[k] = (int32_t)tgt;
    o->res[k] = res;
    o->write[k] = (uint8_t)write;
}

static inline void note_result(struct gf_loop *L, int32_t res)
{
    if (L->halt_on_error && res != L->bs)
        L->status |= GF_STOPPED;
}

/* The null loop: every I/O completes when it is handed out; its latency is the two clock
 * reads around nothing, as fio's null engine's. The deadline ends only a capped call's sleep. */
int64_t gf_null(struct gf_loop *L, const int32_t *tgt, const uint64_t *offs,
                const uint8_t *writes, const int64_t *due, int64_t n, int64_t deadline,
                struct gf_out *o, int64_t *consumed)
{
    int64_t i = 0;
    const int ramp = ramp_begins(L);
    (void)offs;
    while (i < n && !L->stop[0] && !ramp_ended(L, ramp)) {
        if (due && due[i] > now_ns()) {
            if (pause_until(due[i], deadline))
                break;
            continue;  /* look at the stop and the clock again */
        }
        const int64_t t0 = now_ns();
        record(o, i, now_ns() - t0, tgt[i], (int32_t)L->bs,
               writes ? writes[i] : L->slot_write[0]);
        i++;
    }
    *consumed = i;
    return i;
}

/* pread or pwrite (`writes`, or else slot 0's direction), one at a time, from slot 0;
 * stops at the deadline or at the stop. */
int64_t gf_psync(struct gf_loop *L, const int32_t *tgt, const uint64_t *offs,
                 const uint8_t *writes, const int64_t *due, int64_t n, int64_t deadline,
                 struct gf_out *o, int64_t *consumed)
{
    int64_t i = 0;
    const int ramp = ramp_begins(L);
    while (i < n && !stopping(L) && !ramp_ended(L, ramp)) {
        if (due && due[i] > now_ns()) {
            if (pause_until(due[i], deadline))
                break;
            continue;
        }
        const int64_t t = tgt[i], w = writes ? writes[i] : L->slot_write[0];
        const int fd = (int)L->fds[t];
        if (w)
            fill_slot(L, 0, t, offs[i]);
        const int64_t t0 = now_ns();
        ssize_t r = w ? pwrite(fd, L->bufs, (size_t)L->bs, (off_t)offs[i])
                      : pread(fd, L->bufs, (size_t)L->bs, (off_t)offs[i]);
        const int64_t t1 = now_ns();
        const int32_t res = r < 0 ? -errno : (int32_t)r;
        record(o, i, t1 - t0, t, res, w);
        note_result(L, res);
        i++;
        if (t1 > deadline)
            break;
    }
    *consumed = i;
    return i;
}

/* `nsub` of the unsubmitted I/Os (the oldest: the kernel takes SQEs in order) went in at
 * `t_sub` (fio's issue_time: just after the call that submitted them returned, or, for a
 * call that also waits, just before it): in a call of the measured window (`counted`), the
 * time each spent from its stamp to then adds to fio's slat. */
static void submitted(struct gf_loop *L, int64_t nsub, int64_t t_sub, int counted)
{
    int64_t stamps = L->unsubmitted_stamps;  /* all of them: no look at each one */
    if (nsub < L->unsubmitted) {
        const uint32_t mask = (uint32_t)(L->sq_entries - 1);
        uint32_t x = (uint32_t)(L->sq_tail_local - L->unsubmitted);
        stamps = 0;
        for (int64_t j = 0; j < nsub; j++, x++)
            stamps += L->t_issue[L->sq_array[x & mask]];
    }
    if (counted) {
        L->slat_sum += nsub * t_sub - stamps;
        L->slat_n += nsub;
    }
    L->unsubmitted -= nsub;
    L->unsubmitted_stamps -= stamps;
}

/* Submit the oldest unsubmitted I/Os (batch_submit of them at most) and, with `wait`,
 * wait for a completion: after the stop (or with no stop poll) at most wait_ns, which marks
 * the call GF_TIMED_OUT when it passes; and at most `until_due` ns (> 0: a capped I/O falls
 * due then), which marks nothing. Returns how many of them the kernel took (with SQPOLL:
 * every one published), for the caller's `submitted`; negative: -errno. */
static int64_t enter(struct gf_loop *L, int64_t wait, int64_t until_due)
{
    unsigned flags = wait ? ENTER_GETEVENTS : 0;
    /* with SQPOLL the poll thread takes every SQE published, and the call submits none */
    const int64_t published = L->unsubmitted;
    int64_t submit = L->sqpoll ? 0 : L->unsubmitted, limit = 0, watchdog = 0;
    struct timespec_k ts = { 0, 0 };
    struct getevents_arg arg = { 0, 0, 0, (uint64_t)(uintptr_t)&ts };
    void *argp = NULL;
    size_t argsz = 0;
    if (L->batch_submit && submit > L->batch_submit)
        submit = L->batch_submit;
    if (L->sqpoll) {
        if (*L->sq_flags & SQ_NEED_WAKEUP)
            flags |= ENTER_SQ_WAKEUP;  /* a sleeping poll thread is woken */
        if (!flags)
            return published;
    } else if (!submit && !wait) {
        return 0;
    } else {
        flags |= ENTER_GETEVENTS;  /* runs deferred completions (DEFER_TASKRUN) too */
    }
    if (wait && L->wait_ns && (L->status & GF_STOPPED || L->stop_ud == 0)) {
        /* after the stop (or with no stop poll to wake a wait) a wait gives up after
         * wait_ns, so that the caller's watchdog sees a device that stopped completing */
        limit = L->wait_ns;
        watchdog = 1;
    }
    if (wait && until_due > 0 && (!limit || until_due < limit)) {
        limit = until_due;  /* a capped I/O is due first: the wait ends for it */
        watchdog = 0;
    }
    if (limit) {
        ts.tv_sec = limit / 1000000000LL;
        ts.tv_nsec = limit % 1000000000LL;
        flags |= ENTER_EXT_ARG;
        argp = &arg;
        argsz = sizeof(arg);
    }
    for (;;) {
        long rc = syscall(__NR_io_uring_enter, (int)L->ring_fd, (unsigned)submit,
                          (unsigned)(wait ? 1 : 0), flags, argp, argsz);
        if (rc >= 0)  /* the SQEs it took (a call that submitted returns no error) */
            return L->sqpoll ? published : (rc < submit ? rc : submit);
        if (errno == ETIME) {
            if (watchdog)
                L->status |= GF_TIMED_OUT;
            return L->sqpoll ? published : 0;
        }
        if (errno != EINTR)
            return -errno;
    }
}

/* Before a wait, look for up to spin_ns for a completion the kernel holds for this thread
 * (IORING_SQ_TASKRUN: deferred or cooperative task work) or has posted: the wait that
 * follows then finds it and returns without sleeping. A thread that sleeps for every
 * completion pays a wake-up per I/O, where one that arrives a moment later pays none.
 * After SPIN_FREE_MISSES looks in a row that found nothing, each further one doubles the
 * waits that sleep at once before the next look (up to 2^SPIN_SKIP_SHIFT_MAX - 1): a
 * device slower than spin_ns costs a look in 64 waits, while one whose completions mostly
 * come in time, with an occasional late one, keeps looking. */
static void spin_for_completion(struct gf_loop *L)
{
    if (!L->spin_ns)
        return;
    if (L->spin_skip > 0) {
        L->spin_skip--;
        return;
    }
    const int64_t until = now_ns() + L->spin_ns;
    do {
        if (__atomic_load_n(L->sq_flags, __ATOMIC_ACQUIRE) & SQ_TASKRUN
            || __atomic_load_n(L->cq_tail, __ATOMIC_ACQUIRE) != (uint32_t)L->cq_head_local) {
            L->spin_misses = 0;
            return;
        }
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();  /* a spinning hyperthread leaves its sibling the core */
#endif
    } while (now_ns() < until);
    if (L->spin_misses < SPIN_FREE_MISSES + SPIN_SKIP_SHIFT_MAX)
        L->spin_misses++;
    if (L->spin_misses > SPIN_FREE_MISSES)
        L->spin_skip = (1LL << (L->spin_misses - SPIN_FREE_MISSES)) - 1;
}

/* Reap every CQE there is, each stamped `now`. */
static int64_t reap(struct gf_loop *L, int64_t now, struct gf_out *o, int64_t k)
{
    uint32_t head = (uint32_t)L->cq_head_local;
    const uint32_t tail = __atomic_load_n(L->cq_tail, __ATOMIC_ACQUIRE);
    const uint32_t words = L->nvme ? 4 : 2;  /* a CQE32's, a CQE's */
    while (head != tail) {
        const uint64_t *cqe = L->cqes + words * (head & (uint32_t)L->cq_mask);
        const uint64_t ud = cqe[0];
        int32_t res = (int32_t)(uint32_t)cqe[1];
        head++;
        if (L->stop_ud && ud == L->stop_ud) {
            L->status |= GF_STOPPED;
            continue;
        }
        if (L->nop && res == 0)
            res = (int32_t)L->bs;
        if (L->nvme)  /* 0, an NVMe status or -errno: bytes, or the status's code */
            res = nvme_uring_result(res, (unsigned)L->bs);
        record(o, k++, now - L->t_issue[ud], L->slot_tgt[ud], res, L->slot_write[ud]);
        note_result(L, res);
        L->free_slots[L->nfree++] = (int64_t)ud;
        L->inflight--;
    }
    L->cq_head_local = head;
    __atomic_store_n(L->cq_head, head, __ATOMIC_RELEASE);
    return k;
}

/* Prepare slot `slot`'s SQE for target t's I/O at `off` (write: `w`): a plain ring's row
 * holds the slot's address, length and user_data already, and takes the opcode, descriptor
 * and offset; a passthrough ring's row is built whole as the NVMe command. */
static inline void prep_sqe(struct gf_loop *L, int64_t slot, int64_t t, uint64_t off, int64_t w)
{
    if (L->nvme) {
        u64 *sqe = (u64 *)L->sqes + 16 * slot;
        nvme_uring_sqe(sqe, (unsigned)L->fds[t], (unsigned)L->sqe_flags, (unsigned)L->nsids[t],
                       (unsigned)L->lba_shifts[t], w != 0, off, (unsigned)L->bs,
                       (u64)(uintptr_t)(L->bufs + slot * L->bs), (u64)slot);
        if (L->cmd_flags)  /* the buffer registered as index 0 (IORING_URING_CMD_FIXED) */
            PT_PUT(sqe, URING_CMD_FLAGS, L->cmd_flags);
        return;
    }
    uint64_t *sqe = L->sqes + 8 * slot;
    sqe[0] = L->word0[w] | ((uint64_t)(uint32_t)L->fds[t] << 32);
    sqe[1] = off;
}

/* io_uring, `depth` I/Os in flight. Each round, every free slot takes the next I/O of the
 * batch (fio's get_io_u: prepared into its slot), all stamped at once just after, where
 * fio stamps start_time: an I/O's latency runs from there to just after the call that
 * reaped it, so no slot sits free, unstamped, while its I/O waits for a call to submit it
 * (IOPS x mean latency is the depth, as fio's). The I/Os go in oldest first, at most
 * batch_submit (fio's iodepth_batch_submit) per io_uring_enter: with it, as fio's
 * io_uring engine, calls that do not wait submit them until all are in, and only then is
 * the CQ reaped (fio reaps once its queue is full; reaping between the calls would free
 * slots faster than one I/O a call goes in, and keep I/Os waiting in the SQ); only with
 * nothing to reap does a call wait for a completion, submitting what is left (at depth 1:
 * two calls per I/O, as fio). With batch_submit 0, one call per round submits every taken
 * I/O and waits (at depth 1: one call per I/O): fewer calls, but the thread sleeps for
 * nearly every completion, and on a small VM each wake-up lands on the CPU of the io-wq
 * worker doing the reads. How long the I/Os waited from their stamp to their submitting
 * call's return (its start, for a call that also waits) is fio's slat (slat_sum / slat_n,
 * for the calls of the measured window). Once the batch is all taken the rest are
 * submitted and the call returns with them in flight; a call with n = 0 waits until nothing
 * is in flight. With `due`, an I/O is taken only once its time has come; until then the
 * call reaps (or, with nothing in flight, sleeps). Returns the completions written to `o`
 * (at most n + depth), *consumed the batch's I/Os taken; negative: -errno of a failed
 * io_uring_enter. */
int64_t gf_uring(struct gf_loop *L, const int32_t *tgt, const uint64_t *offs,
                 const uint8_t *writes, const int64_t *due, int64_t n, int64_t deadline,
                 struct gf_out *o, int64_t *consumed)
{
    const uint32_t mask = (uint32_t)(L->sq_entries - 1);
    int64_t i = 0, k = 0, rc;
    const int ramp = ramp_begins(L);
    L->status &= ~GF_TIMED_OUT;
    for (;;) {
        const int stop = stopping(L);
        const uint32_t first = (uint32_t)L->sq_tail_local;
        uint32_t tail = first;
        const int64_t round = due ? now_ns() : 0;
        int64_t next_due = 0;  /* > 0: the next I/O is not due before then */
        while (L->nfree && i < n && !stop) {
            if ((uint32_t)(tail - __atomic_load_n(L->sq_head, __ATOMIC_ACQUIRE))
                >= (uint32_t)L->sq_entries)
                break;  /* SQPOLL has not moved the SQ head past finished SQEs yet */
            if (due && due[i] > round) {
                next_due = due[i];
                break;
            }
            const int64_t slot = L->free_slots[--L->nfree], t = tgt[i];
            const int64_t w = writes ? writes[i] : L->slot_write[slot];
            if (w && L->seeds)
                fill_slot(L, slot, t, offs[i]);
            prep_sqe(L, slot, t, offs[i], w);
            L->slot_tgt[slot] = t;
            L->slot_write[slot] = w;
            L->sq_array[tail & mask] = (uint32_t)slot;
            tail++;
            i++;
        }
        const int64_t taken = (uint32_t)(tail - first);
        if (L->inflight == 0 && taken == 0) {
            if (i == n || stop)
                break;  /* the batch is done (or the job stopped) and nothing is in flight */
            if (next_due) {  /* nothing to reap: sleep until the next I/O is due */
                if (pause_until(next_due, deadline) || ramp_ended(L, ramp))
                    break;
                continue;
            }
            sched_yield();  /* SQPOLL owes us SQ slots */
            continue;
        }
        const int64_t t0 = now_ns();
        for (uint32_t x = first; x != tail; x++)  /* taken and prepared: fio's start_time */
            L->t_issue[L->sq_array[x & mask]] = t0;
        if (taken) {
            __atomic_store_n(L->sq_tail, tail, __ATOMIC_RELEASE);
            L->sq_tail_local = tail;
            L->unsubmitted += taken;
            L->unsubmitted_stamps += taken * t0;
            L->inflight += taken;
        }
        if (n > 0 && i == n && !stop) {
            /* all taken: submit the rest, reap what is done, come back for more */
            for (;;) {
                if ((rc = enter(L, 0, 0)) < 0)
                    return rc;
                const int64_t now = now_ns();
                submitted(L, rc, now, !ramp);
                if (!L->unsubmitted) {
                    k = reap(L, now, o, k);
                    break;
                }
            }
            break;
        }
        if (L->batch_submit && L->unsubmitted >= L->batch_submit && !next_due) {
            /* as fio: a call that submits and does not wait; the loop reaps only once
             * every taken I/O is in (fio reaps when its queue is full), so none waits in
             * the SQ for others' completions to be reaped first */
            if ((rc = enter(L, 0, 0)) < 0)
                return rc;
            const int64_t now = now_ns(), before = k;
            submitted(L, rc, now, !ramp);
            const int leaving = now > deadline || ramp_ended(L, ramp);
            if (!L->unsubmitted || leaving)
                k = reap(L, now, o, k);
            if (leaving)
                break;
            if (L->nfree || L->unsubmitted || k > before)
                continue;  /* take and submit again */
            /* every slot in flight and none back: wait (the call below submits nothing) */
        }
        if (t0 > deadline && i < n && !stop) {
            /* the call's time is up: submit the rest and hand back with every slot busy
             * (the slots the last reap freed were taken above); what completes meanwhile
             * waits for the next call's reap, so no slot sits free while the caller
             * records (IOPS x mean latency would fall short of the depth) */
            while (L->unsubmitted) {
                if ((rc = enter(L, 0, 0)) < 0)
                    return rc;
                submitted(L, rc, now_ns(), !ramp);
            }
            break;
        }
        if (!next_due)
            spin_for_completion(L);
        rc = enter(L, 1, next_due ? (next_due > t0 ? next_due - t0 : 1) : 0);
        if (rc < 0)
            return rc;
        submitted(L, rc, t0, !ramp);  /* a call that also waits: its start stands */
        const int64_t now = now_ns();
        k = reap(L, now, o, k);
        if (L->status & GF_TIMED_OUT || ramp_ended(L, ramp)
            || (now > deadline && (stop || i == n)))
            break;  /* (with the batch still to take, the check above leaves) */
    }
    *consumed = i;
    return k;
}
