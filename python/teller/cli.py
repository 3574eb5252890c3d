"""The ``teller`` command line."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import platform
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from teller import __version__, build_profile
from teller.errors import ConfigError, TellerError, TellerIOError

app = typer.Typer(
    name="teller",
    help="Cross-layer root-cause analysis of LLM inference: collect, align, tokenize, diagnose.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
trace_app = typer.Typer(help="Convert, summarize and inspect traces.", no_args_is_help=True)
app.add_typer(trace_app, name="trace")
tpe_app = typer.Typer(
    help="Train, apply and inspect TPE (Trace Pair Encoding) tokenizers.", no_args_is_help=True
)
app.add_typer(tpe_app, name="tpe")
shim_app = typer.Typer(help="Build and locate the collector shim (cupti_shim/).", no_args_is_help=True)
app.add_typer(shim_app, name="shim")

# Output piped or redirected (a file, a CI log) is 160 columns wide, not rich's 80: tables keep
# whole kernel names on one line. COLUMNS, where set, still decides.
_PIPE_WIDTH = (
    None
    if (sys.stdout is not None and sys.stdout.isatty()) or os.environ.get("COLUMNS", "").isdigit()
    else 160
)
console = Console(width=_PIPE_WIDTH)
err_console = Console(stderr=True)


@contextmanager
def _progress(label: str) -> Iterator[Callable[[int, int], None]]:
    """A rich progress bar on stderr (hidden when stderr is not a terminal); yields a
    ``callback(done, total)`` for the long-running APIs."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(
        TextColumn(f"[bold]{label}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=err_console,
        transient=True,
        disable=not err_console.is_terminal,
    ) as prog:
        task = prog.add_task(label, total=None)
        yield lambda done, total: prog.update(task, completed=done, total=total)


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


# API argument names whose command-line option is spelled otherwise than `--` + the name with dashes
_FLAG_ALIASES = {"step_names": "--step-name"}
_FLAGS: dict[str, str] = {}


def _as_flags(msg: str) -> str:
    """A ConfigError from the Python API names its arguments (``vocab_size must be ...``); at the
    command line they are options (``--vocab-size must be ...``). Every two-word argument name that is
    an option of some command is said as that option (one-word names read as plain words: left)."""
    import re

    if not _FLAGS:
        _FLAGS.update(_FLAG_ALIASES)
        stack = [typer.main.get_command(app)]
        while stack:
            cmd = stack.pop()
            stack.extend(getattr(cmd, "commands", {}).values())
            for p in cmd.params:
                longs = [o for o in getattr(p, "opts", ()) if o.startswith("--")]
                if p.name and "_" in p.name and longs:
                    _FLAGS.setdefault(p.name, longs[0])
    given = " ".join(sys.argv[1:])  # (a name inside what the user typed, a directory `data_dir`, stays)
    for name, flag in _FLAGS.items():
        if name in given:
            continue
        msg = re.sub(rf"(?<![\w\-.'\"/]){re.escape(name)}(?![\w'\"/]|\.\w)", flag, msg)
    return msg


def _stdout_gone() -> None:
    """Our output's reader has gone (`teller ... | head`): nothing more is said, as with any tool
    whose output was cut short, and the interpreter's last flush must not fail."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


def _fail(e: Exception, code: int = 2) -> typer.Exit:
    stdout_names = ("/dev/stdout", "/dev/fd/1", "/proc/self/fd/1", f"/proc/{os.getpid()}/fd/1")
    if getattr(e, "errno", None) == errno.EPIPE and getattr(e, "path", None) in (None, *stdout_names):
        # (`trace convert -o /dev/stdout | head`: our own output's reader left; a FIFO is said)
        _stdout_gone()
        return typer.Exit(1)
    # (an error naming a file, a configuration file's key say, is about that file: left as it is)
    text = _as_flags(str(e)) if isinstance(e, ConfigError) and e.path is None else str(e)
    # (escaped: a message's [brackets], e.g. "a [min, max] pair", are text, not rich markup)
    err_console.print(f"[bold red]error:[/] {escape(text)}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


def _output_dir(path: str | None, option: str) -> None:
    """Refuse an output directory that is an existing file before any work is done (not after
    minutes of it, with a traceback)."""
    from teller._io import check_output_dir

    if path:
        try:
            check_output_dir(path, f"{option} names a directory")
        except TellerError as e:
            raise _fail(e) from None


def _output_file(path: str, inputs: list[str], option: str) -> None:
    """Refuse an output file that is a directory or one of the inputs (teller._io.check_output_file)."""
    from teller._io import check_output_file

    try:
        check_output_file(path, inputs, option)
    except TellerError as e:
        raise _fail(e) from None


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
        from teller.collect import shim

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
    """Show the build, versions, and whether CUDA/CUPTI/NVTX headers, libcupti and torch CUDA are found.

    A toolkit that lacks some of them is reported (exit 0); an explicit --cuda-home that is not a
    directory is a usage error (exit 2), as for `teller shim build` and `teller collect`.
    """
    from teller.collect.shim import check_cuda_home

    try:
        check_cuda_home(cuda_home)
    except TellerError as e:
        raise _fail(e) from None
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
    for n in cuda.get("notes") or []:
        err_console.print(f"[yellow]warning:[/] {escape(str(n))}", highlight=False, soft_wrap=True)


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
    _output_file(output, [], "--output")
    t0 = time.perf_counter()
    try:
        tr = _load(inputs, step_name)
        _output_file(output, [src["path"] for src in tr.sources], "--output")
        tr.to_chrome(output)
    except TellerError as e:
        raise _fail(e) from None
    dt = time.perf_counter() - t0
    for w in tr.warnings:
        err_console.print(f"[yellow]warning:[/] {escape(str(w))}", highlight=False, soft_wrap=True)
    # (on stderr: with `-o /dev/stdout` the trace itself is on stdout)
    err_console.print(
        f"wrote [bold]{escape(output)}[/] ({len(tr)} events, {len(tr.steps())} steps, "
        f"{len(tr.sources)} source(s)) in {dt:.2f} s. Open it at https://ui.perfetto.dev",
        highlight=False,
    )


@trace_app.command(
    "summary",
    short_help="Events, top kernels, where each GPU's time went, steps, warnings, and what stands out.",
)
def trace_summary(
    inputs: Annotated[list[str], typer.Argument(help="Trace files or run directories.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON object.")] = False,
    top: Annotated[int, typer.Option(min=0, help="How many kernels to list.")] = 10,
    step_name: StepOpt = None,
) -> None:
    """Events per layer and category, top kernels, GPU busy/idle, launch delay, sync wait, where each
    GPU's time went (compute, communication, copies; idle time by what the GPU waited for: the host,
    a launch, queued work), steps, warnings, and findings: what stands out, largest share of time
    first (GPU waiting for the host, launch-bound, queued work, exposed communication, a straggler
    rank, a slow step)."""
    try:
        tr = _load(inputs, step_name)
    except TellerError as e:
        raise _fail(e) from None
    from teller.findings import findings

    s = tr.summary(top)
    s["findings"] = findings(tr, s)
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
        lt.add_row(escape(k), str(v))
    ct = Table(title="events per category", title_justify="left")
    ct.add_column("category")
    ct.add_column("events", justify="right")
    for k, v in s["by_category"].items():
        ct.add_row(escape(k), str(v))  # (a Chrome `cat` is free text: "io[/]" is no markup)
    console.print(lt)
    console.print(ct)
    linked = s["linked_gpu_events"]
    gpu = s["gpu_events"]
    pct = f"{100 * linked / gpu:.1f}%" if gpu else "n/a"
    console.print(f"GPU activities: {gpu}, linked to their launching call: {linked} ({pct})")
    if s["devices"]:
        from teller.findings import gpu_names

        names = [n.removeprefix("GPU ") for n in gpu_names(s["devices"], tr.sources)]
        from teller._term import table_or_list

        # (drawn where every number and header fits whole, else listed per GPU: a table squeezed by
        # long per-rank names folded "157.500 ms" over two lines and cut the names to one prefix)
        rows = []
        for d, name in zip(s["devices"], names, strict=True):
            busy_pct = 100 * d["busy_ns"] / d["span_ns"] if d["span_ns"] else 0.0
            has = d["launches"] > 0
            rows.append(
                (
                    name,
                    _fmt_ns(d["busy_ns"]),
                    _fmt_ns(d["idle_ns"]),
                    f"{busy_pct:.1f}",
                    _fmt_ns(d["launch_delay_p50_ns"]) if has else "-",
                    _fmt_ns(d["launch_delay_p99_ns"]) if has else "-",
                    _fmt_ns(d["sync_ns"]),
                )
            )
        table_or_list(
            console,
            "GPU busy/idle, launch delay, sync wait",
            ("device", "busy", "idle", "busy %", "launch\ndelay p50", "p99", "sync\nwait"),
            rows,
            right=True,
            fields=("busy", "idle", "busy_%", "launch_delay_p50", "launch_delay_p99", "sync_wait"),
            title_justify="left",
            name_prefix="GPU ",
            min_name=max(map(len, names)),  # (a name folded inside the table is no better than cut)
        )
        rows = []
        for d, name in zip(s["devices"], names, strict=True):
            sp = d["span_ns"] or 1

            def pc(ns: int, sp: int = sp) -> str:
                return f"{100 * ns / sp:.1f}"

            rows.append(
                (
                    name,
                    pc(d["compute_ns"]),
                    pc(d["comm_ns"]),
                    f"{100 * d['comm_compute_overlap_ns'] / d['comm_ns']:.0f} %" if d["comm_ns"] else "-",
                    pc(d["memory_ns"]),
                    pc(d["idle_host_ns"]),
                    pc(d["idle_launch_ns"]),
                    pc(d["idle_queued_ns"]),
                    pc(d["idle_unlinked_ns"]),
                )
            )
        # (short headers broken where they should be: at 80 columns every header is whole)
        table_or_list(
            console,
            "where each GPU's time went (% of its span; idle by what it waited for)",
            (
                "GPU",
                "compute",
                "comm",
                "comm\noverlap",
                "memory",
                "idle:\nhost",
                "launch",
                "queued",
                "unlinked",
            ),
            rows,
            right=True,
            fields=(
                "compute",
                "comm",
                "comm_overlap",
                "memory",
                "idle_host",
                "idle_launch",
                "idle_queued",
                "idle_unlinked",
            ),
            title_justify="left",
            name_prefix="GPU ",
            min_name=max(map(len, names)),  # (a name folded inside the table is no better than cut)
        )
    if s["top_kernels"]:
        kt = Table(title=f"top {len(s['top_kernels'])} kernels by GPU time", title_justify="left")
        kt.add_column("kernel (normalized)")
        kt.add_column("variants", justify="right")
        kt.add_column("count", justify="right")
        kt.add_column("total", justify="right")
        kt.add_column("max", justify="right")
        for k in s["top_kernels"]:
            kt.add_row(
                escape(k["symbol"] or k["name"][:80]),
                str(k["variants"]),
                str(k["count"]),
                _fmt_ns(k["total_ns"]),
                _fmt_ns(k["max_ns"]),
            )
        console.print(kt)
    from teller.trace import split_collector_notes

    notes, warnings = split_collector_notes(s["warnings"])
    if notes:
        console.print(f"{len(notes)} collector note(s):")
        for w in notes:
            console.print(f"  - {escape(str(w))}", highlight=False, soft_wrap=True, style="dim")
    if warnings:
        console.print(f"[yellow]{len(warnings)} parse warning(s):[/]")
        for w in warnings:
            console.print(f"  - {escape(str(w))}", highlight=False, soft_wrap=True)
    _print_findings(s["findings"])


def _print_findings(fs: list[dict[str, Any]]) -> None:
    """The findings (`teller.findings`) as a list; says so when there are none."""
    if not fs:
        console.print("findings: nothing above the thresholds (docs/findings.md)")
        return
    from teller.findings import group_findings

    grouped = group_findings(fs)
    console.print(f"[bold]findings[/] ({len(grouped)}, largest share of time first):")
    for f in grouped:
        console.print(f"  - {escape(f['message'])}", highlight=False, soft_wrap=True)


@trace_app.command(
    "compare",
    short_help="What changed from a healthy capture to a slow one: step time, GPU time, symbols.",
)
def trace_compare(
    baseline: Annotated[str, typer.Argument(help="The healthy capture: a trace file or run directory.")],
    current: Annotated[str, typer.Argument(help="The capture to explain: a trace file or run directory.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON object.")] = False,
    top: Annotated[int, typer.Option(min=0, help="How many symbols to list.")] = 15,
    step_name: StepOpt = None,
    perfetto: Annotated[
        str | None,
        typer.Option(
            "--perfetto",
            help="Also write both captures into one Perfetto trace (.json or .json.gz), the current "
            "one below the baseline, their first steps aligned.",
        ),
    ] = None,
) -> None:
    """Compare two captures of the same workload (teller.compare): the median step time (and, where
    the steps record their load and it moved, their time for that load), each GPU's time breakdown (compute,
    communication, copies, idle by what it waited for; GPUs paired by rank, else in order where both
    have as many), the symbols (kernels, operators, API calls, ranges) whose time per step changed
    most (host ranges by self time; per capture where either has no steps), the kernel time by class
    (GEMM, attention, communication, ...: a class whose work ran on other kernels, say after a
    library upgrade, is one change, not a kernel gone and one new), then the changes worth a
    sentence. A healthy run of the same service is the reference where the RCA models know nothing
    of the deployment."""
    try:
        base = _load([baseline], step_name)
        cur = _load([current], step_name)
    except TellerError as e:
        raise _fail(e) from None
    from teller.compare import compare, side_by_side

    c = compare(base, cur, top, step_patterns=step_name)
    if perfetto is not None:
        try:
            from teller._io import check_output_file

            check_output_file(perfetto, [s["path"] for tr_ in (base, cur) for s in tr_.sources], "--perfetto")
            sbs = side_by_side(base, cur, perfetto, step_patterns=step_name)
        except TellerError as e:
            raise _fail(e) from None
        c["perfetto"] = {"path": str(perfetto), **sbs}
        err_console.print(
            f"wrote {escape(str(perfetto))}: both captures on one timeline (baseline above; the current "
            f"one shifted by {sbs['shift_us'] / 1e3:.3f} ms so that their first steps, or first events, "
            "start together). "
            "Open it at https://ui.perfetto.dev",
            highlight=False,
            soft_wrap=True,
        )
    if as_json:
        print(json.dumps({"baseline": baseline, "current": current, **c}, indent=2))
        return
    unit = c["unit"]
    for what, path, tr_, st in (
        ("baseline", baseline, base, c["steps"]["baseline"]),
        ("current ", current, cur, c["steps"]["current"]),
    ):
        when = (
            f"{st['count']} step(s), median {_fmt_ns(int(st['median_ns']))}"
            if unit == "step"
            # (the step ranges --step-name matches: steps the loader made up for a trace without any,
            # which `trace summary` counts, are not compared)
            else f"{st['count'] or 'no'} step range(s) (compared whole: span {_fmt_ns(int(st['span_ns']))})"
        )
        console.print(f"{what} {escape(path)}: {len(tr_)} events, {when}", highlight=False, soft_wrap=True)
    if c["symbols"]:
        st = Table(title=f"largest changes of time per {unit} (host ranges: self time)", title_justify="left")
        for col in ("symbol", "layer", "baseline", "current", "change", "ratio", f"events per {unit}"):
            st.add_column(col, justify="left" if col in ("symbol", "layer") else "right")
        for r in c["symbols"]:
            st.add_row(
                escape(r["symbol"][:90]),
                escape(r["layer"] or ""),
                _fmt_ns(int(r["baseline_ns"])),
                _fmt_ns(int(r["current_ns"])),
                ("+" if r["delta_ns"] >= 0 else "-") + _fmt_ns(int(abs(r["delta_ns"]))),
                # (no ratio: new where only the current capture has it, else a baseline time of 0)
                f"{r['ratio']:.2f}x"
                if r["ratio"] is not None
                else "new"
                if r["only_in"] == "current"
                else "-",
                f"{r['baseline_count']:.3g} -> {r['current_count']:.3g}",
            )
        console.print(st)
    if c["gpus"]:
        from teller.compare import BREAKDOWN  # (in this order)

        gt = Table(title="where the GPU time went (% of span: baseline -> current)", title_justify="left")
        gt.add_column("GPU")
        for label in ("compute", "comm", "copies", "idle: host", "launch", "queued"):
            gt.add_column(label, justify="right")
        for g in c["gpus"]:
            was = g.get("baseline_gpu")
            gt.add_row(
                escape(g["gpu"] if was in (None, g["gpu"]) else f"{was} -> {g['gpu']}"),
                *(f"{100 * g['baseline'][f]:.1f} -> {100 * g['current'][f]:.1f}" for f, _ in BREAKDOWN),
            )
        console.print(gt)
    if c["kernel_classes"]:
        kt = Table(
            title=f"kernel time per {unit} by class (whichever kernels did the work)", title_justify="left"
        )
        for col in ("class", "baseline", "current", "change", "ratio", "kernels new / gone"):
            kt.add_column(col, justify="left" if col == "class" else "right")
        for a in c["kernel_classes"]:
            kt.add_row(
                escape(a["class"]),
                _fmt_ns(int(a["baseline_ns"])),
                _fmt_ns(int(a["current_ns"])),
                ("+" if a["delta_ns"] >= 0 else "-") + _fmt_ns(int(abs(a["delta_ns"]))),
                f"{a['ratio']:.2f}x" if a["ratio"] is not None else "new" if a["new"] else "-",
                f"{len(a['new'])} / {len(a['gone'])}",
            )
        console.print(kt)
    if c["statements"]:
        console.print(
            "[bold]what changed[/] (largest first; the calls that wait for the GPU after the rest):"
        )
        for s in c["statements"]:
            console.print(f"  - {escape(s)}", highlight=False, soft_wrap=True)
    else:
        console.print("what changed: nothing above the thresholds (docs/findings.md)")


@trace_app.command("tree")
def trace_tree(
    inputs: Annotated[list[str], typer.Argument(help="Trace files or run directories.")],
    step: Annotated[int | None, typer.Option(help="Step index (default: the first step).")] = None,
    max_lines: Annotated[int, typer.Option(min=0, help="Lines to print at most.")] = 80,
    step_name: StepOpt = None,
) -> None:
    """Print the call-chain tree of one step."""
    try:
        tr = _load(inputs, step_name)
    except TellerError as e:
        raise _fail(e) from None
    steps = tr.steps()
    k = 0 if step is None else step
    try:
        tree = tr.tree(k)  # (a ConfigError naming the step range)
    except TellerError as e:
        # (which trace: as tpe encode says it)
        raise _fail(ConfigError(f"{', '.join(inputs)}: {e}") if isinstance(e, ConfigError) else e) from None
    st = steps[k]
    # (a step's name is the trace's text: "MoE[experts=16, ...]" is no markup)
    console.print(f"step {k}: [bold]{escape(st.name)}[/] ({_fmt_ns(st.dur_ns)})", highlight=False)
    print(tree.render(max_lines=max_lines))


# ---------------------------------------------------------------------------------------------------
# collect


def _collect(
    cmd: Annotated[list[str], typer.Argument(help="The command to run, after `--`.", show_default=False)],
    trace_dir: Annotated[
        str | None,
        typer.Option(help="Where run directories go (default: $TELLER_TRACE_DIR, else ./teller-traces)."),
    ] = None,
    cuda_home: Annotated[str | None, typer.Option(help="CUDA toolkit root for headers and libcupti.")] = None,
    nvtx_json: Annotated[
        str | None,
        typer.Option(
            help="JSON list of {module, functions, domain, name, color} groups to wrap in NVTX ranges, or a "
            "built-in profile: torch, transformers, vllm."
        ),
    ] = None,
    so: Annotated[
        str | None, typer.Option(help="A prebuilt libteller_shim.so to inject instead of building one.")
    ] = None,
    no_convert: Annotated[bool, typer.Option("--no-convert", help="Keep the raw files only.")] = False,
    torch_nvtx: Annotated[
        bool,
        typer.Option(
            "--torch-nvtx", help="Also enable torch's own per-operator NVTX ranges (CUDA torch + GPU)."
        ),
    ] = False,
    baseline: Annotated[
        str | None,
        typer.Option(
            "--baseline",
            help="A healthy run (directory or trace) of the same program: when the run ends, say what "
            "changed from it (teller trace compare).",
        ),
    ] = None,
    pty: Annotated[
        bool | None,
        typer.Option(
            "--pty/--no-pty",
            help="Give the program pseudo-terminals for stdout and stderr (line-buffered, coloured, sized "
            "output) or pipes. Default: a pseudo-terminal for each of teller's streams that is a terminal.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Run an unmodified program with the collector injected: NVTX ranges, CUDA API calls, GPU work, logs."""
    from teller.collect import collect

    _output_dir(trace_dir, "--trace-dir")
    base_tr = None
    if baseline is not None:  # (read before the program runs: a bad one is said now, not hours later)
        if not Path(baseline).exists():
            raise _fail(TellerError(f"--baseline {baseline}: no such file or directory"))
        try:
            base_tr = _load([baseline], None)
        except TellerError as e:
            raise _fail(TellerError(f"--baseline: {e}")) from None
    try:
        res = collect(
            list(cmd),
            trace_dir=trace_dir,
            cuda_home=cuda_home,
            nvtx_json=nvtx_json,
            so=so,
            convert=not no_convert,
            torch_nvtx=torch_nvtx,
            pty=pty,
        )
    except TellerError as e:
        # (as a shell says it: 127 the program was not found, 126 it could not be executed)
        code = 2
        if e.path is not None and e.path == cmd[0]:
            code = 127 if isinstance(e, FileNotFoundError) else 126
        raise _fail(e, code) from None
    from teller.trace import split_collector_notes

    notes, warnings = split_collector_notes(list(res.warnings))
    for w in notes:
        err_console.print(
            f"teller: collector: {escape(str(w))}", highlight=False, soft_wrap=True, style="dim"
        )
    for w in warnings:
        err_console.print(f"[yellow]teller warning:[/] {escape(str(w))}", highlight=False, soft_wrap=True)
    s = res.summary
    if s is not None:
        err_console.print(
            f"[bold]teller:[/] {s['events']} events "
            f"({', '.join(f'{k} {v}' for k, v in s['by_layer'].items())}), "
            f"{s['steps']} step(s); GPU activities {s['gpu_events']}, linked {s['linked_gpu_events']}",
            highlight=False,
            soft_wrap=True,
        )
        from teller.findings import group_findings

        # (all of them: summary.json, teller trace summary)
        for f in group_findings(s.get("findings") or [])[:3]:
            err_console.print(f"[bold]teller:[/] {escape(f['message'])}", highlight=False, soft_wrap=True)
    if base_tr is not None and s is None:
        err_console.print(
            "[yellow]teller warning:[/] --baseline: no trace of this run to compare"
            + (" (--no-convert)" if no_convert else ""),
            highlight=False,
        )
    elif base_tr is not None:
        # (the run is written whatever happens here: a run that cannot be read back is a warning)
        from teller.compare import compare

        try:
            c = compare(base_tr, _load([str(res.run_dir)], None))
        except TellerError as e:
            err_console.print(f"[yellow]teller warning:[/] --baseline: {escape(str(e))}", highlight=False)
        else:
            said = c["statements"][:3] or ["nothing above the thresholds"]
            for line in said:
                err_console.print(
                    f"[bold]teller:[/] against the baseline: {escape(line)}", highlight=False, soft_wrap=True
                )
    if res.trace_json:
        err_console.print(
            f"[bold]teller:[/] Perfetto trace: {escape(str(res.trace_json))}", highlight=False, soft_wrap=True
        )
    status = f"exit status {res.returncode}"
    if res.exit_signal:  # (not an exit code above 128: `exit 137` is no SIGKILL)
        import signal

        with contextlib.suppress(ValueError):
            status = f"killed by {signal.Signals(res.exit_signal).name}, {status}"
    err_console.print(
        f"[bold]teller:[/] run directory: {escape(str(res.run_dir))} ({status})",
        highlight=False,
        soft_wrap=True,
    )
    global _DIE_BY
    import signal

    if res.exit_signal in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        # the program was stopped by one: teller ends by it too once all is written (main), as the
        # program would alone, so that a shell loop around `teller collect` stops on Ctrl-C (bash
        # goes on after a child that exits 130 and stops after one killed by SIGINT)
        _DIE_BY = res.exit_signal
    raise typer.Exit(130 if res.interrupted else res.returncode)


# the signal that stopped the collected program, which `main` ends teller with (collect_cmd)
_DIE_BY: int | None = None


def _die_by_signal(sig: int) -> None:
    import signal

    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    with contextlib.suppress(OSError, ValueError):
        signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})
        os.kill(os.getpid(), sig)


_ctx = {"allow_interspersed_args": False}
app.command("collect", context_settings=_ctx)(_collect)
app.command("run", context_settings=_ctx, help="Alias of `teller collect`.")(_collect)


@shim_app.command("build")
def shim_build(
    cuda_home: Annotated[
        str | None, typer.Option(help="CUDA toolkit root (default: CUDA_HOME, the NVIDIA wheels).")
    ] = None,
    force: Annotated[bool, typer.Option(help="Rebuild even if a cached build exists.")] = False,
) -> None:
    """Build libteller_shim.so into the cache (keyed by sources, headers and compiler); print its path."""
    from teller.collect import shim

    try:
        lib = shim.build(cuda_home, force=force)
    except TellerError as e:
        raise _fail(e) from None
    st = shim.status(cuda_home)
    err_console.print(
        f"shim built against CUPTI headers {st.get('cupti_header_version')} "
        f"(libcupti at run time: {st.get('libcupti')})",
        highlight=False,
        soft_wrap=True,
    )
    print(lib)


# ---------------------------------------------------------------------------------------------------
# tpe


@tpe_app.command(
    "train", short_help="Train a TPE tokenizer on a dataset's train split (or a directory of traces)."
)
def tpe_train(
    data_dir: Annotated[
        str,
        typer.Option(
            "--data-dir",
            help="A dataset directory, a run directory, a directory of trace files, or one trace file.",
        ),
    ],
    output_dir: Annotated[str, typer.Option("--output-dir", help="Where to create <run-id>/tokenizer.json.")],
    vocab_size: Annotated[int | None, typer.Option(help="Base symbols + merges (default 8192).")] = None,
    num_merges: Annotated[
        int | None, typer.Option(help="Number of merges (instead of --vocab-size).")
    ] = None,
    min_frequency: Annotated[int, typer.Option(help="A pair must occur this often to be merged.")] = 2,
    min_symbol_count: Annotated[int, typer.Option(help="Rarer symbols map to their layer's [UNK].")] = 1,
    max_token_events: Annotated[int | None, typer.Option(help="Cap on base events per token.")] = None,
    step_name: StepOpt = None,
) -> None:
    """Train a tokenizer on the traces under DATA_DIR (of a dataset directory, its train split only: no
    test leakage); prints the tokenizer directory. Training stops early, with a warning, when no pair
    of adjacent tokens occurs --min-frequency times any more."""
    from teller import tpe

    if vocab_size is None and num_merges is None:
        vocab_size = 8192
    _output_dir(output_dir, "--output-dir")
    from teller._io import check_outside

    try:
        check_outside(output_dir, data_dir, "--output-dir", "--data-dir")
    except TellerError as e:
        raise _fail(e) from None
    t0 = time.perf_counter()
    from teller.errors import TellerWarning

    try:
        with _progress("training TPE") as cb, warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", TellerWarning)
            tok = tpe.train(
                data_dir,
                vocab_size=vocab_size,
                num_merges=num_merges,
                min_frequency=min_frequency,
                min_symbol_count=min_symbol_count,
                max_token_events=max_token_events,
                step_names=step_name,
                progress=cb,
            )
    except TellerError as e:
        raise _fail(e) from None
    for w in caught:  # (said after the progress bar, naming options as typed: --vocab-size, not vocab_size)
        if issubclass(w.category, TellerWarning):
            err_console.print(
                f"[yellow]warning:[/] {escape(_as_flags(str(w.message)))}", highlight=False, soft_wrap=True
            )
        else:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno, w.file, w.line)
    from teller._io import claim_run_dir

    try:
        out = claim_run_dir(output_dir, time.strftime("tpe-%Y%m%d-%H%M%S"))
    except TellerError as e:
        raise _fail(e) from None
    try:
        tok.save(out)
    except TellerError as e:
        with contextlib.suppress(OSError):  # (the directory claimed for it, left empty)
            out.rmdir()
        raise _fail(e) from None
    dt = time.perf_counter() - t0
    n_ev = tok.settings.get("training_events", 0)
    err_console.print(
        f"trained on {n_ev} base symbols (events and range ends) in {tok.settings.get('training_segments')} "
        "steps: "
        f"base {tok.base_size}, vocabulary {tok.vocab_size} ({dt:.2f} s)",
        highlight=False,
    )
    print(out)


@tpe_app.command(
    "encode",
    short_help="Print a readable tokenization of a trace: each token with the span of events it covers.",
)
def tpe_encode(
    input: Annotated[
        str,
        typer.Argument(
            help="One trace: a trace file or a teller run directory (not a directory of several trace files)."
        ),
    ],
    tokenizer_dir: Annotated[str, typer.Option("--tokenizer-dir", help="Directory of tokenizer.json.")],
    step: Annotated[int | None, typer.Option(help="Only this step (segment); with --json too.")] = None,
    max_tokens: Annotated[int, typer.Option(min=1, help="Print at most this many tokens.")] = 60,
    as_json: Annotated[bool, typer.Option("--json", help="Print ids, offsets and features as JSON.")] = False,
) -> None:
    """Print a readable tokenization of one trace, step by step, a token a row: # (the token's position
    in the encoding), token id, positions (the base symbols it covers, first..last: events and <close>
    range ends), max log-dur (ln(1 + duration in us) of its longest event), dur z (the largest z-score
    of its events' durations against the training corpus's) and its call-chain fragment."""
    import numpy as np

    from teller import tpe

    try:
        tok = tpe.load(tokenizer_dir)
        enc = tok.encode(input)
    except TellerError as e:
        raise _fail(e) from None
    segs = enc.segments()
    if step is not None and not 0 <= step < len(segs):
        rng = f" (0..{len(segs) - 1})" if segs else ""
        raise _fail(ConfigError(f"{input}: step {step} out of range: the trace has {len(segs)} step(s){rng}"))
    if as_json:
        # --step: that step's tokens alone; offsets stay positions in the whole trace's event sequence
        a, b = segs[step] if step is not None else (0, len(enc))
        print(
            json.dumps(
                {
                    **({"step": step} if step is not None else {}),
                    "ids": enc.ids[a:b].tolist(),
                    "offsets": enc.offsets[a : b + 1].tolist(),
                    "segment_starts": [0] if step is not None else enc.segment_starts.tolist(),
                    "features": enc.features[a:b].tolist(),
                }
            )
        )
        return
    n_base = int(enc.offsets[-1])  # (base symbols: the steps' events and a <close> per range end)
    n_closes = int((np.asarray(enc.events) < 0).sum()) if enc.events is not None else 0
    console.print(
        f"{len(enc)} tokens for {n_base} base symbols ({n_base - n_closes} events, {n_closes} range ends; "
        f"{n_base / max(len(enc), 1):.2f} per token), {len(segs)} step(s)",
        highlight=False,
    )
    shown = 0
    header = (
        f"  {'#':>6} {'token id':>8}  {'positions':<13} {'max log-dur':>11} {'dur z':>6}  call-chain fragment"
    )
    for k, (a, b) in enumerate(segs):
        if step is not None and k != step:
            continue
        console.print(f"[bold]step {k}[/] ({b - a} tokens)")
        if a < b and shown < max_tokens:
            console.print(f"[dim]{header}[/]", highlight=False, soft_wrap=True)
        for t in range(a, b):
            if shown >= max_tokens:
                console.print(f"... ({len(enc) - shown} more tokens; use --max-tokens)")
                return
            lo, hi = int(enc.offsets[t]), int(enc.offsets[t + 1])
            f = enc.features[t]
            console.print(
                f"  {t:>6} [cyan]{int(enc.ids[t]):>8}[/]  {f'{lo}..{hi - 1}':<13} "
                f"{f[2]:>11.2f} {f[3]:>+6.1f}  {escape(tok.token_str(int(enc.ids[t])))}",
                highlight=False,
                soft_wrap=True,
            )
            shown += 1


@tpe_app.command("inspect")
def tpe_inspect(
    tokenizer_dir: Annotated[str, typer.Argument(help="Directory of tokenizer.json.")],
    top: Annotated[int, typer.Option(min=0, help="How many merged tokens to show.")] = 25,
) -> None:
    """Show the vocabulary: sizes, settings, and the most frequent merged tokens as call-chain fragments."""
    from teller import tpe

    try:
        tok = tpe.load(tokenizer_dir)
    except TellerError as e:
        raise _fail(e) from None
    console.print(
        f"base symbols {tok.base_size}, merges {len(tok.merges)}, vocabulary {tok.vocab_size}",
        highlight=False,
    )
    console.print(f"settings: {escape(json.dumps(tok.settings))}", highlight=False, soft_wrap=True)
    lens = tok.token_lens
    order = sorted(range(len(tok.merge_counts)), key=lambda r: (-tok.merge_counts[r], r))
    t = Table(title=f"top {top} merged tokens by frequency at merge time", title_justify="left")
    t.add_column("token", justify="right")
    t.add_column("count", justify="right")
    t.add_column("events", justify="right")
    t.add_column("call-chain fragment")
    for r in order[:top]:
        tid = tok.base_size + r
        t.add_row(str(tid), str(tok.merge_counts[r]), str(int(lens[tid])), escape(tok.token_str(tid)))
    console.print(t)


# ---------------------------------------------------------------------------------------------------
# dataset / tokenize (teller.data)

dataset_app = typer.Typer(
    help="Generate and validate RCA datasets (the LLM-serving fault simulator).", no_args_is_help=True
)
app.add_typer(dataset_app, name="dataset")


@dataset_app.command(
    "generate",
    short_help="Simulate a vLLM-like serving engine with injected faults: a labelled dataset (resumable).",
)
def dataset_generate(
    output_dir: Annotated[str, typer.Option("--output-dir", help="The dataset directory to create.")],
    num_samples: Annotated[
        int | None, typer.Option("--num-samples", help="Samples to generate (default: the preset's).")
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed: same seed and configuration, identical bytes.")] = 0,
    preset: Annotated[
        str | None,
        typer.Option(
            help="tiny (tests), default (the benchmark), diverse (extra training data for it, "
            "with --train-only) or large (default: the --config file's `base:`, else default)."
        ),
    ] = None,
    config: Annotated[
        str | None,
        typer.Option(
            help="A YAML file overlaid on the preset (its `base:` names the preset; --preset overrides it)."
        ),
    ] = None,
    workers: Annotated[int, typer.Option(help="Parallel worker processes.")] = 1,
    train_only: Annotated[
        bool,
        typer.Option(
            "--train-only",
            help="Every sample in train, in-distribution workloads only: extra training data for a "
            "benchmark made with another seed (teller train --extra-train).",
        ),
    ] = False,
) -> None:
    """Simulate a vLLM-like serving engine with injected faults: trace.json, log.txt, annotation.json
    per sample, manifest.json with splits (train/val/test/test_ood). Resumes an interrupted run."""
    from teller.data import generate

    t0 = time.perf_counter()
    try:
        with _progress("generating") as cb:
            man = generate(
                output_dir,
                num_samples=num_samples,
                seed=seed,
                preset=preset,
                config=config,
                workers=workers,
                progress=cb,
                train_only=train_only,
            )
    except TellerError as e:
        raise _fail(e) from None
    dt = time.perf_counter() - t0
    sizes = ", ".join(f"{k} {len(v)}" for k, v in man["splits"].items())
    err_console.print(
        f"{man['num_samples']} samples ({sizes}), {man['events']['total']} events "
        f"(mean {man['events']['mean']:.0f}/sample) in {dt:.1f} s",
        highlight=False,
    )
    print(output_dir)


@dataset_app.command(
    "validate", short_help="Check every sample and the manifest against their schemas; exit 1 on any problem."
)
def dataset_validate(
    directory: Annotated[str, typer.Argument(help="The dataset directory.")],
    deep: Annotated[
        bool, typer.Option(help="Also parse every trace.json and check it against its annotation.")
    ] = False,
    max_problems: Annotated[int, typer.Option(min=0, help="Print at most this many problems.")] = 200,
) -> None:
    """Check every sample against the annotation schema (and the manifest against its schema); print
    each problem with its file and JSON path; exit 1 if there is any."""
    from teller.data import validate

    try:
        problems = validate(directory, deep=deep)
    except TellerError as e:
        raise _fail(e) from None
    for p in problems[:max_problems]:
        console.print(f"[red]{escape(str(p.path))}[/]: {escape(p.message)}", highlight=False, soft_wrap=True)
    if len(problems) > max_problems:
        console.print(f"... and {len(problems) - max_problems} more", highlight=False)
    if problems:
        err_console.print(f"[bold red]{len(problems)} problem(s)[/]", highlight=False)
        raise typer.Exit(1)
    err_console.print("[green]ok[/]: the dataset is valid", highlight=False)


@dataset_app.command(
    "collect-cpu",
    short_help="Real fault runs on this CPU: a tiny GPT-2 under `teller collect` with host faults injected.",
)
def dataset_collect_cpu(
    output_dir: Annotated[
        str, typer.Option("--output-dir", help="The dataset directory to create or resume.")
    ],
    num_samples: Annotated[int, typer.Option("--num-samples", help="Runs to make (kinds cycle).")] = 12,
    seed: Annotated[int, typer.Option(help="Seed of the plan (kinds, severities, onsets).")] = 0,
    requests: Annotated[int, typer.Option(help="Requests per run of the tiny GPT-2 workload.")] = 40,
    new_tokens: Annotated[int, typer.Option(help="Tokens generated per request.")] = 8,
    layers: Annotated[
        int, typer.Option(help="Layers of the tiny GPT-2 (its depth; another shape tests transfer).")
    ] = 4,
    prompt_len: Annotated[int, typer.Option(help="Prompt tokens per request.")] = 16,
    keep_raw: Annotated[bool, typer.Option(help="Keep each run's raw .tmsgpack files.")] = False,
    splits: Annotated[
        str,
        typer.Option(
            help=(
                "TRAIN,VAL,TEST fractions, shared out per kind (default: all test, a real test set for "
                "simulator-trained models; e.g. 0.6,0.2,0.2 to train on real runs)."
            )
        ),
    ] = "0,0,1",
) -> None:
    """Real fault runs on this CPU: the tiny GPT-2 inference under `teller collect` while busy processes,
    a memory hog, a disk flood, thread oversubscription or a slowed module hit it. Same sample format.
    One directory holds one workload shape (--requests, --new-tokens, --layers, --prompt-len)."""
    from teller.data.cpu_runs import collect_cpu, parse_splits

    t0 = time.perf_counter()
    try:
        fractions = parse_splits(splits)
        with _progress("collecting") as cb:
            man = collect_cpu(
                output_dir,
                num_samples,
                seed=seed,
                requests=requests,
                new_tokens=new_tokens,
                layers=layers,
                prompt_len=prompt_len,
                keep_raw=keep_raw,
                splits=fractions,
                progress=cb,
            )
    except TellerError as e:
        raise _fail(e) from None
    total: dict[str, int] = {}
    for per in man["counts"].values():
        for k, v in per.items():
            total[k] = total.get(k, 0) + v
    counts = ", ".join(f"{k} {v}" for k, v in total.items() if v)
    where = ", ".join(f"{s} {len(ids)}" for s, ids in man["splits"].items() if ids)
    err_console.print(
        f"{man['num_samples']} real runs ({counts}; {where}) in {time.perf_counter() - t0:.0f} s",
        highlight=False,
    )
    print(output_dir)


@app.command(
    "tokenize",
    short_help="Encode a dataset into training shards: TPE trace tokens, log tokens, per-symbol summaries.",
)
def tokenize_cmd(
    data_dir: Annotated[str, typer.Option("--data-dir", help="A dataset directory (manifest.json).")],
    tokenizer_dir: Annotated[
        str, typer.Option("--tokenizer-dir", help="Directory (or file) of the TPE tokenizer.json.")
    ],
    output_dir: Annotated[str, typer.Option("--output-dir", help="Shards go to OUTPUT_DIR/<run-id>/.")],
    run_id: Annotated[
        str | None,
        typer.Option(
            help="Run id, a plain name (default: a hash of dataset, tokenizer and settings; reruns "
            "resume; a run id holding another dataset, tokenizer or settings is refused)."
        ),
    ] = None,
    shard_size: Annotated[int, typer.Option(help="Samples per shard.")] = 256,
    workers: Annotated[int, typer.Option(help="Parallel worker processes.")] = 1,
    log_vocab_size: Annotated[
        int, typer.Option(help="Log word vocabulary size (built on train; at least 11).")
    ] = 4096,
    log_tokenizer: Annotated[
        str | None,
        typer.Option(
            help="Reuse this log_tokenizer.json (another run's) instead of building one: how extra "
            "training data or new data is encoded for models trained on other shards. The run's "
            "reference.json beside it is reused too."
        ),
    ] = None,
    reference: Annotated[
        str | None,
        typer.Option(
            help="Reuse this reference.json (per-deployment kernel times, another run's) instead of "
            "fitting one on the train split."
        ),
    ] = None,
) -> None:
    """Encode every sample with TPE (ids, timing features, token->event offsets, culprit mask) and its
    log with the log tokenizer, into memory-mapped .npy shards plus manifest.json. Fits the
    per-deployment kernel reference (reference.json) on the train split first, unless one is
    reused. Resumable."""
    from teller.data.tokenize import tokenize_dataset

    t0 = time.perf_counter()
    try:
        with _progress("tokenizing") as cb:
            out = tokenize_dataset(
                data_dir,
                tokenizer_dir,
                output_dir,
                run_id=run_id,
                shard_size=shard_size,
                workers=workers,
                log_vocab_size=log_vocab_size,
                log_tokenizer=log_tokenizer,
                reference=reference,
                progress=cb,
            )
    except TellerError as e:
        raise _fail(e) from None
    err_console.print(f"tokenized in {time.perf_counter() - t0:.1f} s", highlight=False)
    print(out)


# ---------------------------------------------------------------------------------------------------
# RCA models: train, evaluate, results, diagnose

train_app = typer.Typer(
    help="Train the RCA models (MoT, single-stream) and the baselines.", no_args_is_help=True
)
app.add_typer(train_app, name="train")
results_app = typer.Typer(help="Aggregate evaluation results into tables and plots.", no_args_is_help=True)
app.add_typer(results_app, name="results")


def _train_model(
    kind: str,
    config: str | None,
    data_dir: str,
    tpe_dir: str | None,
    output_dir: str | None,
    resume: bool,
    overrides: dict[str, object],
    extra_train: list[str] | None = None,
) -> None:
    from teller.models.train import load_config, train

    t0 = time.perf_counter()
    out = output_dir or f"output/checkpoints/{kind}"
    try:
        cfg = load_config(config, kind)
        with _progress(f"training {kind}") as update:

            def cb(what: str, done: int, total: int, rec: dict[str, float]) -> None:
                if what == "train":
                    update(done, total)
                elif what == "note":  # (resumed, stopped early: said, not silent)
                    err_console.print(str(rec["text"]), highlight=False, soft_wrap=True)
                elif what == "calibrate":
                    err_console.print(
                        f"calibrated on {rec['split']}: temperature {rec['temperature']:.3f} "
                        f"(NLL {rec['nll_before']:.4f} -> {rec['nll_after']:.4f}, "
                        f"ECE {rec['ece_before']:.4f} -> {rec['ece_after']:.4f})",
                        highlight=False,
                    )
                else:
                    shown = ", ".join(f"{k} {v:.4g}" for k, v in rec.items() if k != "epoch")
                    err_console.print(f"epoch {done}/{total}: {shown}", highlight=False)

            ov = {k: v for k, v in overrides.items() if v is not None}
            ov["arch"] = kind  # `train single --config X` trains the single-stream variant of X
            run = train(
                cfg,
                data_dir,
                out,
                tpe_dir=tpe_dir,
                resume=resume,
                progress=cb,
                overrides=ov,
                extra_train=extra_train or (),
            )
    except TellerError as e:
        # a value given on the command line is named as its option (`--epochs`), not as the
        # configuration key it overrides (`train.epochs`)
        given = {k for k, v in overrides.items() if v is not None}
        for key, section in (
            ("epochs", "train"),
            ("seed", "train"),
            ("device", "train"),
            ("modalities", "model"),
        ):
            if key in given and str(e).startswith(f"{section}.{key}"):
                e.args = (f"--{key}" + str(e)[len(section) + 1 + len(key) :], *e.args[1:])
        raise _fail(e) from None
    except KeyboardInterrupt:
        # (training saves a whole epoch at a time: what is in OUT is the last finished one)
        err_console.print(
            f"interrupted: {out} keeps the last finished epoch; the same command with --resume goes on "
            "from it",
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(130) from None
    err_console.print(f"trained {kind} in {time.perf_counter() - t0:.1f} s", highlight=False)
    print(run)


_ConfigOpt = Annotated[
    str | None,
    typer.Option(
        "--config",
        help="A YAML configuration, or a shipped one by name: mot, single, mot_minilm, demo, demo_single "
        "(default: the shipped one for the model).",
    ),
]
_DataOpt = Annotated[str, typer.Option("--data-dir", help="Tokenized shards (teller tokenize output).")]
_TpeOpt = Annotated[
    str | None,
    typer.Option(
        "--tpe-dir",
        help="The TPE tokenizer the shards were made with (checked against their manifest; default: the "
        "path it names).",
    ),
]
_OutOpt = Annotated[
    str | None,
    typer.Option(
        "--output-dir",
        help="Run directory (fitted models, config.json; default: output/checkpoints/baselines, or "
        "output/checkpoints/ensemble); one already holding a run is refused.",
    ),
]
_ResumableOutOpt = Annotated[
    str | None,
    typer.Option(
        "--output-dir",
        help="Run directory (checkpoints, config.json; default: output/checkpoints/KIND); one already "
        "holding a run is refused unless --resume.",
    ),
]
_ExtraOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--extra-train",
        help="More tokenized shards whose train split is added to training (same TPE and log "
        "tokenizer; see docs/models.md). Repeatable.",
    ),
]


@train_app.command("mot")
def train_mot_cmd(
    data_dir: _DataOpt,
    config: _ConfigOpt = None,
    tpe_dir: _TpeOpt = None,
    output_dir: _ResumableOutOpt = None,
    resume: Annotated[
        bool,
        typer.Option(help="Continue from OUTPUT_DIR/state.pt (where there is none: from the start, said)."),
    ] = False,
    epochs: Annotated[int | None, typer.Option(help="Override train.epochs.")] = None,
    seed: Annotated[int | None, typer.Option(help="Override train.seed.")] = None,
    device: Annotated[str | None, typer.Option(help="auto, cpu or cuda.")] = None,
    modalities: Annotated[str | None, typer.Option(help="both, trace or log (ablations).")] = None,
    extra_train: _ExtraOpt = None,
) -> None:
    """Train the Mixture-of-Transformers model (configs/mot/train.yaml by default)."""
    _train_model(
        "mot",
        config,
        data_dir,
        tpe_dir,
        output_dir,
        resume,
        {"epochs": epochs, "seed": seed, "device": device, "modalities": modalities},
        extra_train,
    )


@train_app.command("single")
def train_single_cmd(
    data_dir: _DataOpt,
    config: _ConfigOpt = None,
    tpe_dir: _TpeOpt = None,
    output_dir: _ResumableOutOpt = None,
    resume: Annotated[
        bool,
        typer.Option(help="Continue from OUTPUT_DIR/state.pt (where there is none: from the start, said)."),
    ] = False,
    epochs: Annotated[int | None, typer.Option(help="Override train.epochs.")] = None,
    seed: Annotated[int | None, typer.Option(help="Override train.seed.")] = None,
    device: Annotated[str | None, typer.Option(help="auto, cpu or cuda.")] = None,
    extra_train: _ExtraOpt = None,
) -> None:
    """Train the single-stream (shared weights) model (configs/single/train.yaml by default)."""
    _train_model(
        "single",
        config,
        data_dir,
        tpe_dir,
        output_dir,
        resume,
        {"epochs": epochs, "seed": seed, "device": device},
        extra_train,
    )


@train_app.command("baselines")
def train_baselines_cmd(
    data_dir: _DataOpt, output_dir: _OutOpt = None, tpe_dir: _TpeOpt = None, extra_train: _ExtraOpt = None
) -> None:
    """Fit the GBDT and z-score baselines (hyper-parameters and thresholds chosen on val)."""
    from teller.models.baselines import train_baselines

    t0 = time.perf_counter()
    try:
        out = train_baselines(
            data_dir,
            output_dir or "output/checkpoints/baselines",
            log=lambda m: err_console.print(m, highlight=False, markup=False),
            extra_train=extra_train or (),
            tpe_dir=tpe_dir,
        )
    except TellerError as e:
        raise _fail(e) from None
    err_console.print(f"fitted the baselines in {time.perf_counter() - t0:.1f} s", highlight=False)
    print(out)


@train_app.command(
    "ensemble",
    short_help="Mix the GBDT's cause probabilities with the MoT's localization (weight chosen on val).",
)
def train_ensemble_cmd(
    mot: Annotated[str, typer.Option("--mot", help="A MoT (or single-stream) run directory.")],
    baselines: Annotated[str, typer.Option("--baselines", help="A baselines run on the same shards.")],
    output_dir: _OutOpt = None,
) -> None:
    """The GBDT's category with the MoT's per-cause localization: p(cause) mixes both models'
    probabilities (the weight chosen on val), candidates keep the MoT's q(location | cause)."""
    from teller.models.ensemble import fit_ensemble

    try:
        out = fit_ensemble(
            mot,
            baselines,
            output_dir or "output/checkpoints/ensemble",
            log=lambda m: err_console.print(m, highlight=False, markup=False),
        )
    except TellerError as e:
        raise _fail(e) from None
    print(out)


@app.command(
    "evaluate",
    short_help="Score a trained model on a split: accuracy, AC@k, localization, calibration, per fault.",
)
def evaluate_cmd(
    checkpoint: Annotated[
        str,
        typer.Option("--checkpoint", help="A run directory of teller train (or its model.safetensors)."),
    ],
    data_dir: Annotated[
        str | None,
        typer.Option(
            "--data-dir",
            help="Tokenized shards (default: training), or a dataset directory: encoded with the "
            "checkpoint's tokenizers (cached in CHECKPOINT/eval-data, or OUTPUT/eval-data where the "
            "checkpoint is read-only), its --split evaluated.",
        ),
    ] = None,
    split: Annotated[
        str,
        typer.Option(
            help="test, test_ood, val, train, all, or a dataset directory (teller dataset generate / "
            "collect-cpu): encoded with the checkpoint's tokenizers (cached in CHECKPOINT/eval-data, or "
            "OUTPUT/eval-data where the checkpoint is read-only) and "
            "evaluated whole."
        ),
    ] = "test",
    as_json: Annotated[
        bool,
        typer.Option(
            "--json", help="Print the metrics as JSON: one object (a baselines run: a list, one per model)."
        ),
    ] = False,
    output: Annotated[
        str | None, typer.Option("--output", "-o", help="Directory for metrics (default: the checkpoint's).")
    ] = None,
) -> None:
    """Category accuracy, macro-F1, AC@1/3/5, Avg@5, localization top-1/3 (trace tokens; and
    symbol_top1/3: summary rows, with a summary-row head), detection, per-fault,
    per-severity and per-effect tables (simulated data: what each fault actually did; AC@1 without
    the faults that did nothing), calibration (nll, ece, brier), answers by confidence (the share
    of samples with a top-cause probability of at least 0.5 / 0.7 / 0.9 and their AC@1: selective),
    confusion matrix (CSV + PNG), latency. Writes
    eval-<split>-<model>.json (eval-<dataset>-<split>-<model>.json for a dataset directory's split;
    in an --output that holds another run's: eval-<split>-<model>-<run>-<hash>.json) and the confusion
    files into --output, by default the checkpoint's directory."""
    from teller.models.report import evaluate_any, print_metrics, write_metrics

    _output_dir(output, "--output")
    ck = Path(checkpoint)
    out = Path(output) if output else (ck if ck.is_dir() else ck.parent)  # (RUN/model.safetensors: RUN)
    if not output and out.is_dir() and not os.access(out, os.W_OK | os.X_OK):
        # (said before the evaluation, not after it: the metrics are written beside the checkpoint)
        raise _fail(
            TellerIOError(
                f"{out}: not writable, and the metrics go to the checkpoint's directory: pass -o DIR",
                path=str(out),
                errno=errno.EACCES,
            )
        )
    try:
        results = evaluate_any(checkpoint, data_dir, split, cache=output)
    except TellerError as e:
        raise _fail(e) from None
    for m in results:
        write_metrics(m, out)
    if as_json:
        keep = [{k: v for k, v in m.items() if k not in ("confusion", "samples")} for m in results]
        print(json.dumps(keep[0] if len(keep) == 1 else keep, indent=1))
    else:
        for m in results:
            print_metrics(m, console)


@app.command("calibrate", short_help="Fit (or remove) the temperature of a run's cause probabilities.")
def calibrate_cmd(
    checkpoint: Annotated[
        str, typer.Option("--checkpoint", help="A run directory of teller train mot|single.")
    ],
    data_dir: Annotated[
        str | None,
        typer.Option(
            "--data-dir", help="Tokenized shards encoded like the training ones (default: training)."
        ),
    ] = None,
    split: Annotated[str, typer.Option(help="The split to fit on: one the run is not evaluated on.")] = "val",
    reset: Annotated[
        bool, typer.Option("--reset", help="Remove the calibration: probabilities as the network gives them.")
    ] = False,
) -> None:
    """Fit the temperature of a run's category probabilities (softmax(logits / T), minimizing the
    NLL on --split) and record it in the run's config.json; evaluate and diagnose then use it.
    `teller train` does this on val at the end of training; this refits a run (one trained before
    calibration existed, or interrupted before the fit) or removes it. The order of the causes never
    changes, only their probabilities (AC@k ranks cause x location, so it can move by a sample; an
    ensemble keeps the temperature it was fitted with)."""
    from teller.models.train import calibrate

    try:
        cal = calibrate(checkpoint, data_dir, split, reset=reset)
    except TellerError as e:
        raise _fail(e) from None
    if cal is None:
        err_console.print(f"{escape(str(checkpoint))}: calibration removed (temperature 1)", highlight=False)
    else:
        err_console.print(
            f"{escape(str(checkpoint))}: temperature {cal['temperature']:.3f} fitted on "
            f"{escape(str(cal['split']))} (n={cal['n']}): "
            f"NLL {cal['nll_before']:.4f} -> {cal['nll_after']:.4f}, "
            f"ECE {cal['ece_before']:.4f} -> {cal['ece_after']:.4f}",
            highlight=False,
        )
    if cal is not None:  # (the fitted record on stdout, for scripts; a reset has none)
        print(json.dumps(cal))


@results_app.command(
    "summarize", short_help="Compare every evaluated model on every split: results.md, results.json, plots."
)
def results_summarize_cmd(
    runs: Annotated[
        list[str], typer.Argument(help="Run directories holding eval-*.json files, or eval-*.json files.")
    ],
    output: Annotated[str, typer.Option("--output", "-o", help="Output directory.")] = "output",
) -> None:
    """Compare every model on every evaluated split: OUTPUT/results.md (the main table; F1 per fault
    type, AC@1 by severity and by effect per split; each model kind over its runs, e.g. seeds, and
    paired per-sample differences from the MoT with bootstrap intervals and sign tests),
    results.json, results-paired.json and results-*.png plots (with matplotlib)."""
    from teller.models.report import summarize

    _output_dir(output, "--output")
    try:
        md = summarize(runs, output)
    except TellerError as e:
        raise _fail(e) from None
    print(md)


@app.command(
    "diagnose",
    short_help="Name the likely root causes of captured runs: ranked causes, culprit operators, evidence.",
)
def diagnose_cmd(
    paths: Annotated[
        list[str],
        typer.Argument(
            help="Sample directories (trace.json + log.txt), collected runs, or trace files (their log: "
            "the log.txt beside each). Several are diagnosed in one process: the checkpoint is loaded once.",
            show_default=False,
            metavar="PATH...",
        ),
    ],
    checkpoint: Annotated[
        str,
        typer.Option(
            "--checkpoint", help="A MoT/single run directory, or an ensemble run (teller train ensemble)."
        ),
    ],
    top: Annotated[
        int,
        typer.Option(min=1, help="Root causes to show; culprit operators and symbols: twice as many."),
    ] = 3,
    perfetto: Annotated[
        str | None,
        typer.Option(
            "--perfetto",
            help="Output trace with the listed culprit operators' events highlighted (with a summary-row "
            "head, those whose symbol it scores 0.5 or more; one PATH only).",
        ),
    ] = None,
    as_json: Annotated[
        bool,
        typer.Option("--json", help="Print one JSON object (with several PATHs, a JSON array of them)."),
    ] = False,
    brief: Annotated[
        bool,
        typer.Option(
            "--brief",
            help="Print only the summary table: a row per capture (cause, confidence, culprit, flags).",
        ),
    ] = False,
    baseline: Annotated[
        str | None,
        typer.Option(
            "--baseline",
            help="A healthy capture of the same workload: each report also says what changed from it "
            "(teller trace compare).",
        ),
    ] = None,
) -> None:
    """Ranked root causes with calibrated confidence and layer (flagged uncertain below 0.7), culprit
    operators with their evidence, the culprit symbols of the summary-row head (where the model has
    one) with their load-normalized shift, and (--perfetto) a Perfetto trace with the listed culprit
    operators' events highlighted, and what the capture itself shows without the model (teller.findings; with
    --baseline, what changed from a healthy capture of the same workload: teller.compare). A capture
    mostly unknown to the model's tokenizers (at least half its trace events
    or log words, on a side the model reads: another engine, workload or machine than the training
    data) is flagged as unfamiliar: its causes are guesses. Several PATHs are diagnosed in one
    process (a few tens of ms each after the first: Python and torch start once); one that cannot be
    read is reported on stderr (in --json, an object with its path and error), the others still are,
    and the exit status is 2; with several PATHs a summary table, one row per capture, follows their
    reports (--brief: only the table, for one PATH too)."""
    from teller.models.diagnose import diagnose, load_checkpoint_for_diagnosis, render, render_summary

    if brief and as_json:
        raise _fail(TellerError("--brief and --json: choose one (--json has everything)"))
    if perfetto and len(paths) > 1:
        raise _fail(TellerError(f"--perfetto writes one trace: give one PATH, not {len(paths)}"))
    if len(paths) > 1 or as_json:
        # (a checkpoint that cannot be used would fail every PATH: said once, before them, and with
        # --json not as a capture's error; loaded once, diagnose reuses it)
        try:
            load_checkpoint_for_diagnosis(checkpoint)
        except TellerError as e:
            raise _fail(e) from None
    base_tr = None
    if baseline is not None:  # (loaded once for every PATH, as they are; unreadable: said before any)
        from teller.models.diagnose import load_baseline

        try:
            base_tr = load_baseline(baseline, checkpoint)
        except TellerError as e:
            e.args = (f"--baseline {e}", *e.args[1:])  # (which input it is, as collect --baseline says)
            raise _fail(e) from None
    out: list[dict[str, Any]] = []
    failed = False
    for path in paths:
        try:
            d = diagnose(path, checkpoint, top=top, perfetto=perfetto, baseline=base_tr)
            if d.get("baseline") is not None:
                d["baseline"]["path"] = baseline
        except TellerError as e:
            if len(paths) == 1 and not as_json:
                raise _fail(e) from None
            # (one bad capture of a batch, the checkpoint loaded: named, and the rest diagnosed;
            # with --json its object says so on stdout too, one PATH or several)
            err_console.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False, soft_wrap=True)
            failed = True
            d = {"path": path, "error": str(e)}
        out.append(d)
        if not as_json and not brief and "error" not in d:
            render(d, console)
    if as_json:
        print(json.dumps(out[0] if len(paths) == 1 else out, indent=1))
    elif brief or len(paths) > 1:
        render_summary(out, console)
        if brief and perfetto and "error" not in out[0]:
            console.print(f"Perfetto trace: {escape(str(perfetto))}", highlight=False)
    if failed:
        raise typer.Exit(2)


_default_showwarning = warnings.showwarning


def _show_warning(message, category, filename, lineno, file=None, line=None):  # type: ignore[no-untyped-def]
    """teller's own warnings (raised in, or pointing at, teller's code) read as one line on stderr,
    like the CLI's other messages; anyone else's keep Python's format (file, line, source)."""
    if file is None and Path(filename).resolve().is_relative_to(Path(__file__).resolve().parent):
        err_console.print(f"[yellow]warning:[/] {escape(str(message))}", highlight=False, soft_wrap=True)
    else:
        _default_showwarning(message, category, filename, lineno, file, line)


def main() -> None:
    global _DIE_BY
    _DIE_BY = None  # (a main() called again in one process starts afresh)
    warnings.showwarning = _show_warning
    try:
        app()
    except SystemExit:
        if _DIE_BY is not None:
            _die_by_signal(_DIE_BY)
        raise
    except BrokenPipeError:  # e.g. `teller trace summary x | head`
        _stdout_gone()
        sys.exit(1)
    except OSError as e:
        # the last net under every command: an OS error on a named path (permissions, a directory
        # where a file was expected, a full disk) is the user's to fix, so one line naming the path;
        # TELLER_DEBUG=1 keeps the traceback. Errors without a path stay tracebacks: they are bugs.
        if isinstance(e, TellerError):  # (its message names the path already)
            err_console.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False, soft_wrap=True)
            sys.exit(2)
        if not e.filename or os.environ.get("TELLER_DEBUG"):
            raise
        other = f" -> {e.filename2}" if e.filename2 else ""
        err_console.print(
            f"[bold red]error:[/] {escape(f'{e.filename}{other}: {e.strerror or e}')}",
            highlight=False,
            soft_wrap=True,
        )
        sys.exit(2)


if __name__ == "__main__":
    main()
