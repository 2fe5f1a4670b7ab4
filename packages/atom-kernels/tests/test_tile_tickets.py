import pytest
import torch

from atom_kernels.tile_tickets import MAX_TICKET_TILES, tile_counters

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def test_ticket_counters_are_per_stream_and_bounded():
    """One zeroed set per device and stream (launches on one stream never overlap), sized once; a launch
    of more tiles than it holds is refused by name. The tickets themselves are tested through their users
    (test_linear.py's split-K cases)."""
    device = torch.device(DEVICE)
    assert tile_counters(device, 8) is tile_counters(device, MAX_TICKET_TILES)
    with pytest.raises(
        ValueError, match=f"at most {MAX_TICKET_TILES} output tiles, got {MAX_TICKET_TILES + 1}"
    ):
        tile_counters(device, MAX_TICKET_TILES + 1)
    if DEVICE == "cuda":
        with torch.cuda.stream(torch.cuda.Stream()):
            other = tile_counters(device, 8)
        assert other is not tile_counters(device, 8)
