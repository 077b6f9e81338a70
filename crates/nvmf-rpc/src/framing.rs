//! Owns stream framing, both directions: JSON values back to back on a byte
//! stream with no delimiter required (what SPDK's rpc.py sends: `json.dumps`
//! of each request, no newline guaranteed, several per connection, possibly
//! split across reads or several in one read). `FrameDecoder` buffers bytes
//! and yields each complete value (serde_json's `StreamDeserializer`);
//! malformed input is a parse error after which the stream cannot be
//! resynchronized (SPDK closes the connection; so does `server`).

use serde_json::Value;

/// Largest single buffered value (SPDK's receive buffer is 32 MiB).
pub const MAX_FRAME: usize = 32 * 1024 * 1024;

/// Why the stream cannot continue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameError {
    /// Not JSON (the text says where and why).
    Parse(String),
    /// More than [`MAX_FRAME`] bytes without a complete value.
    TooLarge,
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::Parse(e) => write!(f, "Parse error: {e}"),
            FrameError::TooLarge => write!(f, "Parse error: request larger than {MAX_FRAME} bytes"),
        }
    }
}

/// Incremental decoder of back-to-back JSON values.
#[derive(Debug, Default)]
pub struct FrameDecoder {
    buf: Vec<u8>,
}

impl FrameDecoder {
    pub fn new() -> FrameDecoder {
        FrameDecoder::default()
    }

    /// Appends received bytes.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// Bytes buffered and not yet decoded (whitespace included).
    pub fn pending(&self) -> &[u8] {
        &self.buf
    }

    /// True when only whitespace is buffered.
    pub fn is_idle(&self) -> bool {
        self.buf.iter().all(u8::is_ascii_whitespace)
    }

    /// The next complete value: `Ok(None)` when more bytes are needed.
    pub fn next_value(&mut self) -> Result<Option<Value>, FrameError> {
        let start = self
            .buf
            .iter()
            .position(|b| !b.is_ascii_whitespace())
            .unwrap_or(self.buf.len());
        if start == self.buf.len() {
            self.buf.clear();
            return Ok(None);
        }
        let mut it = serde_json::Deserializer::from_slice(&self.buf[start..]).into_iter::<Value>();
        match it.next() {
            Some(Ok(v)) => {
                let used = start + it.byte_offset();
                self.buf.drain(..used);
                Ok(Some(v))
            }
            Some(Err(e)) if e.is_eof() => {
                if self.buf.len() - start > MAX_FRAME {
                    Err(FrameError::TooLarge)
                } else {
                    Ok(None)
                }
            }
            Some(Err(e)) => Err(FrameError::Parse(e.to_string())),
            None => Ok(None),
        }
    }
}
