"""session_revocations: admin sessions signed out early, shared by every node and restart

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-06 12:20:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "session_revocations",
        sa.Column("sid", sa.String(length=64), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("sid"),
    )
    op.create_index(
        op.f("ix_session_revocations_expires_at"), "session_revocations", ["expires_at"]
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_session_revocations_expires_at"), table_name="session_revocations")
    op.drop_table("session_revocations")
