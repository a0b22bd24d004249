"""A job in flight, above the engines: jobrun (its workers, samples, hang watch), launch
(threads, forked and spawned worker processes), opening (its targets), the block loops over
an engine's channel, records (what it hands up); MPI ranks (world), placement and doctor.
The block workload (workloads/block) drives them."""
