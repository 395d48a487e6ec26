from task_state_guard import Ledger


def test_fixture_gives_a_fresh_schema(pg_url: str) -> None:
    with Ledger(pg_url) as ledger:
        assert ledger.status()["tasks"]["queued"] == 0
