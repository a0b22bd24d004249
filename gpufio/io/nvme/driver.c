/* A compiled CPU driver of one NVMe I/O queue pair, for the compiled controller's own
 * CPU-driven ceiling (run/nvme_rates.py): what a driver with no interpreter between its
 * commands gets out of the controller, as bench/nop.py measures io_uring's. It keeps depth
 * reads of bs bytes in flight at random block-aligned offsets, each into its own slot of
 * slot bytes (PRP1 only: bs is at most a page), rings the SQ doorbell once per batch
 * written and the CQ head doorbell once per batch reaped.
 */
#include <sched.h>
#include <stdint.h>
#include <string.h>

struct gnd_pair {  /* every field 64 bits (run/nvme_rates._Pair) */
    uint64_t sq, cq;           /* the entries, at this process's addresses */
    uint64_t sq_db, cq_db;     /* the doorbells, at this process's addresses */
    uint64_t entries, depth;   /* queue entries; commands in flight (< entries) */
    uint64_t slots_iova, slot_bytes, bs, lba_shift, blocks, seed, nsid;
};

static uint64_t next(uint64_t *s) {  /* splitmix64 */
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* n reads through pair p; the number that completed with status 0 (every one completes:
 * the caller's stall guard is the controller's). stop: a word that ends the loop when set. */
int64_t gnd_reads(const struct gnd_pair *p, uint64_t n, const volatile int64_t *stop) {
    uint8_t *sq = (uint8_t *)p->sq, *cq = (uint8_t *)p->cq;
    volatile uint32_t *sq_db = (volatile uint32_t *)p->sq_db, *cq_db = (volatile uint32_t *)p->cq_db;
    uint64_t seed = p->seed, sent = 0, done = 0, good = 0, spins = 0;
    uint32_t tail = 0, head = 0, phase = 1, inflight = 0;
    uint16_t free_slots[65536];
    uint32_t nfree = (uint32_t)p->depth;
    uint64_t span = p->blocks - (p->bs >> p->lba_shift) + 1;
    uint32_t nlb = (uint32_t)(p->bs >> p->lba_shift) - 1;
    for (uint32_t i = 0; i < nfree; i++) free_slots[i] = (uint16_t)i;
    while (done < n && !*stop) {
        uint32_t wrote = 0;
        while (nfree && sent < n) {
            uint16_t slot = free_slots[--nfree];
            uint8_t *e = sq + (uint64_t)tail * 64;
            uint64_t slba = next(&seed) % span, prp1 = p->slots_iova + slot * p->slot_bytes;
            memset(e, 0, 64);
            e[0] = 0x02;  /* read */
            memcpy(e + 2, &slot, 2);
            uint32_t nsid = (uint32_t)p->nsid, lo = (uint32_t)slba, hi = (uint32_t)(slba >> 32);
            memcpy(e + 4, &nsid, 4);
            memcpy(e + 24, &prp1, 8);
            memcpy(e + 40, &lo, 4);
            memcpy(e + 44, &hi, 4);
            memcpy(e + 48, &nlb, 4);
            tail = (uint32_t)((tail + 1) % p->entries);
            sent++;
            inflight++;
            wrote++;
        }
        if (wrote) __atomic_store_n(sq_db, tail, __ATOMIC_RELEASE);
        uint32_t reaped = 0;
        for (;;) {
            uint8_t *c = cq + (uint64_t)head * 16;
            uint16_t st = __atomic_load_n((uint16_t *)(c + 14), __ATOMIC_ACQUIRE);
            if ((st & 1) != phase) break;
            uint16_t cid;
            memcpy(&cid, c + 12, 2);
            free_slots[nfree++] = cid;
            good += ((st >> 1) & 0x7FF) == 0;
            if (++head == p->entries) { head = 0; phase ^= 1; }
            reaped++;
        }
        if (reaped) {
            __atomic_store_n(cq_db, head, __ATOMIC_RELEASE);
            done += reaped;
            inflight -= reaped;
            spins = 0;
        } else if (++spins > 64) {  /* the controller's threads may need this CPU */
            spins = 0;
            sched_yield();
        }
    }
    return (int64_t)good;
}
