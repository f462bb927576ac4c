"""Which database URLs name a server that is not running (`trainyard.config.databases.silent_socket`)."""

from __future__ import annotations

from pathlib import Path

from trainyard.config.databases import down_message, postgres_url, silent_socket


def test_a_socket_url_with_no_socket_is_silent_until_the_server_makes_one(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / "postgres").mkdir(parents=True)
    url = postgres_url(home, "state")
    socket = silent_socket(url)
    assert socket is not None and socket.name == ".s.PGSQL.5432"
    assert "TRAINYARD_STATE_DB" in (down_message(url, "the platform state database", "TRAINYARD_STATE_DB") or "")
    socket.touch()  # what a running server leaves there
    assert silent_socket(url) is None
    assert down_message(url, "x", "Y") is None


def test_tcp_and_sqlite_urls_are_left_to_their_drivers(tmp_path: Path) -> None:
    for url in ("postgresql+psycopg2://u:p@db.example:5432/trainyard", f"sqlite:///{tmp_path}/state.db",
                "postgresql://postgres@/trainyard?host=db.example"):
        assert silent_socket(url) is None
