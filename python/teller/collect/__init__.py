"""The collector: the C shim (built by :mod:`teller.collect.shim`) and the ``teller collect`` launcher."""

from teller.collect.launcher import RunResult, builtin_profiles, collect, resolve_nvtx_json

__all__ = ["RunResult", "builtin_profiles", "collect", "resolve_nvtx_json"]
