"""`teller collect` for real: the shim injected into unmodified Python programs (NVTX runs on the CPU)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import teller.trace as T
from conftest import needs_shim
from teller.collect import shim

pytestmark = needs_shim()


def collect(tmp_path: Path, *args: str, env: dict[str, str] | None = None, timeout: int = 300):
    cmd = [sys.executable, "-m", "teller", "collect", "--trace-dir", str(tmp_path / "traces"), *args]
    p = subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}, cwd=tmp_path
    )
    runs = sorted((tmp_path / "traces").glob("run-*")) if (tmp_path / "traces").exists() else []
    return p, (runs[-1] if runs else None)


def teller_cmd(traces: str, *program: str) -> list[str]:
    """``python -m teller collect --trace-dir TRACES -- PROGRAM...``"""
    return [sys.executable, "-m", "teller", "collect", "--trace-dir", traces, "--", *program]


def names(tr) -> list[str]:
    return [tr.name_of(i) for i in range(len(tr))]


def write(tmp_path: Path, name: str, code: str) -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(code))
    return p


def test_python_nvtx_program(tmp_path):
    prog = write(
        tmp_path,
        "prog.py",
        """
        import sys, nvtx
        with nvtx.annotate("outer", domain="app"):
            for i in range(3):
                with nvtx.annotate("inner", domain="app"):
                    print(f"line {i}", flush=True)
            nvtx.mark("checkpoint", domain="app")
        print("to stderr", file=sys.stderr)
        sys.exit(3)
    """,
    )
    p, run = collect(
        tmp_path,
        "--",
        sys.executable,
        str(prog),
        env={"SECRET_TOKEN": "hunter2", "RANK": "0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"},
    )
    assert p.returncode == 3, p.stderr
    assert "line 0\nline 1\nline 2\n" in p.stdout  # output still reaches the terminal unchanged
    assert "to stderr" in p.stderr and str(run) in p.stderr
    tr = T.load(run, warn=False)
    n = names(tr)
    assert n.count("inner") == 3 and n.count("outer") == 1 and n.count("checkpoint") == 1
    outer = n.index("outer")
    for i in range(len(tr)):
        if n[i] == "inner":
            assert tr.parent[i] == outer
            assert tr.ts[outer] <= tr.ts[i] and tr.end[i] <= tr.end[outer]
    assert all(tr.args(i).get("domain") == "app" for i in range(len(tr)) if n[i] in ("inner", "outer"))
    # logs: every line, timestamped on the trace clock, inside the run
    lines = (run / "log.txt").read_text().splitlines()
    assert [ln.split(" ", 2)[2] for ln in lines if " stdout " in ln] == ["line 0", "line 1", "line 2"]
    ts = [int(ln.split(" ", 1)[0]) for ln in lines]
    assert ts == sorted(ts)
    inner_ends = sorted(int(tr.end[i]) for i in range(len(tr)) if n[i] == "inner")
    # the line printed inside inner range k is logged after that range started and before the run ended
    assert ts[0] >= int(tr.ts[outer]) - 50_000_000 and ts[0] <= int(tr.end[outer]) + 50_000_000, (
        ts,
        inner_ends,
    )
    run_json = json.loads((run / "run.json").read_text())
    assert run_json["exit_code"] == 3 and run_json["command"][-1] == str(prog)
    assert run_json["env"]["RANK"] == "0" and "NVTX_INJECTION64_PATH" in run_json["env"]
    assert "hunter2" not in (run / "run.json").read_text()
    # the shim's header keeps the topology (which GPU an index names), never anything else
    header = json.loads(tr.sources[0]["metadata"]["header"])
    assert header["env"]["RANK"] == "0" and header["env"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert run_json["env"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID" and "SECRET_TOKEN" not in header["env"]
    summary = json.loads((run / "summary.json").read_text())
    assert (run / "trace.json").exists() and summary["events"] == len(tr)
    assert summary["findings"] == []  # (a CPU run of four ranges: nothing stands out, and it says so)


def _package(d, module: str, source: str) -> None:
    """A package directory ``d`` holding one module."""
    d.mkdir()
    write(d, "__init__.py", "")
    write(d, module, source)


def _collect_groups(tmp_path, groups, prog):
    """``teller collect --nvtx-json GROUPS -- python PROG`` with ``tmp_path`` on the child's path."""
    return collect(
        tmp_path,
        "--nvtx-json",
        str(groups),
        "--",
        sys.executable,
        str(prog),
        env={"PYTHONPATH": str(tmp_path)},
    )


def test_nvtx_json_wraps_unmodified_code_and_children(tmp_path):
    _package(
        tmp_path / "pkg",
        "engine.py",
        """
        class Engine:
            def step(self, n):
                return prepare(n) + 1

            @staticmethod
            def helper():
                return 1

        def prepare(n):
            return sum(range(n))
    """,
    )
    prog = write(
        tmp_path,
        "main.py",
        """
        import subprocess, sys
        from pkg.engine import Engine, prepare   # bound after the hook wrapped them
        e = Engine()
        for _ in range(2):
            e.step(1000)
        Engine.helper()
        prepare(5)
        subprocess.run([sys.executable, "-c", "from pkg.engine import prepare; prepare(3)"], check=True)
    """,
    )
    groups = tmp_path / "groups.json"
    groups.write_text(
        json.dumps(
            [
                {
                    "module": "pkg.engine",
                    "functions": ["Engine.step", "Engine.helper", "prepare"],
                    "domain": "engine",
                },
            ]
        )
    )
    p, run = _collect_groups(tmp_path, groups, prog)
    assert p.returncode == 0, p.stderr
    tr = T.load(run, warn=False)
    n = names(tr)
    assert n.count("pkg.engine.Engine.step") == 2
    assert n.count("pkg.engine.Engine.helper") == 1
    assert n.count("pkg.engine.prepare") == 2 + 1 + 1  # two under step, one direct, one in the child
    assert len(set(tr.pid.tolist())) == 2  # the child process wrote its own file
    steps = [i for i in range(len(tr)) if n[i] == "pkg.engine.Engine.step"]
    for s in steps:
        kids = [i for i in range(len(tr)) if tr.parent[i] == s]
        assert [n[k] for k in kids] == ["pkg.engine.prepare"]


def test_nvtx_json_leaves_alone_what_it_cannot_wrap(tmp_path):
    # (a name with a field the hook does not know is refused by teller before the program starts:
    # test_nvtx_json_says_what_it_cannot_wrap_and_why)
    _package(
        tmp_path / "pkg2",
        "m.py",
        "class A:\n    def run(self):\n        return 7\n"
        "def gen():\n    yield 1\n"
        "async def co():\n    return 2\n",
    )
    prog = write(
        tmp_path,
        "main2.py",
        "import asyncio\nfrom pkg2.m import A, gen, co\n"
        "print('got', A().run(), list(gen()), asyncio.run(co()), flush=True)\n",
    )
    groups = tmp_path / "g2.json"
    groups.write_text(
        json.dumps(
            [
                {"module": "pkg2.m", "functions": ["A.run"], "name": "{cls}.{function}"},
                # a generator and a coroutine: a push/pop range cannot follow them, so they are left alone
                {"module": "pkg2.m", "functions": ["gen", "co"]},
            ]
        )
    )
    p, _ = _collect_groups(tmp_path, groups, prog)
    assert p.returncode == 0, p.stderr
    assert "got 7 [1] 2" in p.stdout
    assert "cannot wrap pkg2.m.A.run" not in p.stderr
    assert "cannot wrap pkg2.m.gen" in p.stderr and "cannot wrap pkg2.m.co" in p.stderr


def test_nvtx_json_wraps_only_functions(tmp_path):
    """A class, a property, a constant or a callable object named in --nvtx-json is said and left as it
    is (a wrapper would make the class no type, the property a bound method, the constant a function);
    {cls} of a classmethod is the class it is called on, of a staticmethod the class named; a colour is
    checked before the program starts, and so are unknown keys."""
    _package(
        tmp_path / "pkg3",
        "m.py",
        "import functools\n"
        "X = 5\n"
        "class K:\n    pass\n"
        "class Base:\n"
        "    @property\n    def prop(self):\n        return 4\n"
        "    @classmethod\n    def cm(cls):\n        return cls.__name__\n"
        "    @staticmethod\n    def st():\n        return 3\n"
        "class Sub(Base):\n    pass\n"
        "@functools.lru_cache\ndef cached(n):\n    return n\n",
    )
    prog = write(
        tmp_path,
        "main3.py",
        "from pkg3 import m\n"
        "print('got', m.X, isinstance(m.K(), m.K), m.Base().prop, m.Sub.cm(), m.Base.st(), m.cached(2),"
        " m.cached.cache_info().hits, flush=True)\n",
    )
    groups = tmp_path / "g3.json"
    groups.write_text(
        json.dumps(
            [
                {"module": "pkg3.m", "functions": ["X", "K", "Base.prop", "cached"]},
                {"module": "pkg3.m", "functions": ["Base.cm", "Base.st"], "name": "{cls}:{function}"},
            ]
        )
    )
    p, run = _collect_groups(tmp_path, groups, prog)
    assert p.returncode == 0, p.stderr
    assert "got 5 True 4 Sub 3 2 0" in p.stdout, p.stdout
    for said in (
        "cannot wrap pkg3.m.X: an int, not a function",
        "cannot wrap pkg3.m.K: a class, not a function",
        "cannot wrap pkg3.m.Base.prop: a property, not a function",
        "cannot wrap pkg3.m.cached: a callable _lru_cache_wrapper object",
    ):
        assert said in p.stderr, p.stderr
    assert sorted(names(T.load(run, warn=False))) == ["Base:st", "Sub:cm"]
    # a colour: NVTX's names or #RRGGBB, checked before the program starts; unknown keys are refused
    for bad, said in (
        ({"color": "notacolor"}, "'color': unknown colour 'notacolor'"),
        ({"color": "#12345g"}, "'color': unknown colour '#12345g'"),
        ({"category": 1}, "unknown keys ['category']"),
        ({"subclasses": True}, "unknown keys ['subclasses']"),
    ):
        groups.write_text(json.dumps([{"module": "pkg3.m", "functions": ["Base.st"], **bad}]))
        p, _ = _collect_groups(tmp_path, groups, prog)
        assert p.returncode == 2 and said in p.stderr and "got" not in p.stdout, p.stderr
    groups.write_text(json.dumps([{"module": "pkg3.m", "functions": ["Base.st"], "color": "#FF8800"}]))
    p, run = _collect_groups(tmp_path, groups, prog)
    assert p.returncode == 0 and "cannot wrap" not in p.stderr, p.stderr
    assert names(T.load(run, warn=False)) == ["pkg3.m.Base.st"]


def test_nvtx_json_wraps_compiled_functions_and_methods(tmp_path):
    """A Cython function and a pybind11 method (an `instancemethod` in its class) are functions: they
    are wrapped, and the program sees the same results."""
    prog = write(
        tmp_path,
        "compiled.py",
        """
        import torch
        from sklearn.utils.murmurhash import murmurhash3_32
        g = torch._C.Graph()
        print("got", murmurhash3_32("a"), len(list(g.nodes())), flush=True)
    """,
    )
    groups = tmp_path / "gc.json"
    groups.write_text(
        json.dumps(
            [
                {"module": "sklearn.utils.murmurhash", "functions": ["murmurhash3_32"]},
                {"module": "torch._C", "functions": ["Graph.nodes"]},
            ]
        )
    )
    p, run = _collect_groups(tmp_path, groups, prog)
    assert p.returncode == 0 and "got 1009084850 0" in p.stdout, p.stdout + p.stderr
    assert "cannot wrap" not in p.stderr, p.stderr
    assert sorted(names(T.load(run, warn=False))) == [
        "sklearn.utils.murmurhash.murmurhash3_32",
        "torch._C.Graph.nodes",
    ]


def test_builtin_profile_tiny_gpt2(tmp_path):
    prog = write(
        tmp_path,
        "gen.py",
        """
        import torch
        from transformers import GPT2Config, GPT2LMHeadModel
        torch.manual_seed(0)
        cfg = GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=256, n_positions=64)
        model = GPT2LMHeadModel(cfg).eval()
        ids = torch.randint(0, 256, (1, 8))
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0)
        print("generated", out.shape[1] - 8, "tokens", flush=True)
    """,
    )
    p, run = collect(
        tmp_path,
        "--nvtx-json",
        "transformers",
        "--",
        sys.executable,
        str(prog),
        env={"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"},
    )
    assert p.returncode == 0, p.stderr
    assert "generated 4 tokens" in p.stdout
    tr = T.load(run, warn=False)
    n = names(tr)
    assert n.count("generate") == 1
    assert n.count("GPT2LMHeadModel") == 4  # one forward per generated token
    assert n.count("GPT2Block") == 8 and n.count("GPT2Attention") >= 8
    gen = n.index("generate")
    for i in range(len(tr)):
        if n[i] == "GPT2Block":
            # nested: GPT2Block < GPT2Model < GPT2LMHeadModel < ... < generate
            chain = []
            p_ = int(tr.parent[i])
            while p_ >= 0:
                chain.append(n[p_])
                p_ = int(tr.parent[p_])
            assert "GPT2Model" in chain and "GPT2LMHeadModel" in chain and "generate" in chain
    assert np.all(np.diff(tr.ts) >= 0)
    assert tr.ts[gen] <= tr.ts[n.index("GPT2LMHeadModel")]


@pytest.mark.parametrize("how", ["sigkill", "os_exit", "pool_terminate"])
def test_killed_processes_leave_readable_traces(tmp_path, how):
    prog = write(
        tmp_path,
        "k.py",
        f"""
        import multiprocessing as mp, os, signal, sys, time, nvtx
        how = {how!r}

        def worker(i):
            with nvtx.annotate(f"worker-done", domain="w"):
                pass
            nvtx.push_range("worker-open", domain="w")
            open(f"ready-{{i}}", "w").close()
            time.sleep(60)

        for i in range(5):
            with nvtx.annotate("before-crash", domain="m"):
                pass
        if how == "sigkill":
            nvtx.push_range("open-at-kill", domain="m")
            os.kill(os.getpid(), signal.SIGKILL)
        elif how == "os_exit":
            nvtx.push_range("open-at-exit", domain="m")
            os._exit(7)
        else:
            pool = mp.get_context("fork").Pool(2)
            pool.map_async(worker, range(2))
            deadline = time.monotonic() + 60  # wait for both workers to be inside their open range
            while not all(os.path.exists(f"ready-{{i}}") for i in range(2)) and time.monotonic() < deadline:
                time.sleep(0.01)
            pool.terminate()
            pool.join()
    """,
    )
    p, run = collect(tmp_path, "--", sys.executable, str(prog))
    tr = T.load(run, warn=False)
    n = names(tr)
    assert n.count("before-crash") == 5, (n, p.stderr)
    if how == "sigkill":
        assert p.returncode == 128 + signal.SIGKILL
        i = n.index("open-at-kill")
        assert tr.flags[i] & T.FLAG_UNFINISHED
    elif how == "os_exit":
        assert p.returncode == 7
        assert "open-at-exit" in n
    else:
        assert p.returncode == 0
        assert n.count("worker-done") == 2 and n.count("worker-open") == 2
        assert len(set(tr.pid.tolist())) == 3


def test_sigterm_is_forwarded(tmp_path):
    prog = write(
        tmp_path,
        "s.py",
        """
        import signal, sys, time, nvtx
        def bye(*_):
            print("got SIGTERM", flush=True)
            sys.exit(5)
        signal.signal(signal.SIGTERM, bye)
        with nvtx.annotate("waiting"):
            print("ready", flush=True)
            time.sleep(60)
    """,
    )
    cmd = teller_cmd(str(tmp_path / "traces"), sys.executable, str(prog))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.strip() == "ready"
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 5, err
    assert "got SIGTERM" in out
    run = sorted((tmp_path / "traces").glob("run-*"))[-1]
    assert json.loads((run / "run.json").read_text())["forwarded_signals"] == [signal.SIGTERM]


def test_errors(tmp_path):
    p, run = collect(tmp_path, "--so", str(tmp_path / "nope.so"), "--", "true")
    assert p.returncode == 2 and "nope.so" in p.stderr and run is None
    p, _ = collect(tmp_path, "--nvtx-json", "no-such-profile", "--", "true")
    assert p.returncode == 2 and "built-in" in p.stderr
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"module": "__main__", "functions": ["f"]}]))
    p, _ = collect(tmp_path, "--nvtx-json", str(bad), "--", "true")
    assert p.returncode == 2 and "__main__" in p.stderr
    # as a shell says it: 127 not found, 126 not executable
    p, _ = collect(tmp_path, "--", "definitely-not-a-command-xyz")
    assert p.returncode == 127 and "command not found" in p.stderr
    noexec = tmp_path / "noexec.sh"
    noexec.write_text("#!/bin/sh\necho hi\n")
    p, _ = collect(tmp_path, "--", str(noexec))
    assert p.returncode == 126 and "cannot execute" in p.stderr
    p, _ = collect(tmp_path, "--", str(tmp_path))  # (exec says EACCES; a shell: a directory)
    assert p.returncode == 126 and f"{tmp_path}: cannot execute: is a directory" in p.stderr, p.stderr
    p, _ = collect(tmp_path, "--", "")
    assert p.returncode == 127 and "'': command not found" in p.stderr, p.stderr
    noexec.write_text("#!/nonexistent/interp\necho hi\n")
    noexec.chmod(0o755)
    p, _ = collect(tmp_path, "--", str(noexec))
    assert p.returncode == 127 and "bad interpreter (/nonexistent/interp" in p.stderr, p.stderr
    # --so: a directory, and a shared library that is not a shim
    p, _ = collect(tmp_path, "--so", str(tmp_path), "--", "true")
    assert p.returncode == 2 and "a directory, not a shim library" in p.stderr
    dirs = ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/lib64", "/lib")
    libc = next((Path(d) / "libc.so.6" for d in dirs if (Path(d) / "libc.so.6").is_file()), None)
    if libc is not None:
        p, _ = collect(tmp_path, "--so", str(libc), "--", "true")
        assert p.returncode == 2 and "not a teller shim" in p.stderr
    # --cuda-home beside --so is checked too (it names the CUPTI to load; was ignored when missing)
    so = str(shim.locate())
    p, run = collect(tmp_path, "--so", so, "--cuda-home", str(tmp_path / "nowhere"), "--", "true")
    assert p.returncode == 2 and "nowhere: no such directory" in p.stderr and run is None, p.stderr
    # an --nvtx-json that cannot be read names the file (EIO reading /proc/self/mem: a traceback)
    p, run = collect(tmp_path, "--so", so, "--nvtx-json", "/proc/self/mem", "--", "true")
    assert p.returncode == 2 and "/proc/self/mem: cannot read it" in p.stderr and run is None, p.stderr


def test_program_without_events(tmp_path):
    p, run = collect(tmp_path, "--", sys.executable, "-c", "print('hello')")
    assert p.returncode == 0 and "hello" in p.stdout
    assert "no events were recorded" in p.stderr
    assert (run / "run.json").exists() and (run / "log.txt").read_text().endswith("stdout hello\n")


def test_a_cuda_home_that_is_not_a_toolkit_is_named(tmp_path):
    """--cuda-home searches only that root: a missing directory, or one without NVTX headers, is
    said as such (not as "install the nvidia-nvtx wheel")."""
    from teller.errors import CudaNotFoundError

    with pytest.raises(CudaNotFoundError, match=r"--cuda-home .*nowhere: no such directory"):
        shim.build(cuda_home=tmp_path / "nowhere")
    with pytest.raises(CudaNotFoundError, match=r"no NVTX headers \(nvtx3/nvToolsExt.h\) in its include"):
        shim.build(cuda_home=tmp_path)
    # NVTX alone: every other header the build needs is named at once, before compiling (build.sh
    # named the first, and advised TELLER_CUDA_INCLUDE, which teller overrides)
    (tmp_path / "include" / "nvtx3").mkdir(parents=True)
    (tmp_path / "include" / "nvtx3" / "nvToolsExt.h").write_text("")
    with pytest.raises(CudaNotFoundError) as e:
        shim.build(cuda_home=tmp_path)
    assert "cupti.h, cuda.h, crt/host_defines.h not found in its include directories" in str(e.value)
    assert "extras/CUPTI/include" in str(e.value) and "TELLER_CUDA_INCLUDE" not in str(e.value)


def test_collect_against_a_baseline_run(tmp_path):
    # the same program twice, the second with a slow step: --baseline says what changed when it ends
    prog = write(
        tmp_path,
        "steps.py",
        """
        import sys, time, nvtx
        slow = len(sys.argv) > 1
        for i in range(4):
            with nvtx.annotate(f"ProfilerStep#{i}", domain="app"):
                with nvtx.annotate("work", domain="app"):
                    time.sleep(0.002)
                if slow and i == 2:
                    with nvtx.annotate("stall", domain="app"):
                        time.sleep(0.05)
        """,
    )
    p, base = collect(tmp_path, "--", sys.executable, str(prog))
    assert p.returncode == 0, p.stderr
    p, run = collect(tmp_path, "--baseline", str(base), "--", sys.executable, str(prog), "slow")
    assert p.returncode == 0 and run != base, p.stderr
    said = [ln for ln in p.stderr.splitlines() if "against the baseline:" in ln]
    assert said and any("stall is new" in ln for ln in said), p.stderr
    # a baseline that does not exist, or is no trace, is said before the program runs (nothing run)
    before = sorted((tmp_path / "traces").glob("run-*"))
    (tmp_path / "empty").mkdir()
    for bad in ("nope", "empty"):
        p, _ = collect(tmp_path, "--baseline", str(tmp_path / bad), "--", sys.executable, str(prog))
        assert p.returncode == 2 and "--baseline" in p.stderr and bad in p.stderr, p.stderr
    assert sorted((tmp_path / "traces").glob("run-*")) == before
    # without a trace of the run (--no-convert) it says so
    p, _ = collect(tmp_path, "--no-convert", "--baseline", str(base), "--", sys.executable, str(prog))
    assert p.returncode == 0 and "--baseline: no trace of this run to compare" in p.stderr, p.stderr


def test_a_relative_trace_dir_holds_what_a_program_writes_elsewhere(tmp_path):
    """The run directory reaches the program as an absolute path: a program that changes directory
    (or a child started in another one) still writes into the run."""
    prog = write(
        tmp_path,
        "chdir.py",
        """
        import os, subprocess, sys, nvtx
        os.makedirs("elsewhere", exist_ok=True)
        os.chdir("elsewhere")
        with nvtx.annotate("after-chdir"):
            pass
        subprocess.run([sys.executable, "-c", "import nvtx; nvtx.mark('child')"], cwd="/", check=True)
        """,
    )
    cmd = teller_cmd("traces", sys.executable, str(prog))
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    (run,) = (tmp_path / "traces").glob("run-*")
    assert (
        len(list((run / "raw").glob("*.tmsgpack"))) == 2 and not (tmp_path / "elsewhere" / "traces").exists()
    )
    assert {"after-chdir", "child"} <= set(names(T.load(run, warn=False)))


def test_a_closed_output_reaches_the_program(tmp_path):
    """`teller collect -- yes | head -1` ends as `yes | head -1` does: the program gets SIGPIPE."""
    teller = f"{sys.executable} -m teller collect --no-convert --trace-dir traces"
    sh = f"{teller} -- yes | head -1; echo ${{PIPESTATUS[0]}}"
    p = subprocess.run(["bash", "-c", sh], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    out = p.stdout.split()
    assert out[0] == "y" and out[-1] == "141", (p.stdout, p.stderr)
    assert "killed by SIGPIPE" in p.stderr


def test_a_background_process_holding_the_output_does_not_hold_teller(tmp_path):
    t0 = time.monotonic()
    p, run = collect(tmp_path, "--no-convert", "--", "sh", "-c", "(sleep 30 &); echo done", timeout=60)
    assert p.returncode == 0 and time.monotonic() - t0 < 20, p.stderr
    assert "still held its output" in p.stderr
    assert json.loads((run / "run.json").read_text())["exit_code"] == 0


def test_a_long_unfinished_line_is_logged_in_pieces(tmp_path):
    """A progress bar drawn with \\r and no newline (3 MB here) is read in linear time and logged."""
    prog = write(
        tmp_path,
        "bar.py",
        """
        import sys
        for i in range(150000):
            sys.stderr.write(f"\\rprogress {i:>10}")
        sys.stderr.flush()
        """,
    )
    p, run = collect(tmp_path, "--no-convert", "--", sys.executable, str(prog), timeout=120)
    assert p.returncode == 0, p.stderr
    lines = (run / "log.txt").read_bytes().rstrip(b"\n").split(b"\n")  # (the \r stay inside lines)
    assert 2 <= len(lines) <= 4 and (run / "stderr.log").stat().st_size == 150000 * 20


def test_ctrl_c_at_the_terminal_reaches_the_program_once(tmp_path):
    pty = pytest.importorskip("pty")
    import select

    prog = write(
        tmp_path,
        "cnt.py",
        """
        import signal, time
        n = 0
        def h(s, f):
            global n
            n += 1
        signal.signal(signal.SIGINT, h)
        print("ready", flush=True)
        t = time.time()
        while time.time() - t < 1.5:
            time.sleep(0.01)
        print("count", n, flush=True)
        """,
    )
    cmd = [sys.executable, "-m", "teller", "collect", "--no-convert", "--trace-dir", str(tmp_path / "traces")]
    try:
        pid, fd = pty.fork()
    except OSError as e:
        pytest.skip(f"no pseudo-terminal here: {e}")
    if pid == 0:  # pragma: no cover - the child
        os.execv(sys.executable, [*cmd, "--", sys.executable, str(prog)])
    out, sent, t0 = b"", False, time.monotonic()
    while time.monotonic() - t0 < 60:
        r, _, _ = select.select([fd], [], [], 0.05)
        if r:
            try:
                b = os.read(fd, 4096)
            except OSError:
                break
            if not b:
                break
            out += b
        if not sent and b"ready" in out:
            time.sleep(0.3)
            os.write(fd, b"\x03")  # the terminal sends SIGINT to the whole foreground group
            sent = True
    os.waitpid(pid, 0)
    assert b"count 1" in out, out
    run = sorted((tmp_path / "traces").glob("run-*"))[-1]
    info = json.loads((run / "run.json").read_text())
    assert info["terminal_signals"] == [signal.SIGINT] and info["forwarded_signals"] == []


def test_nvtx_json_says_what_it_cannot_wrap_and_why(tmp_path):
    (tmp_path / "mymod.py").write_text(
        "class K:\n    def meth(self):\n        return 1\n"
        "class K2(K):\n    pass\n"
        "def compute():\n    return 2\n"
    )
    prog = write(tmp_path, "app.py", "import mymod\nmymod.compute(); mymod.K2().meth(); mymod.K().meth()\n")
    groups = tmp_path / "g.json"
    groups.write_text(json.dumps([{"module": "mymdo", "functions": ["compute"]}]))
    p, _ = _collect_groups(tmp_path, groups, prog)
    assert "module(s) mymdo never imported by the program" in p.stderr
    groups.write_text(
        json.dumps([{"module": "mymod", "functions": ["missing", "Nope.meth", "K2.nah", "K2.meth"]}])
    )
    p, run = _collect_groups(tmp_path, groups, prog)
    for said in ("mymod has no function 'missing'", "mymod has no class 'Nope'", "K2 has no method 'nah'"):
        assert said in p.stderr, p.stderr
    # an inherited method named through the subclass: wrapped for that class only
    assert names(T.load(run, warn=False)) == ["mymod.K2.meth"]
    groups.write_text(json.dumps([{"module": "mymod", "functions": ["compute"], "name": "{bogus}"}]))
    p, _ = _collect_groups(tmp_path, groups, prog)
    assert p.returncode == 2 and "'name' uses unknown field {bogus}" in p.stderr
    p, _ = collect(tmp_path, "--nvtx-json", str(tmp_path), "--", "true")
    assert p.returncode == 2 and "a directory, not an --nvtx-json file" in p.stderr


def test_nvtx_json_survives_a_find_spec_probe_and_names_the_class_by_any_cls_field(tmp_path):
    """(from a review) `importlib.util.find_spec` before the import (transformers does it of torch)
    took the module's callbacks and imported nothing: the import then wrapped nothing and teller said
    the module was never imported. A C function stored on a class (called without the instance) stays
    unbound once wrapped, and `{cls!s}` names the class a method is called on, as `{cls}` does."""
    (tmp_path / "probed.py").write_text(
        "import time\n"
        "class Base:\n    def run(self):\n        return 1\n"
        "class Llama(Base):\n    pass\n"
        "class Clock:\n    now = time.monotonic\n    def read(self):\n        return self.now()\n"
        "def work():\n    return 2\n"
    )
    prog = write(
        tmp_path,
        "app.py",
        """
        import importlib.util
        assert importlib.util.find_spec("probed") is not None  # (a probe: imports nothing)
        import probed
        probed.work(); probed.Llama().run(); print("clock", probed.Clock().read() > 0, flush=True)
        """,
    )
    groups = tmp_path / "g.json"
    groups.write_text(
        json.dumps(
            [
                {"module": "probed", "functions": ["work", "Clock.now"]},
                {"module": "probed", "functions": ["Base.run"], "name": "{cls!s}.{function}"},
            ]
        )
    )
    p, run = _collect_groups(tmp_path, groups, prog)
    assert p.returncode == 0 and "clock True" in p.stdout, p.stderr
    assert "never imported" not in p.stderr and "cannot wrap" not in p.stderr, p.stderr
    assert sorted(names(T.load(run, warn=False))) == ["Llama.run", "probed.Clock.now", "probed.work"]
    # a format spec the names cannot take is refused before the program starts
    groups.write_text(json.dumps([{"module": "probed", "functions": ["work"], "name": "{module:d}"}]))
    p, _ = _collect_groups(tmp_path, groups, prog)
    assert p.returncode == 2 and "'name' does not format the names it is given" in p.stderr, p.stderr
    assert "clock" not in p.stdout


def test_nvtx_json_never_imported_is_said_for_the_whole_run(tmp_path):
    """A module is "never imported" when no Python process of the run imported it: not when only a
    worker did, and also when the program is started through a wrapper (a shell script, say)."""
    (tmp_path / "mymod.py").write_text("def compute():\n    return 2\n")
    (tmp_path / "other.py").write_text("def f():\n    return 1\n")
    worker = write(tmp_path, "worker.py", "import mymod\nmymod.compute()\n")
    # the program imports `other` itself and `mymod` only in a worker it starts, and is started by sh
    prog = write(
        tmp_path,
        "app.py",
        "import subprocess, sys, other\nother.f()\n"
        f"subprocess.run([sys.executable, {str(worker)!r}], check=True)\n",
    )
    groups = tmp_path / "g.json"
    groups.write_text(
        json.dumps(
            [
                {"module": m, "functions": [f]}
                for m, f in (("mymod", "compute"), ("other", "f"), ("mymdo", "x"))
            ]
        )
    )
    p, run = collect(
        tmp_path,
        "--nvtx-json",
        str(groups),
        "--",
        "sh",
        "-c",
        '"$0" "$1"',
        sys.executable,
        str(prog),
        env={"PYTHONPATH": str(tmp_path)},
    )
    assert p.returncode == 0, p.stderr
    said = [ln for ln in p.stderr.splitlines() if "never imported" in ln]
    assert len(said) == 1 and "module(s) mymdo never imported" in said[0] and "2 Python processes" in said[0]
    assert sorted(names(T.load(run, warn=False))) == ["mymod.compute", "other.f"]
    assert not (run / ".nvtx-imports").exists()
    # a Python that ignores PYTHONPATH runs no hook: said, as nothing was wrapped
    p, _ = collect(tmp_path, "--nvtx-json", str(groups), "--", sys.executable, "-I", "-c", "pass")
    assert p.returncode == 0 and "no Python process of the program loaded teller's hook" in p.stderr, p.stderr


def test_a_slow_reader_of_the_output_loses_nothing(tmp_path):
    """The 2 s after the program's exit count only while no output flows: a reader that takes its
    time (`| less`, a slow link) still gets everything, and so do the logs."""
    teller = f"{sys.executable} -m teller collect --no-convert --trace-dir traces"
    sh = f"{teller} -- seq 1 30000 | (sleep 3; wc -l)"
    p = subprocess.run(["bash", "-c", sh], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert p.stdout.split() == ["30000"] and "still held its output" not in p.stderr, (p.stdout, p.stderr)
    (run,) = (tmp_path / "traces").glob("run-*")
    assert len((run / "log.txt").read_text().splitlines()) == 30000


def test_an_exit_code_above_128_is_not_a_signal(tmp_path):
    p, _ = collect(tmp_path, "--no-convert", "--", "sh", "-c", "exit 137")
    assert p.returncode == 137 and "(exit status 137)" in p.stderr and "killed" not in p.stderr
    p, _ = collect(tmp_path, "--no-convert", "--", "sh", "-c", "kill -9 $$")
    assert p.returncode == 137 and "killed by SIGKILL, exit status 137" in p.stderr


def test_logs_that_cannot_be_written_do_not_stop_the_program(tmp_path):
    """(from a review) A log write that fails (here a file-size limit; a full disk alike) killed the
    copying thread: nobody read the program's pipe any more, the program blocked on it and teller
    waited for good. The logs now stop where they failed, and the output is still copied whole."""
    import resource

    limit = 200 * 1024

    def small_files():  # pragma: no cover - in the child
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    prog = "for i in range(20000): print('x' * 99)"
    cmd = [sys.executable, "-m", "teller", "collect", "--no-convert", "--trace-dir", str(tmp_path / "traces")]
    p = subprocess.run(
        [*cmd, "--", sys.executable, "-c", prog],
        capture_output=True,
        timeout=120,
        preexec_fn=small_files,
        cwd=tmp_path,
    )
    assert p.returncode == 0, p.stderr
    assert len(p.stdout) == 20000 * 100  # (a pipe: no size limit on teller's own output)
    err = p.stderr.decode()
    assert "the logs of the program's stdout are incomplete" in err and "File too large" in err, err
    run = sorted((tmp_path / "traces").glob("run-*"))[-1]
    assert json.loads((run / "run.json").read_text())["returncode"] == 0
    assert (run / "log.txt").stat().st_size <= limit


def test_builtin_torch_profile_under_torch_compile_fullgraph(tmp_path):
    """(from a review) Dynamo traced into the wrapper of `Module._call_impl` and could not trace the
    NVTX calls: `torch.compile(fullgraph=True)` failed, and without fullgraph every module call broke
    the graph. Under compilation the wrapper now calls the function as it is; eager calls keep their
    ranges."""
    prog = write(
        tmp_path,
        "comp.py",
        """
        import torch
        class Block(torch.nn.Module):  # (a user's module: Dynamo inlines its _call_impl, not torch's)
            def __init__(self):
                super().__init__()
                self.l = torch.nn.Linear(4, 4)
            def forward(self, x):
                return self.l(x).relu()
        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.a, self.b = Block(), Block()
            def forward(self, x):
                return self.b(self.a(x))
        m = Net()
        x = torch.randn(3, 4)
        c = torch.compile(m, backend="eager", fullgraph=True)
        y = c(x)  # (compiled before any eager call: no range of a module class made yet)
        assert torch.allclose(y, m(x))  # eager: ranges
        print("compiled ok", flush=True)
        """,
    )
    p, run = collect(
        tmp_path,
        "--nvtx-json",
        "torch",
        "--",
        sys.executable,
        str(prog),
        env={"OMP_NUM_THREADS": "1"},
    )
    assert p.returncode == 0, p.stderr
    assert "compiled ok" in p.stdout
    n = names(T.load(run, warn=False))
    # the compiled call: one range for the call into the compiled module, none inside; the eager
    # call: every module
    assert sorted(n) == ["Block", "Block", "Linear", "Linear", "Net", "OptimizedModule"], n


def _fake_torch(d: Path, cuda: bool) -> None:
    """A `torch` whose `torch.cuda.nvtx` is shaped as torch's own: with `cuda`, its `_nvtx` functions
    log each call to `nvtx-calls.txt`; without, CPU torch's stub (one `_fail` bound to every name,
    raising on use). And an `nvtx` package that is not installed."""
    (d / "torch" / "cuda").mkdir(parents=True)
    write(d, "torch/__init__.py", "")
    write(d, "torch/cuda/__init__.py", "")
    real = f"""
        import os
        LOG = {str(d / "nvtx-calls.txt")!r}
        class _native:
            @staticmethod
            def rangePushA(msg):
                open(LOG, "a").write(f"push {{msg}}\\n")
                return 0
            @staticmethod
            def rangePop():
                open(LOG, "a").write("pop\\n")
                return 0
        _nvtx = _native
    """
    stub = """
        class _NVTXStub:
            @staticmethod
            def _fail(*args, **kwargs):
                raise RuntimeError("NVTX functions not installed. Are you sure you have a CUDA build?")
            rangePushA = _fail
            rangePop = _fail
        _nvtx = _NVTXStub()
    """
    tail = """
        def range_push(msg):
            return _nvtx.rangePushA(msg)
        def range_pop():
            return _nvtx.rangePop()
    """
    write(d, "torch/cuda/nvtx.py", (real if cuda else stub) + tail)
    write(d, "nvtx.py", "raise ImportError('no nvtx here')\n")


def _collect_with_fake_torch(tmp_path: Path, cuda: bool):
    """`mymod.f` wrapped through the fake torch's NVTX, called twice: the finished process."""
    _fake_torch(tmp_path, cuda=cuda)
    write(tmp_path, "mymod.py", "def f(x):\n    return x + 1\n")
    prog = write(tmp_path, "app.py", "import mymod\nprint('sum', mymod.f(1) + mymod.f(2))\n")
    groups = tmp_path / "g.json"
    groups.write_text(json.dumps([{"module": "mymod", "functions": ["f"]}]))
    return _collect_groups(tmp_path, groups, prog)[0]


def test_nvtx_json_with_a_torch_that_cannot_push_ranges_leaves_the_program_alone(tmp_path):
    """(from a review) Without the `nvtx` package the hook took torch.cuda.nvtx, which CPU torch
    has but which raises on every push: every wrapped call raised and the program died. It is now
    tried once, and the program runs unwrapped with one message."""
    p = _collect_with_fake_torch(tmp_path, cuda=False)
    assert p.returncode == 0, p.stderr
    assert "sum 5" in p.stdout
    assert p.stderr.count("torch.cuda.nvtx cannot push ranges") == 1, p.stderr
    assert "Traceback" not in p.stderr


def test_nvtx_json_through_torch_cuda_nvtx_records_no_probe_range(tmp_path):
    """(from a review) Without the `nvtx` package the hook uses torch.cuda.nvtx; deciding whether it
    works must not push a range of its own (a "teller-probe" range reached every such trace)."""
    p = _collect_with_fake_torch(tmp_path, cuda=True)
    assert p.returncode == 0 and "sum 5" in p.stdout, p.stderr
    calls = (tmp_path / "nvtx-calls.txt").read_text().splitlines()
    assert calls == ["push mymod.f", "pop", "push mymod.f", "pop"], calls


@pytest.mark.parametrize("where", ["before", "after"])
def test_another_chain_loading_sitecustomize_beside_ours(tmp_path, where):
    """(from reviews) Another tool's hook that loads "the next sitecustomize" other than its own, as
    teller's does. Before ours on the path, teller's loaded it again and the two loaded each other
    until the recursion limit. After ours, it loaded ours again: a second install put a second
    finder on sys.meta_path, and the two asked each other until a RecursionError killed the
    program at its first wrapped import. Each now runs once and the function is wrapped once."""
    other = tmp_path / "other"
    other.mkdir()
    write(
        other,
        "sitecustomize.py",
        """
        import importlib.util, os, sys
        print("other hook", file=sys.stderr, flush=True)
        me = os.path.dirname(os.path.abspath(__file__))
        for p in sys.path:
            c = os.path.join(p or ".", "sitecustomize.py")
            if os.path.abspath(p or ".") != me and os.path.isfile(c):
                spec = importlib.util.spec_from_file_location("_other_chained", c)
                spec.loader.exec_module(importlib.util.module_from_spec(spec))
                break
        """,
    )
    write(tmp_path, "mymod.py", "def f():\n    return 1\n")
    child = write(tmp_path, "child.py", "import mymod\nmymod.f()\nprint('child done')\n")
    # the program starts a child with the other tool's hook before or after teller's on its path
    # (not teller itself: its own process would load the other hook too)
    path = (
        f"{str(other)!r} + os.pathsep + os.environ['PYTHONPATH']"
        if where == "before"
        else f"os.environ['PYTHONPATH'] + os.pathsep + {str(other)!r}"
    )
    prog = write(
        tmp_path,
        "app.py",
        f"""
        import os, subprocess, sys
        env = dict(os.environ, PYTHONPATH={path})
        subprocess.run([sys.executable, {str(child)!r}], env=env, check=True)
        """,
    )
    groups = tmp_path / "g.json"
    groups.write_text(json.dumps([{"module": "mymod", "functions": ["f"]}]))
    p, run = _collect_groups(tmp_path, groups, prog)
    assert p.returncode == 0 and "child done" in p.stdout, p.stderr
    assert p.stderr.count("other hook") == 1 and "RecursionError" not in p.stderr, p.stderr
    assert names(T.load(run, warn=False)).count("mymod.f") == 1  # (wrapped once)


def test_a_profile_name_beside_a_directory_of_that_name_is_the_profile(tmp_path, monkeypatch):
    """(from a review) In a vllm checkout `--nvtx-json vllm` was refused as "a directory"."""
    from teller.collect.launcher import PROFILE_DIR, resolve_nvtx_json
    from teller.errors import ConfigError

    monkeypatch.chdir(tmp_path)
    (tmp_path / "vllm").mkdir()
    assert resolve_nvtx_json("vllm") == PROFILE_DIR / "vllm.json"
    with pytest.raises(ConfigError, match="a directory, not an --nvtx-json file"):
        resolve_nvtx_json("./vllm")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_program_stopped_by_a_signal_stops_teller_by_it(tmp_path, sig):
    """(from a review) teller exited 130 where the program died of SIGINT: a shell loop around
    `teller collect` went on after Ctrl-C (bash stops only after a child killed by SIGINT). teller
    now ends by the program's SIGINT, SIGTERM or SIGHUP once the run is written; other signals (a
    crash) stay exit codes."""
    # (the signal's default action, whatever the program inherited: a shell's background job starts
    # with SIGINT ignored, and Python then keeps it ignored)
    code = (
        f"import os, signal, time; print('before', flush=True); signal.signal({int(sig)}, signal.SIG_DFL); "
        f"os.kill(os.getpid(), {int(sig)}); time.sleep(30)"
    )
    p, run = collect(tmp_path, "--", sys.executable, "-c", code)
    assert p.returncode == -sig, (p.returncode, p.stderr)
    assert "before" in p.stdout and f"killed by {signal.Signals(sig).name}" in p.stderr
    info = json.loads((run / "run.json").read_text())
    assert info["exit_signal"] == sig and info["returncode"] == 128 + sig


def test_concurrent_shim_builds_share_one_build(tmp_path):
    """(from a review) Builders on a fresh cache (`srun -n 8 teller collect ...`) removed each
    other's directories (a temporary name by pid alone; rmtree then rename): a lock per build key now
    lets one build and the others take its library; a forced rebuild replaces it whole."""
    env = {**os.environ, "TELLER_CACHE_DIR": str(tmp_path / "cache")}
    code = "from teller.collect import shim; print(shim.build(quiet=False))"  # ("built ..." by a builder)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        for _ in range(3)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [e.decode() for _, e in outs]
    lines = [o.decode().splitlines() for o, _ in outs]
    assert sum(1 for ls in lines for x in ls if x.startswith("built ")) == 1, lines  # (one build)
    libs = {ls[-1] for ls in lines}
    assert len(libs) == 1 and Path(libs.pop()).is_file()
    root = tmp_path / "cache" / "shim"
    built = [d for d in root.iterdir() if d.is_dir()]
    assert len(built) == 1, sorted(root.iterdir())  # (no temporary directory left behind)
    assert built[0].stat().st_mode & 0o755 == 0o755  # (a shared cache stays readable: not mkdtemp's 0700)
    before = (built[0] / "build.json").stat().st_mtime_ns
    forced = subprocess.run(
        [sys.executable, "-c", "from teller.collect import shim; print(shim.build(force=True))"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert forced.returncode == 0, forced.stderr
    assert [d for d in root.iterdir() if d.is_dir()] == built
    assert (built[0] / "build.json").stat().st_mtime_ns != before
