"""The test clusters' start retries on new ports whenever Ray says a chosen port was taken, however it says it."""
from local_cluster import port_taken


def test_a_dashboard_port_taken_by_another_process_is_read_as_a_taken_port_and_retried():
    dashboard = ("Exception: Failed to find a valid port for dashboard after 0 retries: [Errno 98] error while "
                 "attempting to bind on address ('127.0.0.1', 44227): address already in use")
    assert port_taken(dashboard)
    assert port_taken("The GCS server is trying to use a port number 6379 that is already in use")
    assert port_taken("bind: Address already in use")


def test_a_start_that_failed_for_another_reason_is_not_retried():
    assert not port_taken("ModuleNotFoundError: No module named 'alignlab'")
