//! Inflating a gzip file on a second thread while the caller parses what has arrived.
//!
//! Decision: a trace of tens of MB spends a fifth of its load time inflating (a100 fixture: ~7 of
//! ~31 ms), and the parser is a single pass that never looks back further than the event it is in.
//! So the output buffer is allocated once at the size the gzip trailer states (ISIZE), a writer
//! thread inflates into its tail, and the reader is handed a growing prefix that is never written
//! again. Slices the parser borrows therefore stay valid, and the parser's code is unchanged: an
//! event cut off by the end of what has arrived fails to parse, and the reader waits for more and
//! parses it again from its start (`chrome.rs`, `attempt`).
//!
//! ISIZE is the size modulo 2^32 of the *last* gzip member only. The buffer gets one spare byte:
//! if the writer fills it, the trailer lied (a file over 4 GiB, several members), the writer stops
//! with `Overflow`, and the caller starts over on the serial path. Only validated UTF-8 is handed
//! out (a multi-byte character cut by a chunk end waits for its last bytes), so the scanner keeps
//! its "validated once" fast path for strings.

use crate::error::Error;
use std::io::Read;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};

/// Bytes the writer inflates between two hand-overs. Large enough that locking is noise (a 100 MB
/// trace: 400 hand-overs); the first ones are smaller (`FIRST_CHUNK`, doubling).
pub const CHUNK: usize = 256 * 1024;
/// The first hand-over: the reader waits this long (~10 us of inflating) before it starts.
const FIRST_CHUNK: usize = 16 * 1024;

/// Why the feed ends.
#[derive(Debug, Clone, PartialEq)]
pub enum End {
    /// Every byte arrived.
    Complete,
    /// More bytes than the gzip trailer announced: start over without the pipeline.
    Overflow,
    /// The gzip stream is corrupt or truncated (the message, the bytes inflated before it).
    Failed(String, usize),
}

#[derive(Default)]
struct State {
    filled: usize,
    end: Option<End>,
}

struct Shared {
    state: Mutex<State>,
    cond: Condvar,
    /// Set by the reader when it needs no more bytes (a raw stream read serially instead).
    cancel: AtomicBool,
}

impl Shared {
    // (a poisoned lock still guards plain numbers: read on rather than panic in a host process)
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wait<'g>(&self, g: std::sync::MutexGuard<'g, State>) -> std::sync::MutexGuard<'g, State> {
        self.cond.wait(g).unwrap_or_else(|e| e.into_inner())
    }
}

/// Pointer to the buffer, sent to the writer thread. Sound because the writer writes only at or
/// after `filled` and the reader reads only before it, `filled` being published under the mutex.
struct Base(*mut u8);
unsafe impl Send for Base {}

/// The announced size when the pipeline is worth taking: a single-member gzip's ISIZE that is
/// plausible for its compressed size (deflate cannot shrink more than ~1032:1; a trailer smaller
/// than the input suggests a wrapped size or several members). `None`: inflate serially.
pub fn announced_size(data: &[u8]) -> Option<usize> {
    let (n, isize) = (data.len(), trailer_size(data)?);
    (isize >= n && isize <= n.saturating_mul(1032)).then_some(isize)
}

/// A gzip stream's ISIZE trailer (the last member's inflated size modulo 2^32), or None for what
/// is not a gzip stream of at least a header and a trailer.
pub fn trailer_size(data: &[u8]) -> Option<usize> {
    let n = data.len();
    if n < 18 || data[0] != 0x1f || data[1] != 0x8b {
        return None;
    }
    Some(u32::from_le_bytes([data[n - 4], data[n - 3], data[n - 2], data[n - 1]]) as usize)
}

/// Inflates `data` into the buffer at `base` (`cap` bytes: the announced size plus one spare byte),
/// handing the filled length over after each step (`FIRST_CHUNK`, doubling up to `chunk`). Runs on
/// the writer thread.
fn write(data: &[u8], base: Base, cap: usize, chunk: usize, shared: &Shared) {
    let mut dec = Members::new(data);
    let mut filled = 0usize;
    // the first hand-overs are small so that the reader starts early, then they double up to `chunk`
    let mut step = chunk.min(FIRST_CHUNK);
    let end = loop {
        if filled == cap {
            break End::Overflow;
        }
        if shared.cancel.load(Ordering::Relaxed) {
            break End::Overflow;
        }
        let want = step.min(cap - filled);
        step = (step * 2).min(chunk);
        // SAFETY: [filled, filled + want) lies inside the allocation and no reader slice covers it
        // (readers only see [0, published filled)).
        let dst = unsafe { std::slice::from_raw_parts_mut(base.0.add(filled), want) };
        let mut got = 0;
        let mut eof = false;
        // fill the whole chunk before handing it over: decoders return short reads
        while got < want {
            match dec.read(&mut dst[got..]) {
                Ok(0) => {
                    eof = true;
                    break;
                }
                Ok(k) => got += k,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    let mut st = shared.lock();
                    st.filled = filled + got;
                    st.end = Some(End::Failed(e.to_string(), filled + got));
                    shared.cond.notify_all();
                    return;
                }
            }
        }
        filled += got;
        let mut st = shared.lock();
        st.filled = filled;
        if eof {
            st.end = Some(End::Complete);
            shared.cond.notify_all();
            return;
        }
        shared.cond.notify_all();
    };
    let mut st = shared.lock();
    st.end = Some(end);
    shared.cond.notify_all();
}

/// The reader's side: a growing, UTF-8-validated prefix of the buffer.
pub struct Feed<'a> {
    path: &'a str,
    base: *const u8,
    shared: &'a Shared,
    /// Bytes handed to the parser (validated UTF-8, ending on a character boundary).
    avail: usize,
    /// Bytes seen filled by the writer.
    seen: usize,
    end: Option<End>,
}

/// Why `more` stopped the parse.
#[derive(Debug)]
pub enum Stop {
    /// The pipeline cannot finish (the trailer understated the size, or no thread could be
    /// started): start over serially.
    Overflow,
    /// A real error of the file (gzip or UTF-8), as the serial path reports it.
    Err(Error),
}

impl<'a> Feed<'a> {
    /// The bytes the parser may read. Their lifetime is the buffer's: it is neither moved nor
    /// written below `avail` while the feed lives.
    pub fn slice(&self) -> &'a [u8] {
        // SAFETY: [0, avail) was published by the writer under the mutex and is never written again.
        unsafe { std::slice::from_raw_parts(self.base, self.avail) }
    }

    /// Stops the writer at its next hand-over: the caller reads the file another way.
    pub fn cancel(&self) {
        self.shared.cancel.store(true, Ordering::Relaxed);
    }

    /// Reads to the end of the stream, validating what is left: the error the serial read would
    /// give first (a corrupt stream, then invalid UTF-8) where there is one.
    fn drain(&mut self) -> Option<Stop> {
        loop {
            match self.more() {
                Ok(true) => {}
                Ok(false) => return None,
                Err(stop) => return Some(stop),
            }
        }
    }

    /// The file the bytes come from.
    pub fn path(&self) -> &'a str {
        self.path
    }

    /// True once every byte is in and handed out.
    pub fn complete(&self) -> bool {
        self.end == Some(End::Complete) && self.avail == self.seen
    }

    /// Waits until more validated bytes can be handed out: `Ok(true)` when `slice` grew,
    /// `Ok(false)` when the whole stream is in and handed out. A corrupt stream wins over invalid
    /// UTF-8 (as on the serial path, which inflates everything before it validates).
    pub fn more(&mut self) -> Result<bool, Stop> {
        loop {
            if self.avail < self.seen {
                // SAFETY: [avail, seen) was published and is never written again.
                let fresh = unsafe { std::slice::from_raw_parts(self.base.add(self.avail), self.seen - self.avail) };
                let (ok, bad) = match std::str::from_utf8(fresh) {
                    Ok(_) => (fresh.len(), false),
                    // a cut character waits for its end; a wrong byte is an error
                    Err(e) => (e.valid_up_to(), e.error_len().is_some() || self.end.is_some()),
                };
                if bad {
                    let at = self.avail + ok;
                    self.wait_end();
                    return Err(self.end_error().unwrap_or_else(|| {
                        Stop::Err(Error::format(self.path, Some(at as u64), None, "invalid UTF-8"))
                    }));
                }
                if ok > 0 {
                    self.avail += ok;
                    return Ok(true);
                }
            }
            if let Some(stop) = self.end_error() {
                return Err(stop);
            }
            if self.end.is_some() {
                return Ok(false);
            }
            let mut st = self.shared.lock();
            while st.filled == self.seen && st.end.is_none() {
                st = self.shared.wait(st);
            }
            self.seen = st.filled;
            self.end = st.end.clone();
        }
    }

    /// The first `n` inflated bytes (fewer if the stream is shorter), not yet validated: to tell
    /// a raw stream from JSON before any is handed to the parser.
    pub fn head(&mut self, n: usize) -> &'a [u8] {
        let mut st = self.shared.lock();
        while st.filled < n && st.end.is_none() {
            st = self.shared.wait(st);
        }
        self.seen = st.filled;
        self.end = st.end.clone();
        drop(st);
        // SAFETY: [0, seen) was published and is never written again.
        unsafe { std::slice::from_raw_parts(self.base, self.seen.min(n)) }
    }

    fn wait_end(&mut self) {
        let mut st = self.shared.lock();
        while st.end.is_none() {
            st = self.shared.wait(st);
        }
        self.seen = st.filled;
        self.end = st.end.clone();
    }

    fn end_error(&self) -> Option<Stop> {
        match &self.end {
            Some(End::Overflow) => Some(Stop::Overflow),
            Some(End::Failed(msg, n)) => Some(Stop::Err(gzip_error(self.path, msg, *n))),
            _ => None,
        }
    }
}

const TRAILING: &str = "not another gzip member";

/// A gzip file's members one after the other (as `MultiGzDecoder`), but what follows the last member
/// and is not another one is an error of its own ("N bytes after the end of the gzip data are not
/// another gzip member"), not the "unexpected end of file" of a member header that never was.
pub struct Members<'a> {
    dec: Option<flate2::bufread::GzDecoder<&'a [u8]>>,
}

impl<'a> Members<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Members {
            dec: Some(flate2::bufread::GzDecoder::new(data)),
        }
    }
}

impl std::io::Read for Members<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            let Some(d) = self.dec.as_mut() else {
                return Ok(0);
            };
            let n = d.read(buf)?;
            if n > 0 || buf.is_empty() {
                return Ok(n);
            }
            // the member ended: what is left of the input is another member, or nothing
            let rest: &[u8] = self.dec.take().map(|d| d.into_inner()).unwrap_or(&[]);
            if rest.is_empty() {
                return Ok(0);
            }
            if rest.len() >= 2 && rest[0] == 0x1f && rest[1] == 0x8b {
                self.dec = Some(flate2::bufread::GzDecoder::new(rest));
                continue;
            }
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{} byte(s) after the end of the gzip data are {TRAILING}", rest.len()),
            ));
        }
    }
}

/// The error of a corrupt or truncated gzip stream, worded alike on both paths.
pub fn gzip_error(path: &str, msg: &str, inflated: usize) -> Error {
    let msg = if msg.ends_with(TRAILING) {
        format!("{msg} (the {inflated} bytes before them decompressed)")
    } else if msg == "out of memory" {
        // (an allocation the decompressed text needed failed: the file may be fine, only too large
        // here; a gzip bomb reads the same)
        format!(
            "out of memory after {inflated} decompressed bytes: the decompressed trace does not fit in \
             the memory this process may use"
        )
    } else {
        format!("corrupt or truncated gzip stream after {inflated} decompressed bytes: {msg}")
    };
    Error::format(path, None, None, msg)
}

/// The compression a file's first bytes announce, where it is one teller does not read.
pub fn other_compression(data: &[u8]) -> Option<(&'static str, &'static str)> {
    const KNOWN: [(&[u8], &str, &str); 5] = [
        (&[0x28, 0xb5, 0x2f, 0xfd], "zstd", "zstd -d"),
        (b"BZh", "bzip2", "bunzip2"),
        (&[0xfd, b'7', b'z', b'X', b'Z', 0x00], "xz", "unxz"),
        (b"PK\x03\x04", "zip", "unzip"),
        (&[0x04, 0x22, 0x4d, 0x18], "lz4", "lz4 -d"),
    ];
    KNOWN
        .iter()
        .find(|(m, _, _)| data.starts_with(m))
        .map(|&(_, name, cmd)| (name, cmd))
}

/// Runs `parse` on a feed of `data` inflated by a second thread, `chunk` bytes at a time.
/// `Err(Stop::Overflow)`: the trailer's size was wrong (or no buffer or thread could be had); the
/// caller must start over serially.
///
/// SAFETY (of the slices `Feed` hands out): `parse` is generic over the feed's lifetime, so no
/// slice of the buffer can leave it, and the writer thread is joined before the buffer is freed;
/// `Feed`'s fields are private, so only `slice`/`head` create slices, of published bytes only.
pub fn with_feed<T>(
    path: &str,
    data: &[u8],
    announced: usize,
    chunk: usize,
    parse: impl FnOnce(&mut Feed<'_>) -> Result<T, Stop>,
) -> Result<T, Stop> {
    let cap = announced + 1;
    // zeroed pages come lazily from the OS: nothing is touched before the writer gets there. A
    // size that cannot be had is the serial read's to report (it grows its buffer as it goes).
    let Some(buf) = ZeroedBuf::new(cap) else {
        return Err(Stop::Overflow);
    };
    let ptr = buf.ptr;
    let shared = Shared {
        state: Mutex::new(State::default()),
        cond: Condvar::new(),
        cancel: AtomicBool::new(false),
    };
    let r = std::thread::scope(|s| {
        let sh = &shared;
        let base = Base(ptr);
        let spawned = std::thread::Builder::new()
            .name("teller-inflate".into())
            .spawn_scoped(s, move || {
                let done = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    write(data, base, cap, chunk.max(1), sh)
                }));
                if done.is_err() {
                    // never leave the reader waiting, never unwind into the caller's process
                    let mut st = sh.lock();
                    let at = st.filled;
                    st.end
                        .get_or_insert(End::Failed("the inflating thread failed".into(), at));
                    sh.cond.notify_all();
                }
            });
        if spawned.is_err() {
            // no thread to be had (a process at its limit): the serial read needs none
            return Err(Stop::Overflow);
        }
        let mut feed = Feed {
            path,
            base: ptr as *const u8,
            shared: &shared,
            avail: 0,
            seen: 0,
            end: None,
        };
        let r = parse(&mut feed);
        if r.is_err() {
            // the serial read inflates and validates everything before it parses: a corrupt
            // stream, then invalid UTF-8 anywhere, win over what the parse found
            if let Some(stop) = feed.drain() {
                return Err(stop);
            }
        }
        r
    });
    // (the writer is joined: nothing refers to the buffer any more)
    drop(buf);
    r
}

/// The inflated bytes: zeroed memory of a fixed size, never moved (slices of it are handed out
/// while the writer fills the rest), freed when the read is done.
struct ZeroedBuf {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}

impl ZeroedBuf {
    fn new(cap: usize) -> Option<Self> {
        let layout = std::alloc::Layout::array::<u8>(cap.max(1)).ok()?;
        // SAFETY: the layout has a non-zero size; a null return is handled
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        (!ptr.is_null()).then_some(ZeroedBuf { ptr, layout })
    }
}

impl Drop for ZeroedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout, freed once
        unsafe { std::alloc::dealloc(self.ptr, self.layout) }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_allocation_failure_is_not_called_corruption() {
        let e = super::gzip_error("t.json.gz", "out of memory", 2048).to_string();
        assert!(
            e.contains("out of memory after 2048 decompressed bytes") && !e.contains("corrupt"),
            "{e}"
        );
        let e = super::gzip_error("t.json.gz", "invalid block type", 10).to_string();
        assert!(
            e.contains("corrupt or truncated gzip stream after 10 decompressed bytes"),
            "{e}"
        );
    }
}
