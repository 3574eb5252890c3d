"""The raw MessagePack format: Python writer -> Rust reader, truncation, padding, alignment."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import teller.trace as T
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from teller.errors import TellerWarning, TraceFormatError
from teller.rawfmt import RawWriter, read_records

MONO0 = 1_000_000_000
REAL0 = 1_733_130_000_000_000_000


def write_small(path, pid=4242, clock=(MONO0, REAL0)):
    with RawWriter(path, pid=pid, host="node1", argv=["python", "infer.py"], clock_sync=clock) as w:
        w.thread_name(pid, "main")
        r = w.begin("annotation", "execute_model", tid=pid, ts=MONO0 + 1000)
        w.span("host_op", "aten::mm", tid=pid, start=MONO0 + 1100, end=MONO0 + 1500, ext=9)
        w.span("runtime", "cudaLaunchKernel", tid=pid, start=MONO0 + 1200, end=MONO0 + 1250, corr=7, ext=9)
        w.gpu(
            "kernel",
            "void gemm_kernel<128, 64>(float*, float*)",
            device=0,
            stream=7,
            start=MONO0 + 1300,
            end=MONO0 + 1900,
            corr=7,
            args={"grid": [4, 1, 1], "block": [128, 1, 1]},
        )
        w.mark("marker", "tick", tid=pid, ts=MONO0 + 1600)
        w.counter("kv_cache_usage", ts=MONO0 + 1700, value=0.5)
        w.end(r, tid=pid, ts=MONO0 + 2000)
    return path


def test_round_trip(tmp_path):
    p = write_small(tmp_path / "a.tmsgpack")
    tr = T.load(p)
    assert len(tr) == 5
    by_name = {tr.name_of(i): i for i in range(len(tr))}
    em = by_name["execute_model"]
    assert tr.ts[em] == REAL0 + 1000 and tr.dur[em] == 1000
    k = by_name["void gemm_kernel<128, 64>(float*, float*)"]
    rt = by_name["cudaLaunchKernel"]
    assert tr.link[k] == rt and tr.parent[k] == rt
    assert tr.device[k] == 0 and tr.tid[k] == 7 and tr.pid[k] == 0
    assert tr.parent[rt] == by_name["aten::mm"] and tr.parent[by_name["aten::mm"]] == em
    assert tr.args(k) == {"grid": [4, 1, 1], "block": [128, 1, 1]}
    assert tr.symbol_of(k) == "kernel:gemm_kernel"
    assert tr.flags[by_name["tick"]] & T.FLAG_INSTANT
    assert [s.name for s in tr.steps()] == ["execute_model"]
    assert (tr.step == 0).all()
    assert tr.num_counters == 1
    assert tr._n.thread_names() == [(4242, 4242, "main")]
    assert tr.summary()["linked_gpu_events"] == 1


def test_python_oracle_reads_same_records(tmp_path):
    p = write_small(tmp_path / "a.tmsgpack")
    recs = read_records(p)
    assert recs[0][:3] == [1, "teller-trace", 1]
    types = [r[0] for r in recs]
    assert types.count(3) == 2 and types.count(4) == 1 and types.count(5) == 1 and types.count(6) == 1


def _complete_events_before(data: bytes, cut: int) -> int:
    """How many events the records fully inside data[:cut] describe (oracle: msgpack package)."""
    import msgpack

    u = msgpack.Unpacker(raw=False, strict_map_key=False)
    u.feed(data[:cut])
    opened = 0
    n = 0
    while True:
        try:
            r = u.unpack()
        except msgpack.OutOfData:
            break
        if r == 0:
            continue
        if r[0] in (3, 4, 7):
            n += 1
        elif r[0] == 5:
            opened += 1
        elif r[0] == 6:
            opened -= 1
            n += 1
    return n + opened  # open ranges are closed (unfinished) by the reader


def test_truncation_at_every_cut_point(tmp_path):
    src = write_small(tmp_path / "full.tmsgpack")
    data = src.read_bytes()
    import msgpack

    u = msgpack.Unpacker(raw=False, strict_map_key=False)
    u.feed(data)
    boundaries = set()
    for _ in u:
        boundaries.add(u.tell())
    for cut in range(1, len(data) + 1):
        p = tmp_path / "cut.tmsgpack"
        p.write_bytes(data[:cut])
        expected = _complete_events_before(data, cut)
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                tr = T.load(p)
        except TraceFormatError as e:
            # only a cut inside the HEADER, or a file with no complete event, may fail
            assert expected == 0, (cut, e)
            assert "cut.tmsgpack" in str(e)
            continue
        assert len(tr) == expected, cut
        if cut not in boundaries:
            assert any("truncated" in str(w.message) for w in caught), cut


def test_zero_padding_and_torn_record(tmp_path):
    p = tmp_path / "pad.tmsgpack"
    with RawWriter(p, pid=1, clock_sync=(0, REAL0)) as w:
        w.span("host_op", "a", tid=1, start=10, end=20)
    data = bytearray(p.read_bytes())
    data += b"\0" * (256 - len(data))  # end of chunk 0
    # chunk 1: a torn record (body without its array header), then zeros
    data += b"\x03\x02\xa1b" + b"\0" * 252
    # chunk 2: a good record
    import msgpack

    data += msgpack.packb([3, 2, "c", 1, 30, 40, 0, 0])
    p.write_bytes(bytes(data))
    with pytest.warns(TellerWarning, match="torn record"):
        tr = T.load(p)
    assert sorted(tr.name_of(i) for i in range(len(tr))) == ["a", "c"]


def test_corrupt_record_is_an_error(tmp_path):
    p = tmp_path / "bad.tmsgpack"
    with RawWriter(p, pid=1, clock_sync=(0, REAL0)) as w:
        w.span("host_op", "a", tid=1, start=10, end=20)
        w.record([3, 2, "b", "not-a-tid", 1, 2])
    with pytest.raises(TraceFormatError) as ei:
        T.load(p)
    e = ei.value
    assert "bad.tmsgpack" in str(e) and "tid" in str(e)
    assert e.offset is not None and e.index is not None
    assert isinstance(e, ValueError)


def test_string_defined_after_use_and_undefined(tmp_path):
    p = tmp_path / "s.tmsgpack"
    with RawWriter(p, pid=1, clock_sync=(0, REAL0)) as w:
        w.record([3, 2, 50, 1, 10, 20])
        w.record([2, 50, "late_name"])
        w.record([3, 2, 51, 1, 30, 40])
    with pytest.warns(TellerWarning, match="never defined"):
        tr = T.load(p)
    assert sorted(tr.name_of(i) for i in range(len(tr))) == ["<string #51>", "late_name"]


def test_unfinished_range_is_closed_and_flagged(tmp_path):
    p = tmp_path / "u.tmsgpack"
    with RawWriter(p, pid=1, clock_sync=(0, REAL0)) as w:
        w.begin("annotation", "forward", tid=1, ts=100)
        w.span("host_op", "aten::mm", tid=1, start=150, end=400)
    with pytest.warns(TellerWarning, match="still open"):
        tr = T.load(p)
    i = [tr.name_of(k) for k in range(len(tr))].index("forward")
    assert tr.flags[i] & T.FLAG_UNFINISHED
    assert tr.ts[i] == REAL0 + 100 and tr.end[i] == REAL0 + 400


def test_an_end_written_before_its_begin_still_closes_the_range(tmp_path):
    """A range ended on another thread has its END in that thread's chunk, which may sit earlier in
    the file than the BEGIN's: the pair is made by range id, not by file order (the END was dropped
    and the range ran to the end of the file, adopting later events as children)."""
    p = tmp_path / "e.tmsgpack"
    with RawWriter(p, pid=1, clock_sync=(0, REAL0)) as w:
        w.end(1, tid=43, ts=5000)
        w.end(1, tid=44, ts=6000)  # (a second END of it: ignored, the first stands, said)
        w._next_range = 1
        assert w.begin("annotation", "forward", tid=42, ts=1000) == 1
        w.span("runtime", "cudaMalloc", tid=42, start=20000, end=90000)
        w.end(7, tid=42, ts=95000)  # (never begun: still said)
    with pytest.warns(TellerWarning, match="2 END record") as rec:
        tr = T.load(p)
    assert not [r for r in rec if "still open" in str(r.message)]
    names = [tr.name_of(k) for k in range(len(tr))]
    f, m = names.index("forward"), names.index("cudaMalloc")
    assert tr.ts[f] == REAL0 + 1000 and tr.dur[f] == 4000 and not tr.flags[f] & T.FLAG_UNFINISHED
    assert tr.parent[m] == -1


def test_two_processes_on_one_time_base(tmp_path):
    # process B's monotonic clock is 5 s ahead of A's, but both map to the same realtime
    d = tmp_path / "run" / "raw"
    d.mkdir(parents=True)
    with RawWriter(d / "teller-h-1-0.tmsgpack", pid=1, host="h", clock_sync=(MONO0, REAL0)) as w:
        w.span("runtime", "cudaLaunchKernel", tid=1, start=MONO0 + 100, end=MONO0 + 200, corr=5)
        w.gpu("kernel", "k1", device=0, stream=7, start=MONO0 + 300, end=MONO0 + 400, corr=5)
    with RawWriter(
        d / "teller-h-2-0.tmsgpack", pid=2, host="h", clock_sync=(MONO0 + 5_000_000_000, REAL0)
    ) as w:
        w.span(
            "runtime",
            "cudaLaunchKernel",
            tid=2,
            start=MONO0 + 5_000_000_150,
            end=MONO0 + 5_000_000_250,
            corr=5,
        )
        w.gpu(
            "kernel", "k2", device=1, stream=7, start=MONO0 + 5_000_000_350, end=MONO0 + 5_000_000_450, corr=5
        )
    tr = T.load(tmp_path / "run")
    names = [tr.name_of(i) for i in range(len(tr))]
    assert tr.ts.tolist() == [REAL0 + 100, REAL0 + 150, REAL0 + 300, REAL0 + 350]
    # the same correlation id in two processes links within each process only
    k1, k2 = names.index("k1"), names.index("k2")
    assert tr.pid[tr.link[k1]] == 1 and tr.pid[tr.link[k2]] == 2


def test_same_process_split_over_files_links_across_them(tmp_path):
    d = tmp_path / "raw"
    d.mkdir()
    kw = dict(pid=7, host="h", clock_sync=(0, REAL0), start_ns=0)
    with RawWriter(d / "a.tmsgpack", **kw) as w:
        w.span("runtime", "cudaLaunchKernel", tid=7, start=100, end=200, corr=3)
    with RawWriter(d / "b.tmsgpack", **kw) as w:
        w.gpu("kernel", "k", device=0, stream=1, start=300, end=400, corr=3)
    tr = T.load(d)
    assert tr.summary()["linked_gpu_events"] == 1


events = st.lists(
    st.tuples(
        st.sampled_from(["annotation", "host_op", "runtime", "python"]),
        st.text(min_size=0, max_size=40),
        st.integers(min_value=0, max_value=10**6),
        st.integers(min_value=0, max_value=10**5),
        st.integers(min_value=1, max_value=4),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(evs=events)
def test_property_write_read_round_trip(tmp_path, evs):
    p = tmp_path / "h.tmsgpack"
    with RawWriter(p, pid=99, clock_sync=(0, REAL0)) as w:
        for layer, name, start, dur, tid in evs:
            w.span(layer, name, tid=tid, start=start, end=start + dur)
    tr = T.load(p, warn=False)
    got = sorted(
        (tr.layer_name(i), tr.name_of(i), int(tr.ts[i]) - REAL0, int(tr.dur[i]), int(tr.tid[i]))
        for i in range(len(tr))
    )
    want = sorted((layer, name, start, dur, tid) for layer, name, start, dur, tid in evs)
    assert got == want
    assert np.all(np.diff(tr.ts) >= 0)


def _write_devices(d, lists) -> None:
    """One raw file per process id of ``lists``, its header listing that process's GPUs."""
    for pid, devs in lists.items():
        with RawWriter(
            d / f"teller-h-{pid}-0.tmsgpack",
            pid=pid,
            host="h",
            clock_sync=(MONO0, REAL0),
            extra_meta={"deviceProperties": devs},
        ) as w:
            w.gpu("kernel", "k", device=0, stream=7, start=MONO0 + 300, end=MONO0 + 400, corr=5)


def test_device_properties_merge_over_processes_and_survive_chrome(tmp_path):
    # each process lists the GPUs it sees (Kineto's deviceProperties fields); one list comes out
    d = tmp_path / "run" / "raw"
    d.mkdir(parents=True)

    def dev(i, name):
        return {"id": i, "name": name, "computeMajor": 9, "computeMinor": 0}

    _write_devices(
        d, {1: [dev(1, "H100 b"), dev(0, "H100 a")], 2: [dev(1, "H100 b again"), dev(2, "H100 c")]}
    )
    tr = T.load(tmp_path / "run")
    assert [(x["id"], x["name"]) for x in tr.device_properties] == [
        (0, "H100 a"),
        (1, "H100 b"),
        (2, "H100 c"),
    ]
    out = tmp_path / "trace.json"
    tr.to_chrome(out)
    import json

    assert [x["name"] for x in json.loads(out.read_text())["deviceProperties"]] == [
        "H100 a",
        "H100 b",
        "H100 c",
    ]
    assert [x["name"] for x in T.load(out).device_properties] == ["H100 a", "H100 b", "H100 c"]
    # a capture whose producer recorded none
    with RawWriter(tmp_path / "teller-h-3-0.tmsgpack", pid=3, host="h", clock_sync=(MONO0, REAL0)) as w:
        w.gpu("kernel", "k", device=0, stream=7, start=MONO0 + 300, end=MONO0 + 400, corr=5)
    assert T.load(tmp_path / "teller-h-3-0.tmsgpack").device_properties == []


def test_device_properties_without_an_id_are_kept_once_after_the_numbered(tmp_path):
    d = tmp_path / "raw"
    d.mkdir()
    lists = {
        1: [{"name": "X"}, {"id": 1, "name": "B"}],
        2: [{"name": "X"}, {"id": 0, "name": "A"}, {"id": True, "name": "Y"}],
    }
    _write_devices(d, lists)
    want = ["A", "B", "X", "Y"]
    tr = T.load(d)
    assert [x["name"] for x in tr.device_properties] == want
    tr.to_chrome(tmp_path / "trace.json")
    assert [x["name"] for x in T.load(tmp_path / "trace.json").device_properties] == want


def test_not_a_raw_file_is_named_as_such(tmp_path):
    """Random bytes, another MessagePack document or a header cut short each get one plain reason
    (random bytes used to read "string is not valid UTF-8 at byte 13")."""
    rng = np.random.default_rng(0)
    full = write_small(tmp_path / "full.tmsgpack").read_bytes()
    cases = {
        "random.tmsgpack": (rng.integers(1, 256, 4096, dtype=np.uint8).tobytes(), "not a teller raw trace"),
        "array.tmsgpack": (bytes([0x93, 0x01, 0x02, 0x03]), "not a teller raw trace"),
        "cut.tmsgpack": (full[:9], "truncated before the end of the HEADER record"),
        "torn.tmsgpack": (b"\x00" + full[1:], "torn HEADER record"),
        "zeros.tmsgpack": (bytes(4096) + full, "unfinished or torn HEADER record"),
    }
    for name, (data, reason) in cases.items():
        p = tmp_path / name
        p.write_bytes(data)
        with pytest.raises(TraceFormatError) as e:
            T.load(p)
        assert str(e.value).startswith(f"{p}: ") and reason in str(e.value), str(e.value)


def test_a_string_that_is_not_utf8_is_read_lossily_and_said(tmp_path):
    """(from a review) One string in another encoding (a Latin-1 file name in argv, an NVTX message)
    failed the whole file, and so the whole run's conversion: it now reads with U+FFFD, and a
    warning says how many strings."""
    p = tmp_path / "a.tmsgpack"
    with RawWriter(p, pid=7, host="node1", argv=["python", "cafe_argv.py"], clock_sync=(MONO0, REAL0)) as w:
        r = w.begin("annotation", "cafe_step", tid=7, ts=MONO0 + 1000)
        w.end(r, tid=7, ts=MONO0 + 2000)
    data = p.read_bytes()
    for word in (b"cafe_step", b"cafe_argv"):  # (same length: the MessagePack headers stay right)
        assert data.count(word) == 1
        data = data.replace(word, word[:3] + b"\xe9" + word[4:])
    p.write_bytes(data)
    with pytest.warns(UserWarning, match=r"2 string\(s\) not valid UTF-8"):
        tr = T.load(p)
    assert [tr.name_of(i) for i in range(len(tr))] == ["caf\ufffd_step"]


def test_a_begin_end_range_carries_its_id_as_the_calls_inside_it_do(tmp_path):
    """(from a review) The runtime calls made inside an NVTX range carry its id as their external
    correlation id; the range read from BEGIN/END had none (only a SPAN's kept it), so nothing
    matched them. Finished, ended before it began, or left open: each keeps its id."""
    import teller.trace as T
    from teller.rawfmt import RawWriter

    with RawWriter(tmp_path / "p.tmsgpack", pid=7, host="h", clock_sync=(0, 0), start_ns=1) as w:
        rid = w.begin("annotation", "step", tid=7, ts=100)
        w.span("runtime", "cudaLaunchKernel", tid=7, start=110, end=120, corr=1, ext=rid)
        w.end(rid, tid=7, ts=200)
        w.end(rid + 1, tid=7, ts=290)  # (an END written before its BEGIN)
        w.begin("annotation", "late", tid=7, ts=250)
        w.begin("annotation", "open", tid=7, ts=300)
        w.span("runtime", "cudaLaunchKernel", tid=7, start=310, end=320, corr=2, ext=rid + 2)
    tr = T.load(tmp_path / "p.tmsgpack", warn=False)
    ext = {tr.name_of(i): int(tr.ext[i]) for i in range(len(tr)) if tr.layer_name(i) == "annotation"}
    assert ext == {"step": rid, "late": rid + 1, "open": rid + 2}, ext
    calls = sorted(int(tr.ext[i]) for i in range(len(tr)) if tr.name_of(i) == "cudaLaunchKernel")
    assert calls == [rid, rid + 2]
