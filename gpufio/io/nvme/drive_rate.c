/* A drive's rate model, placed in front of a software controller's backend: each command is
 * admitted when fetched and may complete no earlier than the time gdr_admit returns.
 *
 * Three servers, each a token bucket of depth one kept as its next free time (virtual
 * scheduling), and a latency floor:
 *   - commands: 1 / iops per command (the drive's 4 KiB random-read rating),
 *   - media bytes: bytes / read_bw (its sequential-read rating),
 *   - link bytes: bytes / link_bw (the PCIe link's bandwidth after line encoding),
 * and a completion never earlier than admission + latency. A rate of 0 leaves that server
 * out (a figure no public source gave is not modelled). Times are kept in picoseconds and
 * every cost is rounded up, so a model is never faster than its figures.
 *
 * Several poller threads may share one drive: each server's next free time moves by a
 * compare-and-swap. A caller with a monotonic clock gets nondecreasing completion times from
 * one drive, so a poller of one drive can hold its completions in a FIFO and post the head
 * once it is due (of several drives: a heap by due time).
 */
#include <stdint.h>

struct gdr_drive {  /* every field 64 bits (io/nvme/drives.py mirrors it) */
    int64_t io_ps;        /* picoseconds per command; 0: unmodelled */
    int64_t media_fs;     /* femtoseconds per byte from the media; 0: unmodelled */
    int64_t link_fs;      /* femtoseconds per byte over the link; 0: unmodelled */
    int64_t latency_ns;   /* the floor from admission to completion; 0: unmodelled */
    int64_t next_io, next_media, next_link;  /* each server's next free time, ps */
    int64_t admitted;     /* commands admitted */
};

static int64_t ceil_div(double num, double den) {
    double q = num / den;
    int64_t i = (int64_t)q;
    return (double)i < q ? i + 1 : i;
}

/* The drive of ``iops`` commands/s, ``read_bw`` and ``link_bw`` bytes/s, and ``latency_ns``
 * (each 0 where not modelled), idle. */
void gdr_init(struct gdr_drive *d, double iops, double read_bw, double link_bw,
              int64_t latency_ns) {
    d->io_ps = iops > 0 ? ceil_div(1e12, iops) : 0;
    d->media_fs = read_bw > 0 ? ceil_div(1e15, read_bw) : 0;
    d->link_fs = link_bw > 0 ? ceil_div(1e15, link_bw) : 0;
    d->latency_ns = latency_ns > 0 ? latency_ns : 0;
    d->next_io = d->next_media = d->next_link = 0;
    d->admitted = 0;
}

/* Take ``cost`` picoseconds of the server whose next free time is *next, from ``now`` (ps)
 * on: the time this command's share of it ends. */
static int64_t take(int64_t *next, int64_t now, int64_t cost) {
    if (cost <= 0)
        return now;
    int64_t old = __atomic_load_n(next, __ATOMIC_RELAXED), end;
    do {
        end = (old > now ? old : now) + cost;
    } while (!__atomic_compare_exchange_n(next, &old, end, 1, __ATOMIC_ACQ_REL,
                                          __ATOMIC_RELAXED));
    return end;
}

/* A command of ``bytes`` fetched at ``now_ns``: the earliest time (ns, the caller's clock)
 * the model lets it complete. */
int64_t gdr_admit(struct gdr_drive *d, int64_t now_ns, int64_t bytes) {
    int64_t now = now_ns * 1000;
    int64_t due = now + d->latency_ns * 1000;
    int64_t t = take(&d->next_io, now, d->io_ps);
    if (t > due)
        due = t;
    t = take(&d->next_media, now, ceil_div((double)bytes * d->media_fs, 1000.0));
    if (t > due)
        due = t;
    t = take(&d->next_link, now, ceil_div((double)bytes * d->link_fs, 1000.0));
    if (t > due)
        due = t;
    __atomic_add_fetch(&d->admitted, 1, __ATOMIC_RELAXED);
    return (due + 999) / 1000;
}
