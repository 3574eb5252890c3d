//! Thin PyO3 bindings for teller-core.
use pyo3::prelude::*;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", teller_core::VERSION)?;
    m.add("build_profile", if cfg!(debug_assertions) { "debug" } else { "release" })?;
    Ok(())
}
