import pytest


@pytest.fixture(autouse=True, scope="session")
def prefect_server():
    """One temporary Prefect server (own SQLite) for the flow tests, stopped while pytest still
    owns the log streams."""
    from prefect.testing.utilities import prefect_test_harness
    with prefect_test_harness(server_startup_timeout=120):
        yield
