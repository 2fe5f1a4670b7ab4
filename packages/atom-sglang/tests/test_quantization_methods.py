"""Which of SGLang's quantization configs the wrappers take: the methods atom-core reads from config.json
itself (fp8 blocks, MXFP4 experts) pass with the checkpoint's own dict; any other is refused by name."""

import pytest

from atom_sglang.wrapper import checkpoint_config


class _Quant:
    def __init__(self, name: str):
        self.name = name

    def get_name(self) -> str:
        return self.name


@pytest.mark.parametrize("method", ["fp8", "mxfp4"])
def test_methods_atom_reads_pass_without_sglangs_added_keys(method):
    declared = {"quant_method": method, "modules_to_not_convert": ["lm_head"], "packed_modules_mapping": {}}
    hf = {"architectures": ["GptOssForCausalLM"], "quantization_config": declared}
    got = checkpoint_config(hf, _Quant(method), "GptOssForCausalLM")
    assert got["quantization_config"] == {"quant_method": method, "modules_to_not_convert": ["lm_head"]}


def test_another_method_is_refused_by_name():
    hf = {"quantization_config": {"quant_method": "awq"}}
    with pytest.raises(NotImplementedError, match="SGLang chose quantization 'awq'"):
        checkpoint_config(hf, _Quant("awq"), "Qwen3ForCausalLM")
