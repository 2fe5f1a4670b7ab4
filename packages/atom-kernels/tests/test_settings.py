import pytest
import torch

from atom_kernels.settings import Backend, Settings, resolve_backend


def test_env_default_is_parsed(monkeypatch):
    monkeypatch.setenv("ATOM_KERNELS_BACKEND", "Torch")
    assert Settings.from_env().default_backend is Backend.TORCH
    monkeypatch.setenv("ATOM_KERNELS_BACKEND", "auto")
    assert Settings.from_env().default_backend is None


def test_bad_env_value_names_the_choices(monkeypatch):
    monkeypatch.setenv("ATOM_KERNELS_BACKEND", "cutlass")
    with pytest.raises(ValueError, match="auto, triton, aiter, torch"):
        Settings.from_env()


def test_explicit_argument_wins():
    assert resolve_backend("torch", torch.device("cpu")) is Backend.TORCH


def test_aiter_is_refused_by_name_since_no_op_implements_it(monkeypatch):
    import atom_kernels.settings as s

    for installed in (False, True):  # installed or not: asking for it never runs something else
        monkeypatch.setattr(s, "aiter_available", lambda installed=installed: installed)
        with pytest.raises(RuntimeError, match="no atom-kernels op has an aiter implementation"):
            resolve_backend("aiter", torch.device("cpu"))


def test_auto_on_a_gpu_is_triton_even_with_aiter_installed(monkeypatch):
    import atom_kernels.settings as s

    monkeypatch.setattr(s, "aiter_available", lambda: True)
    monkeypatch.setattr(s, "SETTINGS", Settings(default_backend=None, triton_interpret=False))
    assert resolve_backend(None, torch.device("cuda")) is Backend.TRITON


def test_auto_on_cpu_follows_the_interpreter_setting(monkeypatch):
    import atom_kernels.settings as s

    monkeypatch.setattr(s, "SETTINGS", Settings(default_backend=None, triton_interpret=False))
    assert resolve_backend(None, torch.device("cpu")) is Backend.TORCH
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        resolve_backend("triton", torch.device("cpu"))
    monkeypatch.setattr(s, "SETTINGS", Settings(default_backend=None, triton_interpret=True))
    assert resolve_backend(None, torch.device("cpu")) is Backend.TRITON
