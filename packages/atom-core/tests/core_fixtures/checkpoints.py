"""Checkpoints written for a test: random weights of a config (tools.testing_models.random_checkpoint), DeepSeek
with a trained MTP layer, a word-level tokenizer, GPT-OSS with nonzero extras."""

import json

import torch
from torch import nn

from core_fixtures.architectures import DSV3, GLM
from core_fixtures.references import HFMtp
from tools.testing_models import decisive_routing, random_checkpoint, successor_language


def deepseek_checkpoint(path, config_cls, base: dict, overrides: dict):
    """A random tiny model whose routing is decisive (no near-ties between implementations) and whose
    e_score_correction_bias is not zero, saved as transformers saves it."""
    model, _ = random_checkpoint(config_cls(**{**base, **overrides}), path, edit=decisive_routing)
    return model


def deepseek_mtp_checkpoint(
    path, overrides: dict | None = None, *, train_steps: int = 0, seed: int = 0, family: str = "deepseek-v3"
):
    """A tiny DeepSeek-V3 (family "glm-4.5": GLM-4.5, the same MTP layout) with its MTP layer
    (model.layers.{L}.*, num_nextn_predict_layers 1), saved as the published checkpoints are. train_steps > 0
    trains target and MTP layer together on successor_language first, so the draft predicts well. Returns
    (transformers' target model, the HFMtp reference)."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM, DeepseekV3Config, Glm4MoeConfig

    torch.manual_seed(seed)
    config_cls, base = {"deepseek-v3": (DeepseekV3Config, DSV3), "glm-4.5": (Glm4MoeConfig, GLM)}[family]
    cfg = config_cls(**{**base, **(overrides or {})})
    layers = cfg.num_hidden_layers
    main = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    mtp = HFMtp(main, layers)
    with torch.no_grad():
        for mlp in [layer.mlp for layer in main.model.layers] + [mtp.block.mlp]:
            if hasattr(mlp, "gate"):
                mlp.gate.weight.normal_(0, 0.5)
                mlp.gate.e_score_correction_bias.uniform_(-0.3, 0.3)
        mtp.eh_proj.weight.normal_(0, 0.05)
    if train_steps:
        _train(main, mtp, train_steps, seed)
    main.eval(), mtp.eval()
    main.save_pretrained(path)
    tensors = load_file(path / "model.safetensors")
    tensors.update(mtp.checkpoint_tensors(layers))
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "num_nextn_predict_layers": 1}, indent=1))
    return main, mtp


def _train(main, mtp, steps: int, seed: int) -> None:
    _, sample = successor_language(main.config.vocab_size, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    params = list(main.parameters()) + [p for n, p in mtp.named_parameters() if not n.startswith("main_ref")]
    opt = torch.optim.AdamW(params, lr=3e-3, weight_decay=0.0)
    main.train(), mtp.train()
    ce = nn.functional.cross_entropy
    for _ in range(steps):
        tokens = sample(32, 24, gen)
        out = main(tokens, output_hidden_states=True)
        logits = out.logits[:, :-1]
        draft = mtp(tokens, out.hidden_states[-1])[:, :-1]  # row i predicts token i + 2
        v = logits.shape[-1]
        loss = ce(logits.reshape(-1, v), tokens[:, 1:].reshape(-1)) + ce(
            draft.reshape(-1, v), tokens[:, 2:].reshape(-1)
        )
        opt.zero_grad()
        loss.backward()
        opt.step()


def save_word_tokenizer(path, vocab_size: int) -> None:
    """A word-level tokenizer for a synthetic vocabulary: id i is the word "w{i}" (0 and 1: <s> and </s>), words
    joined by spaces, so stop strings can name token sequences."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {"<s>": 0, "</s>": 1, **{f"w{i}": i for i in range(2, vocab_size)}}
    tok = Tokenizer(models.WordLevel(words, unk_token="<s>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(path)


def gpt_oss_extras(model) -> None:
    """Sinks, biases and experts as a trained model has them: none of them zero, the experts large enough
    that their gate and up projections cross the clamp (the clamp the config asks for, on any transformers:
    references.swiglu_as_configured)."""
    from core_fixtures.references import swiglu_as_configured

    swiglu_as_configured(model)
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for layer in model.model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            attn.sinks.copy_(torch.randn(attn.sinks.shape, generator=gen))
            for proj in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj):
                proj.bias.copy_(0.3 * torch.randn(proj.bias.shape, generator=gen))
            mlp.router.bias.copy_(torch.randn(mlp.router.bias.shape, generator=gen))
            for name in ("gate_up_proj", "down_proj", "gate_up_proj_bias", "down_proj_bias"):
                param = getattr(mlp.experts, name)
                param.copy_(0.5 * torch.randn(param.shape, generator=gen))
