"""A generation's way in: submission, idempotency, the request index and token counting."""
