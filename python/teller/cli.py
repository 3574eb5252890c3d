"""The ``teller`` command line."""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from teller import __version__, build_profile
from teller.errors import TellerError

app = typer.Typer(
    name="teller",
    help="Cross-layer root-cause analysis of LLM inference: collect, align, tokenize, diagnose.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
trace_app = typer.Typer(help="Convert, summarize and inspect traces.", no_args_is_help=True)
app.add_typer(trace_app, name="trace")

console = Console()
err_console = Console(stderr=True)


def _version_cb(value: bool) -> None:
    if value:
        print(f"teller {__version__} ({build_profile} build)")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version_cb, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """teller: find why an LLM inference service is slow or failing."""


def _fail(e: Exception, code: int = 2) -> typer.Exit:
    err_console.print(f"[bold red]error:[/] {e}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


# ---------------------------------------------------------------------------------------------------
# doctor


def _doctor_report(cuda_home: str | None) -> dict[str, object]:
    from teller.cuda import find_cuda

    rep: dict[str, object] = {
        "teller": __version__,
        "build_profile": build_profile,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    try:
        import numpy

        rep["numpy"] = numpy.__version__
    except ImportError:
        rep["numpy"] = None
    info = find_cuda(cuda_home)
    rep["cuda"] = info.to_dict()
    try:
        import torch

        rep["torch"] = torch.__version__
        rep["torch_cuda_build"] = torch.version.cuda
        rep["torch_cuda_available"] = bool(torch.cuda.is_available())
    except ImportError:
        rep["torch"] = None
        rep["torch_cuda_build"] = None
        rep["torch_cuda_available"] = False
    try:
        import transformers

        rep["transformers"] = transformers.__version__
    except ImportError:
        rep["transformers"] = None
    try:
        from teller import shim

        rep["shim"] = shim.status(cuda_home)
    except ImportError:
        rep["shim"] = None
    return rep


@app.command()
def doctor(
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON object.")] = False,
    cuda_home: Annotated[
        str | None, typer.Option(help="CUDA toolkit root to check instead of the defaults.")
    ] = None,
) -> None:
    """Show the build, versions, and whether CUDA/CUPTI/NVTX headers, libcupti and torch CUDA are found."""
    rep = _doctor_report(cuda_home)
    if as_json:
        print(json.dumps(rep, indent=2))
        return
    t = Table(title="teller doctor", show_header=False, title_justify="left")
    t.add_column("item", style="bold")
    t.add_column("value")
    ok = "[green]found[/]"
    missing = "[yellow]not found[/]"
    t.add_row("teller", f"{rep['teller']} ({rep['build_profile']} build)")
    t.add_row("python", str(rep["python"]))
    t.add_row("numpy", str(rep["numpy"]))
    t.add_row(
        "torch",
        f"{rep['torch']} (CUDA build {rep['torch_cuda_build']}, "
        f"GPU available: {rep['torch_cuda_available']})",
    )
    t.add_row("transformers", str(rep["transformers"]))
    cuda = rep["cuda"]
    assert isinstance(cuda, dict)
    for key, label in (
        ("cuda_h", "cuda.h"),
        ("cupti_h", "cupti.h"),
        ("nvtx_h", "NVTX headers"),
        ("libcupti", "libcupti"),
    ):
        v = cuda.get(key)
        t.add_row(label, f"{ok} {v}" if v else missing)
    if cuda.get("cupti_version"):
        t.add_row("CUPTI API version", str(cuda["cupti_version"]))
    shim = rep.get("shim")
    if isinstance(shim, dict):
        t.add_row(
            "collector shim",
            f"{ok} {shim.get('path')}"
            if shim.get("built")
            else f"{missing} ({shim.get('reason', 'not built')})",
        )
    console.print(t)


# ---------------------------------------------------------------------------------------------------
# trace


def _load(inputs: list[str], step_names: list[str] | None):
    from teller import trace

    return trace.load(inputs, step_names=step_names or None, warn=False)


def _fmt_ns(ns: float) -> str:
    if ns >= 1e9:
        return f"{ns / 1e9:.3f} s"
    if ns >= 1e6:
        return f"{ns / 1e6:.3f} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.1f} us"
    return f"{ns:.0f} ns"


StepOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--step-name", help="Glob of the ranges that delimit steps (repeatable; first with matches wins)."
    ),
]


@trace_app.command("convert")
def trace_convert(
    inputs: Annotated[
        list[str],
        typer.Argument(help="Run directories, raw .tmsgpack files, Chrome/Kineto JSON (.json/.json.gz)."),
    ],
    output: Annotated[str, typer.Option("-o", "--output", help="Output Chrome trace (.json or .json.gz).")],
    step_name: StepOpt = None,
) -> None:
    """Merge and align inputs into one Chrome trace that opens in Perfetto (ui.perfetto.dev)."""
    t0 = time.perf_counter()
    try:
        tr = _load(inputs, step_name)
        tr.to_chrome(output)
    except TellerError as e:
        raise _fail(e) from None
    dt = time.perf_counter() - t0
    for w in tr.warnings:
        err_console.print(f"[yellow]warning:[/] {w}", highlight=False, soft_wrap=True)
    console.print(
        f"wrote [bold]{output}[/] ({len(tr)} events, {len(tr.steps())} steps, "
        f"{len(tr.sources)} source(s)) in {dt:.2f} s. Open it at https://ui.perfetto.dev",
        highlight=False,
    )


@trace_app.command("summary")
def trace_summary(
    inputs: Annotated[list[str], typer.Argument(help="Trace files or run directories.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON object.")] = False,
    top: Annotated[int, typer.Option(help="How many kernels to list.")] = 10,
    step_name: StepOpt = None,
) -> None:
    """Events per layer and category, top kernels by GPU time, GPU busy/idle, steps, linking, warnings."""
    try:
        tr = _load(inputs, step_name)
    except TellerError as e:
        raise _fail(e) from None
    s = tr.summary(top)
    if as_json:
        print(json.dumps(s, indent=2))
        return
    console.print(
        f"[bold]{len(tr)}[/] events from {s['sources']} source(s), {s['processes']} process(es), "
        f"{s['threads']} thread(s); span {_fmt_ns(s['span_ns'])}; [bold]{s['steps']}[/] step(s)",
        highlight=False,
    )
    lt = Table(title="events per layer", title_justify="left")
    lt.add_column("layer")
    lt.add_column("events", justify="right")
    for k, v in s["by_layer"].items():
        lt.add_row(k, str(v))
    ct = Table(title="events per category", title_justify="left")
    ct.add_column("category")
    ct.add_column("events", justify="right")
    for k, v in s["by_category"].items():
        ct.add_row(k, str(v))
    console.print(lt)
    console.print(ct)
    linked = s["linked_gpu_events"]
    gpu = s["gpu_events"]
    pct = f"{100 * linked / gpu:.1f}%" if gpu else "n/a"
    console.print(f"GPU activities: {gpu}, linked to their launching call: {linked} ({pct})")
    if s["devices"]:
        dt = Table(title="GPU busy/idle", title_justify="left")
        for c in ("device", "busy", "idle", "busy %"):
            dt.add_column(c, justify="right")
        for d in s["devices"]:
            busy_pct = 100 * d["busy_ns"] / d["span_ns"] if d["span_ns"] else 0.0
            dt.add_row(str(d["device"]), _fmt_ns(d["busy_ns"]), _fmt_ns(d["idle_ns"]), f"{busy_pct:.1f}")
        console.print(dt)
    if s["top_kernels"]:
        kt = Table(title=f"top {len(s['top_kernels'])} kernels by GPU time", title_justify="left")
        kt.add_column("kernel (normalized)")
        kt.add_column("variants", justify="right")
        kt.add_column("count", justify="right")
        kt.add_column("total", justify="right")
        kt.add_column("max", justify="right")
        for k in s["top_kernels"]:
            kt.add_row(
                k["symbol"] or k["name"][:80],
                str(k["variants"]),
                str(k["count"]),
                _fmt_ns(k["total_ns"]),
                _fmt_ns(k["max_ns"]),
            )
        console.print(kt)
    if s["warnings"]:
        console.print(f"[yellow]{len(s['warnings'])} parse warning(s):[/]")
        for w in s["warnings"]:
            console.print(f"  - {w}", highlight=False, soft_wrap=True)


@trace_app.command("tree")
def trace_tree(
    inputs: Annotated[list[str], typer.Argument(help="Trace files or run directories.")],
    step: Annotated[int | None, typer.Option(help="Step index (default: the first step).")] = None,
    max_lines: Annotated[int, typer.Option(help="Lines to print at most.")] = 80,
    step_name: StepOpt = None,
) -> None:
    """Print the call-chain tree of one step."""
    try:
        tr = _load(inputs, step_name)
    except TellerError as e:
        raise _fail(e) from None
    steps = tr.steps()
    k = 0 if step is None else step
    if not 0 <= k < len(steps):
        raise _fail(ValueError(f"step {k} out of range: the trace has {len(steps)} step(s)"))
    st = steps[k]
    console.print(f"step {k}: [bold]{st.name}[/] ({_fmt_ns(st.dur_ns)})", highlight=False)
    print(tr.tree(k).render(max_lines=max_lines))


def main() -> None:
    try:
        app()
    except BrokenPipeError:  # e.g. `teller trace summary x | head`
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(1)


if __name__ == "__main__":
    main()
