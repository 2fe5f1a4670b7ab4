import pytest
import torch

from tools.testing_fixtures import _lacks


@pytest.mark.parametrize(
    "machine, marker, lacks",
    [
        ((False, 0, (0, 0), None), pytest.mark.gpu(), True),
        ((True, 1, (9, 0), None), pytest.mark.gpu(), False),
        ((True, 1, (9, 0), None), pytest.mark.sm90(), False),
        ((True, 1, (8, 9), None), pytest.mark.sm90(), True),
        ((True, 1, (10, 0), None), pytest.mark.sm90(), True),
        ((True, 1, (9, 4), "6.4"), pytest.mark.sm90(), True),  # ROCm
        ((True, 1, (8, 9), None), pytest.mark.gpu(min_capability=(9, 0)), True),
        ((True, 1, (9, 0), None), pytest.mark.gpu(min_capability=(8, 9), nvidia=True), False),
        ((True, 1, (9, 4), "6.4"), pytest.mark.gpu(min_capability=(8, 9), nvidia=True), True),
        ((True, 1, (9, 0), None), pytest.mark.multi_gpu(), True),
        ((True, 2, (9, 0), None), pytest.mark.multi_gpu(), False),
        ((True, 2, (9, 0), None), pytest.mark.multi_gpu(count=4), True),
    ],
)
def test_a_gpu_marker_skips_where_the_machine_lacks_what_it_names(monkeypatch, machine, marker, lacks):
    available, count, capability, hip = machine
    monkeypatch.setattr(torch.cuda, "is_available", lambda: available)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: capability)
    monkeypatch.setattr(torch.version, "hip", hip)
    assert _lacks(marker.name, marker.mark) is lacks
