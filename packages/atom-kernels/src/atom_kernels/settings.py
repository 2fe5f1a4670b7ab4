"""The one place atom_kernels reads the environment; kernels themselves never do."""

from __future__ import annotations

import enum
import importlib.util
import os
from dataclasses import dataclass

import torch


class Backend(enum.StrEnum):
    TRITON = "triton"  # CUDA and ROCm; on the CPU only under TRITON_INTERPRET=1
    AITER = "aiter"  # ROCm only, and only when importable
    TORCH = "torch"  # the reference: the CPU path and the oracle


@dataclass(frozen=True, slots=True)
class Settings:
    default_backend: Backend | None
    triton_interpret: bool
    pdl: bool = True  # programmatic dependent launch where the GPU has it (pdl.py); ATOM_KERNELS_PDL=0: off

    @classmethod
    def from_env(cls) -> Settings:
        raw = os.environ.get("ATOM_KERNELS_BACKEND", "auto").strip().lower()
        if raw not in ("auto", *Backend):
            choices = ", ".join(["auto", *Backend])
            raise ValueError(f"ATOM_KERNELS_BACKEND={raw!r} is not one of: {choices}")
        return cls(
            default_backend=None if raw == "auto" else Backend(raw),
            triton_interpret=os.environ.get("TRITON_INTERPRET", "0") == "1",
            pdl=_flag("ATOM_KERNELS_PDL", default=True),
        )


def _flag(name: str, *, default: bool) -> bool:
    raw = os.environ.get(name, "").strip().lower()
    if raw in ("", "auto"):
        return default
    if raw in ("1", "on", "true"):
        return True
    if raw in ("0", "off", "false"):
        return False
    raise ValueError(f"{name}={raw!r} is not one of: auto, 1, on, true, 0, off, false")


SETTINGS = Settings.from_env()


def aiter_available() -> bool:
    return torch.version.hip is not None and importlib.util.find_spec("aiter") is not None


def resolve_backend(requested: Backend | str | None, device: torch.device) -> Backend:
    """Explicit argument, else the settings default, else auto by device."""
    choice = Backend(requested) if requested is not None else SETTINGS.default_backend
    if choice is None:
        # Triton on every GPU, aiter installed or not: no op has an aiter path yet, so choosing it would
        # route ROCm to the torch reference (and switch the engine's CUDA graphs off).
        if device.type == "cuda":
            return Backend.TRITON
        return Backend.TRITON if SETTINGS.triton_interpret else Backend.TORCH
    if choice is Backend.AITER:
        raise RuntimeError(
            "backend 'aiter' was asked for, but no atom-kernels op has an aiter implementation yet "
            f"(aiter {'is' if aiter_available() else 'is not'} importable here); pass backend='triton' "
            "(it runs on ROCm) or set ATOM_KERNELS_BACKEND=auto"
        )
    if choice is Backend.TRITON and device.type == "cpu" and not SETTINGS.triton_interpret:
        raise RuntimeError(
            "backend 'triton' on a CPU tensor needs TRITON_INTERPRET=1 set before atom_kernels is imported"
        )
    return choice
