// A software cache of storage pages in GPU memory, in front of the request queue (BaM's
// idea): a page is one read unit (one feature row for the GNN workload), replacement is
// CLOCK with a reference bit, and a page being filled or copied is locked or pinned so it
// is never evicted under its reader. Everything lives in device memory; only GPU threads
// touch it, with device-scope atomics.
//
// Per row r:  map[r]  = 0 (not cached), MAP_FILLING (a thread is reading it in), or slot + 1.
// Per slot s: ctl[s]  = LOCKED (being evicted and refilled) | REF (used since the clock hand
//                       last passed) | number of readers copying out of it;
//             key[s]  = the row it holds, -1 for none.
// A thread that finds r absent claims it (CAS 0 -> FILLING), takes a victim slot from the
// clock (only an unpinned, unreferenced, unlocked slot: CAS 0 -> LOCKED), reads the row,
// then publishes it (key, unlock with REF, map). A reader pins (atomic add) and then checks
// LOCKED and key again, so a slot evicted between its map lookup and its pin is never read.
// Callers must never wait for a FILLING row while they themselves hold a FILLING claim:
// gio_gather finishes its claims before it looks again.
#pragma once

#define MAP_FILLING 0xffffffffu
#define CTL_LOCKED 0x80000000u
#define CTL_REF 0x40000000u
#define CTL_PINS 0x3fffffffu

enum CacheLook { LOOK_WAIT = 0, LOOK_HIT = 1, LOOK_FILL = 2 };

// Host-built descriptor (contract.GIO_CACHE's order, every field 8 bytes).
struct GioCache {
    uint4* pages;        // nslots pages of page16 16-byte words, in GPU memory
    unsigned long long nslots, page16;
    unsigned* map;       // per row
    unsigned* ctl;       // per slot
    long long* key;      // per slot
    unsigned long long* hand;  // the clock hand (a counter; slot = hand % nslots)
};

__device__ __forceinline__ unsigned cache_ld(const unsigned* p) { return *(volatile const unsigned*)p; }

// A slot nobody uses, locked for the caller, its old row unmapped. There is always one
// eventually: every thread holds at most one pin or lock, and the cache has more slots
// than threads (io/gio/cache.py checks), so at most two sweeps of the hand find one.
__device__ unsigned long long cache_victim(const GioCache* c)
{
    for (;;) {
        const unsigned long long s = atomicAdd(c->hand, 1ull) % c->nslots;
        const unsigned v = cache_ld(&c->ctl[s]);
        if (v & (CTL_LOCKED | CTL_PINS)) continue;
        if (v & CTL_REF) {
            atomicAnd(&c->ctl[s], ~CTL_REF);  // a second chance
            continue;
        }
        if (atomicCAS(&c->ctl[s], 0u, CTL_LOCKED) == 0u) {
            __threadfence();  // the key read below comes after the winning lock, not before
            const long long old = ((volatile long long*)c->key)[s];
            if (old >= 0) atomicCAS(&c->map[old], (unsigned)(s + 1), 0u);
            return s;
        }
    }
}

// Look row up. LOOK_HIT: *s is pinned and holds the row (cache_unpin when copied out).
// LOOK_FILL: the caller owns locked slot *s and must cache_publish or cache_drop it.
// LOOK_WAIT: another thread is filling the row, or a race was lost: ask again later.
__device__ int cache_lookup(const GioCache* c, long long row, unsigned long long* s)
{
    const unsigned m = cache_ld(&c->map[row]);
    if (m == 0u) {
        if (atomicCAS(&c->map[row], 0u, MAP_FILLING) != 0u) return LOOK_WAIT;
        *s = cache_victim(c);
        return LOOK_FILL;
    }
    if (m == MAP_FILLING) return LOOK_WAIT;
    const unsigned long long k = m - 1u;
    const unsigned v = atomicAdd(&c->ctl[k], 1u);
    __threadfence();
    if ((v & CTL_LOCKED) || ((volatile long long*)c->key)[k] != row) {
        atomicSub(&c->ctl[k], 1u);
        return LOOK_WAIT;
    }
    if (!(v & CTL_REF)) atomicOr(&c->ctl[k], CTL_REF);
    *s = k;
    return LOOK_HIT;
}

__device__ __forceinline__ uint4* cache_page(const GioCache* c, unsigned long long s)
{
    return c->pages + s * c->page16;
}

// The filled slot s now holds row: readers may find it. Its page must be written first.
__device__ void cache_publish(const GioCache* c, long long row, unsigned long long s)
{
    ((volatile long long*)c->key)[s] = row;
    __threadfence();
    atomicAdd(&c->ctl[s], CTL_REF - CTL_LOCKED);  // unlock, keeping transient pins
    atomicExch(&c->map[row], (unsigned)(s + 1));
}

// The read for row failed: the slot goes back empty and the row back to "not cached".
__device__ void cache_drop(const GioCache* c, long long row, unsigned long long s)
{
    ((volatile long long*)c->key)[s] = -1;
    __threadfence();
    atomicAnd(&c->ctl[s], ~CTL_LOCKED);
    atomicExch(&c->map[row], 0u);
}

__device__ __forceinline__ void cache_unpin(const GioCache* c, unsigned long long s) { atomicSub(&c->ctl[s], 1u); }
