//! Bindings of `teller_core::tpe`: numpy in, numpy out, GIL released for the heavy work.
// Tuples of numpy arrays are the natural return type of a binding.
#![allow(clippy::type_complexity)]

use numpy::{IntoPyArray, PyArray1, PyArray2, PyArrayMethods, PyReadonlyArray1};
use pyo3::prelude::*;
use teller_core::tpe::{synth, train, SymbolStats, TpeError, TrainConfig};

fn tpe_err(e: TpeError) -> PyErr {
    Python::attach(|py| {
        let build = || -> PyResult<PyErr> {
            let m = py.import("teller.errors")?;
            let c = m.getattr("TokenizerError")?;
            Ok(PyErr::from_value(c.call1((e.to_string(),))?))
        };
        build().unwrap_or_else(|err| err)
    })
}

fn starts_vec(starts: &PyReadonlyArray1<'_, i64>) -> PyResult<Vec<usize>> {
    teller_core::tpe::starts_from_i64(starts.as_slice()?).map_err(tpe_err)
}

/// Learns merges. `progress(done, total)` is called from the training thread with the GIL held, at
/// most about 200 times; if it raises (or Ctrl-C arrives), training stops and the error propagates.
#[pyfunction]
#[pyo3(signature = (ids, starts, base_size, num_merges, min_frequency=2, max_token_events=None, progress=None))]
#[allow(clippy::too_many_arguments)]
pub fn tpe_train(
    py: Python<'_>,
    ids: PyReadonlyArray1<'_, u32>,
    starts: PyReadonlyArray1<'_, i64>,
    base_size: u32,
    num_merges: usize,
    min_frequency: u64,
    max_token_events: Option<u32>,
    progress: Option<Py<PyAny>>,
) -> PyResult<(Vec<(u32, u32)>, Vec<u64>)> {
    let ids = ids.as_slice()?;
    let starts = starts_vec(&starts)?;
    let cfg = TrainConfig {
        num_merges,
        min_frequency,
        max_token_events,
    };
    let step = (num_merges / 200).max(1);
    let mut py_err: Option<PyErr> = None;
    let out = py.detach(|| {
        let mut cb = |done: usize, total: usize| -> bool {
            if !done.is_multiple_of(step) && done != total {
                return true;
            }
            Python::attach(|py| {
                if let Err(e) = py.check_signals() {
                    py_err = Some(e);
                    return false;
                }
                if let Some(p) = &progress {
                    if let Err(e) = p.call1(py, (done, total)) {
                        py_err = Some(e);
                        return false;
                    }
                }
                true
            })
        };
        train(ids, &starts, base_size, &cfg, Some(&mut cb))
    });
    if let Some(e) = py_err {
        return Err(e);
    }
    let out = out.map_err(tpe_err)?;
    Ok((out.tpe.merges().to_vec(), out.merge_counts))
}

/// Per-base-symbol (count, mean, std) of log1p(duration in µs).
#[pyfunction]
pub fn tpe_symbol_stats<'py>(
    py: Python<'py>,
    ids: PyReadonlyArray1<'py, u32>,
    dur_ns: PyReadonlyArray1<'py, i64>,
    base_size: u32,
) -> PyResult<(
    Bound<'py, PyArray1<u64>>,
    Bound<'py, PyArray1<f64>>,
    Bound<'py, PyArray1<f64>>,
)> {
    let (ids, dur) = (ids.as_slice()?, dur_ns.as_slice()?);
    let s = py
        .detach(|| SymbolStats::from_corpus(ids, dur, base_size))
        .map_err(tpe_err)?;
    Ok((
        s.count.into_pyarray(py),
        s.mean.into_pyarray(py),
        s.std.into_pyarray(py),
    ))
}

/// A deterministic synthetic LLM-inference-shaped corpus: (ids, starts, dur_ns, start_ns, base_size).
#[pyfunction]
#[pyo3(signature = (n_events, seed=42, n_symbols=1500, step_events=2000))]
#[allow(clippy::type_complexity)]
pub fn tpe_synth_corpus<'py>(
    py: Python<'py>,
    n_events: usize,
    seed: u64,
    n_symbols: u32,
    step_events: usize,
) -> PyResult<(
    Bound<'py, PyArray1<u32>>,
    Bound<'py, PyArray1<i64>>,
    Bound<'py, PyArray1<i64>>,
    Bound<'py, PyArray1<i64>>,
    u32,
)> {
    let cfg = synth::SynthConfig {
        seed,
        n_events,
        n_symbols,
        step_events,
        ..Default::default()
    };
    let c = py.detach(|| synth::generate(&cfg));
    let starts: Vec<i64> = c.starts.iter().map(|&x| x as i64).collect();
    Ok((
        c.ids.into_pyarray(py),
        starts.into_pyarray(py),
        c.dur_ns.into_pyarray(py),
        c.start_ns.into_pyarray(py),
        c.base_size,
    ))
}

/// A trained TPE model (merges in rank order).
#[pyclass(module = "teller._native", name = "NativeTpe", frozen)]
pub struct NativeTpe {
    inner: teller_core::tpe::Tpe,
}

#[pymethods]
impl NativeTpe {
    #[new]
    fn new(base_size: u32, merges: Vec<(u32, u32)>) -> PyResult<Self> {
        Ok(NativeTpe {
            inner: teller_core::tpe::Tpe::new(base_size, merges).map_err(tpe_err)?,
        })
    }
    #[getter]
    fn base_size(&self) -> u32 {
        self.inner.base_size()
    }
    #[getter]
    fn vocab_size(&self) -> u32 {
        self.inner.vocab_size()
    }
    fn merges(&self) -> Vec<(u32, u32)> {
        self.inner.merges().to_vec()
    }
    /// Number of base events each token covers.
    fn token_lens<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<u32>> {
        self.inner.token_lens().to_vec().into_pyarray(py)
    }
    /// Encodes a corpus: (tokens, token_offsets [n+1], segment_starts [one per segment]).
    #[allow(clippy::type_complexity)]
    fn encode_ids<'py>(
        &self,
        py: Python<'py>,
        ids: PyReadonlyArray1<'py, u32>,
        starts: PyReadonlyArray1<'py, i64>,
    ) -> PyResult<(
        Bound<'py, PyArray1<u32>>,
        Bound<'py, PyArray1<i64>>,
        Bound<'py, PyArray1<i64>>,
    )> {
        let ids = ids.as_slice()?;
        let starts = starts_vec(&starts)?;
        let t = &self.inner;
        let e = py.detach(|| t.encode(ids, &starts)).map_err(tpe_err)?;
        let offs: Vec<i64> = e.token_offsets.iter().map(|&x| x as i64).collect();
        let segs: Vec<i64> = e.segment_starts.iter().map(|&x| x as i64).collect();
        Ok((e.tokens.into_pyarray(py), offs.into_pyarray(py), segs.into_pyarray(py)))
    }
    /// Token ids back to base ids (lossless).
    fn decode<'py>(&self, py: Python<'py>, tokens: PyReadonlyArray1<'py, u32>) -> PyResult<Bound<'py, PyArray1<u32>>> {
        let tokens = tokens.as_slice()?;
        let t = &self.inner;
        let v = py.detach(|| t.decode(tokens)).map_err(tpe_err)?;
        Ok(v.into_pyarray(py))
    }
    /// Per-token timing features, `n_tokens x 5` float32.
    #[allow(clippy::too_many_arguments)]
    fn features<'py>(
        &self,
        py: Python<'py>,
        ids: PyReadonlyArray1<'py, u32>,
        dur_ns: PyReadonlyArray1<'py, i64>,
        start_ns: PyReadonlyArray1<'py, i64>,
        token_offsets: PyReadonlyArray1<'py, i64>,
        segment_starts: PyReadonlyArray1<'py, i64>,
        count: PyReadonlyArray1<'py, u64>,
        mean: PyReadonlyArray1<'py, f64>,
        std: PyReadonlyArray1<'py, f64>,
    ) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let stats = SymbolStats::from_parts(
            count.as_slice()?.to_vec(),
            mean.as_slice()?.to_vec(),
            std.as_slice()?.to_vec(),
        )
        .map_err(tpe_err)?;
        let (ids, dur, start) = (ids.as_slice()?, dur_ns.as_slice()?, start_ns.as_slice()?);
        let offs = starts_vec(&token_offsets)?;
        let segs = starts_vec(&segment_starts)?;
        let n_tok = offs.len().saturating_sub(1);
        let f = py
            .detach(|| teller_core::tpe::token_features(ids, dur, start, &offs, &segs, &stats))
            .map_err(tpe_err)?;
        let arr = f.into_pyarray(py);
        arr.reshape([n_tok, teller_core::tpe::N_FEATURES])
    }
}
