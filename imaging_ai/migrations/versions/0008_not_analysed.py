"""series: why a series is not analysed ("not CT: ...", "localizer", "our own result")

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-09 10:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("series", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("not_analysed", sa.String(200), nullable=False, server_default="")
        )


def downgrade() -> None:
    # Not a batch: on SQLite that copies and drops the table, which the instances' foreign
    # key refuses while rows exist. ALTER TABLE ... DROP COLUMN (SQLite 3.35+) drops it in place.
    op.drop_column("series", "not_analysed")
