"""The tamper-evident audit trail: hash chains per topic-partition, signed checkpoints,
verification against the log, and replay with per-table digests."""
