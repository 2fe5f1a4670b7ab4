"""The engine's plan: every cache size and step mode decided once, from EngineConfig, the model's declared
caches and the memory left for them.

The runner computes it after loading the model (only then are the cache specs and the free memory known)
and allocates from it; the scheduler, the block manager, the drafter and the CUDA graphs are built from
the same object, so no size is derived twice or read back from a part that derived it. Every mode the
engine turns off is in `off` with the one reason it is off, logged once when the engine starts.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass

import torch

from atom_core.attention.mla import UNABSORBED_MIN_TOKENS
from atom_core.cache.specs import STATE
from atom_core.config import ConfigError, ModelConfig
from atom_core.engine.config import EngineConfig
from atom_kernels.settings import Backend, resolve_backend

logger = logging.getLogger("atom.engine")

# decode batch sizes the CUDA graphs are captured at (those below max_num_seqs, and max_num_seqs itself)
GRAPH_BATCH_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256)
# prefill graphs: token counts from 16 up by powers of two, and sequence counts (padding takes one more)
PREFILL_GRAPH_MIN_TOKENS = 16
PREFILL_GRAPH_SEQS = (1, 2, 4, 8)


@dataclass(frozen=True, slots=True)
class CachePlan:
    """Sizes (blocks, tokens and state slots) and modes of one engine.

    State slots are rows of every state layer's cache: [0, num_running_slots) for running sequences
    (state_slots_per_seq each: their own, and one spare per draft under speculation), then
    snapshot_slots rows of states kept at block boundaries for prefix caching."""

    block_size: int
    num_blocks: int
    max_model_len: int
    max_num_seqs: int
    num_speculative_tokens: int  # k: drafts a sequence verifies per step (0: no speculation)
    state_slots_per_seq: int  # 0: the model has no state layers
    snapshot_slots: int
    prefix_caching: bool
    async_scheduling: bool
    graph_sizes: tuple[int, ...]  # captured decode batch sizes; (): eager forwards only
    # captured prefill steps: token counts and sequence counts (()): prefill steps run eagerly
    prefill_graph_tokens: tuple[int, ...] = ()
    prefill_graph_seqs: tuple[int, ...] = ()
    off: tuple[tuple[str, str], ...] = ()  # (mode, why) of every mode turned off
    # under speculation with async scheduling: prefill chunks run beside a verify launched ahead
    prefills_ahead: bool = False

    @property
    def has_state(self) -> bool:
        return self.state_slots_per_seq > 0

    @property
    def num_running_slots(self) -> int:
        return self.max_num_seqs * self.state_slots_per_seq

    @property
    def num_state_slots(self) -> int:
        """Rows each state layer's cache has: running slots, then snapshots."""
        return self.num_running_slots + self.snapshot_slots

    @property
    def snapshot_range(self) -> range:
        return range(self.num_running_slots, self.num_state_slots)

    @property
    def verify_query_len(self) -> int:
        """Tokens a sequence adds in a speculative verify step: its last known token and k drafts."""
        return 1 + self.num_speculative_tokens

    def log(self) -> None:
        for mode, why in self.off:
            logger.info("%s: off (%s)", mode, why)


def check_max_model_len(asked: int | None, model: ModelConfig) -> int:
    """The asked max_model_len, or the model's own; refused above the model's limit (before loading)."""
    limit = model.max_position_embeddings
    if asked is None:
        return limit
    if asked > limit:
        raise ConfigError(f"max_model_len {asked} is above the model's max_position_embeddings {limit}")
    return asked


def plan_engine(
    engine: EngineConfig,
    model: ModelConfig,
    kinds: Collection[str],
    *,
    device: torch.device,
    fit_blocks: Callable[[int], int],
    layer_kinds: Collection[str] = (),
) -> CachePlan:
    """The plan for a model whose caches need `kinds` of metadata (layer_kinds: its cache specs'
    layer kinds). fit_blocks(state rows) -> how many KV blocks the memory left after that many state rows
    holds (agreed by every tensor-parallel rank)."""
    off: list[tuple[str, str]] = []
    spec = engine.speculative_config
    k = spec.num_speculative_tokens if spec is not None else 0
    state = STATE in kinds
    per_seq = 1 + k if state else 0
    wanted = engine.enable_prefix_caching
    # (without prefix caching a state model keeps no snapshots, unless asked for them)
    default_snapshots = engine.max_num_seqs if wanted is not False else 0
    snapshots = (
        (default_snapshots if engine.state_snapshots is None else engine.state_snapshots) if state else 0
    )
    if wanted is False:
        off.append(("prefix caching", "enable_prefix_caching=False"))
    elif state and snapshots == 0:
        if wanted:
            raise ConfigError(
                "enable_prefix_caching=True: a model with state layers resumes a prefix from a state "
                "snapshot, and state_snapshots=0 keeps none"
            )
        off.append(("prefix caching", "state layers resume a prefix from a snapshot; state_snapshots=0"))
    num_blocks = engine.num_kv_blocks or fit_blocks(engine.max_num_seqs * per_seq + snapshots)
    max_model_len = _fit_max_model_len(
        engine.max_model_len, check_max_model_len(engine.max_model_len, model), num_blocks, engine.block_size
    )
    graphs_off = _why_no_graphs(engine, model, device)
    if graphs_off:
        off.append(("CUDA graphs", graphs_off))
    prefill_off = graphs_off or _why_no_prefill_graphs(engine)
    if prefill_off and not graphs_off:
        off.append(("prefill CUDA graphs", prefill_off))
    prefill_tokens, prefill_seqs = ((), ()) if prefill_off else _prefill_graph_shapes(engine, layer_kinds)
    async_off = _why_no_async(engine)
    if async_off:
        off.append(("async scheduling", async_off))
    prefills_off = None if async_off or k == 0 else _why_no_prefills_ahead(engine, state)
    if prefills_off:
        off.append(("prefills beside verifies launched ahead", prefills_off))
    return CachePlan(
        block_size=engine.block_size,
        num_blocks=num_blocks,
        max_model_len=max_model_len,
        max_num_seqs=engine.max_num_seqs,
        num_speculative_tokens=k,
        state_slots_per_seq=per_seq,
        snapshot_slots=snapshots,
        prefix_caching=wanted is not False and (not state or snapshots > 0),
        async_scheduling=async_off is None,
        graph_sizes=() if graphs_off else _graph_sizes(engine.max_num_seqs),
        prefill_graph_tokens=prefill_tokens,
        prefill_graph_seqs=prefill_seqs,
        off=tuple(off),
        prefills_ahead=not async_off and k > 0 and prefills_off is None,
    )


def _fit_max_model_len(asked: int | None, wanted: int, num_blocks: int, block_size: int) -> int:
    """One sequence of max_model_len tokens must fit the KV cache, or no request could be promised to
    finish: a length the user set is refused, the model's own limit is lowered (and said so)."""
    capacity = num_blocks * block_size
    if wanted <= capacity:
        return wanted
    blocks = f"{num_blocks} KV blocks hold {capacity} tokens"
    if asked is not None:
        raise ConfigError(
            f"max_model_len {asked} does not fit the KV cache: {blocks} (give more blocks or "
            "memory, or a smaller max_model_len)"
        )
    logger.warning("max_model_len lowered from %d to %d: %s", wanted, capacity, blocks)
    return capacity


def _why_no_graphs(engine: EngineConfig, model: ModelConfig, device: torch.device) -> str | None:
    if engine.enforce_eager:
        return "enforce_eager"
    if device.type != "cuda":
        return f"{device.type} runs eagerly"
    # the torch reference kernels index with shapes the host computes each step
    if resolve_backend(engine.kernel_backend, device) is not Backend.TRITON:
        return f"the {engine.kernel_backend} kernels' shapes depend on the host"
    # dynamic RoPE rescales by the batch's longest position, read on the host each step
    if model.rope.rope_type == "dynamic":
        return "dynamic RoPE reads the batch's longest position on the host"
    return None


def _why_no_prefill_graphs(engine: EngineConfig) -> str | None:
    if engine.max_prefill_graph_tokens < PREFILL_GRAPH_MIN_TOKENS:
        return f"max_prefill_graph_tokens={engine.max_prefill_graph_tokens}"
    return None


def _prefill_graph_shapes(
    engine: EngineConfig, layer_kinds: Collection[str]
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Token counts (powers of two from 16 up to max_prefill_graph_tokens and the step's token budget)
    and sequence counts (up to max_num_seqs and one padding sequence) of the prefill graphs."""
    top = min(engine.max_prefill_graph_tokens, engine.max_num_batched_tokens)
    if "mla" in layer_kinds:
        # MLA attends fresh prefills of UNABSORBED_MIN_TOKENS or more on up-projected K/V, chosen on the
        # host from the batch's lengths: graphs (captured absorbed) stay below them
        top = min(top, UNABSORBED_MIN_TOKENS - 1)
    tokens, t = [], PREFILL_GRAPH_MIN_TOKENS
    while t <= top:
        tokens.append(t)
        t *= 2
    if not tokens:
        return (), ()
    most = min(PREFILL_GRAPH_SEQS[-1], engine.max_num_seqs + 1)  # (room for a padding sequence)
    return tuple(tokens), tuple(sorted({s for s in PREFILL_GRAPH_SEQS if s < most} | {most}))


def _why_no_async(engine: EngineConfig) -> str | None:
    if engine.async_scheduling is False:
        return "async_scheduling=False"
    if not engine.async_scheduling_on():
        return "on by default only where a device runs beside the host (CUDA)"
    return None


def _why_no_prefills_ahead(engine: EngineConfig, state: bool) -> str | None:
    if state:
        # the device starts each sequence of a verify launched ahead from the state slot of the last
        # draft the verify before accepted; a sequence that prefilled instead keeps its state elsewhere
        return "state layers: a verify launched ahead starts from the last accepted draft's state slot"
    if engine.tensor_parallel_size > 1:
        # a worker builds a verify's fed tokens from its own last verify and chain (ahead_tokens)
        return "tensor-parallel workers feed a verify launched ahead from verifying sequences only"
    return None


def _graph_sizes(max_num_seqs: int) -> tuple[int, ...]:
    return tuple(sorted({s for s in GRAPH_BATCH_SIZES if s < max_num_seqs} | {max_num_seqs}))
