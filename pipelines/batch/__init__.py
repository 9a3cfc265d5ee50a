"""Offline batch and summarization jobs: submission and validation of input files, the
dispatcher that splits a batch into chunks and queues them for the Celery batch pool,
reconciliation of finished chunks, and the final output files."""
