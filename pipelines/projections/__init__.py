"""Read models built from the durable topics by `runner.ProjectionRunner`."""
from __future__ import annotations

from pipelines.projections.base import Projection


def all_projections(signer, *, checkpoint_every: int | None = None) -> list[Projection]:
    """Every projection of the platform, the audit trail signing with `signer`."""
    from pipelines.projections.audit_trail import AuditTrailProjection
    from pipelines.projections.admin_history import AdminHistoryProjection
    from pipelines.projections.batches import BatchesProjection
    from pipelines.projections.generations import GenerationsProjection
    from pipelines.projections.quotas import QuotasProjection

    audit = (AuditTrailProjection(signer) if checkpoint_every is None
             else AuditTrailProjection(signer, checkpoint_every=checkpoint_every))
    return [GenerationsProjection(), BatchesProjection(), QuotasProjection(), AdminHistoryProjection(), audit]
