"""SGLang's external model package entry: `EntryClass` lists ATOM's wrapper for every architecture atom-core
supports. Empty when the plugin is off (ATOM_DISABLE_SGLANG_PLUGIN=1 or an unsupported SGLang), so SGLang
falls back to its own model classes."""

from atom_sglang.plugin import register

if register():
    from atom_sglang.specs import served_architectures
    from atom_sglang.wrapper import entry_class

    EntryClass = [entry_class(arch) for arch in served_architectures()]
else:
    EntryClass = []
