#!/usr/bin/env python3
"""Decode teller raw trace files (docs/trace-format.md) and check a test scenario.

Usage: check_raw.py SCENARIO TRACE_DIR FACTS_JSON
FACTS_JSON is the JSON line the test program printed (pids, tids, ...). Exit status 0 = pass.
Also usable as a library: load_file(path) returns a decoded RawFile.
"""

import glob
import json
import os
import re
import sys
from collections import defaultdict

import msgpack

HEADER, STRING, SPAN, GPU, BEGIN, END, MARK, THREAD_NAME, COUNTER, DROPPED, CLOCK_SYNC, DIAG = range(1, 13)
# Kineto's deviceProperties keys (libkineto CudaDeviceProperties.cpp), in its order
DEVICE_KEYS = [
    "id",
    "name",
    "totalGlobalMem",
    "computeMajor",
    "computeMinor",
    "maxThreadsPerBlock",
    "maxThreadsPerMultiprocessor",
    "regsPerBlock",
    "warpSize",
    "sharedMemPerBlock",
    "numSms",
    "regsPerMultiprocessor",
    "sharedMemPerBlockOptin",
    "sharedMemPerMultiprocessor",
]


class RawFile:
    def __init__(self, path, repeated_strings=False):
        self.path = path
        self.header = None
        self.strings = {}
        self.records = []  # raw records (lists), in file order, padding removed
        # Runs of top-level values that are not arrays: a record torn by SIGKILL mid-write. The shim
        # stores a record's array header byte last, so a torn record reads as 0x00 + loose values.
        self.torn = 0
        in_torn = False
        data = open(path, "rb").read()
        up = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=len(data) + 16)
        up.feed(data)
        while True:
            try:
                v = up.unpack()
            except msgpack.OutOfData:
                break  # a cut at the end of the file
            except Exception as e:  # noqa: BLE001 - garbage after a torn record
                raise AssertionError(f"{path}: undecodable data at offset {up.tell()}: {e}") from e
            if v == 0:
                in_torn = False
                continue  # zero padding
            if not isinstance(v, list) or not v or not isinstance(v[0], int):
                if not in_torn:
                    self.torn += 1
                in_torn = True
                continue
            in_torn = False
            if v[0] == HEADER:
                assert self.header is None, f"{path}: second HEADER"
                assert self.records == [], f"{path}: HEADER is not the first record"
                assert v[1] == "teller-trace" and v[2] == 1, v
                self.header = v[3]
                continue
            if v[0] == STRING:
                sid, text = v[1], v[2]
                assert isinstance(sid, int) and sid >= 1, v
                assert sid not in self.strings, f"{path}: string id {sid} defined twice"
                self.strings[sid] = text
                self.n_strings = getattr(self, "n_strings", 0) + 1
                continue
            self.records.append(v)
        assert self.header is not None, f"{path}: no HEADER"
        texts = list(self.strings.values())
        # (past the string table's budget a name used again is written again, under a new id)
        assert repeated_strings or len(texts) == len(set(texts)), f"{path}: a string was written twice"

    def s(self, sid):
        if isinstance(sid, str):
            return sid
        if sid == 0:
            return None
        assert sid in self.strings, f"{self.path}: undefined string id {sid}"
        return self.strings[sid]

    def of(self, rtype):
        return [r for r in self.records if r[0] == rtype]

    def ranges(self):
        """BEGIN/END pairs: dict range_id -> dict(name, layer, tid, start, end, end_tid, domain, args)."""
        out = {}
        for r in self.records:
            if r[0] == BEGIN:
                rid = r[1]
                assert rid not in out, f"{self.path}: range id {rid} begun twice"
                out[rid] = dict(
                    id=rid,
                    layer=r[2],
                    name=self.s(r[3]),
                    tid=r[4],
                    start=r[5],
                    domain=self.s(r[6]) if len(r) > 6 else None,
                    args=r[7] if len(r) > 7 else None,
                    end=None,
                    end_tid=None,
                )
        for r in self.records:
            if r[0] == END:
                rid = r[1]
                assert rid in out, f"{self.path}: END of unknown range {rid}"
                assert out[rid]["end"] is None, f"{self.path}: range {rid} ended twice"
                out[rid]["end"] = r[3]
                out[rid]["end_tid"] = r[2]
                assert r[3] >= out[rid]["start"], f"{self.path}: range {rid} ends before it starts"
        return out

    def thread_names(self):
        return {r[1]: self.s(r[2]) for r in self.of(THREAD_NAME)}

    def diags(self):
        return [(r[2], self.s(r[3])) for r in self.of(DIAG)]


def load_dir(d, repeated_strings=False):
    files = sorted(glob.glob(os.path.join(d, "raw", "*.tmsgpack")))
    assert files, f"no raw files under {d}/raw"
    return [RawFile(f, repeated_strings) for f in files]


def check(cond, msg):
    if not cond:
        raise AssertionError(msg)


def check_header(f, pid, argv1=None):
    h = f.header
    # the map's count matches what was written: a count one too high reads the padding as a 0: 0 pair
    known = {"pid", "ppid", "host", "argv", "clock", "clock_sync", "start_ns", "env", "producer"}
    known |= {"cupti_version", "errors", "deviceProperties"}
    check(
        set(h) <= known and known - {"cupti_version", "errors", "deviceProperties"} <= set(h),
        f"header keys {list(h)}",
    )
    check(h["pid"] == pid, f"header pid {h['pid']} != {pid}")
    check(h["clock"] == "CLOCK_MONOTONIC", h["clock"])
    check(h["producer"] == "teller-shim 0.1.0", h["producer"])
    check(isinstance(h["clock_sync"], list) and len(h["clock_sync"]) == 2, h["clock_sync"])
    check(0 < h["start_ns"] <= h["clock_sync"][0], "start_ns after clock_sync")
    check(isinstance(h["ppid"], int) and h["host"], "ppid/host")
    for k in h["env"]:
        check(
            k.startswith("TELLER_")
            or k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"),
            f"env key {k} leaked",
        )
    if argv1 is not None:
        check(len(h["argv"]) > 1 and h["argv"][1] == argv1, f"argv {h['argv']}")
    base = os.path.basename(f.path)
    check(base.startswith("teller-") and f"-{pid}-" in base, f"file name {base}")


def check_nesting(ranges, tid):
    """Push/pop ranges on one thread must nest properly (intervals never partially overlap)."""
    rs = sorted(
        (r for r in ranges if r["tid"] == tid and r["end"] is not None), key=lambda r: (r["start"], -r["end"])
    )
    stack = []
    for r in rs:
        while stack and stack[-1]["end"] <= r["start"]:
            stack.pop()
        if stack:
            check(
                r["end"] <= stack[-1]["end"], f"range {r['name']} overlaps {stack[-1]['name']} on tid {tid}"
            )
        stack.append(r)


def depth_children(ranges, parent):
    return [
        r
        for r in ranges
        if r["tid"] == parent["tid"]
        and r is not parent
        and r["end"] is not None
        and parent["start"] <= r["start"]
        and r["end"] <= parent["end"]
    ]


def scenario_basic(d, facts):
    fs = load_dir(d)
    check(len(fs) == 1, f"expected 1 file, got {len(fs)}")
    f = fs[0]
    check_header(f, facts["pid"], "basic")
    check(f.torn == 0, "torn records in a clean run")
    rg = f.ranges()
    R = list(rg.values())
    main = facts["main_tid"]
    byname = defaultdict(list)
    for r in R:
        byname[r["name"]].append(r)
    # every range ended
    check(all(r["end"] is not None for r in R), "unfinished range in a clean run")
    outer, inner = byname["outer"][0], byname["inner"][0]
    check(outer["tid"] == inner["tid"] == main, "outer/inner tid")
    check(outer["start"] < inner["start"] <= inner["end"] < outer["end"], "inner not inside outer")
    check(outer["layer"] == 1 and outer["domain"] is None, "annotation layer/domain")
    marks = {f.s(m[2]): m for m in f.of(MARK)}
    check(set(marks) >= {"mark-a", "colored", "registered-name"}, f"marks {set(marks)}")
    ma = marks["mark-a"]
    check(ma[1] == 10 and ma[3] == main and inner["start"] <= ma[4] <= inner["end"], "mark-a inside inner")
    col = byname["colored"][0]
    check(col["args"] == {"color": 0xFF00FF00, "payload": -42}, f"colored args {col['args']}")
    check(marks["colored"][5] == {"color": 0xFF00FF00, "payload": -42}, "mark args")
    reg = byname["registered-name"]
    check(len(reg) == 3, f"registered-name ranges {len(reg)}")
    check(all(r["domain"] == "my-domain" for r in reg), "domain of registered ranges")
    dflt = byname["default-outer"][0]
    pushed = sorted((r for r in reg if r["start"] < dflt["end"]), key=lambda r: r["start"])
    check(
        len(pushed) == 2
        and dflt["start"]
        < pushed[0]["start"]
        < pushed[1]["start"]
        <= pushed[1]["end"]
        < pushed[0]["end"]
        < dflt["end"],
        "domain push/pop nesting",
    )
    check(marks["registered-name"][5] == {"domain": "my-domain"}, f"domain mark {marks['registered-name']}")
    cross = byname["cross-thread"][0]
    check(
        cross["tid"] == main and cross["end_tid"] == facts["ender_tid"] and cross["end_tid"] != main,
        f"cross-thread range tid {cross['tid']} end_tid {cross['end_tid']}",
    )
    names = f.thread_names()
    check(names.get(main) == "main-thread", f"main thread name {names.get(main)}")
    iters = facts["iters"]
    for i, wt in enumerate(facts["worker_tids"]):
        check(names.get(wt) == f"worker-{i}", f"worker {i} name {names.get(wt)}")
        mine = [r for r in R if r["tid"] == wt]
        check(len(mine) == 3 * iters, f"worker {i}: {len(mine)} ranges, expected {3 * iters}")
        outers = [r for r in mine if r["name"] == f"w{i}-outer"]
        check(len(outers) == iters, f"worker {i} outers {len(outers)}")
        check_nesting(R, wt)
        for k, o in enumerate(sorted(outers, key=lambda r: r["start"])[:50]):
            kids = depth_children(R, o)
            check(
                sorted(c["name"] for c in kids) == sorted([f"w{i}-inner-{k % 3}", "leaf"]), f"children {kids}"
            )
    check_nesting(R, main)
    # range ids unique across threads, string table complete
    check(len(rg) == len(R), "range ids")
    print(f"basic: {len(R)} ranges, {len(f.strings)} strings, {len(f.records)} records OK")


def scenario_fork(d, facts):
    fs = {f.header["pid"]: f for f in load_dir(d)}
    parent, c1, c2 = facts["pid"], facts["child"], facts["child2"]
    check(set(fs) == {parent, c1, c2}, f"files for pids {set(fs)}, expected {parent, c1, c2}")
    p = fs[parent]
    check_header(p, parent, "fork")
    pn = {r["name"]: r for r in p.ranges().values()}
    check(set(pn) == {"parent-before-fork", "parent-open-at-fork"}, f"parent ranges {set(pn)}")
    check(all(r["end"] is not None for r in pn.values()), "parent ranges ended in parent")
    for cpid, rname in ((c1, "child-range"), (c2, "child2-range")):
        c = fs[cpid]
        check_header(c, cpid, "fork")
        check(c.header["ppid"] == parent, "child ppid")
        cn = {r["name"]: r for r in c.ranges().values()}  # ranges() asserts every END has a BEGIN
        check(set(cn) == {rname}, f"child ranges {set(cn)}")
        check(cn[rname]["end"] is not None and cn[rname]["tid"] == cpid, "child range")
        # start_ns comes from /proc/<pid>/stat starttime: clock ticks (10 ms at CLK_TCK=100), so a child
        # forked within the parent's tick may read up to one tick earlier after the conversion.
        check(c.header["start_ns"] + 20_000_000 >= p.header["start_ns"], "child start_ns")
    check([p_.s(m[2]) for m in fs[c1].of(MARK) for p_ in [fs[c1]]] == ["child-mark"], "child mark")
    print("fork: parent and 2 children in separate files OK")


REENTERED = "calls from a signal handler made while the collector was running on the same thread (NVTX ranges, CUDA synchronize callbacks)"


def reentered(f):
    """NVTX calls the reentrancy guard refused (DROPPED records with its reason)."""
    return sum(r[1] for r in f.of(DROPPED) if f.s(r[2]) == REENTERED)


def scenario_signal_inside(d, facts):
    """A SIGSEGV inside the shim whose handler calls NVTX: the handler's calls are refused and
    counted, the interrupted push and mark complete with their names."""
    (f,) = load_dir(d)
    check(f.torn == 0, f"{f.torn} torn records")
    check(facts["faults"] == 2, f"faults {facts['faults']}")
    check(facts["handler_push_ret"] < 0, f"refused push returned {facts['handler_push_ret']}")
    names = [r["name"] for r in sorted(f.ranges().values(), key=lambda r: r["start"])]
    check(names == ["before", "pushed-across-a-page", "from-handler"], f"ranges {names}")
    marks = [f.s(m[2]) for m in f.of(MARK)]
    check(marks == ["marked-across-a-page"], f"marks {marks}")
    check(reentered(f) == 6, f"refused calls {reentered(f)}, expected 6 (3 per fault)")
    check(all(r["end"] is not None for r in f.ranges().values()), "an open range")


def scenario_signal_storm(d, facts):
    """Interval-timer handlers calling NVTX on a thread that is nearly always inside the shim: the
    file decodes, the main thread's ranges nest and are all there, and each handler invocation is
    recorded whole or refused whole (3 calls)."""
    (f,) = load_dir(d)
    check(f.torn == 0, f"{f.torn} torn records")
    rs = list(f.ranges().values())
    check(all(r["end"] is not None for r in rs), "an open range")
    check_nesting(rs, facts["main_tid"])
    main = [r for r in rs if r["name"] != "sig"]
    check(len(main) == 2 * facts["iters"], f"{len(main)} program ranges, expected {2 * facts['iters']}")
    sig = sum(1 for r in rs if r["name"] == "sig")
    sig_marks = sum(1 for m in f.of(MARK) if f.s(m[2]) == "sig-mark")
    main_marks = sum(1 for m in f.of(MARK) if f.s(m[2]) == "main-mark")
    check(main_marks == facts["iters"], f"{main_marks} program marks, expected {facts['iters']}")
    check(sig == sig_marks, f"{sig} handler ranges but {sig_marks} handler marks")
    refused = reentered(f)
    check(refused == 3 * (facts["alarms"] - sig), f"refused {refused}, alarms {facts['alarms']}, recorded {sig}")
    check(refused > 0 and facts["alarms"] > 100, f"no handler ran inside the shim ({facts['alarms']} alarms)")
    print(f"signal-storm: {facts['alarms']} alarms, {sig} recorded, {refused // 3} refused, {facts['iters']} iterations")


def scenario_crash(d, facts, how):
    fs = load_dir(d)
    check(len(fs) == 1, f"expected 1 file, got {len(fs)}")
    f = fs[0]
    check_header(f, facts["pid"], f"crash-{how}")
    R = list(f.ranges().values())
    done = [r for r in R if r["name"] == "done"]
    check(len(done) == 100 and all(r["end"] is not None for r in done), f"done ranges {len(done)}")
    doomed = [r for r in R if r["name"] == "doomed"]
    check(len(doomed) == 1 and doomed[0]["end"] is None, "doomed range must be open")
    check([f.s(m[2]) for m in f.of(MARK)] == ["before-death"], "mark before death")
    if how in ("kill", "term"):
        sp = [r for r in R if r["name"] == "spinner-open"]
        check(len(sp) == 1 and sp[0]["end"] is None, "spinner-open must be open")
        spins = [r for r in R if r["name"] == "spin" and r["end"] is not None]
        check(len(spins) > 10, f"spinner completed only {len(spins)} ranges")
        check(f.thread_names().get(sp[0]["tid"]) == "spinner", "spinner thread name")
        check(f.torn <= 1, f"{f.torn} torn records (at most one per thread killed mid-record)")
    else:
        check(f.torn == 0, "torn records")
    print(f"crash-{how}: {len(R)} ranges readable after the crash, open range visible OK (torn={f.torn})")


def scenario_convert(d, facts):
    fs = load_dir(d)
    f = fs[0]
    recs = [r for r in f.records if r[0] in (SPAN, GPU, DROPPED)]
    got = []
    for r in recs:
        r = list(r)
        if r[0] == SPAN:
            r[2] = f.s(r[2])
        elif r[0] == GPU:
            r[2] = f.s(r[2])
        elif r[0] == DROPPED:
            r[2] = f.s(r[2])
        got.append(r)
    longname = "void long_kernel<" + "k" * (5000 - 17)
    exp = [
        [SPAN, 4, "cudaLaunchKernel", 4242, 1000, 1100, 42, 777],
        [
            GPU,
            6,
            "void gemm<128, 64>(float*)",
            3,
            7,
            2000,
            2900,
            42,
            {"grid": [4, 2, 1], "block": [128, 1, 1]},
        ],
        [
            GPU,
            6,
            "void gemm<128, 64>(float*)",
            3,
            7,
            3000,
            3900,
            42,
            {"grid": [4, 2, 1], "block": [128, 1, 1]},
        ],
        [GPU, 6, longname, 0, 13, 5000, 6000, 50, {"grid": [1, 1, 1], "block": [32, 32, 32]}],
        [GPU, 7, "Memcpy HtoD", 3, 7, 6100, 6200, 43, {"bytes": 4096, "kind": "HtoD"}],
        [GPU, 8, "Memset", 3, 7, 6300, 6400, 44, {"bytes": 1024}],
        [GPU, 9, "cudaStreamSynchronize", 3, 7, 6400, 6600, 45, {"context": 1}],
        [SPAN, 5, "cuCtxSynchronize", 4243, 6700, 6800, 46, 0],
        [SPAN, 4, "runtime_cbid:9999", 4242, 6900, 6950, 47, 0],
        [DROPPED, 5, "CUPTI activity buffer full"],
    ]
    check(
        got == exp,
        "converted records differ:\n"
        + "\n".join(f"got {g}\nexp {e}" for g, e in zip(got, exp, strict=False) if g != e)
        + f"\n(len got {len(got)} exp {len(exp)})",
    )
    check(list(f.strings.values()).count("void gemm<128, 64>(float*)") == 1, "kernel name written once")
    # the device hook: once per new id, in record order (CONTEXT 3, kernel 0, CONTEXT 70; repeats ignored)
    check(facts.get("device_hook") == [3, 0, 70], f"device hook calls {facts.get('device_hook')}")
    devs = f.header.get("deviceProperties")
    check(isinstance(devs, list) and len(devs) == 64, f"{len(devs or [])} devices, expected the table's 64")
    ids = [d["id"] for d in devs]
    check(ids == [0, 3, 70] + list(range(100, 161)), f"device ids {ids}")
    check(
        devs[1]
        == {"id": 3, "name": "Convert GPU 3", "totalGlobalMem": 4 << 30, "computeMajor": 8, "numSms": 103},
        f"device 3 {devs[1]}",
    )
    check(
        all(len(d["name"]) == 255 and d["name"].startswith(f"Long GPU {d['id']:03d}") for d in devs[3:]),
        "long device names",
    )
    print(f"convert: {len(exp)} records exact, device hook, {len(devs)} devices in the header OK")


def scenario_inject(d, facts, mode):
    fs = load_dir(d)
    child = [c for c in fs if facts.get("child") and c.header["pid"] == facts["child"]]
    fs = [x for x in fs if x not in child]
    check(len(fs) == 1, f"expected 1 file, got {len(fs)}")
    f = fs[0]
    if mode in ("fake", "discover"):  # forked after the devices were recorded
        check(len(child) == 1, f"{len(child)} files for the forked child {facts.get('child')}")
        c = child[0]
        check([r["name"] for r in c.ranges().values()] == ["child-range"], "child range")
        check(
            "deviceProperties" not in c.header,
            f"the child claims the parent's GPUs: {c.header.get('deviceProperties')}",
        )
    check_header(f, facts["pid"], mode)
    R = {r["name"]: r for r in f.ranges().values()}
    for n in ("step", "inner-step", "after-init"):
        check(n in R and R[n]["end"] is not None and R[n]["layer"] == 1, f"NVTX range {n} missing")
    diags = f.diags()
    if mode == "nodriver":
        check(any(sev == 1 and "not loaded" in msg for sev, msg in diags), f"no driver DIAG: {diags}")
        check(len([1 for _, m in diags if "not loaded" in m]) == 1, "init not idempotent (DIAG twice)")
        check(any("not loaded" in e for e in f.header.get("errors", [])), "header errors")
        check(not f.of(GPU) and not f.of(SPAN), "no GPU records without a driver")
        check(
            "deviceProperties" not in f.header,
            f"deviceProperties without a driver: {f.header.get('deviceProperties')}",
        )
    elif mode == "multi":
        check(
            any(sev == 2 and "MULTIPLE_SUBSCRIBERS" in msg and "fake-nsys" in msg for sev, msg in diags),
            f"multi DIAG (with the holder's name): {diags}",
        )
        check(any("MULTIPLE_SUBSCRIBERS" in e for e in f.header.get("errors", [])), "header errors")
        check(
            f.header.get("cupti_version") == facts.get("cupti_api", f.header.get("cupti_version")), "version"
        )
        check("deviceProperties" not in f.header, "deviceProperties without CUPTI activity")
    else:  # fake / discover: full pipeline
        if mode == "discover":
            check(
                any(
                    m.startswith("libcupti: ") and m.endswith("fake_cu13/lib/libcupti.so.13")
                    for _, m in diags
                ),
                f"libcupti not discovered next to libcudart: {diags}",
            )
        check(f.header.get("cupti_version", 0) >= 130000, f"cupti_version {f.header.get('cupti_version')}")
        check("errors" not in f.header, f"errors {f.header.get('errors')}")
        # the query calls: every per-API switch asked after its kind was enabled, all accepted
        quiet = [m for _, m in diags if m.startswith("query API calls not recorded")]
        told = re.search(r"(\d+) of (\d+) skipped by CUPTI itself", quiet[0]) if quiet else None
        check(
            told is not None and told[1] == told[2] and int(told[2]) >= 20,
            f"query-call switches: {quiet}",
        )
        spans = {r[6]: r for r in f.of(SPAN)}
        gpus = {f.s(r[2]): r for r in f.of(GPU)}
        ci, co = facts["corr_in"], facts["corr_out"]
        check(
            spans[ci][1] == 4 and f.s(spans[ci][2]) == "cudaLaunchKernel" and spans[ci][3] == facts["tid"],
            "launch span",
        )
        check(
            spans[ci][7] == R["step"]["id"],
            f"ext of launch in 'step' = {spans[ci][7]}, range id {R['step']['id']}",
        )
        inner_corr = [c for c, r in spans.items() if r[7] == R["inner-step"]["id"]]
        check(len(inner_corr) == 1, "launch in inner-step maps to the innermost range")
        check(spans[co][7] == 0, "launch outside ranges has no ext")
        cc = facts["corr_cross"]
        check(
            spans[cc][7] == R["cross-b"]["id"],
            f"launch after an out-of-order pop of another domain: ext {spans[cc][7]}, the open range "
            f"'cross-b' is {R['cross-b']['id']} ('cross-a', closed, {R['cross-a']['id']})",
        )
        check(gpus["kernel_in_step"][7] == ci and gpus["kernel_outside"][7] == co, "kernel corr")
        k = gpus["kernel_in_step"]
        check(R["step"]["start"] <= spans[ci][4] <= spans[ci][5] <= k[5] <= k[6], "timestamps on one clock")
        # one range per blocking call: the runtime's (its nested cuStreamSynchronize is not a second
        # range) and a direct driver call's
        sync = sorted((r for r in f.ranges().values() if r["layer"] == 9), key=lambda r: r["start"])
        check(
            [(r["name"], r["args"]) for r in sync]
            == [
                ("cudaStreamSynchronize", {"corr": facts["corr_sync"]}),
                ("cuCtxSynchronize", {"corr": facts["corr_dsync"]}),
            ]
            and all(r["end"] is not None and r["tid"] == facts["tid"] for r in sync),
            f"sync ranges {sync}",
        )
        dropped = f.of(DROPPED)
        check(len(dropped) == 1 and dropped[0][1] == 3, f"dropped {dropped}")
        names = f.thread_names()
        check("teller-cupti" in names.values(), "writer thread named")
        writer_tid = [t for t, n in names.items() if n == "teller-cupti"][0]
        check(writer_tid != facts["tid"], "activity records written by the writer thread")
        check_fake_devices(f, facts, writer_tid)
    print(f"inject-{mode}: OK ({len(diags)} diagnostics)")


def check_fake_devices(f, facts, writer_tid):
    """CONTEXT records for devices 0, 1 and 7 of the fake libcuda (tests/fake_cuda.c): the header lists 0
    and 1 with Kineto's keys (1 without the opt-in shared memory its driver refuses), 7 (unknown to the
    driver) is left out with a warning, and the shim's own device queries are not recorded as spans."""
    devs = f.header.get("deviceProperties")
    check(isinstance(devs, list) and [d.get("id") for d in devs] == [0, 1], f"deviceProperties {devs}")
    d0, d1 = devs
    # (Kineto's keys, then the UUID where the driver gave one: device 1's query fails, its key left out)
    check(list(d0) == [*DEVICE_KEYS, "uuid"], f"device 0 keys {list(d0)}")
    check(list(d1) == [k for k in DEVICE_KEYS if k != "sharedMemPerBlockOptin"], f"device 1 keys {list(d1)}")
    check(d0["uuid"] == "GPU-a0a1a2a3-a4a5-a6a7-a8a9-aaabacadaeaf", f"device 0 uuid {d0['uuid']}")
    check([d["name"] for d in devs] == ["Teller Fake GPU 0", "Teller Fake GPU 1"], f"names {devs}")
    check(d0["totalGlobalMem"] == 80 << 30 and d1["totalGlobalMem"] == 81 << 30, "totalGlobalMem")
    check(
        (d0["numSms"], d1["numSms"]) == (132, 133) and d0["sharedMemPerBlockOptin"] == 232448, "numSms/optin"
    )
    check((d0["computeMajor"], d0["computeMinor"], d0["warpSize"]) == (9, 0, 32), "compute capability/warp")
    warns = [m for sev, m in f.diags() if sev == 1]
    check(sum("cuDeviceGet/cuDeviceGetName(7)" in m for m in warns) == 1, f"unknown device warning: {warns}")
    check(sum("cuDeviceGetAttribute(97, 1)" in m for m in warns) == 1, f"refused attribute warning: {warns}")
    check(sum("cuDeviceGetUuid(1)" in m for m in warns) == 1, f"refused uuid warning: {warns}")
    check(
        facts.get("driver_calls") == 31,
        f"the fake driver answered {facts.get('driver_calls')} queries, not 31",
    )
    own = [r for r in f.of(SPAN) if r[3] == writer_tid]
    check(not own, f"the shim's own driver queries recorded as spans: {own[:3]}")


def scenario_gpu(d, facts):
    """Real CUPTI on a GPU (gpu_smoke.py): kernels, memcpy, runtime spans tied to the NVTX range."""
    fs = [f for f in load_dir(d) if f.header["pid"] == facts["pid"]]
    check(len(fs) == 1, f"{len(fs)} files for the process")
    f = fs[0]
    diags = f.diags()
    check(
        f.header.get("cupti_version", 0) >= 130000,
        f"cupti_version {f.header.get('cupti_version')}, diags {diags}",
    )
    check("errors" not in f.header, f"errors {f.header.get('errors')}")
    check(any("CUPTI collection active" in m for _, m in diags), f"diags {diags}")
    R = {r["name"]: r for r in f.ranges().values() if r["layer"] == 1}
    check("gpu-step" in R and "gpu-copy" in R, f"NVTX ranges {sorted(R)}")
    step = R["gpu-step"]
    check(step["domain"] == "smoke" and step["end"] is not None, "NVTX range")
    spans = f.of(SPAN)
    rt = [r for r in spans if r[1] == 4]
    check(rt, "no runtime API spans")
    in_step = {r[6] for r in rt if r[7] == step["id"]}
    check(in_step, "no runtime call carries the NVTX range as external correlation id")
    kernels = [r for r in f.of(GPU) if r[1] == 6]
    check(kernels, "no kernel records")
    check(any(k[7] in in_step for k in kernels), "no kernel correlates with a launch inside 'gpu-step'")
    for k in kernels:
        check(
            len(k) > 8 and k[5] <= k[6] and isinstance(f.s(k[2]), str) and "grid" in k[8],
            f"kernel record {k}",
        )
    # one time base: the kernels launched in the step run after the step began, before the process ended
    kin = [k for k in kernels if k[7] in in_step]
    check(all(step["start"] <= k[5] for k in kin), "kernel before its NVTX range: clocks differ")
    dtoh = [
        r
        for r in f.of(GPU)
        if r[1] == 7 and len(r) > 8 and isinstance(r[8], dict) and r[8].get("kind") == "DtoH"
    ]
    check(any(r[8]["bytes"] == 1024 * 1024 * 4 for r in dtoh), f"no 4 MiB DtoH memcpy: {dtoh[:3]}")
    sync = [r for r in f.ranges().values() if r["layer"] == 9]
    check(sync and all(r["end"] is not None for r in sync), f"sync ranges {sync[:3]}")
    names = f.thread_names()
    check("teller-cupti" in names.values(), "writer thread")
    # the header names the GPU (device 0, what torch used) as Kineto does, with the driver's values
    devs = f.header.get("deviceProperties") or []
    d0 = next((d for d in devs if d.get("id") == 0), None)
    check(d0 is not None, f"no device 0 in deviceProperties {devs}, diags {diags}")
    check(list(d0) == [*DEVICE_KEYS, "uuid"], f"device 0 keys {list(d0)} (diags {diags})")
    check(
        re.fullmatch(r"GPU-[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}", d0["uuid"]) is not None,
        f"device 0 uuid {d0['uuid']!r}",
    )
    check(d0["name"] == facts["gpu_name"], f"device name {d0['name']!r}, torch says {facts['gpu_name']!r}")
    check(d0["totalGlobalMem"] == facts["gpu_mem"] and d0["numSms"] == facts["gpu_sms"], f"device 0 {d0}")
    check(
        [d0["computeMajor"], d0["computeMinor"]] == facts["gpu_cc"] and d0["warpSize"] == 32, f"device 0 {d0}"
    )
    # the shim's device queries (cuDeviceGet*, on its writer thread) are not in the trace
    writer_tid = [t for t, n in names.items() if n == "teller-cupti"][0]
    own = [f.s(r[2]) for r in spans if r[3] == writer_tid]
    check(not own, f"API spans on the writer thread: {own[:5]}")
    print(
        f"gpu: {len(kernels)} kernels, {len(rt)} runtime spans, {len(sync)} sync ranges, "
        f"{len(dtoh)} DtoH copies, GPU {d0['name']!r} OK (cupti {f.header['cupti_version']})"
    )


def main():
    if len(sys.argv) != 4:
        print(__doc__)
        return 2
    scen, d, facts_path = sys.argv[1:]
    facts = {}
    if facts_path != "-":
        lines = [ln for ln in open(facts_path).read().splitlines() if ln.startswith("{")]
        facts = json.loads(lines[-1]) if lines else {}
    try:
        if scen == "basic":
            scenario_basic(d, facts)
        elif scen == "fork":
            scenario_fork(d, facts)
        elif scen.startswith("crash-"):
            scenario_crash(d, facts, scen[6:])
        elif scen == "signal-inside":
            scenario_signal_inside(d, facts)
        elif scen == "signal-storm":
            scenario_signal_storm(d, facts)
        elif scen == "convert":
            scenario_convert(d, facts)
        elif scen == "gpu":
            scenario_gpu(d, facts)
        elif scen.startswith("inject-"):
            scenario_inject(d, facts, scen[7:])
        else:
            print(f"unknown scenario {scen}")
            return 2
    except AssertionError as e:
        print(f"FAIL {scen}: {e}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
