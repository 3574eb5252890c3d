//! Binding of `teller_core::logtok`: the log tokenizer's splitter and encoder.
#![allow(clippy::type_complexity)]

use numpy::{IntoPyArray, PyArray1};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use teller_core::logtok::{token_counts, LogVocab};

/// A log tokenizer's vocabulary, ready to encode lines (`teller.data.tokenize.LogTokenizer`).
#[pyclass(frozen, module = "teller._native")]
pub struct NativeLogVocab {
    inner: LogVocab,
}

#[pymethods]
impl NativeLogVocab {
    /// A ValueError if the vocabulary lacks `[UNK]`, `[BOL]`, `<stdout>` or `<stderr>`.
    #[new]
    fn new(vocab: Vec<String>) -> PyResult<Self> {
        Ok(Self {
            inner: LogVocab::new(&vocab).map_err(PyValueError::new_err)?,
        })
    }

    /// `(ids uint32, line uint32, num float64, deferred)`: per token its id, its line and the
    /// parsed number of a `<num>` token (NaN otherwise); `deferred`: the lines with non-ASCII text,
    /// left for the caller to split, as `(line, token index after its stream token)`.
    /// A ValueError if `texts` and `stderr` differ in length (one stream flag per line).
    fn encode<'py>(
        &self,
        py: Python<'py>,
        texts: Vec<String>,
        stderr: Vec<bool>,
    ) -> PyResult<(
        Bound<'py, PyArray1<u32>>,
        Bound<'py, PyArray1<u32>>,
        Bound<'py, PyArray1<f64>>,
        Vec<(u32, u32)>,
    )> {
        if texts.len() != stderr.len() {
            return Err(PyValueError::new_err(format!(
                "NativeLogVocab.encode: {} lines but {} stream flags (one per line)",
                texts.len(),
                stderr.len()
            )));
        }
        let e = py.detach(|| self.inner.encode(&texts, &stderr));
        Ok((
            e.ids.into_pyarray(py),
            e.line.into_pyarray(py),
            e.num.into_pyarray(py),
            e.deferred,
        ))
    }
}

/// `(counts, deferred)`: how often each token string occurs in the lines (a word lower-cased, a
/// placeholder as `<kind>`), and the indices of the lines with non-ASCII text, left uncounted for
/// the caller to split.
#[pyfunction]
pub fn log_token_counts(py: Python<'_>, texts: Vec<String>) -> (Vec<(String, u64)>, Vec<usize>) {
    let (c, d) = py.detach(|| token_counts(&texts));
    // (ASCII by construction: every counted line was)
    let pairs = c
        .into_iter()
        .map(|(k, v)| (String::from_utf8_lossy(&k).into_owned(), v))
        .collect();
    (pairs, d)
}
