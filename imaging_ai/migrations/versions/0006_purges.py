"""purges: retention's audit of deleted instance files; instances know their node and purge

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-08 10:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "purges",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("study_id", sa.Integer(), nullable=False),
        sa.Column("node", sa.String(length=100), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("cutoff", sa.DateTime(timezone=True), nullable=False),
        sa.Column("reason", sa.String(length=200), nullable=False),
        sa.Column("files", sa.Integer(), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(["study_id"], ["studies.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(op.f("ix_purges_study_id"), "purges", ["study_id"])
    op.create_index(op.f("ix_purges_started_at"), "purges", ["started_at"])
    with op.batch_alter_table("instances", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("node", sa.String(length=100), nullable=False, server_default="")
        )
        batch_op.add_column(sa.Column("purge_id", sa.Integer(), nullable=True))
        batch_op.create_index(batch_op.f("ix_instances_purge_id"), ["purge_id"])
        batch_op.create_foreign_key("fk_instances_purge_id", "purges", ["purge_id"], ["id"])


def downgrade() -> None:
    with op.batch_alter_table("instances", schema=None) as batch_op:
        batch_op.drop_constraint("fk_instances_purge_id", type_="foreignkey")
        batch_op.drop_index(batch_op.f("ix_instances_purge_id"))
        batch_op.drop_column("purge_id")
        batch_op.drop_column("node")
    op.drop_index(op.f("ix_purges_started_at"), table_name="purges")
    op.drop_index(op.f("ix_purges_study_id"), table_name="purges")
    op.drop_table("purges")
