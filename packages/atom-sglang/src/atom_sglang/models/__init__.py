"""SGLang's external model package for ATOM (SGLANG_EXTERNAL_MODEL_PACKAGE=atom_sglang.models).

SGLang imports every module here and registers each module's `EntryClass`.
"""
