/* A compiled CPU driver of NVMe I/O queue pairs, for the compiled controller's own
 * CPU-driven ceiling (run/nvme_rates.py): what a driver with no interpreter between its
 * commands gets out of the controller, as bench/nop.py measures io_uring's. One thread
 * drives its pairs in turn, keeping depth reads of bs bytes in flight on each at random
 * block-aligned offsets, each into its own slot (PRP1 only: bs is at most a page); it rings
 * an SQ doorbell once per batch written and a CQ head doorbell once per batch reaped.
 */
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "nvme_cmd.cuh"  /* the one encoder of the command (gpufio/kernels) */

struct gnd_pair {  /* every field 64 bits (io/nvme/compiled._Pair) */
    uint64_t sq, cq;           /* the entries, at this process's addresses */
    uint64_t sq_db, cq_db;     /* the doorbells, at this process's addresses */
    uint64_t entries, depth;   /* queue entries; commands in flight (< entries) */
    uint64_t slots_iova, slot_bytes, bs, lba_shift, blocks, seed, nsid;
};

struct state {  /* a pair's side of the driver */
    uint64_t seed, sent, done, good;
    uint32_t tail, head, phase, nfree;
    uint16_t *free_slots;
};

static uint64_t next(uint64_t *s) {  /* splitmix64 */
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Fill p's free slots with reads (up to n sent) and take its completions; how many it
 * reaped. */
static uint32_t pass(const struct gnd_pair *p, struct state *s, uint64_t n) {
    uint8_t *sq = (uint8_t *)p->sq, *cq = (uint8_t *)p->cq;
    uint64_t span = p->blocks - (p->bs >> p->lba_shift) + 1;
    uint32_t nsid = (uint32_t)p->nsid, wrote = 0;
    while (s->nfree && s->sent < n) {
        uint16_t slot = s->free_slots[--s->nfree];
        u64 *e = (u64 *)(sq + (uint64_t)s->tail * NQ_SQE_BYTES);
        uint64_t slba = next(&s->seed) % span, prp1 = p->slots_iova + slot * p->slot_bytes;
        nvme_cmd(e, false, false, slot, nsid, (unsigned)p->lba_shift, slba << p->lba_shift,
                 (unsigned)p->bs, prp1, 0);
        s->tail = (uint32_t)((s->tail + 1) % p->entries);
        s->sent++;
        wrote++;
    }
    if (wrote) __atomic_store_n((uint32_t *)p->sq_db, s->tail, __ATOMIC_RELEASE);
    uint32_t reaped = 0;
    for (;;) {
        uint8_t *c = cq + (uint64_t)s->head * NQ_CQE_BYTES;
        uint16_t st = __atomic_load_n((uint16_t *)(c + NQ_CQ_OFF_STATUS), __ATOMIC_ACQUIRE), cid;
        if ((st & 1) != s->phase) break;
        memcpy(&cid, c + NQ_CQ_OFF_CID, 2);
        s->free_slots[s->nfree++] = cid;
        s->good += nvme_cqe_result(st, 1) == 1;
        if (++s->head == p->entries) { s->head = 0; s->phase ^= 1; }
        reaped++;
    }
    if (reaped) {
        __atomic_store_n((uint32_t *)p->cq_db, s->head, __ATOMIC_RELEASE);
        s->done += reaped;
    }
    return reaped;
}

/* n reads through each of the npairs pairs at p; the number that completed with status 0
 * (or -1: no memory). stop: a word that ends the loop when set (the caller's stall guard). */
int64_t gnd_reads(const struct gnd_pair *p, int64_t npairs, uint64_t n,
                  const volatile int64_t *stop) {
    struct state *st = calloc((size_t)npairs, sizeof *st);
    int64_t good = 0, left = npairs, spins = 0;
    if (!st) return -1;
    for (int64_t i = 0; i < npairs; i++) {
        st[i] = (struct state){.seed = p[i].seed, .phase = 1, .nfree = (uint32_t)p[i].depth};
        st[i].free_slots = malloc(p[i].depth * sizeof *st[i].free_slots);
        if (!st[i].free_slots) { left = -1; break; }
        for (uint32_t k = 0; k < st[i].nfree; k++) st[i].free_slots[k] = (uint16_t)k;
    }
    while (left > 0 && !*stop) {
        uint32_t reaped = 0;
        left = 0;
        for (int64_t i = 0; i < npairs; i++) {
            if (st[i].done >= n) continue;
            reaped += pass(&p[i], &st[i], n);
            left += st[i].done < n;
        }
        if (reaped) {
            spins = 0;
        } else if (++spins > 64) {  /* the controller's threads may need this CPU */
            spins = 0;
            sched_yield();
        }
    }
    for (int64_t i = 0; i < npairs; i++) {
        good += (int64_t)st[i].good;
        free(st[i].free_slots);
    }
    free(st);
    return left < 0 ? -1 : good;
}
