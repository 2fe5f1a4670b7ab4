"""Triton's CPU interpreter without its repeated patching of triton.language on every helper call (tests).

Under TRITON_INTERPRET=1, each call a kernel makes to a @triton.jit helper (ours, or triton.language's own
such as tl.zeros) runs `_patch_lang` again: inspect.getmembers over tl, tl.tensor and tl.math to wrap
their builtins, about a millisecond a call, though the launch already wrapped them. In atom-vllm's
end-to-end tests that was 40% of the time. `install()` lets a helper call skip the patching when the
language modules its globals see were already patched during the current launch; a helper whose module
sees others (triton.language.standard sees tl.core) still patches them, once per launch. The interpreted
code and the builtins it calls are the same.

Installed only where the interpreter has the structure this was written against (checked on Triton 3.8, 3.9:
`GridExecutor.__call__` runs a launch, `InterpretedFunction.__call__` a helper call, `_patch_lang(fn)`
patches); anywhere else `install()` changes nothing and says so.
"""

from __future__ import annotations

import inspect
import threading

_launch = threading.local()  # .patched: ids of the language modules patched in the current launch
_installed = False


def install() -> bool:
    """Patch Triton's interpreter as described above; returns whether it was (idempotent)."""
    global _installed
    if _installed:
        return True
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return False
    executor = getattr(interpreter, "GridExecutor", None)
    helper = getattr(interpreter, "InterpretedFunction", None)
    if (
        executor is None
        or helper is None
        or not hasattr(interpreter, "_patch_lang")
        or not hasattr(helper, "rewrite")
    ):
        print(
            "tools.testing_interpreter: Triton's interpreter is not the one this was written for; unchanged"
        )
        return False
    languages: dict[int, frozenset[int]] = {}

    def languages_of(fn) -> frozenset[int]:
        """The triton.language modules `fn`'s globals see (what _patch_lang patches for it)."""
        key = id(fn.__globals__)
        if key not in languages:
            seen = (v for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core))
            languages[key] = frozenset(id(module) for module in seen)
        return languages[key]

    run_launch = executor.__call__

    def launch(self, *args, **kwargs):
        outer = getattr(_launch, "patched", None)
        _launch.patched = set(languages_of(self.fn))  # what the launch itself patches
        try:
            return run_launch(self, *args, **kwargs)
        finally:
            _launch.patched = outer

    def call_helper(self, *args, **kwargs):
        patched = getattr(_launch, "patched", None)
        needed = languages_of(self.fn)
        if patched is None or not needed <= patched:
            interpreter._patch_lang(self.fn)
            if patched is not None:
                patched |= needed
        fn = self.rewrite()
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise interpreter.InterpreterError(repr(e)) from e

    executor.__call__ = launch
    helper.__call__ = call_helper
    _installed = True
    return True
