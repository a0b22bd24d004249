/* A stand-in kernel for tests/io/test_loop_stamps.py: io/loops.c is compiled with its
 * clock_gettime and syscall renamed to these, so a test sees each clock read and each
 * io_uring_enter in the order the loop makes them. The clock ticks once per read; an enter
 * takes the SQEs it submits and completes what it has taken (res = the SQE's length): at
 * once, or (`lazy`) only in an enter that waits, as a device slower than the loop; with
 * `lazy` 2, as a DEFER_TASKRUN ring, the SQ flags say so (IORING_SQ_TASKRUN) from the
 * submitting enter until the waiting one. After fake_passthrough, its SQEs and CQEs are a
 * passthrough ring's (128 and 32 bytes) and every completion carries the status given. */
#include <stdarg.h>
#include <stdint.h>
#include <time.h>

static volatile uint32_t *sq_head, *sq_tail, *sq_array, *sq_flags, *cq_tail;
static const uint64_t *sqes;
static uint64_t *cqes;
static uint32_t sq_mask, cq_mask;
static int64_t ticks, nlog;
static char *events;  /* 'C' a clock read, 'S' an enter that submits, 'W' one that waits */
static int64_t events_cap, lazy, taken, slots[4096];
static int64_t sqe_words, cqe_words, passthrough;  /* SQE and CQE strides; NVMe passthrough */
static int32_t status;                             /* what a passthrough CQE carries */

#define SQ_TASKRUN (1U << 2)

void fake_ring(uint32_t *sh, uint32_t *st, uint32_t *sa, uint32_t *sf, uint32_t *ct,
               const uint64_t *s, uint64_t *c, uint32_t smask, uint32_t cmask, char *log,
               int64_t cap, int64_t slow)
{
    sq_head = sh; sq_tail = st; sq_array = sa; sq_flags = sf; cq_tail = ct; sqes = s; cqes = c;
    sq_mask = smask; cq_mask = cmask; events = log; events_cap = cap; ticks = 0; nlog = 0;
    lazy = slow; taken = 0; sqe_words = 8; cqe_words = 2; passthrough = 0;
}

void fake_passthrough(int32_t res)
{
    sqe_words = 16; cqe_words = 4; passthrough = 1; status = res;
}

int64_t fake_events(void) { return nlog; }

static void note(char e) { if (nlog < events_cap) events[nlog++] = e; }

int clock_gettime(clockid_t clock, struct timespec *ts)
{
    (void)clock;
    ts->tv_sec = 0;
    ts->tv_nsec = ++ticks;
    note('C');
    return 0;
}

long syscall(long nr, ...)
{
    va_list ap;
    va_start(ap, nr);
    (void)va_arg(ap, int);
    unsigned submit = va_arg(ap, unsigned), wait = va_arg(ap, unsigned);
    va_end(ap);
    note(submit ? 'S' : 'W');
    for (unsigned i = 0; i < submit; i++)
        slots[taken++] = sq_array[(*sq_head)++ & sq_mask];
    if (lazy && !wait) {
        if (lazy == 2 && taken)
            __atomic_store_n(sq_flags, SQ_TASKRUN, __ATOMIC_RELEASE);
        return submit;
    }
    __atomic_store_n(sq_flags, 0, __ATOMIC_RELEASE);
    for (int64_t i = 0; i < taken; i++) {
        const uint64_t *sqe = sqes + sqe_words * slots[i];
        uint64_t *cqe = cqes + cqe_words * (*cq_tail & cq_mask);
        cqe[0] = sqe[4];
        cqe[1] = passthrough ? (uint32_t)status : (uint32_t)sqe[3];
        __atomic_store_n(cq_tail, *cq_tail + 1, __ATOMIC_RELEASE);
    }
    taken = 0;
    return submit;
}
