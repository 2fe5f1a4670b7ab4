"""Programmatic dependent launch (PDL): a decode step's next kernel starts while the current one finishes.

A decode step is hundreds of short kernels in a row; without PDL each waits for the previous one to finish
before its programs are even placed, then pays its first loads' latency with HBM idle. A kernel launched
with PDL (`launch_pdl=True`, sm_90+) may start as soon as every program of the kernel before it has run
`let_next_launch`. Until `wait_for_inputs` returns (the previous kernel has finished and its writes are
visible) it may only read what no kernel of the step writes: weights and other constants, which the
weight-streaming GEMV prefetches there. Everything else (activations, caches, block tables, counters, and
every store) comes after the wait, so ordering is that of a plain stream: each kernel's wait covers the
one before it, whose own wait covered its predecessor. Inside CUDA graphs the launches become programmatic
edges. Decode-step replays with and without it (atom-core's profile_engine_step.py, ATOM_KERNELS_PDL=0
against the default, same machine) are faster with it for Llama-3-8B and Qwen3-30B-A3B at B=1.

Two rules keep this sound, for any kernel added here:
- every program runs `wait_for_inputs` before it exits or stores (no early return above it): a plain
  launch later in the stream counts on each PDL kernel having finished only after its predecessor did;
- `let_next_launch` comes first, so the next few kernels may be placed while this one still runs: what
  they read before their wait (the weights given to `linear` and `rms_norm`) must not be written by a
  kernel still in flight. Weights are written at load time, by plain copies; never inside a step.

Launched with it: linear's GEMV and skinny kernels, rms_norm, silu_and_mul, qk_norm_rope_write, the
generic paged-attention kernel with its split combine, and MoE's routing, expert ordering, expert GEMMs
(not one token's: slower there, expert_gemm.py) and top-k combine (Qwen3-30B-A3B faster at B=1 and
B=64), and the tensor-parallel all-reduce fused with its norm (all_reduce_rms_norm; Llama-3-8B TP=2
faster at B=1); fp8_linear's kernels (the activation quantization, the W8A8 skinny kernel, the
weight-only GEMV, which prefetches its first weight step as linear's does, and the weight-only MMA
kernel); a GDN decode layer's kernels (causal_conv1d's, gdn_gating, the recurrent delta rule, which wait
first: their states and slots are written inside a step) and rms_norm_gated; MLA's latent write, the
absorbed products (absorb_query loads its weight block before the wait), attention and split combine
(wait first). The other kernels (the chunked GDN prefill, the e4m3 decode kernel, the one-shot
all-reduce) launch plainly, and a plain launch waits for everything before it.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from atom_kernels.settings import SETTINGS


@functools.cache
def _device_has_pdl(index: int) -> bool:
    return torch.version.hip is None and torch.cuda.get_device_capability(index)[0] >= 9


def pdl_launch(device: torch.device) -> bool:
    """Whether kernels on `device` launch with PDL: NVIDIA sm_90 or newer, not under Triton's CPU
    interpreter, and not turned off (ATOM_KERNELS_PDL=0). Passed as both the `PDL` constexpr and
    `launch_pdl` of a launch: the constexpr compiles the wait in, the launch flag lets it start early."""
    if device.type != "cuda" or SETTINGS.triton_interpret or not SETTINGS.pdl:
        return False
    return _device_has_pdl(device.index if device.index is not None else torch.cuda.current_device())


@triton.jit
def wait_for_inputs(PDL: tl.constexpr):
    """Block until the previous kernel in the stream has finished and its writes are visible (PDL only)."""
    if PDL:
        gdc_wait()


@triton.jit
def let_next_launch(PDL: tl.constexpr):
    """Allow the next kernel to start placing its programs (PDL only); it still waits before its inputs."""
    if PDL:
        gdc_launch_dependents()
