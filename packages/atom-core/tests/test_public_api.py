import torch

import atom_core
import atom_core.integration as api
from atom_kernels.activation.ref import silu_and_mul_ref


def test_the_adapter_surface_is_what_the_docs_name():
    assert set(api.__all__) == {
        "EngineVersionError",
        "__version__",
        "EnginePlugin",
        "check_engine_version",
        "silu_and_mul",
    }
    assert api.__version__ == atom_core.__version__


def test_kernel_ops_reach_adapters_through_core():
    x = torch.randn(5, 32)
    torch.testing.assert_close(api.silu_and_mul(x), silu_and_mul_ref(x), rtol=1e-5, atol=1e-5)


def test_importing_the_adapter_surface_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, atom_core.integration; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
