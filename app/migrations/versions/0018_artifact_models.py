"""artifacts.models: what each GGUF file's header says, for the memory estimate (S3, issue 24)

Revision ID: 0018_artifact_models
Revises: 0017_node_draining
Create Date: 2026-12-02 23:40:00.000000

The acquire job reads each model file's header on the node and reports its facts (or why the header
cannot be believed); artifacts acquired before this release have none until acquired again.
"""
from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision = '0018_artifact_models'
down_revision = '0017_node_draining'
branch_labels = None
depends_on = None


def upgrade():
    op.add_column('artifacts', sa.Column('models', sa.JSON(), nullable=True))


def downgrade():
    op.execute('ALTER TABLE artifacts DROP COLUMN models')
