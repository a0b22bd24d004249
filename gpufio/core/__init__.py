"""The vocabulary every band speaks: jobs, options, units, errors, the engine-facing
context, offset streams, targets, the data pattern, statistics. Imports nothing above it."""
