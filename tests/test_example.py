"""kolorun runs examples/torch_digits.py (the training example without Spark) on 2 ranks."""

from __future__ import annotations

import re

from conftest import output_tail, run_kolorun


def parse_run(stdout: str) -> tuple[float, set[str], list[str]]:
    accuracy = float(re.search(r"\[0\]<stdout>:test accuracy: ([\d.]+)", stdout).group(1))
    checksums = set(re.findall(r"<stdout>:rank \d+: parameter checksum (\w+)", stdout))
    placements = re.findall(r"<stdout>:(rank \d+ of \d+: local_rank .*)", stdout)
    return accuracy, checksums, placements


def test_torch_digits_trains_to_90_percent_with_identical_weights() -> None:
    result = run_kolorun(["-np", "2", "python", "examples/torch_digits.py"], timeout=300)
    assert result.returncode == 0, output_tail(result)
    accuracy, checksums, placements = parse_run(result.stdout)
    assert accuracy >= 0.90, result.stdout[-2000:]
    assert len(checksums) == 1, f"ranks ended with different weights: {checksums}"
    assert "[0]<stdout>:weights identical on all 2 ranks: True" in result.stdout
    assert any(p.startswith("rank 0 of 2: local_rank 0, cross_rank 0/1") for p in placements)
    assert any(p.startswith("rank 1 of 2: local_rank 1, cross_rank 0/1") for p in placements)
