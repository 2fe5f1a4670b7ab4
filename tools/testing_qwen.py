"""Tiny Qwen3-Next / Qwen3.5 checkpoints saved by transformers (optionally with a trained MTP layer), for
atom-core's parity and MTP tests and the adapters' engine tests."""

import torch

from tools.testing_models import successor_language

VOCAB = 211

CONFIG = dict(
    vocab_size=VOCAB,
    hidden_size=48,
    intermediate_size=64,
    num_hidden_layers=4,
    layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    linear_num_key_heads=2,
    linear_num_value_heads=4,  # two value heads per key head
    linear_key_head_dim=16,
    linear_value_head_dim=32,  # key dim != value dim
    linear_conv_kernel_dim=4,
    num_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    shared_expert_intermediate_size=24,
    mlp_only_layers=[1],  # layer 1's MLP is dense
    max_position_embeddings=256,
    rope_parameters=dict(
        rope_type="default",
        rope_theta=10000.0,
        partial_rotary_factor=0.5,
        mrope_section=[2, 1, 1],  # Qwen3.5: rotary frequencies per position row T, H, W (interleaved)
        mrope_interleaved=True,
    ),
)


MOE_KEYS = ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size")
ARCHS = {  # case: (transformers config class name, config without these keys, fuse the experts)
    "qwen3-next": ("Qwen3NextConfig", (), False),
    "qwen3.5": ("Qwen3_5TextConfig", (*MOE_KEYS, "mlp_only_layers"), False),
    "qwen3.5-moe": ("Qwen3_5MoeTextConfig", ("mlp_only_layers", "intermediate_size"), False),
    "qwen3.5-moe-fused": ("Qwen3_5MoeTextConfig", ("mlp_only_layers", "intermediate_size"), True),
    # the published architecture: text_config + a vision tower, served text-only
    "qwen3.5-conditional-generation": ("Qwen3_5Config", (*MOE_KEYS, "mlp_only_layers"), False),
}
VISION = dict(
    depth=1,
    hidden_size=32,
    intermediate_size=32,
    num_heads=2,
    out_hidden_size=48,
    patch_size=4,
    spatial_merge_size=2,
    temporal_patch_size=1,
)


def qwen3_next_checkpoint(path, case: str = "qwen3-next", **overrides):
    """A random tiny model of `case` (CONFIG, then overrides) saved by transformers (per-expert keys, or
    fused 3-D expert tensors as Qwen3.5-MoE checkpoints also ship), with every norm, gate and decay
    randomized so each path matters. Returns transformers' model."""
    import transformers
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    config_name, dropped, fused = ARCHS[case]
    fields = {k: v for k, v in {**CONFIG, **overrides}.items() if k not in dropped}
    torch.manual_seed(0)
    if config_name == "Qwen3_5Config":
        config = transformers.Qwen3_5Config(text_config=fields, vision_config=VISION)
        model = transformers.Qwen3_5ForConditionalGeneration(config).float()
        config = config.text_config
    else:
        config = getattr(transformers, config_name)(**fields)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight") and "linear_attn" not in name:
                param.uniform_(-0.3, 0.3)  # the (1 + w) norms
            elif name.endswith(("A_log", "dt_bias")) or "linear_attn.norm" in name:
                param.uniform_(0.3, 1.5)
            elif param.dim() >= 2:
                param.normal_(0, 0.15)
    model.eval().save_pretrained(path)
    if fused:
        tensors, experts = load_file(path / "model.safetensors"), config.num_experts
        for layer in range(config.num_hidden_layers):
            p = f"model.layers.{layer}.mlp.experts"
            per_expert = {
                w: [tensors.pop(f"{p}.{e}.{w}_proj.weight") for e in range(experts)]
                for w in ("gate", "up", "down")
            }
            gate_up = [torch.cat([g, u]) for g, u in zip(per_expert["gate"], per_expert["up"], strict=True)]
            tensors[f"{p}.gate_up_proj"] = torch.stack(gate_up)  # [E, 2I, H], gate rows first
            tensors[f"{p}.down_proj"] = torch.stack(per_expert["down"])  # [E, H, I]
        save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    return model


class QwenMtpReference(torch.nn.Module):
    """Qwen3-Next's / Qwen3.5's MTP layer written from its published description (the independent reference
    for ATOM's draft), on the model's own transformers decoder layer built as full attention: row i of
    tokens [B, T] and the target's final hidden states h [B, T, H] give logits predicting token i + 2, from
    head(norm(layer(fc([pre_fc_norm_embedding(Emb(t_{i+1})), pre_fc_norm_hidden(h_i)])))), row i at
    position i; every norm scales by (1 + w)."""

    def __init__(self, main):
        super().__init__()
        import copy

        cfg = getattr(main.config, "text_config", main.config)  # a ConditionalGeneration: its text model's
        h = cfg.hidden_size
        self.main_ref = [main]  # not a submodule: its parameters are the target's
        self.text = [getattr(main.model, "language_model", main.model)]
        full = cfg.layer_types.index("full_attention")
        layer_cfg = copy.deepcopy(cfg)
        layer_cfg.layer_types = ["full_attention"] * cfg.num_hidden_layers
        layer_cfg._attn_implementation = "eager"
        self.block = type(self.text[0].layers[full])(layer_cfg, 0)
        with torch.no_grad():
            for name, param in self.block.named_parameters():
                if name.endswith("norm.weight"):
                    param.uniform_(-0.3, 0.3)
                elif param.dim() >= 2:
                    param.normal_(0, 0.15)
        self.norms = torch.nn.ParameterDict(
            {
                n: torch.nn.Parameter(torch.empty(h).uniform_(-0.3, 0.3))
                for n in ("embedding", "hidden", "out")
            }
        )
        self.fc = torch.nn.Linear(2 * h, h, bias=False)
        torch.nn.init.normal_(self.fc.weight, 0, 0.1)

    def forward(self, tokens: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        main, text = self.main_ref[0], self.text[0]
        eps, n = text.config.rms_norm_eps, tokens.shape[1] - 1
        emb = text.embed_tokens(tokens[:, 1:])
        x = self.fc(
            torch.cat(
                [_rms1(emb, self.norms["embedding"], eps), _rms1(hidden[:, :-1], self.norms["hidden"], eps)],
                -1,
            )
        )
        pos = torch.arange(n)[None]
        rotary = pos[None].expand(3, -1, -1) if hasattr(text.rotary_emb, "mrope_section") else pos
        mask = torch.full((n, n), torch.finfo(torch.float32).min).triu(1)[None, None]
        x = self.block(
            x, position_embeddings=text.rotary_emb(x, rotary), attention_mask=mask, position_ids=pos
        )
        return main.lm_head(_rms1(x, self.norms["out"], eps))

    def checkpoint_tensors(self, fused_experts: bool) -> dict[str, torch.Tensor]:
        """Its weights under the published names (mtp.*), experts per expert or fused 3-D."""
        found = {f"mtp.layers.0.{k}": v for k, v in self.block.state_dict().items()}
        experts = getattr(self.block.mlp, "experts", None)
        if experts is not None and not fused_experts:
            p = "mtp.layers.0.mlp.experts"
            del found[f"{p}.gate_up_proj"], found[f"{p}.down_proj"]
            for e in range(experts.num_experts):
                gate, up = experts.gate_up_proj[e].chunk(2, dim=0)
                names = {"gate_proj": gate, "up_proj": up, "down_proj": experts.down_proj[e]}
                found.update({f"{p}.{e}.{name}.weight": w for name, w in names.items()})
        found.update(
            {
                "mtp.fc.weight": self.fc.weight,
                "mtp.pre_fc_norm_embedding.weight": self.norms["embedding"],
                "mtp.pre_fc_norm_hidden.weight": self.norms["hidden"],
                "mtp.norm.weight": self.norms["out"],
            }
        )
        return {k: v.detach().clone().contiguous() for k, v in found.items()}


def _rms1(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1 + w)


def qwen_mtp_checkpoint(path, case: str, *, train_steps: int = 0, seed: int = 0, **overrides):
    """qwen3_next_checkpoint's model with an MTP layer (mtp.*), saved as the published checkpoints are.
    train_steps > 0 trains target and MTP layer together on successor_language first, so the draft predicts
    well. Returns (transformers' target model, the QwenMtpReference)."""
    import json

    from safetensors.torch import load_file, save_file

    main = qwen3_next_checkpoint(path, case, **overrides)
    torch.manual_seed(seed)
    mtp = QwenMtpReference(main)
    if train_steps:
        _, sample = successor_language(main.config.get_text_config().vocab_size, seed)
        gen = torch.Generator().manual_seed(seed + 1)
        params = list(main.parameters()) + [
            p for n, p in mtp.named_parameters() if not n.startswith("main_ref")
        ]
        opt = torch.optim.AdamW(params, lr=3e-3, weight_decay=0.0)
        ce = torch.nn.functional.cross_entropy
        main.train(), mtp.train()
        for _ in range(train_steps):
            tokens = sample(32, 24, gen)
            hidden = main.model(tokens).last_hidden_state
            logits, draft = main.lm_head(hidden)[:, :-1], mtp(tokens, hidden)[:, :-1]
            v = logits.shape[-1]
            loss = ce(logits.reshape(-1, v), tokens[:, 1:].reshape(-1)) + ce(
                draft.reshape(-1, v), tokens[:, 2:].reshape(-1)
            )
            opt.zero_grad()
            loss.backward()
            opt.step()
        main.eval().save_pretrained(path)  # the trained target replaces the saved one
    mtp.eval()
    fused = ARCHS[case][2]
    tensors = load_file(path / "model.safetensors")
    if train_steps and fused:
        raise NotImplementedError(
            "train a per-expert case (fused experts are saved by qwen3_next_checkpoint)"
        )
    tensors.update(mtp.checkpoint_tensors(fused))
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((path / "config.json").read_text())
    text = config.get("text_config", config)
    text["mtp_num_hidden_layers" if "qwen3.5" in case else "num_nextn_predict_layers"] = 1
    (path / "config.json").write_text(json.dumps(config, indent=1))
    return main, mtp
