"""Fixtures shared by every suite."""

from __future__ import annotations

from pathlib import Path

import pytest

from config.settings import Settings

POSTGRES_URL = "postgresql+psycopg2://postgres@127.0.0.1:5432/test"


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    """Embedded-default settings rooted in a fresh temporary folder."""
    return Settings(home=tmp_path / ".trainyard")


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """The test machine's PostgreSQL; skip (with the reason) where no server answers."""
    import sqlalchemy

    engine = sqlalchemy.create_engine(POSTGRES_URL)
    try:
        with engine.connect() as conn:
            conn.execute(sqlalchemy.text("select 1"))
    except Exception as e:  # noqa: BLE001 - any failure to connect means "no server here"
        pytest.skip(f"no PostgreSQL server answers at 127.0.0.1:5432 ({type(e).__name__})")
    finally:
        engine.dispose()
    return POSTGRES_URL
