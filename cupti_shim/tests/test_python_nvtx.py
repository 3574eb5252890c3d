"""Python `nvtx` package under the shim: domains, registered strings, colors, payloads, start/end,
and fork-based multiprocessing workers that are terminated (SIGTERM) or leave with os._exit.

Run by run_tests.sh with NVTX_INJECTION64_PATH and TELLER_TRACE_DIR set. Exit 77 = skipped."""
import multiprocessing as mp
import os
import sys
import time

try:
    import nvtx
except ImportError:
    print("SKIP: the nvtx package is not installed")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_raw  # noqa: E402


def worker_exit(_):
    with nvtx.annotate("worker-exit-range", domain="workers"):
        pass
    nvtx.push_range("worker-open-at-exit", domain="workers")
    os._exit(0)


def worker_forever(_):
    with nvtx.annotate("worker-before-hang", domain="workers"):
        pass
    nvtx.push_range("worker-hang", domain="workers")
    time.sleep(60)


def main():
    trace_dir = os.environ["TELLER_TRACE_DIR"]
    with nvtx.annotate("py-outer", color="blue", domain="pydom", payload=7):
        with nvtx.annotate("py-inner", domain="pydom"):
            nvtx.mark("py-mark", domain="pydom")
    rng = nvtx.start_range("py-startend")
    nvtx.end_range(rng)
    ctx = mp.get_context("fork")
    p = ctx.Process(target=worker_exit, args=(0,))
    p.start()
    p.join()
    pool = ctx.Pool(2)
    pool.map_async(worker_forever, range(2))
    time.sleep(1.0)
    pool.terminate()  # SIGTERM to the workers
    pool.join()

    files = check_raw.load_dir(trace_dir)
    me = [f for f in files if f.header["pid"] == os.getpid()]
    assert len(me) == 1, f"{len(me)} files for the main process"
    R = {r["name"]: r for r in me[0].ranges().values()}
    assert R["py-outer"]["domain"] == "pydom", R["py-outer"]
    assert R["py-outer"]["args"].get("payload") == 7 and "color" in R["py-outer"]["args"], R["py-outer"]["args"]
    assert R["py-outer"]["start"] < R["py-inner"]["start"] <= R["py-inner"]["end"] < R["py-outer"]["end"]
    assert R["py-startend"]["end"] is not None
    marks = [me[0].s(m[2]) for m in me[0].of(check_raw.MARK)]
    assert marks == ["py-mark"], marks
    kids = [f for f in files if f.header["pid"] != os.getpid()]
    exit_kid = [f for f in kids if any(r["name"] == "worker-exit-range" for r in f.ranges().values())]
    assert len(exit_kid) == 1, "os._exit worker file"
    ks = {r["name"]: r for r in exit_kid[0].ranges().values()}
    assert ks["worker-exit-range"]["end"] is not None and ks["worker-open-at-exit"]["end"] is None
    hung = [f for f in kids if any(r["name"] == "worker-hang" for r in f.ranges().values())]
    assert len(hung) == 2, f"{len(hung)} terminated pool workers have files"
    for f in hung:
        hs = {r["name"]: r for r in f.ranges().values()}
        assert hs["worker-before-hang"]["end"] is not None and hs["worker-hang"]["end"] is None
        assert f.header["ppid"] == os.getpid()
    print(f"python nvtx: {len(files)} files (main, os._exit worker, 2 SIGTERMed pool workers) OK")


if __name__ == "__main__":
    main()
