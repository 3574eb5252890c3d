//! teller-core: the pure-Rust heart of teller (no Python here).
//!
//! * [`model`]: the columnar event model (struct of arrays, interned names).
//! * [`json`], [`chrome`]: a byte-level JSON scanner and the Chrome Trace Event / Kineto reader.
//! * [`raw`]: the reader of teller's own crash-safe MessagePack stream (`docs/trace-format.md`).
//! * [`align`]: one time base, correlation linking, call-chain trees, steps.
//! * [`normalize`]: canonical symbols for tokenization.
//! * [`writer`]: Chrome trace output that opens in Perfetto.
//! * [`summary`]: what `teller trace summary` reports.
//! * [`snapshot`]: a loaded trace as bytes and back (pickling in the binding).

pub mod align;
pub mod chrome;
pub mod error;
pub mod inflate;
pub mod json;
pub mod load;
pub mod logtok;
pub mod model;
pub mod names;
pub mod normalize;
pub mod raw;
pub mod sequence;
pub mod snapshot;
pub mod summary;
pub mod symrows;
pub mod writer;

pub use error::{Error, Result};
pub use load::{load, LoadOptions};
pub use model::{Layer, Trace};

pub const VERSION: &str = env!("CARGO_PKG_VERSION");
pub mod tpe;
