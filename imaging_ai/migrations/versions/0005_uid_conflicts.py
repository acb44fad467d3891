"""uid_conflicts: instances refused because their SOP Instance UID is catalogued under another study

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-06 07:20:00.000000
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
        "uid_conflicts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("sop_instance_uid", sa.String(length=64), nullable=False),
        sa.Column("sop_class_uid", sa.String(length=64), nullable=False),
        sa.Column("study_instance_uid", sa.String(length=64), nullable=False),
        sa.Column("series_instance_uid", sa.String(length=64), nullable=False),
        sa.Column("catalogued_study_uid", sa.String(length=64), nullable=False),
        sa.Column("calling_ae", sa.String(length=16), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("uid_conflicts", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_uid_conflicts_at"), ["at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("uid_conflicts", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_uid_conflicts_at"))

    op.drop_table("uid_conflicts")
