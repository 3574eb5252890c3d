//! Thin PyO3 bindings for teller-core: convert arguments, release the GIL, call the core, map errors.
//! No logic lives here that the core could hold.

use numpy::ndarray::ArrayView1;
use numpy::{Element, PyArray1};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};
use teller_core::align::AlignOptions;
use teller_core::model::{ArgValue, Layer, LAYER_NAMES};
use teller_core::normalize::NormalizeOptions;
use teller_core::{Error, LoadOptions};

mod logtok;
mod symrows;
mod tpe;

/// Maps a core error to the matching class of `teller.errors` (defined in Python so that each class
/// can also subclass the right built-in, e.g. ValueError or FileNotFoundError).
pub fn to_py_err(e: Error) -> PyErr {
    Python::attach(|py| {
        let mut errno = None;
        let (cls, path, offset, index, detail) = match &e {
            Error::NotFound { path } => ("TellerFileNotFoundError", Some(path.clone()), None, None, None),
            Error::Io { path, msg, errno: n } => {
                errno = *n; // (TellerIOError picks its subclass by it: TellerPermissionError, ...)
                ("TellerIOError", Some(path.clone()), None, None, Some(msg.clone()))
            }
            Error::Format {
                path,
                offset,
                index,
                msg,
            } => (
                "TraceFormatError",
                Some(path.clone()),
                *offset,
                *index,
                Some(msg.clone()),
            ),
            Error::Empty { path, msg } => ("EmptyTraceError", Some(path.clone()), None, None, Some(msg.clone())),
            Error::Config(msg) => ("ConfigError", None, None, None, Some(msg.clone())),
        };
        let build = || -> PyResult<PyErr> {
            let m = py.import("teller.errors")?;
            let c = m.getattr(cls)?;
            let kw = PyDict::new(py);
            kw.set_item("path", path)?;
            kw.set_item("offset", offset)?;
            kw.set_item("index", index)?;
            kw.set_item("detail", detail)?;
            if errno.is_some() {
                kw.set_item("errno", errno)?;
            }
            let obj = c.call((e.to_string(),), Some(&kw))?;
            Ok(PyErr::from_value(obj))
        };
        build().unwrap_or_else(|err| err)
    })
}

fn align_options(step_names: Option<Vec<String>>, normalize: Option<&Bound<'_, PyDict>>) -> PyResult<AlignOptions> {
    let mut o = AlignOptions::default();
    if let Some(s) = step_names {
        if s.is_empty() {
            return Err(to_py_err(Error::Config("step_names must not be empty".into())));
        }
        o.step_patterns = s;
    }
    if let Some(d) = normalize {
        let mut n = NormalizeOptions::default();
        for (k, v) in d.iter() {
            let k: String = k.extract()?;
            match k.as_str() {
                "strip_namespaces" => n.strip_namespaces = v.extract()?,
                "collapse_tiles" => n.collapse_tiles = v.extract()?,
                "collapse_digits" => n.collapse_digits = v.extract()?,
                "max_len" => n.max_len = v.extract()?,
                other => {
                    return Err(to_py_err(Error::Config(format!(
                        "unknown normalization option {other:?}"
                    ))))
                }
            }
        }
        o.normalize = n;
    }
    Ok(o)
}

/// A loaded, aligned trace. Columns are exposed as read-only numpy views of the Rust buffers.
#[pyclass(module = "teller._native", name = "NativeTrace", frozen)]
pub struct NativeTrace {
    inner: teller_core::Trace,
}

fn view<'py, T: Element>(slf: &Bound<'py, NativeTrace>, data: &[T]) -> PyResult<Bound<'py, PyArray1<T>>> {
    // Zero-copy: the array borrows the Vec's buffer and keeps the (frozen, so never mutated)
    // NativeTrace alive as its base object.
    let v = ArrayView1::from(data);
    let arr = unsafe { PyArray1::borrow_from_array(&v, slf.clone().into_any()) };
    arr.call_method1("setflags", (false,))?;
    Ok(arr)
}

fn arg_to_py<'py>(py: Python<'py>, t: &teller_core::Trace, v: &ArgValue) -> PyResult<Bound<'py, PyAny>> {
    Ok(match *v {
        ArgValue::Int(i) => i.into_pyobject(py)?.into_any(),
        ArgValue::Float(f) => f.into_pyobject(py)?.into_any(),
        ArgValue::Bool(b) => pyo3::types::PyBool::new(py, b).to_owned().into_any(),
        ArgValue::Str(s) => t.strings.get(s).into_pyobject(py)?.into_any(),
        ArgValue::Json(s) => {
            let json = py.import("json")?;
            match json.call_method1("loads", (t.strings.get(s),)) {
                Ok(x) => x,
                Err(_) => t.strings.get(s).into_pyobject(py)?.into_any(),
            }
        }
        ArgValue::Null => py.None().into_bound(py),
    })
}

#[pymethods]
impl NativeTrace {
    fn __len__(&self) -> usize {
        self.inner.len()
    }

    /// A column as a read-only numpy view (no copy).
    fn column<'py>(slf: &Bound<'py, Self>, name: &str) -> PyResult<Bound<'py, PyAny>> {
        let t = &slf.get().inner;
        Ok(match name {
            "layer" => view(slf, &t.layer)?.into_any(),
            "name" => view(slf, &t.name)?.into_any(),
            "cat" => view(slf, &t.cat)?.into_any(),
            "ts" => view(slf, &t.ts)?.into_any(),
            "dur" => view(slf, &t.dur)?.into_any(),
            "pid" => view(slf, &t.pid)?.into_any(),
            "tid" => view(slf, &t.tid)?.into_any(),
            "device" => view(slf, &t.device)?.into_any(),
            "corr" => view(slf, &t.corr)?.into_any(),
            "ext" => view(slf, &t.ext)?.into_any(),
            "flags" => view(slf, &t.flags)?.into_any(),
            "source" => view(slf, &t.source)?.into_any(),
            "link" => view(slf, &t.link)?.into_any(),
            "parent" => view(slf, &t.parent)?.into_any(),
            "step" => view(slf, &t.step)?.into_any(),
            "symbol" => view(slf, &t.symbol)?.into_any(),
            other => return Err(PyValueError::new_err(format!("unknown column {other:?}"))),
        })
    }

    fn strings(&self) -> Vec<&str> {
        self.inner.strings.iter().collect()
    }

    fn symbols(&self) -> Vec<&str> {
        self.inner.symbols.iter().collect()
    }

    fn warnings(&self) -> Vec<String> {
        self.inner.warnings.clone()
    }

    /// Steps as (event, name, start_ns, end_ns, pid, tid, source) tuples.
    fn steps(&self) -> Vec<(i64, String, i64, i64, i64, i64, u16)> {
        let t = &self.inner;
        t.steps
            .iter()
            .map(|s| {
                (
                    s.event,
                    t.strings.get(s.name).to_string(),
                    s.start,
                    s.end,
                    s.pid,
                    s.tid,
                    s.source,
                )
            })
            .collect()
    }

    fn sources<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let out = PyList::empty(py);
        for s in &self.inner.sources {
            let d = PyDict::new(py);
            d.set_item("path", &s.path)?;
            d.set_item("kind", &s.kind)?;
            d.set_item("base_ns", s.base_ns)?;
            d.set_item("pid", s.pid)?;
            d.set_item("host", &s.host)?;
            d.set_item("process", s.process)?;
            d.set_item("producer", &s.producer)?;
            d.set_item("events", s.events)?;
            let md = PyDict::new(py);
            for (k, v) in &s.metadata {
                md.set_item(k, v)?;
            }
            d.set_item("metadata", md)?;
            out.append(d)?;
        }
        Ok(out)
    }

    /// Arguments of event `i` as a dict.
    fn args<'py>(&self, py: Python<'py>, i: usize) -> PyResult<Bound<'py, PyDict>> {
        let t = &self.inner;
        if i >= t.len() {
            return Err(pyo3::exceptions::PyIndexError::new_err(format!(
                "event index {i} out of range (trace has {} events)",
                t.len()
            )));
        }
        let d = PyDict::new(py);
        for (k, v) in t.args_of(i) {
            d.set_item(t.strings.get(*k), arg_to_py(py, t, v)?)?;
        }
        Ok(d)
    }

    /// (pid, name) and (pid, tid, name) tables.
    fn process_names(&self) -> Vec<(i64, String)> {
        self.inner
            .process_names
            .iter()
            .map(|&(p, n)| (p, self.inner.strings.get(n).to_string()))
            .collect()
    }
    fn thread_names(&self) -> Vec<(i64, i64, String)> {
        self.inner
            .thread_names
            .iter()
            .map(|&(p, t, n)| (p, t, self.inner.strings.get(n).to_string()))
            .collect()
    }
    /// Labels of non-numeric pids/tids as {id: label}.
    fn id_labels(&self) -> Vec<(i64, String)> {
        let mut v: Vec<(i64, String)> = self
            .inner
            .id_labels
            .iter()
            .map(|(&k, &s)| (k, self.inner.strings.get(s).to_string()))
            .collect();
        v.sort();
        v
    }
    fn num_flows(&self) -> usize {
        self.inner.flows.len()
    }
    fn num_counters(&self) -> usize {
        self.inner.counters.len()
    }

    /// The trace as bytes (`teller_core::snapshot`): what `Trace.__reduce__` pickles.
    fn snapshot<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        let t = &self.inner;
        let b = py.detach(|| teller_core::snapshot::to_bytes(t));
        PyBytes::new(py, &b)
    }

    #[pyo3(signature = (path, highlight=None))]
    fn to_chrome(&self, py: Python<'_>, path: String, highlight: Option<Vec<u32>>) -> PyResult<()> {
        let opts = teller_core::writer::WriteOptions {
            highlight: highlight.unwrap_or_default(),
        };
        let t = &self.inner;
        py.detach(|| teller_core::writer::write_chrome_file(t, &path, &opts))
            .map_err(to_py_err)
    }

    /// Per-step symbol sequences in call-chain order (see teller_core::sequence):
    /// (names, ids, starts, steps, event, start_ns, dur_ns).
    #[pyo3(signature = (close_layers=None, skip_instants=false))]
    #[allow(clippy::type_complexity)]
    fn sequences<'py>(
        &self,
        py: Python<'py>,
        close_layers: Option<Vec<String>>,
        skip_instants: bool,
    ) -> PyResult<(
        Vec<String>,
        Bound<'py, PyArray1<u32>>,
        Bound<'py, PyArray1<i64>>,
        Bound<'py, PyArray1<u32>>,
        Bound<'py, PyArray1<i64>>,
        Bound<'py, PyArray1<i64>>,
        Bound<'py, PyArray1<i64>>,
    )> {
        use numpy::IntoPyArray;
        let mut opts = teller_core::sequence::SequenceOptions {
            skip_instants,
            ..Default::default()
        };
        if let Some(cl) = close_layers {
            opts.close_layers = cl
                .iter()
                .map(|l| Layer::from_name(l).ok_or_else(|| to_py_err(Error::Config(format!("unknown layer {l:?}")))))
                .collect::<PyResult<Vec<_>>>()?;
        }
        let t = &self.inner;
        let s = py.detach(|| teller_core::sequence::sequences(t, &opts));
        let mut starts: Vec<i64> = s.offsets.iter().map(|&x| x as i64).collect();
        starts.pop();
        Ok((
            s.names,
            s.ids.into_pyarray(py),
            starts.into_pyarray(py),
            s.steps.into_pyarray(py),
            s.event.into_pyarray(py),
            s.start_ns.into_pyarray(py),
            s.dur_ns.into_pyarray(py),
        ))
    }

    #[pyo3(signature = (top=10))]
    fn summary<'py>(&self, py: Python<'py>, top: usize) -> PyResult<Bound<'py, PyDict>> {
        let t = &self.inner;
        let s = py.detach(|| teller_core::summary::summarize(t, top));
        let d = PyDict::new(py);
        d.set_item("events", s.events)?;
        let bc = PyDict::new(py);
        for (k, v) in &s.by_category {
            bc.set_item(k, v)?;
        }
        d.set_item("by_category", bc)?;
        let bl = PyDict::new(py);
        for (k, v) in &s.by_layer {
            bl.set_item(k, v)?;
        }
        d.set_item("by_layer", bl)?;
        d.set_item("steps", s.steps)?;
        d.set_item("gpu_events", s.gpu_events)?;
        d.set_item("linked_gpu_events", s.linked_gpu_events)?;
        d.set_item("span_ns", s.span_ns)?;
        d.set_item("processes", s.processes)?;
        d.set_item("threads", s.threads)?;
        d.set_item("sources", s.sources)?;
        let tk = PyList::empty(py);
        for k in &s.top_kernels {
            let kd = PyDict::new(py);
            kd.set_item("name", &k.name)?;
            kd.set_item("symbol", &k.symbol)?;
            kd.set_item("count", k.count)?;
            kd.set_item("total_ns", k.total_ns)?;
            kd.set_item("max_ns", k.max_ns)?;
            kd.set_item("variants", k.variants)?;
            tk.append(kd)?;
        }
        d.set_item("top_kernels", tk)?;
        let dv = PyList::empty(py);
        for x in &s.devices {
            let dd = PyDict::new(py);
            dd.set_item("device", x.device)?;
            dd.set_item("source", x.source)?;
            dd.set_item("pid", x.pid)?;
            // (a label pid, as the file names it: its id is this load's own)
            if let Some(&sym) = self.inner.id_labels.get(&x.pid) {
                dd.set_item("pid_label", self.inner.strings.get(sym))?;
            }
            dd.set_item("part", x.part)?;
            dd.set_item("busy_ns", x.busy_ns)?;
            dd.set_item("span_ns", x.span_ns)?;
            dd.set_item("idle_ns", x.span_ns - x.busy_ns)?;
            dd.set_item("launches", x.launches)?;
            dd.set_item("launch_delay_p50_ns", x.launch_delay_p50_ns)?;
            dd.set_item("launch_delay_p99_ns", x.launch_delay_p99_ns)?;
            dd.set_item("sync_ns", x.sync_ns)?;
            dd.set_item("compute_ns", x.compute_ns)?;
            dd.set_item("comm_ns", x.comm_ns)?;
            dd.set_item("memory_ns", x.memory_ns)?;
            dd.set_item("comm_compute_overlap_ns", x.comm_compute_overlap_ns)?;
            dd.set_item("idle_host_ns", x.idle_host_ns)?;
            dd.set_item("idle_launch_ns", x.idle_launch_ns)?;
            dd.set_item("idle_queued_ns", x.idle_queued_ns)?;
            dd.set_item("idle_unlinked_ns", x.idle_unlinked_ns)?;
            dd.set_item("kernels", x.kernels)?;
            dd.set_item("kernels_shorter_than_launch", x.kernels_shorter_than_launch)?;
            dd.set_item("starts_before_launch", x.starts_before_launch)?;
            dd.set_item("max_start_before_launch_ns", x.max_start_before_launch_ns)?;
            dv.append(dd)?;
        }
        d.set_item("devices", dv)?;
        d.set_item("warnings", s.warnings)?;
        Ok(d)
    }
}

/// Loads and aligns trace files / run directories (GIL released while reading).
#[pyfunction]
#[pyo3(signature = (paths, step_names=None, normalize=None))]
fn load(
    py: Python<'_>,
    paths: Vec<String>,
    step_names: Option<Vec<String>>,
    normalize: Option<Bound<'_, PyDict>>,
) -> PyResult<NativeTrace> {
    let opts = LoadOptions {
        align: align_options(step_names, normalize.as_ref())?,
    };
    let t = py.detach(|| teller_core::load(&paths, &opts)).map_err(to_py_err)?;
    Ok(NativeTrace { inner: t })
}

/// A trace from the bytes of `NativeTrace.snapshot` (every length and index checked).
#[pyfunction]
fn from_snapshot(py: Python<'_>, data: &[u8]) -> PyResult<NativeTrace> {
    let t = py
        .detach(|| teller_core::snapshot::from_bytes(data))
        .map_err(to_py_err)?;
    Ok(NativeTrace { inner: t })
}

/// The canonical symbol of an event name (`layer:canonical`).
#[pyfunction]
#[pyo3(signature = (layer, name, normalize=None))]
fn symbol(layer: &str, name: &str, normalize: Option<Bound<'_, PyDict>>) -> PyResult<String> {
    let l = Layer::from_name(layer).ok_or_else(|| {
        to_py_err(Error::Config(format!(
            "unknown layer {layer:?}; known: {}",
            LAYER_NAMES.join(", ")
        )))
    })?;
    let o = align_options(None, normalize.as_ref())?;
    Ok(teller_core::normalize::symbol(l, name, &o.normalize))
}

/// Per kernel name, whether the GPU breakdown counts it as communication (a collective: NCCL/RCCL,
/// vLLM's custom all-reduce, DeepEP's token exchanges; `teller_core::summary::is_collective`).
#[pyfunction]
fn is_collective(names: Vec<String>) -> Vec<bool> {
    names.iter().map(|n| teller_core::summary::is_collective(n)).collect()
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", teller_core::VERSION)?;
    m.add(
        "build_profile",
        if cfg!(debug_assertions) { "debug" } else { "release" },
    )?;
    m.add("LAYER_NAMES", PyTuple::new(m.py(), LAYER_NAMES)?)?;
    m.add("NORMALIZATION_VERSION", teller_core::normalize::VERSION)?;
    m.add(
        "DEFAULT_STEP_PATTERNS",
        PyTuple::new(m.py(), teller_core::align::DEFAULT_STEP_PATTERNS)?,
    )?;
    m.add_class::<NativeTrace>()?;
    m.add_function(wrap_pyfunction!(load, m)?)?;
    m.add_function(wrap_pyfunction!(from_snapshot, m)?)?;
    m.add_function(wrap_pyfunction!(symbol, m)?)?;
    m.add_function(wrap_pyfunction!(is_collective, m)?)?;
    m.add_class::<tpe::NativeTpe>()?;
    m.add_function(wrap_pyfunction!(tpe::tpe_train, m)?)?;
    m.add_function(wrap_pyfunction!(tpe::tpe_symbol_stats, m)?)?;
    m.add_function(wrap_pyfunction!(tpe::tpe_synth_corpus, m)?)?;
    m.add_function(wrap_pyfunction!(symrows::symbol_rows, m)?)?;
    m.add_class::<logtok::NativeLogVocab>()?;
    m.add_function(wrap_pyfunction!(logtok::log_token_counts, m)?)?;
    Ok(())
}
