"""Alembic environment: runs migrations on the engine that imaging-ai hands over."""

from __future__ import annotations

from alembic import context

from imaging_ai.db.models import Base

target_metadata = Base.metadata


def run_migrations_online() -> None:
    """Run the migrations inside one transaction on the given engine."""
    engine = context.config.attributes["engine"]
    with engine.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            render_as_batch=connection.dialect.name == "sqlite",
        )
        with context.begin_transaction():
            context.run_migrations()


run_migrations_online()
