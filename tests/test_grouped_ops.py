"""Grouped allgather/reducescatter and the async alltoall/reducescatter, on 2 real ranks."""

from conftest import run_kolorun, worker


def test_grouped_and_async_ops_give_each_rank_its_result() -> None:
    proc = run_kolorun(["-np", "2", "python", worker("grouped_worker.py")], timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OK rank 0" in proc.stdout and "OK rank 1" in proc.stdout, proc.stdout
