"""teller's NVTX function wrapper, loaded by ``teller collect --nvtx-json`` without code changes.

This directory is put first on ``PYTHONPATH``; Python imports this ``sitecustomize`` at start-up (also
in children and spawned workers, which inherit the environment). It

1. chain-loads any other ``sitecustomize`` further down ``sys.path`` (so a site's own keeps working);
2. reads the groups in ``$TELLER_NVTX_JSON`` (``[{"module": "m", "functions": ["f", "Cls.meth"],
   "domain": "d", "name": "{module}.{qualname}"}]``, the shape Nsight Systems users know);
3. wraps those functions in NVTX ranges as soon as their module is imported (an import hook on
   ``sys.meta_path``), before ``from m import f`` can bind the original.

Name formats may use ``{module}``, ``{qualname}``, ``{function}`` and ``{cls}`` (the class of the
first argument at call time, e.g. ``"{cls}"`` names each ``torch.nn.Module`` call by its class; for a
classmethod the class it is called on, for a staticmethod the class named). Only functions are
wrapped: a class, property, constant or other callable object is reported and left as it is.
Nothing here may break the host program: every failure is reported once on stderr and skipped.
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.util
import json
import os
import string
import sys
import types

_HOOK_DIR = os.path.dirname(os.path.abspath(__file__))


def _warn(msg: str) -> None:
    try:
        sys.stderr.write(f"[teller] {msg}\n")
    except Exception:  # noqa: BLE001 - never break the host
        pass


# Which of the --nvtx-json modules the program's Python processes imported, for the whole run: one line
# per event, appended to a file of the run directory that teller reads when the program has exited
# (a process killed before its exit handlers has still said what it imported). Lines: "hook" (this
# process wraps the groups), "hook-off" (it cannot: said on its stderr), "imported MODULE".
IMPORTS_FILE = ".nvtx-imports"


def _record(line: str) -> None:
    d = os.environ.get("TELLER_RUN_DIR")
    if not d:
        return
    try:
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)
        fd = os.open(os.path.join(d, IMPORTS_FILE), flags, 0o644)
        try:
            os.write(fd, (line + "\n").encode("utf-8"))  # (one short O_APPEND write: whole)
        finally:
            os.close(fd)
    except OSError:
        pass


def _chain_load() -> None:
    """Import the next sitecustomize on sys.path after ours, if any (ours shadows it). Only those
    after ours: one before it is another tool's hook that chain-loads in turn, and loading it again
    would make the two load each other without end. (Runs once per process: the guard below.)"""
    absolute = [os.path.abspath(p or ".") for p in sys.path]
    after = absolute.index(_HOOK_DIR) + 1 if _HOOK_DIR in absolute else 0
    paths = [p for p, a in zip(sys.path[after:], absolute[after:]) if a != _HOOK_DIR]  # noqa: B905 (3.9)
    for p in paths:
        cand = os.path.join(p or ".", "sitecustomize.py")
        if os.path.isfile(cand):
            try:
                spec = importlib.util.spec_from_file_location("_teller_chained_sitecustomize", cand)
                if spec and spec.loader:
                    mod = importlib.util.module_from_spec(spec)
                    spec.loader.exec_module(mod)
            except Exception as e:  # noqa: BLE001
                _warn(f"the chained sitecustomize {cand} failed: {e!r}")
            return


# -- range emitters ----------------------------------------------------------------------------------


def _emitter():
    """(pusher(message, domain, color), popper(domain)): each gives a callable of no arguments that
    pushes (pops) that range, through the nvtx package, else torch.cuda.nvtx. Bound once per label
    and domain, so a wrapped call pays two C calls and no lookups (a wrapped `Module._call_impl`
    cost 800-900 ns more than a bare one with per-call lookups, about 340 ns bound)."""
    try:
        import nvtx  # type: ignore[import-not-found]

        # Domain objects and event attributes are built once per (label, domain, color): pushing a
        # cached attributes object costs about half of `nvtx.push_range(message=...)`.
        domains: dict = {}

        def domain_of(name: str | None):
            d = domains.get(name)
            if d is None:
                d = domains[name] = nvtx.get_domain(name)
            return d

        def pusher(message: str, domain: str | None, color: str | None):
            d = domain_of(domain)
            attrs = d.get_event_attributes(message=message, color=color_argb(color))
            return functools.partial(d.push_range, attrs)

        def popper(domain: str | None):
            return domain_of(domain).pop_range

        return pusher, popper
    except ImportError:
        pass
    if importlib.util.find_spec("torch") is None:
        return None
    # torch.cuda.nvtx, imported when the first wrapped function runs (not at start-up in every
    # process: importing torch takes seconds, and a program may set OMP_NUM_THREADS before it does),
    # and checked once there without pushing a range (a probe range would be recorded): torch
    # without CUDA has the module, but its `_nvtx` is a stub that raises "NVTX functions not
    # installed" on first use
    import threading

    state: list = []
    busy: list = []
    # (re-entrant: a wrapped function called inside torch's own import, on the importing thread,
    # runs without a range, its push and its pop both; other threads wait for the answer, so that
    # no thread pops a range it never pushed)
    lock = threading.RLock()

    def resolve():
        if state:
            return state[0]
        with lock:
            if state:
                return state[0]
            if busy:
                return (_noop, _noop)
            busy.append(True)
            pair = (_noop, _noop)
            try:
                from torch.cuda import nvtx as tnvtx  # type: ignore[import-not-found]

                native = getattr(tnvtx, "_nvtx", None)
                for name in ("rangePushA", "rangePop"):
                    # (torch's stub binds one `_fail` to every name; the real ones carry their own)
                    if getattr(getattr(native, name, None), "__name__", None) != name:
                        raise RuntimeError("NVTX functions not installed (a torch without CUDA)")
                pair = (tnvtx.range_push, tnvtx.range_pop)
            except Exception as e:  # noqa: BLE001
                _record("hook-off")
                _warn(
                    "--nvtx-json: the `nvtx` package is not installed and torch.cuda.nvtx cannot push "
                    f"ranges ({e}); no ranges recorded (pip install nvtx)"
                )
            finally:
                busy.clear()
            state.append(pair)
            return pair

    def pusher(message: str, domain: str | None, color: str | None):
        label = message if not domain else f"{domain}:{message}"
        return lambda: resolve()[0](label)

    def popper(domain: str | None):
        return lambda: resolve()[1]()

    return pusher, popper


def _noop(*_args) -> None:
    return None


# Whether torch.compile is tracing the caller (torch.compiler.is_compiling, once torch is imported):
# a wrapped function then runs as it is, with no range. Dynamo reads the check as true and traces
# the plain call; it cannot trace the NVTX calls (fullgraph=True failed, and without it every wrapped
# module call broke the graph, so what ran was not the program's compiled graph).
_compiling = _noop


def _on_torch(module) -> None:
    global _compiling
    fn = getattr(getattr(module, "compiler", None), "is_compiling", None)
    if fn is not None:
        _compiling = fn
    elif hasattr(module, "compile"):
        # torch 2.0-2.2: torch._dynamo.is_compiling, read once Dynamo is imported (it is heavy: not
        # imported here), which happens before anything is compiled
        def compiling() -> bool:
            dyn = sys.modules.get("torch._dynamo")
            f = getattr(dyn, "is_compiling", None)
            return bool(f()) if f is not None else False

        _compiling = compiling
    # (torch 1.x has no torch.compile: nothing to look for)


_EMIT = None


# code flags of functions whose body runs later, in parts: generator, coroutine, iterable
# coroutine, async generator (`inspect` would cost its import in every collected process)
_SUSPENDS = 0x20 | 0x80 | 0x100 | 0x200


# what may be wrapped: Python functions and C functions or method descriptors. Anything else put in
# its place would change what the program sees: a class would stop being a type (isinstance fails),
# a property would read as a bound method, a constant would become a function, a callable object
# (an lru_cache wrapper, a scripted function) would lose its own methods
_FUNCTION_TYPES = (
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodDescriptorType,
    types.WrapperDescriptorType,
    types.ClassMethodDescriptorType,
)
# compiled functions of other makers, by their type's name (their modules are not imported here):
# Cython's, plain and fused; they behave as functions do, so a wrapper changes nothing they show
_FUNCTION_TYPE_NAMES = {"cython_function_or_method", "fused_cython_function"}


class _Refused(Exception):
    """What is not wrapped, and why (said as it is; other errors with their type)."""


def _not_a_function(fn) -> str | None:
    """Why ``fn`` is not wrapped, or None when it can be."""
    if isinstance(fn, _FUNCTION_TYPES) or type(fn).__name__ in _FUNCTION_TYPE_NAMES:
        return None
    if isinstance(fn, type):
        return "a class, not a function: name its methods (Cls.__init__, Cls.__call__); not wrapped"
    if isinstance(fn, property):
        return "a property, not a function; not wrapped"
    if callable(fn):
        return (
            f"a callable {type(fn).__name__} object, not a function (a wrapper would hide its own "
            "attributes); not wrapped"
        )
    kind = type(fn).__name__
    return f"{'an' if kind[:1] in 'aeiou' else 'a'} {kind}, not a function; not wrapped"


from _teller_nvtx_colors import color_argb  # noqa: E402  (beside this file, first on the path)


def _wrap(
    fn,
    label_fmt: str,
    module: str,
    qualname: str,
    domain: str | None,
    color: str | None,
    dynamic: bool,
    owner: str = "",
    kind: str = "function",
):
    """``fn`` in a push/pop range. ``kind``: "function" (``{cls}``: the class of the first argument),
    "classmethod" (the class it is called on), or "staticmethod" (``owner``, the class named)."""
    if getattr(fn, "__teller_wrapped__", False):
        return fn
    why = _not_a_function(fn)
    if why:
        raise _Refused(why)
    if kind == "staticmethod":
        dynamic = False
    flags = getattr(getattr(fn, "__code__", None), "co_flags", 0)
    if flags & _SUSPENDS:
        # a push/pop range would cover only making the generator or coroutine, and ranges of
        # interleaved coroutines on one thread would pop each other's
        raise _Refused("a generator or async function: a push/pop range cannot follow it; not wrapped")
    pusher, popper = _EMIT
    function = qualname.rsplit(".", 1)[-1]
    # (a name with a field it does not know fails here, where the caller says so and leaves the
    # function as it is, not at every call of the user's program)
    label = label_fmt.format(module=module, qualname=qualname, function=function, cls=owner)
    pop = popper(domain)
    by_class = kind == "classmethod"
    if not dynamic:
        push = pusher(label, domain, color)

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if _compiling():
                return fn(*args, **kwargs)
            try:
                push()
            except Exception:  # noqa: BLE001 - never break the host: the call runs without a range
                return fn(*args, **kwargs)
            try:
                return fn(*args, **kwargs)
            finally:
                _pop_quietly(pop)

    else:
        pushes: dict = {}  # class -> its label's push, for dynamic ({cls}) names

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if _compiling():
                return fn(*args, **kwargs)
            cls = (args[0] if by_class else type(args[0])) if args else None
            p = pushes.get(cls)
            if p is None:
                if len(pushes) >= 4096:  # (torch.fx makes a class per graph: the cache stays bounded)
                    pushes.clear()
                name = getattr(cls, "__name__", owner) if args else owner
                label = label_fmt.format(module=module, qualname=qualname, function=function, cls=name)
                p = pushes[cls] = pusher(label, domain, color)
            try:
                p()
            except Exception:  # noqa: BLE001 - never break the host: the call runs without a range
                return fn(*args, **kwargs)
            try:
                return fn(*args, **kwargs)
            finally:
                _pop_quietly(pop)

    wrapper.__teller_wrapped__ = True  # type: ignore[attr-defined]
    return wrapper


def _pop_quietly(pop) -> None:
    try:
        pop()
    except Exception:  # noqa: BLE001 - never break the host (nor replace what the call returned)
        pass


def _patch(module, groups) -> None:
    mname = module.__name__
    for g in groups:
        fmt = g.get("name") or "{module}.{qualname}"
        # (by the parsed fields, not the text "{cls}": "{cls!s}" and "{cls:>8}" name the class too)
        dynamic = any(f == "cls" for _, f, _, _ in string.Formatter().parse(fmt))
        for spec in g["functions"]:
            try:
                if "." in spec:
                    cls_name, meth = spec.split(".", 1)
                    owner = getattr(module, cls_name, None)
                    if not isinstance(owner, type):
                        _warn(f"--nvtx-json: cannot wrap {mname}.{spec}: {mname} has no class {cls_name!r}")
                        continue
                    # (an inherited method is wrapped for this class: set on it, the base left alone)
                    base = next((c for c in owner.__mro__ if meth in c.__dict__), None)
                    if base is None:
                        _warn(f"--nvtx-json: cannot wrap {mname}.{spec}: {cls_name} has no method {meth!r}")
                        continue
                    raw = base.__dict__[meth]
                    if base is not owner:  # (inherited, perhaps wrapped for its base already: its own label)
                        inner = getattr(raw, "__func__", raw)
                        if getattr(inner, "__teller_wrapped__", False) and hasattr(inner, "__wrapped__"):
                            inner = inner.__wrapped__
                            raw = type(raw)(inner) if isinstance(raw, (staticmethod, classmethod)) else inner
                    bound_c = type(raw).__name__ == "instancemethod"
                    if bound_c:  # (pybind11's methods: the function inside, which takes the instance)
                        raw = raw.__func__
                    args = (fmt, mname, spec, g.get("domain"), g.get("color"), dynamic, owner.__name__)
                    if isinstance(raw, staticmethod):
                        setattr(owner, meth, staticmethod(_wrap(raw.__func__, *args, kind="staticmethod")))
                    elif isinstance(raw, classmethod):
                        setattr(owner, meth, classmethod(_wrap(raw.__func__, *args, kind="classmethod")))
                    elif isinstance(raw, types.BuiltinFunctionType) and not bound_c:
                        # (a C function stored on a class is no descriptor, called without the
                        # instance; a Python wrapper would be bound and given it: kept unbound)
                        setattr(owner, meth, staticmethod(_wrap(raw, *args, kind="staticmethod")))
                    else:
                        setattr(owner, meth, _wrap(raw, *args))
                else:
                    fn = getattr(module, spec, None)
                    if fn is None:
                        _warn(f"--nvtx-json: cannot wrap {mname}.{spec}: {mname} has no function {spec!r}")
                        continue
                    setattr(
                        module, spec, _wrap(fn, fmt, mname, spec, g.get("domain"), g.get("color"), dynamic)
                    )
            except _Refused as e:
                _warn(f"--nvtx-json: cannot wrap {mname}.{spec}: {e}")
            except Exception as e:  # noqa: BLE001
                _warn(f"--nvtx-json: cannot wrap {mname}.{spec}: {e!r}")


# module name -> callbacks to run on the module right after it is executed (imported)
_AFTER_IMPORT: dict = {}


def _after_import(name: str, cb) -> None:
    mod = sys.modules.get(name)
    if mod is not None:
        cb(mod)
    else:
        _AFTER_IMPORT.setdefault(name, []).append(cb)


class _AfterExecLoader(importlib.abc.Loader):
    """The loader of a module in _AFTER_IMPORT: its callbacks are taken when the module is executed,
    not when its spec is found (``importlib.util.find_spec`` asks for one and imports nothing, as
    transformers does of torch: the later import must still run them)."""

    def __init__(self, inner, name: str) -> None:
        self._inner = inner
        self._name = name

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module) -> None:
        self._inner.exec_module(module)
        for cb in _AFTER_IMPORT.pop(self._name, ()):
            try:
                cb(module)
            except Exception as e:  # noqa: BLE001
                _warn(f"post-import hook for {module.__name__} failed: {e!r}")

    def __getattr__(self, name):
        return getattr(self._inner, name)


class _Finder(importlib.abc.MetaPathFinder):
    """Wraps the loader of the modules in _AFTER_IMPORT so their callbacks run before the import
    returns (so `from m import f` already sees the wrapped function)."""

    _teller = True

    def find_spec(self, fullname, path, target=None):
        if fullname not in _AFTER_IMPORT:
            return None
        for finder in sys.meta_path:
            # (another teller finder, of a second copy of this module, would ask this one back)
            if finder is self or getattr(finder, "_teller", False) or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _AfterExecLoader(spec.loader, fullname)
                return spec
        return None


def _enable_torch_nvtx() -> None:
    """TELLER_TORCH_NVTX=1: torch's own per-operator NVTX ranges (needs a CUDA build and a GPU)."""

    def on_torch(module) -> None:
        try:
            if module.cuda.is_available():
                ctx = module.autograd.profiler.emit_nvtx(record_shapes=False)
                ctx.__enter__()
                sys.modules[__name__].__dict__["_TORCH_NVTX_CTX"] = ctx
            else:
                _warn("--torch-nvtx: torch sees no GPU; torch's operator ranges are not available")
        except Exception as e:  # noqa: BLE001
            _warn(f"--torch-nvtx: {e!r}")

    _after_import("torch", on_torch)


def _install_fault_delays() -> None:
    """TELLER_FAULT_DELAY (fault-injection runs only): a JSON list of
    ``{"module", "function", "delay_ms", "start_s", "end_s", "start_call", "end_call"}``; calls number
    ``start_call..end_call`` of that function sleep ``delay_ms`` while the process is between
    ``start_s`` and ``end_s`` seconds old (each bound optional)."""
    spec = os.environ.get("TELLER_FAULT_DELAY")
    if not spec:
        return
    import time

    t0 = time.monotonic()
    try:
        items = json.loads(spec)
    except ValueError as e:
        _warn(f"TELLER_FAULT_DELAY is not JSON: {e}")
        return

    def patch(module, item) -> None:
        owner, _, attr = item["function"].rpartition(".")
        target = getattr(module, owner) if owner else module
        fn = getattr(target, attr)
        delay, start, end = item["delay_ms"] / 1000.0, item.get("start_s", 0.0), item.get("end_s", 1e18)
        first, last = item.get("start_call", 0), item.get("end_call", 1 << 62)
        calls = [0]

        @functools.wraps(fn)
        def slowed(*args, **kwargs):
            k = calls[0]
            calls[0] = k + 1
            if first <= k < last and start <= time.monotonic() - t0 < end:
                time.sleep(delay)
            return fn(*args, **kwargs)

        setattr(target, attr, slowed)

    for item in items:
        _after_import(item["module"], functools.partial(patch, item=item))


def _install() -> None:
    global _EMIT
    _install_fault_delays()
    path = os.environ.get("TELLER_NVTX_JSON")
    if os.environ.get("TELLER_TORCH_NVTX") == "1":
        _enable_torch_nvtx()
    if not path:
        return
    try:
        with open(path, encoding="utf-8") as f:
            groups = json.load(f)
    except Exception as e:  # noqa: BLE001
        _warn(f"--nvtx-json: cannot read {path}: {e!r}")
        return
    _EMIT = _emitter()
    if _EMIT is None:
        _record("hook-off")
        _warn("--nvtx-json: neither the `nvtx` package nor torch.cuda.nvtx is importable; no ranges recorded")
        return
    _record("hook")
    _after_import("torch", _on_torch)
    by_module: dict = {}
    for g in groups if isinstance(groups, list) else []:
        if isinstance(g, dict) and isinstance(g.get("module"), str) and isinstance(g.get("functions"), list):
            by_module.setdefault(g["module"], []).append(g)
    for name, gs in by_module.items():
        _after_import(name, functools.partial(_patch, groups=gs))
        # (teller says, after the run, which modules no process imported: a misspelt name, say)
        _after_import(name, lambda _m, n=name: _record(f"imported {n}"))


# Once per process: another tool's hook that loads "the next sitecustomize" may run this file again
# (a second copy of the module): a second install would wrap every function twice and put a second
# finder on sys.meta_path, and two finders that ask each other recurse without end.
if not getattr(sys, "_teller_hook_loaded", False):
    sys._teller_hook_loaded = True  # type: ignore[attr-defined]
    _chain_load()
    try:
        _install()
        if _AFTER_IMPORT:
            sys.meta_path.insert(0, _Finder())
    except Exception as _e:  # noqa: BLE001
        _warn(f"NVTX function wrapping disabled: {_e!r}")
