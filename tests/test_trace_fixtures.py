"""Every real fixture loads; counts match an independent count made with the json module."""

from __future__ import annotations

import collections
import json

import numpy as np
import pytest
import teller.trace as T
from conftest import FIXTURES, TRACES

# Category each layer falls back to when an event has no "cat" (teller's documented behaviour).
DEFAULT_CAT = {"i": "marker", "I": "marker", "R": "marker", "X": "other", "B": "other"}


def independent_counts(doc) -> tuple[collections.Counter, int, int]:
    """(events per category, GPU activities, GPU activities with a launch correlation) by json alone."""
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    cats: collections.Counter = collections.Counter()
    api_corr: dict[tuple[object, int], bool] = {}
    gpu = []
    open_b: collections.Counter = collections.Counter()
    for e in events:
        ph = e.get("ph")
        cat = e.get("cat")
        if ph in ("X", "i", "I", "R"):
            cats[cat if cat is not None else DEFAULT_CAT[ph]] += 1
        elif ph == "B":
            open_b[(e.get("pid"), e.get("tid"))] += 1
            cats[cat if cat is not None else "other"] += 1
        if ph == "X" and cat in ("cuda_runtime", "cuda_driver", "Runtime"):
            c = (e.get("args") or {}).get("correlation")
            if c:
                api_corr[c] = True
        if ph == "X" and cat in ("kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset"):
            gpu.append((e.get("args") or {}).get("correlation"))
    linked = sum(1 for c in gpu if c and c in api_corr)
    return cats, len(gpu), linked


@pytest.mark.parametrize("name", FIXTURES)
def test_counts_match_json_module(name, fixture_json):
    tr = T.load(TRACES / name, warn=False)
    cats, gpu, linked = independent_counts(fixture_json(name))
    s = tr.summary()
    assert s["events"] == len(tr) == sum(cats.values())
    assert s["by_category"] == dict(cats)
    assert s["gpu_events"] == gpu
    assert s["linked_gpu_events"] == linked
    assert linked > 0


@pytest.mark.parametrize("name", FIXTURES)
def test_columns_are_consistent(name):
    tr = T.load(TRACES / name, warn=False)
    n = len(tr)
    for col in (
        "layer",
        "name",
        "ts",
        "dur",
        "pid",
        "tid",
        "device",
        "corr",
        "ext",
        "link",
        "parent",
        "step",
        "symbol",
    ):
        arr = getattr(tr, col)
        assert isinstance(arr, np.ndarray) and len(arr) == n, col
        assert not arr.flags.writeable, col
    assert np.all(np.diff(tr.ts) >= 0), "events are in call-chain (start) order"
    assert np.all(tr.dur >= 0)
    # parents precede children; a CPU parent contains its child's start
    has_parent = np.flatnonzero(tr.parent >= 0)
    assert np.all(tr.parent[has_parent] < has_parent)
    cpu_child = has_parent[tr.link[has_parent] < 0]
    par = tr.parent[cpu_child]
    assert np.all(tr.ts[par] <= tr.ts[cpu_child]) and np.all(tr.ts[cpu_child] <= tr.end[par])
    gpu = tr.layer_mask("kernel", "memcpy", "memset")
    linked = gpu & (tr.link >= 0)
    assert np.all(tr.parent[linked] == tr.link[linked])
    launch = tr.link[linked]
    assert np.all(np.isin(tr.layer[launch], [T.LAYER_NAMES.index("runtime"), T.LAYER_NAMES.index("driver")]))
    assert np.all(tr.corr[launch] == tr.corr[linked])
    # symbols are layer-prefixed
    for i in range(0, n, max(1, n // 50)):
        assert tr.symbol_of(i).startswith(tr.layer_name(i) + ":")
    assert len(tr.steps()) >= 1


def _event_key(tr):
    names = tr.strings
    return sorted(
        zip(
            tr.layer.tolist(),
            [names[i] for i in tr.name],
            tr.ts.tolist(),
            tr.dur.tolist(),
            tr.corr.tolist(),
            tr.ext.tolist(),
            strict=True,
        )
    )


@pytest.mark.parametrize("name", FIXTURES)
def test_round_trip_preserves_events(name, tmp_path):
    tr = T.load(TRACES / name, warn=False)
    out = tmp_path / "rt.json.gz"
    tr.to_chrome(out)
    tr2 = T.load(out, warn=False)
    assert len(tr2) == len(tr)
    assert _event_key(tr2) == _event_key(tr)
    assert tr2.summary()["linked_gpu_events"] == tr.summary()["linked_gpu_events"]
    assert [s.name for s in tr2.steps()] == [s.name for s in tr.steps()]
    # args survive too
    i = int(np.flatnonzero(tr.layer_mask("kernel"))[0])
    j = int(np.flatnonzero((tr2.ts == tr.ts[i]) & (tr2.name == tr2.strings.index(tr.name_of(i))))[0])
    a, b = tr.args(i), tr2.args(j)
    b.pop("teller.step", None)
    assert a == b


def test_graph_launch_links_many_kernels_to_one_call():
    tr = T.load(TRACES / "mi300x_sglang_decode_hipgraph.kineto.json.gz", warn=False)
    k = tr.layer_mask("kernel") & (tr.link >= 0)
    launches = np.unique(tr.link[k])
    assert k.sum() >= 500 and len(launches) <= 20
    assert {tr.name_of(int(i)) for i in launches} <= {
        "hipGraphLaunch",
        "hipLaunchKernel",
        "hipExtModuleLaunchKernel",
        "hipModuleLaunchKernel",
        "cudaGraphLaunch",
    }


def test_old_kineto_quirks():
    tr = T.load(TRACES / "resnet50_2020_barelist.kineto.json.gz", warn=False)
    # "stream 7" tids become stream 7; numeric-string tids become ints
    k = tr.layer_mask("kernel")
    assert set(np.unique(tr.tid[k]).tolist()) == {7}
    assert set(np.unique(tr.device[k]).tolist()) == {0}
    cpu = tr.layer_mask("host_op")
    assert 4093687616 in set(tr.tid[cpu].tolist())
    # lower-case "external id" is read
    assert (tr.ext[cpu] > 0).any()


def test_label_pids_survive(tmp_path):
    tr = T.load(TRACES / "a100_nccl_2rank.kineto.json.gz", warn=False)
    trace_events = [i for i in range(len(tr)) if tr.strings[int(tr.cat[i])] == "Trace"]
    assert len(trace_events) == 1
    out = tmp_path / "t.json"
    tr.to_chrome(out)
    import json

    doc = json.loads(out.read_text())
    row = [e for e in doc["traceEvents"] if e.get("cat") == "Trace"][0]
    assert row["pid"] == "Spans" and row["tid"] == "PyTorch Profiler"


def _sort_indices(doc, labels: bool = False) -> set:
    ev = doc["traceEvents"] if isinstance(doc, dict) else doc
    names = ("process_sort_index", "thread_sort_index") + (("process_labels",) if labels else ())
    return {
        (
            e["name"],
            str(e["pid"]),
            str(e.get("tid")) if e["name"] == "thread_sort_index" else None,
            e["args"].get("sort_index", e["args"].get("labels")),
        )
        for e in ev
        if e.get("ph") == "M" and e.get("name") in names
    }


@pytest.mark.parametrize("name", ["a100_nccl_2rank.kineto.json.gz", "b300_cuda13_moe.kineto.json.gz"])
def test_track_sort_indices_survive_a_round_trip(name, tmp_path):
    """Kineto orders its tracks with process_sort_index / thread_sort_index (the GPUs after the host)
    and labels them with process_labels: the written trace keeps them, as read, through a snapshot
    too, so Perfetto shows the same tracks in the same order."""
    import gzip
    import pickle

    src = _sort_indices(json.loads(gzip.open(TRACES / name).read()), labels=True)
    assert {k[0] for k in src} == {"process_sort_index", "thread_sort_index", "process_labels"}
    tr = pickle.loads(pickle.dumps(T.load(TRACES / name, warn=False)))
    out = tmp_path / "rt.json"
    tr.to_chrome(out)
    assert _sort_indices(json.loads(out.read_text()), labels=True) == src
    again = tmp_path / "again.json"
    T.load(out, warn=False).to_chrome(again)
    assert _sort_indices(json.loads(again.read_text()), labels=True) == src


def test_a_sort_index_moves_with_its_process_when_merged_inputs_clash(tmp_path):
    """Two inputs with the same pids: the second file's processes move, and their sort indices with
    them; a sort index that is not a whole number is left out."""
    doc = {
        "traceEvents": [
            {"ph": "M", "name": "process_sort_index", "pid": 5, "tid": 0, "args": {"sort_index": 3}},
            {"ph": "M", "name": "thread_sort_index", "pid": 5, "tid": 9, "args": {"sort_index": -2.0}},
            {"ph": "M", "name": "process_sort_index", "pid": 6, "tid": 0, "args": {"sort_index": "x"}},
            {"ph": "M", "name": "process_sort_index", "pid": 7, "tid": 0, "args": {"sort_index": 1.5}},
            {"ph": "X", "name": "op", "cat": "cpu_op", "pid": 5, "tid": 9, "ts": 1.0, "dur": 2.0},
        ]
    }
    files = []
    for r in (0, 1):
        p = tmp_path / f"rank{r}.json"
        p.write_text(json.dumps(doc))
        files.append(p)
    out = tmp_path / "both.json"
    T.load(files, warn=False).to_chrome(out)
    got = _sort_indices(json.loads(out.read_text()))
    assert got == {
        ("process_sort_index", "5", None, 3),
        ("thread_sort_index", "5", "9", -2),
        ("process_sort_index", "10000005", None, 3),
        ("thread_sort_index", "10000005", "9", -2),
    }


def test_steps_and_tree():
    tr = T.load(TRACES / "mi250_rocm62_tiny.kineto.json.gz", warn=False)
    steps = tr.steps()
    assert [s.name for s in steps] == ["ProfilerStep#1", "ProfilerStep#2"]
    tree = tr.tree(0)
    walk = list(tree.walk())
    assert walk[0][1] == steps[0].event and walk[0][0] == 0
    # every GPU event of the step sits under its launching runtime call
    for _depth, i in walk:
        if tr.layer_name(i) in ("kernel", "memcpy") and tr.link[i] >= 0:
            assert int(tr.link[i]) in tree.nodes
    assert "runtime: hipMemcpyWithStream" in tree.render()


def test_custom_step_names_and_fallback():
    path = TRACES / "mi250_rocm62_tiny.kineto.json.gz"
    tr = T.load(path, step_names=["aten::linear"], warn=False)
    assert {s.name for s in tr.steps()} == {"aten::linear"}
    tr = T.load(path, step_names=["no-such-range-*"], warn=False)
    # fallback: the root ranges of the busiest thread (here the profiler's step ranges)
    assert [s.name for s in tr.steps()] == ["ProfilerStep#1", "ProfilerStep#2"]
    assert (tr.step >= 0).any()


def test_multiple_inputs_merge(tmp_path):
    a = TRACES / "mi250_rocm62_tiny.kineto.json.gz"
    b = TRACES / "b300_cuda13_moe.kineto.json.gz"
    ta, tb = T.load(a, warn=False), T.load(b, warn=False)
    tab = T.load([a, b], warn=False)
    assert len(tab) == len(ta) + len(tb)
    assert len(tab.sources) == 2
    assert (
        tab.summary()["linked_gpu_events"]
        == ta.summary()["linked_gpu_events"] + tb.summary()["linked_gpu_events"]
    )


def _merged_trace(path, flows: list[tuple[int, int, int, int]]) -> None:
    """Two processes (100, 200) whose correlation counters overlap, merged into one Chrome trace as
    teller writes it: runtime calls on the process, kernels on GPU tracks 0 and 1. ``flows``:
    (id, start pid, start ts, kernel index) ac2g pairs."""
    import json

    calls = [  # (pid, ts, corr)
        (100, 10, 1),
        (200, 11, 1),
        (100, 20, 2),
        (200, 21, 2),
        (100, 30, 3),
        (200, 40, 4),
    ]
    kernels = [  # (device, ts, corr)
        (0, 50, 1),  # k0: process 100's corr 1 (flow)
        (1, 51, 1),  # k1: process 200's corr 1 (flow)
        (1, 60, 2),  # k2: corr 2, no flow, both processes used it: ambiguous
        (0, 70, 3),  # k3: corr 3, no flow, only process 100 used it
        (1, 80, 4),  # k4: corr 4, a flow from pid 300 (no such call): only 200 used it
    ]
    ev = [
        {
            "ph": "X",
            "cat": "cuda_runtime",
            "name": "cudaLaunchKernel",
            "pid": p,
            "tid": p,
            "ts": ts,
            "dur": 2,
            "args": {"correlation": c},
        }
        for p, ts, c in calls
    ]
    ev += [
        {
            "ph": "X",
            "cat": "kernel",
            "name": f"k{k}",
            "pid": d,
            "tid": 7,
            "ts": ts,
            "dur": 5,
            "args": {"correlation": c, "device": d},
        }
        for k, (d, ts, c) in enumerate(kernels)
    ]
    for fid, sp, sts, k in flows:
        d, kts, _ = kernels[k]
        ev.append({"ph": "s", "cat": "ac2g", "name": "ac2g", "id": fid, "pid": sp, "tid": sp, "ts": sts})
        ev.append(
            {"ph": "f", "cat": "ac2g", "name": "ac2g", "id": fid, "pid": d, "tid": 7, "ts": kts, "bp": "e"}
        )
    path.write_text(json.dumps({"traceEvents": ev}))


def _launch_pid(tr, name: str) -> int | None:
    names = np.array(tr.strings, dtype=object)[tr.name]
    i = int(np.flatnonzero(names == name)[0])
    return None if tr.link[i] < 0 else int(tr.pid[tr.link[i]])


def test_merged_multi_process_trace_links_each_kernel_to_its_own_process(tmp_path):
    f = tmp_path / "merged.json"
    _merged_trace(f, [(1, 100, 10, 0), (2, 200, 11, 1), (3, 300, 40, 4)])
    tr = T.load(f, warn=False)
    got = {k: _launch_pid(tr, k) for k in ("k0", "k1", "k2", "k3", "k4")}
    # k2's id was used by both processes and no flow says which: unlinked, not linked to the wrong one
    assert got == {"k0": 100, "k1": 200, "k2": None, "k3": 100, "k4": 200}


def test_merged_trace_with_flow_ids_reused_across_processes(tmp_path):
    """Files merged by another tool keep Kineto's flow id = correlation id, so one id starts in two
    processes: those flows say nothing, the load says so, and the shared ids stay unlinked."""
    f = tmp_path / "merged.json"
    _merged_trace(f, [(1, 100, 10, 0), (1, 200, 11, 1)])
    tr = T.load(f, warn=False)
    assert any("more than one process" in w for w in tr.warnings)
    assert _launch_pid(tr, "k0") is None and _launch_pid(tr, "k1") is None
    assert _launch_pid(tr, "k3") == 100 and _launch_pid(tr, "k4") == 200


def test_flows_of_merged_inputs_keep_their_own_ids_in_the_written_trace(tmp_path):
    """Flow ids pair events within their file: two ranks' `fwdbwd` 3 are two flows, a string id
    and a numeric one are two, and -1 is an id like any other. teller wrote them as they were
    (Perfetto pairs version-1 flows by cat, name and id: arrows across ranks) and -1 as a huge
    negative number; each now gets an id of its own, the same on both ends."""

    def rank(pid: int, ids: list) -> dict:
        evs = [{"ph": "X", "cat": "cpu_op", "name": "op", "pid": pid, "tid": 1, "ts": 0, "dur": 50}]
        for k, fid in enumerate(ids):
            for ph, ts in (("s", 1 + k), ("f", 20 + k)):
                evs.append(
                    {
                        "ph": ph,
                        "cat": "fwdbwd",
                        "name": "fwdbwd",
                        "id": fid,
                        "pid": pid,
                        "tid": 1,
                        "ts": ts,
                        **({"bp": "e"} if ph == "f" else {}),
                    }
                )
        return {"traceEvents": evs}

    paths = []
    for pid, ids in ((100, [3, "x3", -1]), (200, [3])):
        paths.append(tmp_path / f"rank{pid}.json")
        paths[-1].write_text(json.dumps(rank(pid, ids)))
    T.load(paths, warn=False).to_chrome(tmp_path / "out.json")
    flows = [
        e for e in json.loads((tmp_path / "out.json").read_text())["traceEvents"] if e.get("cat") == "fwdbwd"
    ]
    ends = collections.defaultdict(list)
    for e in flows:
        ends[e["id"]].append((e["pid"], e["ph"]))
    assert len(ends) == 4 and all(0 < i < 2**53 for i in ends), ends
    assert sorted(map(sorted, ends.values())) == [[(p, "f"), (p, "s")] for p in (100, 100, 100, 200)]
    assert T.load(tmp_path / "out.json", warn=False).num_flows == 8


def test_inputs_of_different_processes_keep_their_processes_apart(tmp_path):
    """Two ranks' files both number their GPU tracks 0 (and may share an OS pid): merged, each keeps
    processes of its own (a later input's clashing pids move by 10_000_000), in the model and in the
    written trace, so that Perfetto shows one track per rank's GPU stream, not both interleaved."""
    import gzip
    import json

    src = json.loads(gzip.open(TRACES / "a100_nccl_2rank.kineto.json.gz").read())
    files = []
    for r in (0, 1):
        p = tmp_path / f"rank{r}.json"
        p.write_text(json.dumps(src))  # (the same pids in both: the worst case)
        files.append(p)
    one = T.load(files[0], warn=False)
    both = T.load(files, warn=False)
    first, second = both.source == 0, both.source == 1
    assert set(both.pid[first]) == set(one.pid)
    assert not set(both.pid[first]) & set(both.pid[second])
    numbers = sorted(int(p) for p in set(one.pid) if p < 2**52)
    assert sorted(int(p) for p in set(both.pid[second]) if p < 2**52) == [p + 10_000_000 for p in numbers]
    # links and steps as in each file alone
    assert both.summary()["linked_gpu_events"] == 2 * one.summary()["linked_gpu_events"]
    assert len(both.steps()) == 2 * len(one.steps())
    out = tmp_path / "both.json"
    both.to_chrome(out)
    ev = json.loads(out.read_text())["traceEvents"]
    kern = [(e["pid"], e["tid"], e["ts"]) for e in ev if e.get("cat") == "kernel"]
    assert len(kern) == len(set(kern))  # (no kernel of one rank on the other's track)
    names = {(e["pid"], e["args"]["name"]) for e in ev if e.get("ph") == "M" and e["name"] == "process_name"}
    assert len({p for p, _ in names}) == len(names)  # (one name per process)
    # Kineto's own tracks (string pids) of the second file are named after it
    labels = {e["pid"] for e in ev if isinstance(e.get("pid"), str)}
    tag = f"{tmp_path.name}/rank1.json"  # (the file with its directory: every rank's may be trace.json)
    assert {"Traces", f"Traces ({tag})", "Spans", f"Spans ({tag})"} <= labels, labels


def test_a_process_whose_pid_another_had_keeps_one_pid_and_its_gpu(tmp_path):
    """Raw files: process B reused process A's pid (another start) and wrote two files: B's events
    share one new pid, and its GPU is still device 0 after a round trip (the moved pid is not read
    back as the device)."""
    from teller.rawfmt import RawWriter

    def proc(name: str, start: int, t0: int) -> None:
        with RawWriter(tmp_path / name, pid=7, host="h", clock_sync=(0, 0), start_ns=start) as w:
            w.span("runtime", "cudaLaunchKernel", tid=7, start=t0, end=t0 + 50, corr=1)
            w.gpu("kernel", "void k(float*)", device=0, stream=7, start=t0 + 100, end=t0 + 200, corr=1)

    proc("teller-h-7-a.tmsgpack", 1, 1000)
    proc("teller-h-7-b1.tmsgpack", 2, 5000)
    proc("teller-h-7-b2.tmsgpack", 2, 9000)
    tr = T.load(sorted(tmp_path.glob("*.tmsgpack")), warn=False)
    by_source = {int(s): sorted(set(tr.pid[tr.source == s].tolist())) for s in set(tr.source.tolist())}
    # (a raw file's GPU work is on pid = its device, 0: moved with the process's own pid)
    assert by_source[0] == [0, 7] and by_source[1] == by_source[2] == [10_000_000, 10_000_007], by_source
    assert set(tr.device[tr.layer_mask("kernel")].tolist()) == {0}
    out = tmp_path / "both.json"
    tr.to_chrome(out)
    back = T.load(out, warn=False)
    assert set(back.device[back.layer_mask("kernel")].tolist()) == {0}
    # one entry per process in the file's teller.sources, B's two files in it; read back, each GPU
    # is named by its process's (first) file, as when the raw files are read
    from teller.findings import gpu_names, origin

    entries = json.loads(out.read_text())["teller"]["sources"]
    assert [(e["path"].rsplit("/", 1)[-1], e["pids"], e["events"]) for e in entries] == [
        ("teller-h-7-a.tmsgpack", [0, 7], 2),
        ("teller-h-7-b1.tmsgpack", [10_000_000, 10_000_007], 4),
    ]
    assert [p.rsplit("/", 1)[-1] for p in entries[1]["paths"]] == [
        "teller-h-7-b1.tmsgpack",
        "teller-h-7-b2.tmsgpack",
    ]
    names = gpu_names(tr.summary()["devices"], tr.sources)
    assert names == ["GPU 0 of teller-h-7-a.tmsgpack", "GPU 0 of teller-h-7-b1.tmsgpack"]
    assert gpu_names(back.summary()["devices"], back.sources) == names
    # a GPU track under a label pid is found by its label (the summary's pid is this load's id)
    srcs = [
        {
            "kind": "chrome",
            "metadata": {"teller": json.dumps({"sources": [{"path": "x", "pids": ["GPU A"]}]})},
        }
    ]
    assert origin(srcs, {"source": 0, "pid": 2**52 + 5, "pid_label": "GPU A"})["path"] == "x"
    assert origin(srcs, {"source": 0, "pid": 2**52 + 5}) is None


def test_highlighted_events_are_copied_onto_a_track_perfetto_shows(tmp_path):
    """Perfetto ignores `cname`: the highlighted events are also copied onto a "teller: culprits"
    process sorted first, one track per track they come from, and read back once, not twice."""
    import json

    tr = T.load(TRACES / "b300_cuda13_moe.kineto.json.gz", warn=False)
    kernels = np.flatnonzero(tr.layer_mask("kernel"))
    pick = [int(i) for i in kernels[::3]] + [int(np.flatnonzero(tr.layer_mask("host_op"))[0])]
    out = tmp_path / "hl.json"
    tr.to_chrome(out, highlight=pick)
    ev = json.loads(out.read_text())["traceEvents"]
    orig = [e for e in ev if e.get("ph") == "X" and e.get("cat") != "teller.culprit"]
    copies = [e for e in ev if e.get("cat") == "teller.culprit"]
    assert len(copies) == len(pick) and sum(e["args"].get("teller.highlight", False) for e in orig) == len(
        pick
    )
    assert {e["pid"] for e in copies} == {"teller: culprits"}
    assert sorted(e["args"]["teller.event"] for e in copies) == sorted(pick)
    for c in copies:  # a copy is its event, in time and name
        i = c["args"]["teller.event"]
        assert c["name"] == tr.name_of(i) and c["dur"] * 1000 == pytest.approx(tr.dur[i], abs=1)
    meta = [e for e in ev if e.get("ph") == "M" and e.get("pid") == "teller: culprits"]
    assert {"process_name", "process_sort_index"} <= {e["name"] for e in meta}
    tracks = {e["tid"]: e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    assert len(tracks) == len({e["tid"] for e in copies}) >= 2  # (kernels and a host operator)
    for tid in tracks:  # each track's slices nest (none overlaps another partly)
        spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in copies if e["tid"] == tid)
        assert all(b[0] >= a[1] - 1e-6 or b[1] <= a[1] + 1e-6 for a, b in zip(spans, spans[1:], strict=False))
    back = T.load(out, warn=False)
    assert len(back) == len(tr) and "teller.culprit" not in {back.strings[c] for c in set(back.cat)}
    again = tmp_path / "again.json"
    back.to_chrome(again)
    assert "teller: culprits" not in again.read_text()


def test_a_gz_name_in_capitals_is_compressed(tmp_path):
    import gzip

    tr = T.load(TRACES / "mi250_rocm62_tiny.kineto.json.gz", warn=False)
    out = tmp_path / "X.JSON.GZ"
    tr.to_chrome(out)
    assert out.read_bytes()[:2] == b"\x1f\x8b" and gzip.decompress(out.read_bytes()).startswith(b"{")


def test_what_teller_derived_is_not_read_back_as_args(tmp_path):
    """teller.step / teller.highlight in a trace teller wrote are derived again, not kept as args
    (they went stale); teller.unfinished is read as the flag it stands for, round trip after round
    trip."""
    import json

    src = tmp_path / "open.json"
    ev = [
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": "aten::mm",
            "pid": 1,
            "tid": 1,
            "ts": 0,
            "dur": 5,
            "args": {"a": 1},
        },
        {"ph": "B", "cat": "user_annotation", "name": "never closed", "pid": 1, "tid": 1, "ts": 10},
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 12, "dur": 3},
    ]
    src.write_text(json.dumps({"traceEvents": ev}))
    tr = T.load(src, warn=False)
    unfinished = lambda t: sorted(t.name_of(i) for i in range(len(t)) if t.flags[i] & 2)  # noqa: E731
    assert unfinished(tr) == ["never closed"]
    cur = tr
    for k in range(2):
        out = tmp_path / f"rt{k}.json"
        cur.to_chrome(out, highlight=[0])
        cur = T.load(out, warn=False)
        assert unfinished(cur) == ["never closed"], k
        assert all(not key.startswith("teller.") for i in range(len(cur)) for key in cur.args(i)), k
    assert cur.args(
        int(np.flatnonzero(np.array([cur.name_of(i) == "aten::mm" for i in range(len(cur))]))[0])
    ) == {"a": 1}


def test_a_merged_file_read_back_keeps_each_process_gpu_apart(tmp_path):
    """Two processes' GPU 0 (per-rank files, or raw files of two processes whose pids clashed) stay
    two GPUs in the summary of the merged file teller wrote, read back: the moved pid tells them
    apart (`part`), each keeps its own sync wait, and they are not called one shared GPU."""

    from teller.findings import findings, gpu_names
    from teller.rawfmt import RawWriter

    def proc(name: str, start: int, t0: int, wait: int) -> None:
        with RawWriter(tmp_path / name, pid=7, host="h", clock_sync=(0, 0), start_ns=start) as w:
            w.span("runtime", "cudaLaunchKernel", tid=7, start=t0, end=t0 + 50, corr=1)
            w.gpu("kernel", "void k(float*)", device=0, stream=7, start=t0 + 100, end=t0 + 2000, corr=1)
            w.gpu("sync", "cudaStreamSynchronize", device=0, stream=7, start=t0 + 60, end=t0 + 60 + wait)

    proc("teller-h-7-a.tmsgpack", 1, 1000, 1500)
    proc("teller-h-7-b.tmsgpack", 2, 5000, 700)
    tr = T.load(sorted(tmp_path.glob("*.tmsgpack")), warn=False)
    out = tmp_path / "both.json"
    tr.to_chrome(out)
    back = T.load(out, warn=False)
    for t in (tr, back):
        devs = t.summary()["devices"]
        assert [(d["device"], d["pid"], d["sync_ns"], d["busy_ns"]) for d in devs] == [
            (0, 0, 1460, 1900),  # (the wait within the GPU's span: from t0 + 100)
            (0, 10_000_000, 660, 1900),
        ], devs
    devs = back.summary()["devices"]
    assert [d["part"] for d in devs] == [0, 1] and {d["source"] for d in devs} == {0}
    assert not [f for f in findings(back) if f["kind"] == "shared_gpu"]
    # named by the files they were written from, read back as when those were read (the merged
    # file's teller.sources lists each input's pids)
    names = ["GPU 0 of teller-h-7-a.tmsgpack", "GPU 0 of teller-h-7-b.tmsgpack"]
    assert gpu_names(tr.summary()["devices"], tr.sources) == names
    assert gpu_names(devs, back.sources) == names
    # written again from the read-back file: the inputs' entries are kept, not the merged file's
    out2 = tmp_path / "again.json"
    back.to_chrome(out2)
    again = T.load(out2, warn=False)
    assert gpu_names(again.summary()["devices"], again.sources) == names
    # a file that does not list its inputs' pids (another tool's, or teller's before it did): the
    # pid Perfetto shows each under
    doc = json.loads(out.read_text())
    for e in doc["teller"]["sources"]:
        del e["pids"]
    out.write_text(json.dumps(doc))
    old = T.load(out, warn=False)
    assert gpu_names(old.summary()["devices"], old.sources) == ["GPU 0 pid 0", "GPU 0 pid 10000000"]


def test_a_merged_file_read_back_keeps_each_ranks_gpu_nesting_and_steps(tmp_path):
    """Two ranks' GPU 0 in one merged file, read back: a GPU annotation nests only over its own
    rank's kernels, and an unlinked GPU event takes its step from the rank that launched work on its
    GPU track, as when the rank files are read directly (they were one GPU stack and one step list:
    rank 200's annotation nested under rank 100's, its kernels in rank 100's step)."""

    def rank(pid: int) -> dict:
        return {
            "traceEvents": [
                {
                    "ph": "X",
                    "cat": "user_annotation",
                    "name": "ProfilerStep#0",
                    "ts": 0,
                    "dur": 100,
                    "pid": pid,
                    "tid": 1,
                },
                {
                    "ph": "X",
                    "cat": "cuda_runtime",
                    "name": "cudaLaunchKernel",
                    "ts": 5,
                    "dur": 2,
                    "pid": pid,
                    "tid": 1,
                    "args": {"correlation": 9},
                },
                {
                    "ph": "X",
                    "cat": "gpu_user_annotation",
                    "name": f"ga{pid}",
                    "ts": 10,
                    "dur": 20,
                    "pid": 0,
                    "tid": 7,
                    "args": {"device": 0},
                },
                {
                    "ph": "X",
                    "cat": "kernel",
                    "name": f"k{pid}",
                    "ts": 12,
                    "dur": 5,
                    "pid": 0,
                    "tid": 7,
                    "args": {"device": 0, "stream": 7, "correlation": 9},
                },
                {
                    "ph": "X",
                    "cat": "kernel",
                    "name": f"u{pid}",
                    "ts": 20,
                    "dur": 5,
                    "pid": 0,
                    "tid": 7,
                    "args": {"device": 0, "stream": 7},
                },
            ]
        }

    paths = []
    for pid in (100, 200):
        paths.append(tmp_path / f"rank{pid}.json")
        paths[-1].write_text(json.dumps(rank(pid)))
    tr = T.load(paths, warn=False)
    tr.to_chrome(tmp_path / "merged.json")
    back = T.load(tmp_path / "merged.json", warn=False)
    for t in (tr, back):
        by = {t.name_of(i): i for i in range(len(t))}
        steps = t.steps()
        for pid in (100, 200):
            assert t.parent[by[f"u{pid}"]] == by[f"ga{pid}"], (pid, t.parent.tolist())
            for name in (f"ga{pid}", f"u{pid}", f"k{pid}"):
                assert steps[t.step[by[name]]].pid == pid, (name, t.step.tolist())
    assert back.parent.tolist() == tr.parent.tolist() and back.step.tolist() == tr.step.tolist()


def test_a_merged_kineto_pair_keeps_each_host_wait_with_its_gpu(tmp_path):
    """Per-rank Kineto files: the GPU 0 tracks clash and move, the hosts' pids do not. Read back from
    the merged file, each host's sync wait stays with the GPU its own calls launched work on."""
    import json

    def rank(host: int, t0: int, wait: int) -> dict:
        return {
            "traceEvents": [
                {
                    "ph": "X",
                    "cat": "cuda_runtime",
                    "name": "cudaLaunchKernel",
                    "pid": host,
                    "tid": host,
                    "ts": t0,
                    "dur": 5,
                    "args": {"correlation": 1},
                },
                {
                    "ph": "X",
                    "cat": "kernel",
                    "name": "k",
                    "pid": 0,
                    "tid": 7,
                    "ts": t0 + 10,
                    "dur": 100,
                    "args": {"correlation": 1, "device": 0, "stream": 7},
                },
                {
                    "ph": "X",
                    "cat": "cuda_sync",
                    "name": "Stream Sync",
                    "pid": host,
                    "tid": host,
                    "ts": t0 + 20,
                    "dur": wait,
                    "args": {"device": 0},
                },
            ]
        }

    for k, (host, wait) in enumerate(((100, 50), (200, 30))):
        (tmp_path / f"rank{k}.json").write_text(json.dumps(rank(host, 1000, wait)))
    tr = T.load([tmp_path / "rank0.json", tmp_path / "rank1.json"], warn=False)
    tr.to_chrome(tmp_path / "both.json")
    back = T.load(tmp_path / "both.json", warn=False)
    for t in (tr, back):
        devs = t.summary()["devices"]
        assert [(d["pid"], d["sync_ns"]) for d in devs] == [(0, 50_000), (10_000_000, 30_000)], devs
    # a rank whose kernels are not linked to its calls (no correlation ids): its wait goes to the one
    # GPU 0 its file has
    r1 = rank(200, 1000, 30)
    for e in r1["traceEvents"]:
        e["args"].pop("correlation", None)
    (tmp_path / "rank1.json").write_text(json.dumps(r1))
    tr = T.load([tmp_path / "rank0.json", tmp_path / "rank1.json"], warn=False)
    devs = tr.summary()["devices"]
    assert [(d["pid"], d["sync_ns"]) for d in devs] == [(0, 50_000), (10_000_000, 30_000)], devs


def test_an_instant_keeps_its_scope_through_a_round_trip(tmp_path):
    """A global ("s": "g") or process ("p") instant, e.g. a profiler's iteration marker, is written
    with its scope (Perfetto draws it across the trace or the process); a thread's stays a thread's."""
    import json

    evs = [
        {"ph": "X", "cat": "cpu_op", "name": "op", "pid": 1, "tid": 1, "ts": 0, "dur": 10},
        {"ph": "i", "s": "g", "cat": "marker", "name": "iteration", "pid": 1, "tid": 1, "ts": 2},
        {"ph": "i", "s": "p", "cat": "marker", "name": "proc mark", "pid": 1, "tid": 1, "ts": 3},
        {"ph": "i", "cat": "marker", "name": "thread mark", "pid": 1, "tid": 1, "ts": 4},
    ]
    (tmp_path / "in.json").write_text(json.dumps({"traceEvents": evs}))
    tr = T.load(tmp_path / "in.json", warn=False)
    for k in range(2):
        tr.to_chrome(tmp_path / f"out{k}.json")
        out = json.loads((tmp_path / f"out{k}.json").read_text())["traceEvents"]
        scope = {e["name"]: e.get("s") for e in out if e.get("ph") == "i"}
        assert scope == {"iteration": "g", "proc mark": "p", "thread mark": "t"}, scope
        tr = T.load(tmp_path / f"out{k}.json", warn=False)


def test_a_step_range_nested_in_another_is_not_a_step_of_its_own(tmp_path):
    """Matches of the step pattern inside another match (a deep chain of them too: linear, where a
    walk up each match's chain was quadratic) are part of the outer step."""
    import json

    def x(name, ts, dur, tid=1):
        return {"ph": "X", "cat": "user_annotation", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur}

    deep = 2000
    evs = [x(f"ProfilerStep#{i}", i, 10 * deep - 2 * i) for i in range(deep)]
    evs += [x("ProfilerStep#a", 30 * deep, 10), x("ProfilerStep#b", 30 * deep + 20, 10)]
    evs += [x("ProfilerStep#c", 30 * deep + 21, 5)]  # (inside #b)
    (tmp_path / "t.json").write_text(json.dumps({"traceEvents": evs}))
    tr = T.load(tmp_path / "t.json", warn=False)
    assert [s.name for s in tr.steps()] == ["ProfilerStep#0", "ProfilerStep#a", "ProfilerStep#b"]
    # an op that overruns its step (improper nesting) makes the next step its child: that step is
    # not inside the one before, and stays a step
    evs = [x(f"ProfilerStep#{k}", 100 * k, 99) for k in range(3)]
    evs += [{**x("gemm", 100 * k + 50, 70), "cat": "cpu_op"} for k in range(3)]
    (tmp_path / "t.json").write_text(json.dumps({"traceEvents": evs}))
    tr = T.load(tmp_path / "t.json", warn=False)
    assert [s.name for s in tr.steps()] == ["ProfilerStep#0", "ProfilerStep#1", "ProfilerStep#2"]
    # a match that overruns the match it is nested in, inside an outer one: part of the outer step,
    # and so is what follows it there (steps of one thread never overlap)
    evs = [x("ProfilerStep#1", 0, 100), x("ProfilerStep#1", 10, 20), x("ProfilerStep#1", 20, 30)]
    evs.append({**x("work", 60, 5), "cat": "cpu_op"})
    (tmp_path / "t.json").write_text(json.dumps({"traceEvents": evs}))
    tr = T.load(tmp_path / "t.json", warn=False)
    assert len(tr.steps()) == 1 and tr.step.tolist() == [0, 0, 0, 0]


def test_unrelated_captures_merged_onto_one_timeline_are_said(tmp_path):
    """(from a review) A directory of unrelated profiles loaded as one trace (5 GPUs of 4 kinds,
    a 5-year span) said nothing: sources far apart in time now get a warning; sources of one time
    (ranks of one capture) do not."""
    import glob
    import shutil

    files = sorted(glob.glob(str(TRACES / "*.json.gz")))
    with pytest.warns(
        UserWarning, match=r"5 sources merged onto one timeline fall into 5 groups far apart in time"
    ):
        tr = T.load(files)
    assert any("far apart in time" in w for w in tr.warnings)
    assert any("far apart in time" in w for w in tr.summary()["warnings"])
    a = TRACES / "a100_nccl_2rank.kineto.json.gz"
    b = shutil.copy(a, tmp_path / "rank1.json.gz")
    assert not any("apart in time" in w for w in T.load([a, b], warn=False).warnings)


def test_a_counter_of_several_series_is_written_as_one_event_each_time(tmp_path):
    """(from a review) Each series of a `C` event was written as an event of its own: chrome://tracing
    takes a counter's series from its first event and draws a missing one as 0. A number written as
    a string (Perfetto reads it) was dropped."""
    doc = [
        {"ph": "C", "name": "mem", "pid": 1, "ts": 12, "args": {"alloc": "1024", "resv": 2048}},
        {"ph": "C", "name": "mem", "pid": 1, "ts": 14, "args": {"alloc": 1, "resv": 2.5}},
        {"ph": "X", "name": "op", "cat": "cpu_op", "pid": 1, "tid": 1, "ts": 10, "dur": 10},
    ]
    src = tmp_path / "c.json"
    src.write_text(json.dumps(doc))
    out = tmp_path / "out.json"
    T.load(src, warn=False).to_chrome(out)
    got = [(e["ts"], e["args"]) for e in json.loads(out.read_text())["traceEvents"] if e.get("ph") == "C"]
    assert [a for _, a in got] == [{"alloc": 1024, "resv": 2048}, {"alloc": 1, "resv": 2.5}], got


def test_an_id_link_event_is_skipped_not_refused(tmp_path):
    """(from a review) Chromium's `=` phase (TRACE_EVENT_PHASE_LINK_IDS) failed the whole load as
    "not in the Trace Event Format"; like the other phases teller does not model, it is counted."""
    doc = [
        {"ph": "=", "name": "link", "pid": 1, "tid": 1, "ts": 1, "id": "0x1", "args": {"linked_id": "0x2"}},
        {"ph": "X", "name": "op", "cat": "cpu_op", "pid": 1, "tid": 1, "ts": 10, "dur": 10},
    ]
    src = tmp_path / "l.json"
    src.write_text(json.dumps(doc))
    tr = T.load(src, warn=False)
    assert len(tr) == 1 and any("'='" in w for w in tr.warnings), tr.warnings


def test_a_time_beyond_range_once_the_base_is_added_is_refused(tmp_path):
    """(from a review) Each time was bounded alone, not with baseTimeNanoseconds added: a trace loaded
    that way was written with a base its own reader refused."""
    from teller.errors import TraceFormatError

    doc = {
        "baseTimeNanoseconds": 3_000_000_000_000_000_000,
        "traceEvents": [{"ph": "X", "name": "op", "cat": "cpu_op", "pid": 1, "tid": 1, "ts": 3e15, "dur": 1}],
    }
    src = tmp_path / "far.json"
    src.write_text(json.dumps(doc))
    with pytest.raises(TraceFormatError, match=r"far.json.*plus 'baseTimeNanoseconds'.*beyond 4e18"):
        T.load(src, warn=False)
    doc["traceEvents"][0]["ts"] = 5e14  # (within range with the base: read, written, read back)
    src.write_text(json.dumps(doc))
    out = tmp_path / "out.json"
    T.load(src, warn=False).to_chrome(out)
    assert int(T.load(out, warn=False).ts[0]) == 3_500_000_000_000_000_000


@pytest.mark.parametrize("name", FIXTURES)
def test_a_converted_trace_keeps_the_inputs_top_level_keys(name, tmp_path):
    """(from a review) Only deviceProperties and distributedInfo were written back: a conversion lost
    Kineto's traceName, cupti_version, cuda_runtime_version, record_shapes, otherData, ...; a value
    whose strings JSON refuses (the reader is lenient there) is left out, not written unreadable."""
    import gzip

    raw = (gzip.open if name.endswith(".gz") else open)(TRACES / name, "rb").read()
    src = json.loads(raw)
    out = tmp_path / "out.json"
    T.load(TRACES / name, warn=False).to_chrome(out)
    got = json.loads(out.read_text())
    if isinstance(src, dict):
        skip = {"traceEvents", "displayTimeUnit", "baseTimeNanoseconds", "schemaVersion"}
        assert {k: got.get(k) for k in src if k not in skip} == {
            k: v for k, v in src.items() if k not in skip
        }
    bad = tmp_path / "bad.json"
    ev = [{"ph": "X", "name": "op", "cat": "cpu_op", "pid": 1, "tid": 1, "ts": 1, "dur": 2}]
    bad.write_text('{"traceName": "a\\qb", "note": "ok", "traceEvents": ' + json.dumps(ev) + "}")
    T.load(bad, warn=False).to_chrome(out)
    got = json.loads(out.read_text())
    assert "traceName" not in got and got["note"] == "ok"


@pytest.mark.parametrize("name", FIXTURES)
def test_categories_survive_a_round_trip(name, tmp_path):
    """(from a review) An event without a category (Kineto's "Iteration Start" instants) came back
    with one ("marker", "other"): written without one where the reader's default gives its layer
    back. Each event keeps its category and its layer."""
    a = T.load(TRACES / name, warn=False)
    out = tmp_path / "o.json"
    a.to_chrome(out)
    b = T.load(out, warn=False)

    def cats(t):
        return collections.Counter((t.strings[int(t.cat[i])], int(t.layer[i])) for i in range(len(t)))

    assert cats(b) == cats(a)
