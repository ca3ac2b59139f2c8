"""Grouped allgather/reducescatter and the async alltoall/reducescatter, on 2 real ranks."""

from conftest import run_kolorun, worker


def test_grouped_and_async_ops_give_each_rank_its_result_and_a_group_fuses() -> None:
    # A 10 µs cycle and no quiet time: the engine starts a cycle as soon as anything is submitted,
    # so only a group handed over at once is one collective every time.
    proc = run_kolorun(
        ["-np", "2", "python", worker("grouped_worker.py")],
        timeout=120,
        env={"HOROVOD_CYCLE_TIME": "0.01", "KOLO_SUBMIT_QUIET_TIME": "0"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OK rank 0" in proc.stdout and "OK rank 1" in proc.stdout, proc.stdout
