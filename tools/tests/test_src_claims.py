from pathlib import Path

import pytest

from tools.check_src_claims import claims


def test_the_real_sources_name_no_device_and_quote_no_timing():
    assert claims() == []


@pytest.mark.parametrize(
    "line, flagged",
    [
        ("# on the H200 this tile won", True),
        ("# 4.4 us at one row", True),
        ("# 751 TFLOP/s against 550", True),
        ("# ROCm MI300X", True),
        ("# copy at 3.2 TB/s", True),
        ("# sm_90 and gfx942 only (results/h200/sweep_decode_plan.jsonl#decode_plan_h200)", False),
        ('raise ValueError(f"did not compile within {timeout:g} s")', False),
        ("BLOCK_M = 64  # rows a program", False),
    ],
)
def test_a_planted_claim_is_found_and_names_are_not(tmp_path: Path, line: str, flagged: bool):
    src = tmp_path / "packages" / "pkg" / "src" / "pkg"
    src.mkdir(parents=True)
    (src / "mod.py").write_text(f'"""A module."""\n\n{line}\n')
    assert claims(tmp_path) == ([f"packages/pkg/src/pkg/mod.py:3: {line}"] if flagged else [])
