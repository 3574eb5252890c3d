"""The per-deployment kernel reference (teller.data.reference): keys, fits, residuals, files."""

from __future__ import annotations

import json

import numpy as np
import pytest
from teller import trace as T
from teller.data import generate
from teller.data.reference import (
    KernelReference,
    base_key,
    deployment_key,
    event_residuals,
    kernel_points,
    outside_faults,
)
from teller.errors import ConfigError, TellerFileNotFoundError
from teller.rawfmt import RawWriter

MONO0, REAL0 = 1_000_000_000, 1_764_000_000_000_000_000


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("ref") / "ds"
    generate(d, num_samples=12, seed=7, preset="tiny")
    return d


def test_deployment_key_from_device_properties_and_the_vllm_args_line(tiny):
    for sd in sorted(p for p in tiny.iterdir() if p.is_dir()):
        wl = json.loads((sd / "annotation.json").read_text())["workload"]
        tr = T.load(sd / "trace.json")
        assert (
            deployment_key(tr, (sd / "log.txt").read_text())
            == f"{wl['gpu_name']}|{wl['model_name']}|tp{wl['tp']}"
        )
        assert deployment_key(tr, None) is None
        assert deployment_key(tr, "INFO no engine arguments here") is None
        assert deployment_key(tr, "args: Namespace(model='m/x', dtype=auto)").endswith("|m/x|tp1")
        # vLLM 0.10's "non-default args: {...}" (a dict's repr)
        dict_line = "non-default args: {'model': 'm/x', 'tensor_parallel_size': 4, 'quantization': 'fp8'}"
        assert deployment_key(tr, dict_line).endswith("|m/x|tp4|q=fp8")
        # (a review) "model: 'x'" in free text (a prompt) names no model
        assert deployment_key(tr, "Received request: prompt: 'use model: 'evil/m''") is None
    # what else changes a kernel's time: keyed only when not the default, the last line naming it
    key = deployment_key(
        tr, "args: Namespace(model='m/x', tensor_parallel_size=2, dtype='auto', quantization=None)"
    )
    assert key.endswith("|m/x|tp2")
    log = (
        "args: Namespace(model='m/x', dtype='auto', quantization='fp8', kv_cache_dtype='auto')\n"
        "Initializing a V1 LLM engine (v0.10.1) with config: model='m/x', dtype=torch.float16, "
        "quantization=fp8, kv_cache_dtype=fp8_e5m2, quantization_param_path=None"
    )
    assert deployment_key(tr, log).endswith("|m/x|tp1|dtype=float16|q=fp8|kv=fp8_e5m2")
    assert deployment_key(tr, "config: model='m/x', dtype=torch.bfloat16, kv_cache_dtype=auto").endswith(
        "|m/x|tp1"
    )
    # spellings of one thing are one key; a dtype named outside the configuration lines (a fused-MoE
    # config file) is not the model's
    half = deployment_key(tr, "args: Namespace(model='m/x', dtype='half', kv_cache_dtype='fp8')")
    assert half.endswith("|m/x|tp1|dtype=float16|kv=fp8_e4m3")
    assert (
        deployment_key(
            tr, "config: model='m/x', dtype=torch.float16, kv_cache_dtype=fp8_e4m3, quantization=None"
        )
        == half
    )
    moe = (
        "args: Namespace(model='m/x', quantization='fp8')\n"
        "config: model='m/x', dtype=torch.bfloat16, quantization=fp8\n"
        "Using configuration from /c/E=8,N=14336,device_name=NVIDIA_H100,dtype=fp8_w8a8.json for MoE layer."
    )
    assert deployment_key(tr, moe).endswith("|m/x|tp1|q=fp8")
    # the first model's lines: a second engine start of another model does not mix in
    two = "args: Namespace(model='m/x', tensor_parallel_size=2)\nargs: Namespace(model='m/y', dtype='half')"
    assert deployment_key(tr, two).endswith("|m/x|tp2")


def test_no_device_properties_no_key(tmp_path):
    with RawWriter(tmp_path / "teller-h-1-0.tmsgpack", pid=1, host="h", clock_sync=(MONO0, REAL0)) as w:
        w.gpu("kernel", "k", device=0, stream=7, start=MONO0 + 300, end=MONO0 + 400, corr=5)
    tr = T.load(tmp_path / "teller-h-1-0.tmsgpack")
    assert deployment_key(tr, "args: Namespace(model='m', tensor_parallel_size=2)") is None


def test_kernel_points_number_each_symbol_within_its_process_and_step(tmp_path):
    # two steps on one process: gemm, norm, gemm in each; positions 0, 0, 1 per step
    d = tmp_path / "raw"
    d.mkdir()
    with RawWriter(d / "teller-h-1-0.tmsgpack", pid=1, host="h", clock_sync=(MONO0, REAL0)) as w:
        for s in range(2):
            t = MONO0 + s * 100_000
            w.span(
                "annotation",
                "engine_step",
                tid=1,
                start=t,
                end=t + 50_000,
                args={"num_tokens": 7 if s == 0 else 63},
            )
            for k, name in enumerate(("gemm", "norm", "gemm")):
                c = 10 * s + k + 1
                w.span(
                    "runtime",
                    "cudaLaunchKernel",
                    tid=1,
                    start=t + 100 + 1000 * k,
                    end=t + 200 + 1000 * k,
                    corr=c,
                )
                w.gpu(
                    "kernel",
                    name,
                    device=0,
                    stream=7,
                    start=t + 5000 + 10_000 * k,
                    end=t + 7000 + 10_000 * k,
                    corr=c,
                )
    tr = T.load(d, step_names=["engine_step"])
    idx, pk, w, s, x = kernel_points(tr)
    np.testing.assert_array_equal(s, 0.0)  # the steps record no num_seqs
    got = sorted((int(tr.ts[i]), k, round(float(ww), 4)) for i, k, ww in zip(idx, pk, w, strict=True))
    names = [k for _, k, _ in got]
    assert names == ["kernel:gemm\t0", "kernel:norm\t0", "kernel:gemm\t1"] * 2
    assert [ww for *_, ww in got] == [round(np.log1p(7), 4)] * 3 + [round(np.log1p(63), 4)] * 3
    np.testing.assert_allclose(x, np.log1p(2.0))  # 2 us each
    # without step ranges (one step for the whole capture): no positions, one pooled fit per kernel
    f = tmp_path / "flat"
    f.mkdir()
    with RawWriter(f / "teller-h-1-0.tmsgpack", pid=1, host="h", clock_sync=(MONO0, REAL0)) as w:
        for k, name in enumerate(("gemm", "norm", "gemm", "gemm")):
            w.span(
                "runtime",
                "cudaLaunchKernel",
                tid=1,
                start=MONO0 + 1000 * k,
                end=MONO0 + 100 + 1000 * k,
                corr=k + 1,
            )
            w.gpu(
                "kernel",
                name,
                device=0,
                stream=7,
                start=MONO0 + 9000 * (k + 1),
                end=MONO0 + 9000 * (k + 1) + 500,
                corr=k + 1,
            )
    flat = T.load(f)
    assert len({int(x) for x in flat.step if x >= 0}) < 2
    assert sorted(kernel_points(flat)[1]) == ["kernel:gemm\t*"] * 3 + ["kernel:norm\t*"]


def test_fit_and_residuals_hand_computed():
    # an exact quadratic in w: the held-out half prefers the quadratic, which recovers it
    rng = np.random.default_rng(0)
    w = rng.uniform(1, 8, 200)
    s = np.zeros(200)
    x = 0.05 * w**2 + 0.3 * w + 1.0
    z = np.zeros(3)
    ref = KernelReference.fit(
        [("A|m|tp1", ["k\t0"] * 100, w[:100], s[:100], x[:100])]
        + [("A|m|tp1", ["k\t0"] * 100, w[100:], s[100:], x[100:])]
        + [("A|m|tp1", ["k\t1"] * 3, np.array([1.0, 2, 3]), z, np.array([2.0, 3, 4]))]
    )
    row = ref.table["A|m|tp1"]["k\t0"]
    assert row["kind"] == "quad" and row["n"] == 200
    np.testing.assert_allclose(row["coef"], [1.0, 0.3, 0.05, 0, 0, 0], atol=1e-5)
    assert row["w"] == pytest.approx([w.min(), w.max()], abs=1e-6)
    # 3 events of one capture: nothing to hold out, a line through them
    row1 = ref.table["A|m|tp1"]["k\t1"]
    assert row1["kind"] == "quad" and row1["coef"] == pytest.approx([1.0, 1.0, 0, 0, 0, 0], abs=1e-9)
    r = ref.residuals(
        "A|m|tp1",
        ["k\t0", "k\t0", "k\t1", "other\t0"],
        np.array([2.0, 100.0, 2.0, 2.0]),
        np.zeros(4),
        np.array([2.0, 9.0, 3.5, 1.0]),
    )
    want0 = 2.0 - (0.05 * 4 + 0.6 + 1.0)
    want1 = 9.0 - (0.05 * w.max() ** 2 + 0.3 * w.max() + 1.0)  # the load clipped to the fitted range
    np.testing.assert_allclose(r[:3], [want0, want1, 0.5], atol=1e-4)
    assert np.isnan(r[3])
    assert np.isnan(ref.residuals("B|m|tp1", ["k\t0"], np.array([2.0]), z[:1], np.array([2.0]))).all()
    assert np.isnan(ref.residuals(None, ["k\t0"], np.array([2.0]), z[:1], np.array([2.0]))).all()
    # too few events: no fit; a single load: the median
    o = np.ones(4)
    ref2 = KernelReference.fit(
        [
            ("K", ["a\t0"] * 2, o[:2], o[:2], o[:2]),
            ("K", ["b\t0"] * 4, o, o, np.array([1.0, 2, 3, 10])),
        ]
    )
    assert "a\t0" not in ref2.table["K"] and ref2.table["K"]["b\t0"]["coef"] == [2.5, 0, 0, 0, 0, 0]
    assert KernelReference.fit([(None, ["k\t0"] * 5, o[:1].repeat(5), np.ones(5), np.ones(5))]).table == {}


def test_a_kinked_load_curve_gets_a_table_and_a_sequence_bound_kernel_its_axis():
    # a roofline: flat (memory-bound) up to w = 4, then slope 1 (compute-bound); 40 captures
    # alternating between the halves; a quadratic misses the kink, the table follows it
    rng = np.random.default_rng(1)
    pts = []
    for _c in range(40):
        w = np.round(rng.uniform(1, 8, 30), 1)
        sq = np.round(rng.uniform(0.5, 5, 30), 1)
        x = np.maximum(w, 4.0) + rng.normal(0, 0.01, 30)
        xs = 2.0 * sq + rng.normal(0, 0.01, 30)  # a sampling kernel: the sequence count alone
        pts.append(("K", ["gemm\t0"] * 30 + ["softmax\t0"] * 30, np.r_[w, w], np.r_[sq, sq], np.r_[x, xs]))
    ref = KernelReference.fit(pts)
    g, sm = ref.table["K"]["gemm\t0"], ref.table["K"]["softmax\t0"]
    assert g["kind"] == "table" and g["axis"] == "w"
    assert np.all(np.diff(g["knots"]) > 0) and len(g["knots"]) == len(g["values"]) <= 71
    q = np.array([1.5, 3.95, 4.0, 6.0, 7.55])
    r = ref.residuals("K", ["gemm\t0"] * 5, q, np.ones(5), np.maximum(q, 4.0))
    assert np.abs(r).max() < 0.05
    assert sm["kind"] == "quad" or sm["axis"] == "s"
    r = ref.residuals(
        "K",
        ["softmax\t0"] * 3,
        np.array([7.0, 2.0, 5.0]),
        np.array([1.0, 2.0, 4.0]),
        np.array([2.0, 4.0, 8.0]),
    )
    assert np.abs(r).max() < 0.05


def test_a_load_that_is_not_a_finite_number_reads_as_none(tmp_path):
    with RawWriter(tmp_path / "teller-h-1-0.tmsgpack", pid=1, host="h", clock_sync=(MONO0, REAL0)) as w:
        for s, args in enumerate(
            ({"num_tokens": float("nan"), "num_seqs": float("inf")}, {"num_tokens": 3, "num_seqs": 2})
        ):
            t = MONO0 + s * 100_000
            w.span("annotation", "engine_step", tid=1, start=t, end=t + 50_000, args=args)
            w.span("runtime", "cudaLaunchKernel", tid=1, start=t + 100, end=t + 200, corr=s + 1)
            w.gpu("kernel", "gemm", device=0, stream=7, start=t + 5000, end=t + 7000, corr=s + 1)
    tr = T.load(tmp_path, step_names=["engine_step"])
    idx, _pk, w, s, _x = kernel_points(tr)
    got = sorted(zip(tr.ts[idx].tolist(), w.tolist(), s.tolist(), strict=True))
    assert [g[1:] for g in got] == [(0.0, 0.0), (pytest.approx(np.log1p(3)), pytest.approx(np.log1p(2)))]


def test_halves_alternate_per_deployment():
    # two deployments interleaved in the training order: each still alternates its own captures
    # between the halves (globally alternating, each would sit in one half and get no table)
    rng = np.random.default_rng(1)
    pts = []
    for c in range(40):
        w = np.round(rng.uniform(1, 8, 30), 1)
        pts.append(
            ("AB"[c % 2], ["gemm\t0"] * 30, w, np.zeros(30), np.maximum(w, 4.0) + rng.normal(0, 0.01, 30))
        )
    ref = KernelReference.fit(pts)
    assert ref.table["A"]["gemm\t0"]["kind"] == ref.table["B"]["gemm\t0"]["kind"] == "table"
    # deterministic: the same file twice
    assert json.dumps(KernelReference.fit(pts).to_dict(), sort_keys=True) == json.dumps(
        ref.to_dict(), sort_keys=True
    )


def test_a_fitted_reference_reads_back(tmp_path):
    from teller.data.reference import _fit_table

    # non-integer loads whose cell means round to the same knot: merged, and the file loads
    w = np.array([0.2499996] * 3 + [0.2500004] * 3 + [0.9] * 3)
    x = np.array([1.0, 1.0, 1.0, 3.0, 3.0, 3.0, 5.0, 5.0, 5.0])
    row = _fit_table(w, np.zeros(9), x)
    assert row["knots"] == [0.25, 0.9] and row["values"] == [2.0, 5.0]
    rng = np.random.default_rng(3)
    pts = []
    for _c in range(10):
        ww = rng.uniform(1, 6, 20)
        ss = rng.uniform(0.5, 3, 20)
        pts.append(
            ("K", ["a\t0"] * 20 + ["b\t0"] * 20, np.r_[ww, ww], np.r_[ss, ss], np.r_[np.sqrt(ww), ww * ss])
        )
    ref = KernelReference.fit(pts)
    back = KernelReference.load(ref.save(tmp_path / "reference.json"))
    assert back.table == ref.table
    q = (["a\t0", "b\t0"], np.array([2.0, 3.0]), np.array([1.0, 2.0]), np.array([1.5, 6.5]))
    np.testing.assert_array_equal(back.residuals("K", *q), ref.residuals("K", *q))


def test_the_quadratic_in_both_loads_hand_computed():
    from teller.data.reference import _fit_quad, _predict

    rng = np.random.default_rng(4)
    w, s = rng.uniform(1, 6, 60), rng.uniform(0.5, 3, 60)
    c = np.array([0.5, 0.2, 0.03, 0.4, -0.05, 0.07])
    x = c[0] + c[1] * w + c[2] * w * w + c[3] * s + c[4] * s * s + c[5] * w * s
    row = _fit_quad(w, s, x)
    np.testing.assert_allclose(row["coef"], c, atol=1e-5)
    assert row["s"] == pytest.approx([s.min(), s.max()], abs=1e-6)
    # outside the fitted ranges the loads are clipped
    np.testing.assert_allclose(
        _predict(row, np.array([100.0]), np.array([-5.0])),
        _predict(row, np.array([w.max()]), np.array([s.min()])),
    )


def test_a_version_1_reference_reads_a_deployment_with_a_dtype_part():
    # keys fitted before the dtype / quantization parts have none: a version-1 table is looked up
    # by the key without them
    old = KernelReference({"A|m|tp1": {"k\t0": [0.0, 0.0, 1.0, 0.0, 9.0, 3]}}, version=1)
    key = "A|m|tp1|dtype=float16|kv=fp8_e4m3"
    assert base_key(key) == "A|m|tp1" and old.knows(key)
    r = old.residuals(key, ["k\t0"], np.array([1.0]), np.array([1.0]), np.array([1.5]))
    np.testing.assert_allclose(r, [0.5])
    new = KernelReference(
        {"A|m|tp1": {"k\t0": {"kind": "quad", "coef": [1, 0, 0, 0, 0, 0], "w": [0, 9], "s": [0, 9], "n": 3}}}
    )
    assert not new.knows(key) and np.isnan(new.residuals(key, ["k\t0"], *np.ones((3, 1)))).all()


def test_table_cells_hand_computed():
    from teller.data.reference import _cells, _fit_table, _predict

    v = np.array([1.0, 1.02, 2.0, 2.96, 3.04])
    x = np.array([1.0, 3.0, 5.0, 7.0, 8.0])
    knots, med, spread = _cells(v, x)
    # cells of 0.1 centred on multiples of 0.1: {1.0, 1.02}, {2.0}, {2.96, 3.04}
    np.testing.assert_allclose(knots, [1.01, 2.0, 3.0])
    np.testing.assert_allclose(med, [2.0, 5.0, 7.5])
    assert spread == pytest.approx(0.75)  # the median of |1 - 2|, |3 - 2|, |7 - 7.5|, |8 - 7.5|
    row = _fit_table(v, np.zeros(5), x)
    assert row["axis"] == "w"
    np.testing.assert_allclose(
        _predict(row, np.array([0.0, 1.5, 3.0, 9.0]), np.zeros(4)), [2.0, 2.0 + 3 * 0.49 / 0.99, 7.5, 7.5]
    )


def test_file_round_trip_and_errors(tmp_path):
    # version 1 (a quadratic in w per row) still reads, and computes what it did
    v1 = tmp_path / "v1.json"
    v1.write_text(
        json.dumps(
            {
                "format": "teller-kernel-reference",
                "version": 1,
                "table": {"A|m|tp1": {"k\t0": [0.0, 0.5, 1.0, 1.0, 2.0, 9]}},
            }
        )
    )
    old = KernelReference.load(v1)
    assert old.version == 1 and len(old) == 1
    r = old.residuals(
        "A|m|tp1", ["k\t0"] * 2, np.array([1.5, 5.0]), np.array([3.0, 3.0]), np.array([2.0, 2.0])
    )
    np.testing.assert_allclose(r, [2.0 - 1.75, 2.0 - 2.0])
    p = old.save(tmp_path / "reference.json")
    assert json.loads(p.read_text())["version"] == 1
    ref = KernelReference(
        {
            "A|m|tp1": {
                "k\t0": {"kind": "table", "axis": "s", "knots": [1.0, 2.0], "values": [3.0, 5.0], "n": 9},
                "k\t1": {"kind": "quad", "coef": [1, 0, 0, 1, 0, 0], "w": [0, 9], "s": [0, 2], "n": 4},
            }
        }
    )
    p = ref.save(tmp_path / "reference.json")
    back = KernelReference.load(p)
    assert back.table == ref.table and len(back) == 2 and back.version == 2
    r = back.residuals(
        "A|m|tp1", ["k\t0", "k\t1"], np.array([0.0, 0.0]), np.array([1.5, 5.0]), np.array([4.0, 4.0])
    )
    np.testing.assert_allclose(r, [0.0, 4.0 - 3.0])  # s clipped to 2
    with pytest.raises(TellerFileNotFoundError, match="no kernel reference"):
        KernelReference.load(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    cases = [
        ("{", "not JSON"),
        ('{"format": "x"}', "not a teller kernel reference"),
        ('{"format": "teller-kernel-reference", "version": 9, "table": {}}', "version 9"),
        ('{"format": "teller-kernel-reference", "version": 1, "table": {"A": {"k": [1, 2]}}}', "malformed"),
        (
            '{"format": "teller-kernel-reference", "version": 2, "table": {"A": {"k": [1, 2, 3, 4, 5, 6]}}}',
            "malformed",
        ),
        (
            '{"format": "teller-kernel-reference", "version": 2, "table": {"A": {"k": '
            '{"kind": "table", "axis": "w", "knots": [2, 1], "values": [0, 0], "n": 2}}}}',
            "malformed",
        ),
        (
            '{"format": "teller-kernel-reference", "version": 2, "table": {"A": {"k": '
            '{"kind": "quad", "coef": [1, 2], "w": [0, 1], "s": [0, 1], "n": 2}}}}',
            "malformed",
        ),
        ('{"format": "teller-kernel-reference", "version": true, "table": {}}', "version True"),
    ]
    cases += [
        (
            '{"format": "teller-kernel-reference", "version": 2, "table": {"A": {"k": '
            + json.dumps(row)
            + "}}}",
            "malformed",
        )
        for row in (
            {"kind": "table", "axis": "w", "knots": [1, 2], "values": [[1], [2]], "n": 2},
            {"kind": "table", "axis": "w", "knots": ["1", "2"], "values": [1, 2], "n": 2},
            {"kind": "table", "axis": "x", "knots": [1, 2], "values": [1, 2], "n": 2},
            {"kind": "quad", "coef": ["1", 0, 0, 0, 0, 0], "w": [0, 1], "s": [0, 1], "n": 2},
            {"kind": "quad", "coef": [[1], [0], [0], [0], [0], [0]], "w": [0, 1], "s": [0, 1], "n": 2},
            {"kind": "quad", "coef": [1, 0, 0, 0, 0, True], "w": [0, 1], "s": [0, 1], "n": 2},
            {"kind": "quad", "coef": [1, 0, 0, 0, 0, 0], "w": [1, 0], "s": [0, 1], "n": 2},
            {"kind": "quad", "coef": [1, 0, 0, 0, 0, 0], "w": [0, 1], "n": 2},
            {"kind": "cubic"},
        )
    ]
    for text, msg in cases:
        bad.write_text(text)
        with pytest.raises(ConfigError, match=msg) as e:
            KernelReference.load(bad)
        assert str(bad) in str(e.value)


def test_fault_windows_are_left_out_and_healthy_residuals_are_small(tiny):
    man = json.loads((tiny / "manifest.json").read_text())
    pts, faulty = [], None
    for sid in man["splits"]["train"] + man["splits"]["val"] + man["splits"]["test"]:
        sd = tiny / sid
        ann = json.loads((sd / "annotation.json").read_text())
        tr = T.load(sd / "trace.json")
        idx, pk, w, s, x = kernel_points(tr)
        keep = outside_faults(tr, idx, ann)
        if ann["faults"]:
            f = ann["faults"][0]
            ts = tr.ts[idx]
            inside = (ts + tr.dur[idx] >= f["start_ns"]) & (ts <= f["end_ns"])
            np.testing.assert_array_equal(keep, ~inside)
            faulty = faulty or (sd, tr)
        else:
            assert keep.all()
        pts.append(
            (
                deployment_key(tr, (sd / "log.txt").read_text()),
                [k for k, ok in zip(pk, keep, strict=True) if ok],
                w[keep],
                s[keep],
                x[keep],
            )
        )
    ref = KernelReference.fit(pts)
    assert len(ref) > 0
    # a capture the reference was fitted on (outside its fault): residuals centred on 0
    sd, tr = faulty
    r = event_residuals(tr, ref, deployment_key(tr, (sd / "log.txt").read_text()))
    assert r.shape == (len(tr),) and np.isfinite(r).any()
    assert np.isnan(r[~tr.layer_mask("kernel")]).all()
    assert abs(float(np.nanmedian(r))) < 0.1
    assert event_residuals(tr, ref, None) is None and event_residuals(tr, None, "x") is None


def test_reference_numbers_are_finite_reals():
    # the load-time check of every number of a reference.json: finite, real, in float range
    import numpy as np
    from teller.data.reference import _nums

    assert _nums([1, -2.5, np.float64(3.0)]) and _nums([], 0) and not _nums([1.0], 2)
    for bad in (True, float("nan"), float("inf"), 10**400, "1", None, [1.0]):
        assert not _nums([0.0, bad]), bad
