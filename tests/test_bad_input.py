"""Bad input gets a clear TellerError naming the file, where, and what; never a panic."""

from __future__ import annotations

import gzip
import json
import warnings

import pytest
import teller.trace as T
from conftest import TRACES
from teller.errors import (
    ConfigError,
    EmptyTraceError,
    TellerError,
    TellerFileNotFoundError,
    TellerWarning,
    TraceFormatError,
)


def write(tmp_path, name, content: bytes | str):
    p = tmp_path / name
    p.write_bytes(content.encode() if isinstance(content, str) else content)
    return p


def ok_event(**kw):
    e = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1.5, "dur": 2}
    e.update(kw)
    return e


def doc(*events):
    return json.dumps({"traceEvents": list(events)})


def test_missing_file_is_file_not_found(tmp_path):
    p = tmp_path / "nope.json"
    with pytest.raises(TellerFileNotFoundError) as ei:
        T.load(p)
    assert isinstance(ei.value, FileNotFoundError) and isinstance(ei.value, TellerError)
    assert str(p) in str(ei.value) and ei.value.path == str(p)


def test_empty_file(tmp_path):
    p = write(tmp_path, "empty.json", "")
    with pytest.raises(EmptyTraceError, match="empty.json"):
        T.load(p)
    p = write(tmp_path, "ws.json", "  \n ")
    with pytest.raises(EmptyTraceError, match="ws.json"):
        T.load(p)


def test_no_events(tmp_path):
    p = write(tmp_path, "none.json", '{"traceEvents": []}')
    with pytest.raises(EmptyTraceError, match="no events"):
        T.load(p)


def test_truncated_json_names_offset(tmp_path):
    full = doc(ok_event(), ok_event(name="aten::add"))
    p = write(tmp_path, "trunc.json", full[: len(full) - 20])
    with pytest.raises(TraceFormatError) as ei:
        T.load(p)
    e = ei.value
    assert "trunc.json" in str(e) and "truncated" in str(e)
    assert e.offset is not None and 0 < e.offset <= len(full)
    assert isinstance(e, ValueError)


@pytest.mark.parametrize(
    "bad",
    ['{"x": [1 2 @@ ]}', '{"y": {"k" 5}}', '{"z": ["\\q"]}', '{"w": [1, NaN]}', '{"v": [1, 01]}'],
)
def test_an_args_value_that_is_not_json_is_refused_where_it_is(tmp_path, bad):
    """A compound value is kept as its text and written back out as it was: text that is not JSON
    was read without a word and made `to_chrome` write a file no JSON reader (nor Perfetto) opens."""
    head = '{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 2, "pid": 1, "tid": 1, "args": '
    p = write(tmp_path, "args.json", head + bad + "}]}")
    with pytest.raises(TraceFormatError, match="args.json") as e:
        T.load(p)
    assert e.value.offset is not None and len(head) < e.value.offset < len(head) + len(bad)
    p = write(
        tmp_path, "top.json", '{"traceEvents": [' + json.dumps(ok_event()) + '], "distributedInfo": [oops]}'
    )
    with pytest.raises(TraceFormatError, match="top.json.*unexpected character 'o'"):
        T.load(p)


@pytest.mark.parametrize("cut", [1, 7, 30, 55, 80])
def test_every_truncation_is_an_error_not_a_crash(tmp_path, cut):
    full = doc(ok_event(), ok_event(name="aten::add"))
    p = write(tmp_path, "t.json", full[:cut])
    with pytest.raises(TraceFormatError, match="t.json"):
        T.load(p)


def test_truncated_real_fixture_gzip(tmp_path):
    data = (TRACES / "mi250_rocm62_tiny.kineto.json.gz").read_bytes()
    p = write(tmp_path, "cut.json.gz", data[: len(data) // 2])
    with pytest.raises(TraceFormatError, match="cut.json.gz.*gzip"):
        T.load(p)


def test_corrupt_gzip(tmp_path):
    good = gzip.compress(doc(ok_event()).encode())
    bad = good[:12] + bytes(b ^ 0xFF for b in good[12:30]) + good[30:]
    p = write(tmp_path, "bad.json.gz", bad)
    with pytest.raises(TraceFormatError, match="bad.json.gz"):
        T.load(p)


def test_what_follows_the_gzip_data_and_other_compressions(tmp_path):
    body = doc(ok_event()).encode()
    gz = gzip.compress(body)
    # two members read as one stream (gzip's concatenation); bytes that are not a member are said so
    assert (
        len(T.load(write(tmp_path, "two.json.gz", gzip.compress(body[:20]) + gzip.compress(body[20:])))) == 1
    )
    with pytest.raises(
        TraceFormatError, match=r"9 byte\(s\) after the end of the gzip data are not another gzip"
    ):
        T.load(write(tmp_path, "tail.json.gz", gz + b"garbage!!"))
    with pytest.raises(EmptyTraceError, match="its gzip data decompress to nothing"):
        T.load(write(tmp_path, "e.json.gz", gzip.compress(b"")))
    import bz2
    import lzma

    for name, data, what in (
        ("t.json.bz2", bz2.compress(body), "bzip2-compressed"),
        ("t.json.xz", lzma.compress(body), "xz-compressed"),
        ("t.json.zst", b"\x28\xb5\x2f\xfd" + bytes(20), "zstd-compressed"),
    ):
        with pytest.raises(TraceFormatError, match=f"{name}: {what}, which teller does not read"):
            T.load(write(tmp_path, name, data))


def test_time_out_of_range_says_the_value(tmp_path):
    for ts in ("-5e15", "5e15"):
        p = write(tmp_path, "t.json", doc(ok_event()).replace('"ts": 1.5', f'"ts": {ts}'))
        with pytest.raises(TraceFormatError, match=rf"'ts' is out of range \({ts} us; teller reads -4"):
            T.load(p)


def test_large_gzip_errors_match_the_plain_file(tmp_path):
    # a gzipped trace of 256 KiB and more is parsed while a second thread inflates it: a broken
    # event deep inside reads as the same error as in the plain file, and a corrupt stream as gzip
    plain = gzip.decompress((TRACES / "mi300x_sglang_decode_hipgraph.kineto.json.gz").read_bytes())
    assert len(plain) >= 256 << 10
    at = plain.index(b'"ts"', len(plain) * 3 // 4)
    broken = plain[:at] + b'"ts": "x"' + plain[at + 4 :]
    with pytest.raises(TraceFormatError) as want:
        T.load(write(tmp_path, "b.json", broken))
    with pytest.raises(TraceFormatError) as got:
        T.load(write(tmp_path, "b.json.gz", gzip.compress(broken)))
    assert (got.value.offset, got.value.index) == (want.value.offset, want.value.index)
    assert str(got.value).replace("b.json.gz", "b.json") == str(want.value)
    z = bytearray(gzip.compress(plain))
    z[len(z) // 2 : len(z) // 2 + 32] = bytes(32)
    with pytest.raises(TraceFormatError, match="c.json.gz.*gzip"):
        T.load(write(tmp_path, "c.json.gz", bytes(z)))


@pytest.mark.parametrize(
    "event, message",
    [
        (ok_event(ts="12.5"), "'ts' must be a number"),
        (ok_event(dur=[1]), "'dur' must be a number"),
        (ok_event(name=5), "'name' must be a string"),
        (ok_event(cat={"a": 1}), "'cat' must be a string"),
        (ok_event(pid=[1]), "'pid' must be an integer or a string"),
        (ok_event(args=[1, 2]), "'args' must be an object"),
        (ok_event(ph="Z"), "unknown phase 'Z'"),
        (ok_event(ph="XX"), "unknown phase"),
        ({"cat": "cpu_op", "name": "x", "ts": 1}, "no 'ph'"),
        (ok_event(ts=None), "'ts' must be a number"),
        ({"ph": "X", "name": "x", "pid": 1, "tid": 1}, "has no 'ts'"),
    ],
)
def test_wrong_types_name_event_index(tmp_path, event, message):
    p = write(tmp_path, "types.json", doc(ok_event(), ok_event(), event))
    with pytest.raises(TraceFormatError) as ei:
        T.load(p)
    e = ei.value
    assert message in str(e) and "types.json" in str(e)
    assert e.index == 2, str(e)
    assert e.offset is not None


def test_not_a_trace(tmp_path):
    for name, content in [
        ("n.json", "42"),
        ("o.json", '{"foo": 1}'),
        ("s.json", '"x"'),
        ("b.json", b"\x89PNG\r\n"),
    ]:
        p = write(tmp_path, name, content)
        with pytest.raises(TraceFormatError, match=name):
            T.load(p)


def test_trailing_garbage(tmp_path):
    p = write(tmp_path, "g.json", doc(ok_event()) + " xyz")
    with pytest.raises(TraceFormatError, match="after the end"):
        T.load(p)


def test_unknown_category_is_a_warning_not_an_error(tmp_path):
    p = write(tmp_path, "c.json", doc(ok_event(), ok_event(cat="my_custom_cat")))
    with pytest.warns(TellerWarning, match="my_custom_cat"):
        tr = T.load(p)
    assert len(tr) == 2
    assert sorted(tr.layer_name(i) for i in range(2)) == ["host_op", "other"]


def test_skipped_phases_and_unmatched_ranges_are_warnings(tmp_path):
    p = write(
        tmp_path,
        "w.json",
        doc(
            ok_event(),
            {"ph": "b", "cat": "async", "name": "a", "id": 1, "pid": 1, "tid": 1, "ts": 1},
            {"ph": "B", "name": "open", "pid": 1, "tid": 1, "ts": 2},
            {"ph": "E", "pid": 1, "tid": 2, "ts": 3},
            ok_event(dur=-5, name="neg"),
        ),
    )
    with pytest.warns(TellerWarning) as rec:
        tr = T.load(p)
    text = " | ".join(str(w.message) for w in rec)
    assert "'b' x1" in text and "without a matching 'E'" in text and "without a matching 'B'" in text
    assert "negative duration" in text
    assert len(tr) == 3


def test_b_e_pairs_and_string_ids(tmp_path):
    p = write(
        tmp_path,
        "be.json",
        json.dumps(
            [
                {
                    "ph": "B",
                    "cat": "user_annotation",
                    "name": "outer",
                    "pid": "7",
                    "tid": "main",
                    "ts": 10,
                    "args": {"k": 1},
                },
                {"ph": "X", "cat": "cpu_op", "name": "inner", "pid": "7", "tid": "main", "ts": 11, "dur": 2},
                {"ph": "E", "pid": "7", "tid": "main", "ts": 20.25},
            ]
        ),
    )
    tr = T.load(p)
    i = [tr.name_of(k) for k in range(len(tr))].index("outer")
    assert tr.dur[i] == 10250 and tr.args(i) == {"k": 1} and tr.pid[i] == 7
    j = 1 - i
    assert tr.parent[j] == i


def test_b_e_pairs_are_made_in_time_order_not_file_order(tmp_path):
    """The format does not ask for events in time order (Perfetto sorts before pairing): B/E are
    paired per thread by timestamp; the range keeps its B's device and stream, and a key both
    ends give appears once (the B's value)."""
    ev = lambda ph, ts, **kw: {"ph": ph, "pid": 1, "tid": 1, "ts": ts, **kw}  # noqa: E731
    p = write(
        tmp_path,
        "order.json",
        json.dumps(
            [
                ev("B", 2, name="b"),
                ev("B", 1, name="a"),
                ev("E", 3),
                ev("E", 10),
                ev("E", 30, args={"k": 2, "e": 1}),  # (listed before its B)
                ev("B", 25, name="c", args={"k": 1}),
                {
                    "ph": "B",
                    "name": "k",
                    "cat": "kernel",
                    "pid": 0,
                    "tid": "stream 7",
                    "ts": 40,
                    "args": {"device": 3, "stream": 7, "correlation": 5},
                },
                {"ph": "E", "pid": 0, "tid": "stream 7", "ts": 41},
            ]
        ),
    )
    tr = T.load(p, warn=False)
    by = {tr.name_of(k): k for k in range(len(tr))}
    span = {n: (int(tr.ts[i] - tr.ts.min()), int(tr.dur[i])) for n, i in by.items() if n != "k"}
    assert span == {"a": (0, 9000), "b": (1000, 1000), "c": (24000, 5000)}
    assert tr.parent[by["b"]] == by["a"] and tr.parent[by["c"]] == -1
    assert tr.args(by["c"]) == {"k": 1, "e": 1}
    assert tr.device[by["k"]] == 3 and tr.tid[by["k"]] == 7
    # (said where the file's order was not the time order: a producer's jittered 'E' pairs this way)
    p2 = write(
        tmp_path,
        "sorted.json",
        json.dumps([ev("B", 1, name="a"), ev("E", 2), ev("B", 3, name="b"), ev("E", 4)]),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        T.load(p2)
    with pytest.warns(TellerWarning, match=r"'B'/'E' events of 1 thread\(s\) are not in time order"):
        T.load(p)
    # (and one trace written by teller reads back with the same device)
    tr.to_chrome(tmp_path / "back.json")
    back = T.load(tmp_path / "back.json", warn=False)
    assert back.device.tolist() == tr.device.tolist()


def test_a_gpu_activity_takes_its_device_from_its_pid_only_where_that_is_one(tmp_path):
    """Without args.device a GPU activity's pid is its device (Kineto), and a label pid "GPU 1" names
    one; another label ("stream 7" as a pid) or a pid past i32 is no device: -1, said once (it was
    the label's string number, or the pid wrapped to 705032704)."""
    k = lambda pid, name: {"ph": "X", "cat": "kernel", "name": name, "ts": 1, "dur": 1, "pid": pid, "tid": 7}  # noqa: E731
    p = write(
        tmp_path,
        "dev.json",
        json.dumps([k(3, "a"), k("GPU 1", "b"), k("gpu:2", "c"), k("other", "d"), k(5_000_000_000, "e")]),
    )
    with pytest.warns(
        TellerWarning, match=r"2 event\(s\) with an args.device, or a GPU activity's pid, that is not"
    ):
        tr = T.load(p)
    assert {tr.name_of(i): int(tr.device[i]) for i in range(len(tr))} == {
        "a": 3,
        "b": 1,
        "c": 2,
        "d": -1,
        "e": -1,
    }


def test_counters_with_an_id_are_counters_of_their_own(tmp_path):
    """The format: a 'C' event's name and id together name the counter (Perfetto: "name id"); two
    ids of one name were merged into one series."""
    c = lambda ts, i, v: {"ph": "C", "name": "kv", "pid": 1, "tid": 1, "ts": ts, "id": i, "args": {"used": v}}  # noqa: E731
    evs = [ok_event(), c(1, 1, 0.5), c(2, 2, 0.9), c(3, "a", 0.1), {**c(4, 1, 0.6), "id": None}]
    tr = T.load(write(tmp_path, "ctr.json", json.dumps(evs)), warn=False)
    tr.to_chrome(tmp_path / "out.json")
    out = json.loads((tmp_path / "out.json").read_text())["traceEvents"]
    names = sorted({e["name"] for e in out if e.get("ph") == "C"})
    assert names == ["kv", "kv 1", "kv 2", "kv a"], names
    back = T.load(tmp_path / "out.json", warn=False)
    assert back.num_counters == tr.num_counters == 4
    # a negative id is a number (it was read as a string's index: a panic past the string table)
    tr = T.load(write(tmp_path, "neg.json", json.dumps([ok_event(), c(1, -1, 0.5)])), warn=False)
    tr.to_chrome(tmp_path / "neg.out.json")
    out = json.loads((tmp_path / "neg.out.json").read_text())["traceEvents"]
    assert [e["name"] for e in out if e.get("ph") == "C"] == ["kv -1"]
    # a string id names its counter as written: a hex id past 2^63 printed as a negative number, and
    # "0x10" as 16 (one series with a numeric id 16)
    evs = [ok_event(), c(1, "0x8000000000000001", 0.5), c(2, "0x10", 0.5), c(3, 16, 0.5), c(4, " 7 ", 0.1)]
    tr = T.load(write(tmp_path, "hex.json", json.dumps(evs)), warn=False)
    tr.to_chrome(tmp_path / "hex.out.json")
    out = json.loads((tmp_path / "hex.out.json").read_text())["traceEvents"]
    assert sorted(e["name"] for e in out if e.get("ph") == "C") == [
        "kv 0x10",
        "kv 0x8000000000000001",
        "kv 16",
        "kv 7",
    ]


def test_directory_without_traces(tmp_path):
    (tmp_path / "x.txt").write_text("hi")
    with pytest.raises(EmptyTraceError, match="no trace files"):
        T.load(tmp_path)


def test_run_directory_with_empty_raw_says_so(tmp_path):
    # a `teller collect` run whose program made no NVTX/CUDA call: run.json and logs, raw/ empty
    (tmp_path / "raw").mkdir()
    (tmp_path / "run.json").write_text('{"exit_code": 1}')
    (tmp_path / "log.txt").write_text("boom\n")
    with pytest.raises(EmptyTraceError, match="no raw files in raw/") as e:
        T.load(tmp_path)
    assert str(tmp_path) in str(e.value)


def test_sample_directory_reads_trace_not_annotation(tmp_path):
    # a dataset sample: trace.json beside annotation.json (and a run's summary.json): only the trace is read
    src = TRACES / "mi250_rocm62_tiny.kineto.json.gz"
    (tmp_path / "trace.json.gz").write_bytes(src.read_bytes())
    (tmp_path / "annotation.json").write_text('{"label": "normal"}')
    (tmp_path / "summary.json").write_text("{}")
    assert len(T.load(tmp_path, warn=False)) == len(T.load(src, warn=False)) > 0


def test_bad_options():
    with pytest.raises(ConfigError):
        T.load(TRACES / "mi250_rocm62_tiny.kineto.json.gz", step_names=[])
    with pytest.raises(ConfigError, match="unknown normalization option"):
        T.load(TRACES / "mi250_rocm62_tiny.kineto.json.gz", normalize={"bogus": True})
    with pytest.raises(ConfigError, match="unknown layer"):
        T.symbol("gpu", "x")


def test_write_to_missing_dir_keeps_nothing_half_written(tmp_path):
    tr = T.load(TRACES / "mi250_rocm62_tiny.kineto.json.gz", warn=False)
    with pytest.raises(TellerFileNotFoundError):
        tr.to_chrome(tmp_path / "no" / "such" / "dir" / "t.json")
    out = tmp_path / "t.json"
    out.write_text("previous content")
    tr.to_chrome(out)
    assert json.loads(out.read_text())["traceEvents"]
    assert not list(tmp_path.glob(".t.json.tmp-*"))


def test_invalid_utf8_names_its_offset(tmp_path):
    good = doc(ok_event(name="abc"))
    data = good.encode().replace(b"abc", b"a\xffc")
    p = write(tmp_path, "u.json", data)
    with pytest.raises(TraceFormatError, match="invalid UTF-8") as ei:
        T.load(p)
    assert ei.value.offset == data.index(b"\xff")


def test_an_input_without_events_among_others_is_named(tmp_path):
    """`trace summary good.json empty.json` read as one source, silently; with every input empty the
    error's path was the comma-joined list (not a path)."""
    good = write(tmp_path, "good.json", json.dumps([ok_event()]))
    empty = write(tmp_path, "empty.json", "[]")
    tr = T.load([good, empty], warn=False)
    assert len(tr) == 1
    assert [w for w in tr.warnings if "no events" in w] == [
        f"{empty}: no events in this input (read with the others)"
    ]
    other = write(tmp_path, "other.json", '{"traceEvents": []}')
    with pytest.raises(EmptyTraceError) as e:
        T.load([empty, other])
    assert e.value.path == str(empty) and "no events in any of the 2 inputs" in str(e.value)
