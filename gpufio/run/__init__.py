"""The block workload's driver, above the engines: runner (phases, samples, results) and
launch (threads, forked and spawned worker processes)."""
