"""Adasum (``op=hvd.Adasum``) under kolorun: one launch per rank count, each running every
check of tests/workers/adasum_worker.py (dtypes, sizes, fused batches, process sets, the
optimizer, training), and a 3-rank job where every Adasum call is refused on every rank."""

import pytest

from conftest import output_tail, run_kolorun, worker


@pytest.mark.parametrize("ranks", [2, 4, 8, 3])
def test_adasum_matches_the_reference_or_is_refused_on_every_rank(ranks: int) -> None:
    proc = run_kolorun(["-np", str(ranks), "python", worker("adasum_worker.py")], timeout=240)
    assert proc.returncode == 0, output_tail(proc)
    for r in range(ranks):
        assert f"OK rank {r}" in proc.stdout, output_tail(proc)
