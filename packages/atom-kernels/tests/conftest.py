import os

import torch

# Triton kernels run on the CPU only through the interpreter, which must be chosen before the
# first @triton.jit runs (that is, before atom_kernels is imported).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
