"""deployments.served: what the control plane saw of a deployment's requests (S2, S6, issue 23)

Revision ID: 0016_deployment_served
Revises: 0015_deployments
Create Date: 2026-12-02 13:30:00.000000

{"requests", "generated_tokens", "time_to_first_token_seconds", "tokens_per_second"}: counts since
the deployment was created, and the figures of its last answered request. Kept apart from
`measured`, which is what the node reported and which each report replaces.
"""
from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision = '0016_deployment_served'
down_revision = '0015_deployments'
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table('deployments') as batch:
        batch.add_column(sa.Column('served', sa.JSON(), nullable=True))


def downgrade():
    with op.batch_alter_table('deployments') as batch:
        batch.drop_column('served')
