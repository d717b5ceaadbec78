"""nodes marked production eligible before acceptance evidence existed are not eligible (V1)

Revision ID: 0010_unvalidated_not_eligible
Revises: 0009_credential_first_use
Create Date: 2026-12-01 01:40:00.000000

Until "Enrolment's production flag is a request", a claim copied the enrolment's
production_eligible onto the node, so a node could be eligible without ever being validated.
Each such node is set ineligible, with one audit row saying why, as the acceptance module's
clear_eligibility writes it (actor "system", details {"reasons": [...]}); the operator marks it
again (POST /api/v1/admin/nodes/{id}/production-eligibility) once its checklist is validated.
"""
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision = '0010_unvalidated_not_eligible'
down_revision = '0009_credential_first_use'
branch_labels = None
depends_on = None

REASONS = ["acceptance evidence introduced (V1)"]

nodes = sa.table('nodes', sa.column('id', sa.String(36)), sa.column('production_eligible', sa.Boolean()))
audit_events = sa.table(
    'audit_events',
    sa.column('at', sa.DateTime(timezone=True)),
    sa.column('actor', sa.String(100)),
    sa.column('action', sa.String(64)),
    sa.column('node_id', sa.String(36)),
    sa.column('details', sa.JSON()),
)


def upgrade():
    now = datetime.now(UTC)
    if op.get_bind().dialect.name == 'sqlite':
        now = now.replace(tzinfo=None)  # SQLite keeps naive UTC (app.timeutil.UTCDateTime)
    eligible = nodes.c.production_eligible == sa.true()
    # The audit rows first, from the same condition the UPDATE then clears (app/nodes/liveness.py's pattern).
    events = sa.select(
        sa.literal(now, sa.DateTime(timezone=True)),
        sa.literal('system'),
        sa.literal('node.production_eligibility_cleared'),
        nodes.c.id,
        sa.literal({'reasons': REASONS}, sa.JSON()),
    ).where(eligible)
    op.execute(audit_events.insert().from_select(['at', 'actor', 'action', 'node_id', 'details'], events))
    op.execute(nodes.update().where(eligible).values(production_eligible=False))


def downgrade():
    # Which nodes were eligible is in the audit trail; the flag is not set back without validation.
    pass
