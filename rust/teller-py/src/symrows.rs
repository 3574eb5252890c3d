//! Binding of `teller_core::symrows`: the per-symbol summary rows (`teller.data.summary`).
#![allow(clippy::type_complexity)]

use numpy::{IntoPyArray, PyArray1, PyReadonlyArray1};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use teller_core::symrows::{symbol_rows as core_rows, SymRowsInput};

/// `(ids int64 [S], rows float64 [S * 25])`: one summary row per distinct `sid`, ascending, column 6
/// left 0 (the caller's: numpy's logarithm; see `teller_core::symrows`). Every
/// per-event array has the trace's length; `fam_stats` is `[n_families * 3]`; `log1p_count` is
/// numpy's `log1p(arange(k))` for k beyond the largest symbol's event count. A length or range
/// mismatch is a ValueError (the caller's contract, not the user's data).
#[pyfunction]
#[pyo3(signature = (sid, ts, end, pid, x, ex, gap, early, w, tbin, step, coll, sord, xrank, host, gpu,
                    host_shift, gpu_shift, ref_resid, fam, fam_stats, log1p_count, baseline_frac, by_position))]
#[allow(clippy::too_many_arguments)]
pub fn symbol_rows<'py>(
    py: Python<'py>,
    sid: PyReadonlyArray1<'py, i64>,
    ts: PyReadonlyArray1<'py, i64>,
    end: PyReadonlyArray1<'py, i64>,
    pid: PyReadonlyArray1<'py, i64>,
    x: PyReadonlyArray1<'py, f64>,
    ex: PyReadonlyArray1<'py, f64>,
    gap: PyReadonlyArray1<'py, f64>,
    early: PyReadonlyArray1<'py, bool>,
    w: PyReadonlyArray1<'py, f64>,
    tbin: PyReadonlyArray1<'py, i64>,
    step: PyReadonlyArray1<'py, i64>,
    coll: PyReadonlyArray1<'py, bool>,
    sord: Option<PyReadonlyArray1<'py, i64>>,
    xrank: PyReadonlyArray1<'py, f64>,
    host: PyReadonlyArray1<'py, bool>,
    gpu: PyReadonlyArray1<'py, bool>,
    host_shift: f64,
    gpu_shift: f64,
    ref_resid: Option<PyReadonlyArray1<'py, f64>>,
    fam: Option<PyReadonlyArray1<'py, i64>>,
    fam_stats: Option<PyReadonlyArray1<'py, f64>>,
    log1p_count: PyReadonlyArray1<'py, f64>,
    baseline_frac: f64,
    by_position: bool,
) -> PyResult<(Bound<'py, PyArray1<i64>>, Bound<'py, PyArray1<f64>>)> {
    let inp = SymRowsInput {
        sid: sid.as_slice()?,
        ts: ts.as_slice()?,
        end: end.as_slice()?,
        pid: pid.as_slice()?,
        x: x.as_slice()?,
        ex: ex.as_slice()?,
        gap: gap.as_slice()?,
        early: early.as_slice()?,
        w: w.as_slice()?,
        tbin: tbin.as_slice()?,
        step: step.as_slice()?,
        coll: coll.as_slice()?,
        sord: sord.as_ref().map(|a| a.as_slice()).transpose()?,
        xrank: xrank.as_slice()?,
        host: host.as_slice()?,
        gpu: gpu.as_slice()?,
        host_shift,
        gpu_shift,
        ref_resid: ref_resid.as_ref().map(|a| a.as_slice()).transpose()?,
        fam: fam.as_ref().map(|a| a.as_slice()).transpose()?,
        fam_stats: fam_stats.as_ref().map(|a| a.as_slice()).transpose()?,
        log1p_count: log1p_count.as_slice()?,
        baseline_frac,
        by_position,
    };
    let (ids, rows) = py.detach(|| core_rows(&inp)).map_err(PyValueError::new_err)?;
    Ok((ids.into_pyarray(py), rows.into_pyarray(py)))
}
