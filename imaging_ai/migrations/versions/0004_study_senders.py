"""studies: open sending associations and their release (assembly's release rule)

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30 22:20:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("studies", schema=None) as batch_op:
        batch_op.add_column(sa.Column("senders", sa.Integer(), nullable=False, server_default="0"))
        batch_op.add_column(sa.Column("released_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("studies", schema=None) as batch_op:
        batch_op.drop_column("released_at")
        batch_op.drop_column("senders")
