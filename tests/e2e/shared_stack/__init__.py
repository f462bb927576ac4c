"""End-to-end tests that share one embedded stack (see `conftest.py`)."""
