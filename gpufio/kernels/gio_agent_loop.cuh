// The agents' one loop: a warp per ring serves the ring's request slots (gio_queue.cuh's
// protocol). Each pass gathers the READY slots 32 at a time (a ballot, a rank per lane),
// writes each one's command into the ring's submission queue, fences, publishes the batch,
// reaps completions into results and DONE slots, and backs off while the ring is quiet; the
// warp leaves when nothing is in flight and no requester runs, and writes its ring_stats.
// Both agents are this loop over a ring of their own: gio_agent.cu's io_uring rings in
// CUDA-registered host memory and nvme_agent.cu's NVMe queue pairs.
//
// A Ring derives from AgentSlots and has these __device__ __forceinline__ members, each
// called in every lane of the warp (the loop and its ordering are the same for both):
//   AgentCounts start()         where submitted / completed start (after the Ring's own
//                               loads, before the host is told the warp runs)
//   unsigned room(batch, n)     how many of n more commands fit after the pass's batch
//   void build(s, g, pos)       ring slot s's command (queue slot g), pos entries past the
//                               tail it last published
//   void publish(batch)         the new tail, once every lane's command is fenced
//   AgentReaped reap(inflight)  the completions that came: how many, how many this start's
//   void reaped(got, submitted, completed)  take got completions (after a warp barrier)
//   void unreaped(submitted)    a pass that submitted and reaped nothing
//   void end(submitted, completed)  lane 0's last words, after ring_stats
#pragma once
#include "gio_queue.cuh"

#define AGENT_IDLE_MIN_NS 64u
#define AGENT_IDLE_MAX_NS 2048u

// The ring this warp serves: agent warps are packed several to a block (RequestQueue's
// warps_per_block), as every block holds an SM's share a whole-SM kernel cannot then use.
__device__ __forceinline__ unsigned agent_ring()
{
    return blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
}

// The request slots an agent warp serves: ring r's depth slots, from queue slot first.
struct AgentSlots {
    const GioQueue* q;
    unsigned r, lane, depth;
    u64 first;
    int* state;

    __device__ __forceinline__ explicit AgentSlots(const GioQueue* queue)
        : q(queue), r(agent_ring()), lane(threadIdx.x & 31u), depth((unsigned)queue->depth),
          first((u64)r * depth), state(queue->state + first) {}
};

struct AgentCounts { u64 submitted, completed; };
struct AgentReaped { unsigned got, mine; };

// Lane 0's acquire load of a 32-bit word of host memory, in every lane.
__device__ __forceinline__ unsigned warp_acquire_sys(u64 addr)
{
    return warp_word((threadIdx.x & 31) == 0 ? ld_acquire_sys(addr) : 0u);
}

// Lane 0's reading of a control word, in every lane.
__device__ __forceinline__ int warp_control(const GioQueue* q, int word)
{
    return (int)warp_word((threadIdx.x & 31) == 0 ? (unsigned)ld_flag(&q->control[word]) : 0u);
}

// The agent warp's whole life over ring (a warp per ring; a block's warps past the last
// ring return before they construct one).
template <class Ring>
__device__ __forceinline__ void agent_loop(Ring& ring)
{
    const GioQueue* q = ring.q;
    const unsigned lane = ring.lane, depth = ring.depth;
    int* state = ring.state;
    unsigned inflight = 0, idle_ns = AGENT_IDLE_MIN_NS;
    const AgentCounts start = ring.start();
    u64 submitted = start.submitted, completed = start.completed;
    if (lane == 0) atomicAdd(&q->control[C_AGENTS], 1);  // RequestQueue.start waits for all
    while (!warp_control(q, C_ABORT)) {
        unsigned batch = 0;
        for (unsigned base = 0; base < depth; base += 32) {
            const unsigned s = base + lane;
            const bool ready = s < depth && ld_acquire_gpu(&state[s]) == READY;
            const unsigned m = __ballot_sync(FULL, ready);
            if (!m) continue;
            // the lanes ranked past the room leave their slots READY for the next pass
            const unsigned n = ring.room(batch, (unsigned)__popc(m));
            const unsigned rank = __popc(m & ((1u << lane) - 1u));
            if (ready && rank < n) {
                ring.build(s, ring.first + s, batch + rank);
                st_relaxed_gpu(&state[s], SUBMITTED);
            }
            batch += n;
        }
        if (batch) {
            __threadfence_system();  // every lane's command, before the barrier and the tail
            __syncwarp();
            ring.publish(batch);
            inflight += batch;
            submitted += batch;
        }
        const AgentReaped done = ring.reap(inflight);
        if (done.got) {
            __syncwarp();
            completed += done.mine;
            ring.reaped(done.got, submitted, completed);
            inflight -= done.mine;
            idle_ns = AGENT_IDLE_MIN_NS;
        } else if (!batch) {
            if (inflight == 0 && warp_control(q, C_REQUESTERS) == 0) break;
            // back off while the ring is quiet: every completion poll is a PCIe read of host
            // memory, which costs the other side of a busy ring
            __nanosleep(idle_ns);
            idle_ns = min(idle_ns * 2, AGENT_IDLE_MAX_NS);
        } else {
            ring.unreaped(submitted);
        }
    }
    if (lane == 0) {
        q->ring_stats[2 * ring.r] = submitted;
        q->ring_stats[2 * ring.r + 1] = completed;
        ring.end(submitted, completed);
    }
}
