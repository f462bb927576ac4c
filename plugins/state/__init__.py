"""The platform's SQL state, in one home (DESIGN §2): one database, opened one way.

- `db.py`            the engine (SQLite pragmas, PostgreSQL pool), `SqlStore` (the one store
                     constructor: sessions, tables on first open, retried writes), the UTC column
                     and which database errors are worth retrying;
- `reservations.py`  placement's allocations: reserve (all or nothing), lease, renew, release;
- `jobs.py`          each training run's lifecycle, its attempts, and node cordons.

Engines that decide (placement's search, recovery's classify and decide) stay pure and are handed
what these stores hold; the attempt engine, the CLI and the operators read and write them.
No Airflow imports here.
"""
