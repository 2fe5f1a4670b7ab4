"""What the atom backends (MHA/GQA in backend.py, MLA in mla.py) share: SGLang's backend contract
for per-forward metadata (page tables from `req_to_token`, metadata.py) and for decode/verify CUDA graphs
(static buffers refilled in place, graph_state.py)."""

from __future__ import annotations

from sglang.srt.layers.attention.base_attn_backend import AttentionBackend

from atom_sglang.attention.graph_state import DecodeGraphState
from atom_sglang.attention.metadata import AtomForwardMetadata, UnsupportedForwardMode, build_metadata


class AtomBackendBase(AttentionBackend):
    def __init__(self, model_runner, page_size: int, kernel_backend: str | None):
        super().__init__()
        self.device = model_runner.device
        self.req_to_token_pool = model_runner.req_to_token_pool
        self.token_to_kv_pool = model_runner.token_to_kv_pool
        self.page_size = page_size
        self.kernel_backend = kernel_backend  # None: atom-kernels picks (Triton on GPUs, torch on the CPU)
        self.data_type = getattr(model_runner, "dtype", None)
        # SGLang's EAGLE verify reads this when a batch carries no seq_lens_sum.
        self.max_context_len = self.req_to_token_pool.req_to_token.shape[1]
        self.forward_metadata: AtomForwardMetadata | None = None
        self.graph_state: DecodeGraphState | None = None

    def init_forward_metadata(self, forward_batch):
        if forward_batch.forward_mode.is_idle():
            self.forward_metadata = None
            return
        req_to_token = self.req_to_token_pool.req_to_token
        self.forward_metadata = build_metadata(forward_batch, req_to_token, self.page_size)

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int):
        self.graph_state = DecodeGraphState(
            max_bs, max_num_tokens, self.max_context_len, self.page_size, self.device
        )

    def init_forward_metadata_out_graph(self, forward_batch, in_capture: bool = False):
        mode = forward_batch.forward_mode
        if not (mode.is_decode_or_idle() or mode.is_target_verify()):
            raise UnsupportedForwardMode(
                f"the atom attention backend captures DECODE and TARGET_VERIFY graphs, not {mode.name}"
            )
        if self.graph_state is None:
            raise RuntimeError("init_cuda_graph_state must run before graph metadata is prepared")
        self.forward_metadata = self.graph_state.update(forward_batch, self.req_to_token_pool.req_to_token)

    def get_cuda_graph_seq_len_fill_value(self):
        return 1

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        return self._attend(q, k, v, layer, save_kv_cache, kwargs)

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        return self._attend(q, k, v, layer, save_kv_cache, kwargs)

    def _attend(self, q, k, v, layer, save_kv_cache: bool, kwargs: dict):
        raise NotImplementedError


def refuse(backend: str, layer, problems: list[str], kwargs: dict, handled: frozenset[str]) -> None:
    """Fail loudly, naming every feature a layer or call asks for that the backend does not compute
    (problems found by the backend, plus each set keyword argument outside `handled`)."""
    problems = problems + [
        f"argument {name!r}"
        for name, value in kwargs.items()
        if value is not None and value is not False and name not in handled
    ]
    if problems:
        raise NotImplementedError(
            f"the {backend} backend does not support {', '.join(problems)} (layer {layer.layer_id})"
        )
