"""The projections the fp8 GEMM benchmarks time (Llama-3-8B's, and the MoE models' dense layers)."""

SHAPES = {  # name: (N, K)
    "llama3-8b/qkv": (6144, 4096),
    "llama3-8b/o": (4096, 4096),
    "llama3-8b/gate_up": (28672, 4096),
    "llama3-8b/down": (4096, 14336),
    "dsv3/q_b": (24576, 1536),
    "dsv3/kv_a": (576, 7168),
    "dsv3/o": (7168, 16384),
    "dsv3/q_a+kv_a": (2112, 7168),
}
