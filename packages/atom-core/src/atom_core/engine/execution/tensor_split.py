"""Whether a model can be split over tensor_parallel_size ranks, asked before any worker starts: rank 0's
model (and draft) is built without storage, so a size that its heads, experts or vocabulary do not divide
raises the layer's own one-line error here, instead of in every spawned worker at once."""

from __future__ import annotations

from atom_core.attention import PagedAttentionBackend
from atom_core.build import BuildContext
from atom_core.config import ModelConfig, ParallelConfig
from atom_core.engine.config import EngineConfig
from atom_core.loader import build_draft, build_model


def check_tensor_split(model_config: ModelConfig, engine: EngineConfig, size: int) -> None:
    """Raises ValueError (or ConfigError) naming what `size` ranks cannot split; builds nothing real."""
    backend = PagedAttentionBackend(layout=engine.cache_config().layout, kernel_backend=engine.kernel_backend)
    context = BuildContext(
        backend, parallel=ParallelConfig(size, 0, None), device="meta", state_dtype=engine.state_cache_dtype
    )
    build_model(model_config, context)
    if engine.speculative_config is not None:
        build_draft(model_config, context, None)
