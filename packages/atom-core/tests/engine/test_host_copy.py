"""host_copy.row_index: rows 0..n-1 become a view, any others a device index, and rows past the end of
the tensor they index raise instead of being cut off by a slice."""

import pytest
import torch

from atom_core.host_copy import row_index


def test_leading_rows_are_a_view_and_others_an_index():
    source = torch.arange(12).view(6, 2)
    leading = row_index([0, 1, 2], "cpu", 6)
    assert leading == slice(0, 3) and source[leading].data_ptr() == source.data_ptr()
    picked = row_index([4, 1, -1], "cpu", 6)
    assert source[picked].tolist() == [[8, 9], [2, 3], [10, 11]]
    assert row_index([], "cpu", 0) == slice(0, 0)


@pytest.mark.parametrize("rows", [[0, 1, 2, 3, 4], [5, 4], [-5]])
def test_rows_past_the_end_raise_by_name(rows):
    with pytest.raises(IndexError, match="out of range for 4 rows"):
        row_index(rows, "cpu", 4)
