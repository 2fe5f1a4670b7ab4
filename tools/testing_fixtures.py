"""pytest fixtures shared by several packages' tests (registered by the root conftest.py)."""

import pytest


@pytest.fixture
def installed_as(tmp_path, monkeypatch):
    """Make importlib.metadata report another version of a distribution: a real dist-info, first on sys.path."""

    def fake(dist: str, version: str) -> None:
        info = tmp_path / f"{dist.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        monkeypatch.syspath_prepend(str(tmp_path))

    return fake


# GPU gates, as markers (`pytest -m gpu` selects what a GPU machine adds to the CPU's run). On a machine
# that lacks what the marker asks for, the test is skipped with the marker's reason.
#   @pytest.mark.gpu(reason=...): a CUDA or ROCm GPU; min_capability=(8, 9) and nvidia=True narrow it
#   @pytest.mark.sm90(reason=...): an NVIDIA Hopper GPU (sm_90: wgmma, TMA, cuBLAS's blockwise fp8)
#   @pytest.mark.multi_gpu(reason=...): at least two GPUs (count= for more)
GPU_MARKERS = {
    "gpu": "a GPU",
    "sm90": "an NVIDIA sm_90 (Hopper) GPU",
    "multi_gpu": "two or more GPUs",
}


def pytest_configure(config):
    for name, needs in GPU_MARKERS.items():
        config.addinivalue_line(
            "markers", f"{name}(reason=...): needs {needs}; skipped elsewhere, with the reason"
        )


def _lacks(name: str, marker) -> bool:
    import torch

    if not torch.cuda.is_available():
        return True
    if name == "multi_gpu":
        return torch.cuda.device_count() < marker.kwargs.get("count", 2)
    nvidia = torch.version.hip is None
    capability = torch.cuda.get_device_capability()
    if name == "sm90":
        return not nvidia or capability[0] != 9
    if marker.kwargs.get("nvidia") and not nvidia:
        return True
    return capability < marker.kwargs.get("min_capability", (0, 0))


def pytest_collection_modifyitems(items):
    for item in items:
        for name, needs in GPU_MARKERS.items():
            marker = item.get_closest_marker(name)
            if marker is not None and _lacks(name, marker):  # (reported at the test, as skipif is)
                item.add_marker(pytest.mark.skip(reason=marker.kwargs.get("reason") or f"needs {needs}"))
