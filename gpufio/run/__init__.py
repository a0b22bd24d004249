"""A job in flight, above the loops: jobrun (its workers, samples, hang watch), launch
(threads, forked and spawned worker processes, each running its block loop from
gpufio/loops), opening (its targets), records (what it hands up) and placement. The
block workload (workloads/block, with its MPI ranks) drives them."""
