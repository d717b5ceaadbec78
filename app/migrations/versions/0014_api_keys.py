"""client API keys for the serving API, stored as SHA-256 digests (S1, issue 23)

Revision ID: 0014_api_keys
Revises: 0013_node_credential_refused
Create Date: 2026-12-02 00:00:00.000000

A key is found by its digest on every client request, so `key_hash` is unique (its index is the
lookup); the key itself is never stored (P2).
"""
from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision = '0014_api_keys'
down_revision = '0013_node_credential_refused'
branch_labels = None
depends_on = None


def upgrade():
    op.create_table('api_keys',
    sa.Column('id', sa.String(length=36), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('key_hash', sa.String(length=64), nullable=False),
    sa.Column('prefix', sa.String(length=16), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('expires_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('last_used_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('key_hash')
    )


def downgrade():
    op.drop_table('api_keys')
