//! One error type for the whole core. The binding maps each variant to a Python exception class
//! (`teller.errors`), so every variant carries what a user needs: the file, where in it, and what.

use std::fmt;

#[derive(Debug, Clone, PartialEq)]
pub enum Error {
    /// An input path does not exist.
    NotFound { path: String },
    /// Any other I/O failure (permissions, a directory where a file was expected, ...). `errno` is
    /// the operating system's error number where there is one (the binding picks the Python class
    /// by it: PermissionError, IsADirectoryError, ...).
    Io {
        path: String,
        msg: String,
        errno: Option<i32>,
    },
    /// Malformed content. `offset` is a byte offset in the (decompressed) stream, `index` the index of
    /// the event or record being read when the problem was found.
    Format {
        path: String,
        offset: Option<u64>,
        index: Option<u64>,
        msg: String,
    },
    /// A readable file (or set of inputs) with no events at all.
    Empty { path: String, msg: String },
    /// A bad option value.
    Config(String),
}

impl Error {
    pub fn format(path: &str, offset: Option<u64>, index: Option<u64>, msg: impl Into<String>) -> Self {
        Error::Format {
            path: path.to_string(),
            offset,
            index,
            msg: msg.into(),
        }
    }
    pub fn io(path: &str, e: &std::io::Error) -> Self {
        if e.kind() == std::io::ErrorKind::NotFound {
            Error::NotFound { path: path.to_string() }
        } else {
            // (the system's words alone: "Not a directory", not "Not a directory (os error 20)";
            // the errno travels as a field)
            let text = e.to_string();
            let msg = match (e.raw_os_error(), text.rfind(" (os error ")) {
                (Some(_), Some(k)) if text.ends_with(')') => text[..k].to_string(),
                _ => text,
            };
            Error::Io {
                path: path.to_string(),
                msg,
                errno: e.raw_os_error(),
            }
        }
    }
    pub fn path(&self) -> Option<&str> {
        match self {
            Error::NotFound { path }
            | Error::Io { path, .. }
            | Error::Format { path, .. }
            | Error::Empty { path, .. } => Some(path),
            Error::Config(_) => None,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NotFound { path } => write!(f, "{path}: no such file or directory"),
            Error::Io { path, msg, .. } => write!(f, "{path}: {msg}"),
            Error::Format {
                path,
                offset,
                index,
                msg,
            } => {
                // "path: at byte 12 (event #3): msg", or "path: msg" when neither is known
                write!(f, "{path}:")?;
                if let Some(o) = offset {
                    write!(f, " at byte {o}")?;
                }
                if let Some(i) = index {
                    write!(f, " (event #{i})")?;
                }
                if offset.is_some() || index.is_some() {
                    write!(f, ":")?;
                }
                write!(f, " {msg}")
            }
            Error::Empty { path, msg } => write!(f, "{path}: {msg}"),
            Error::Config(msg) => write!(f, "{msg}"),
        }
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_errors_read_as_one_clause_per_known_field() {
        assert_eq!(Error::format("a.json", None, None, "bad").to_string(), "a.json: bad");
        assert_eq!(
            Error::format("a.json", Some(12), Some(3), "bad").to_string(),
            "a.json: at byte 12 (event #3): bad"
        );
        assert_eq!(
            Error::format("a.json", None, Some(3), "bad").to_string(),
            "a.json: (event #3): bad"
        );
    }
}
