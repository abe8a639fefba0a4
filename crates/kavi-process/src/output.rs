//! Capturing a child's output: each stream read from its pipe, its head kept in memory and the
//! rest spilled to a file, and shown live to whoever watches.

use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::Arc;

use tempfile::NamedTempFile;
use tokio::io::AsyncReadExt;
use tokio_util::sync::CancellationToken;

use crate::{CaptureOptions, DRAIN_GRACE};

/// One of a child's two output streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// A function given each chunk of a child's output as it arrives.
pub type OutputChunks = dyn Fn(Stream, &[u8]) + Send + Sync;

/// Receives a child's output in the chunks it arrives in, besides its capture.
#[derive(Clone)]
pub struct LiveOutput {
    pub chunks: Arc<OutputChunks>,
    /// Someone watches it as it comes (`--stream`), so the pipes are read from the child's
    /// start. Otherwise (a log another process may read) what a child prints in its first
    /// moments may arrive only when it exits, as its capture does.
    pub watched: bool,
}

impl std::fmt::Debug for LiveOutput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LiveOutput")
    }
}

/// One output stream of a finished process.
#[derive(Debug, Default)]
pub struct Captured {
    /// The first `limit` bytes.
    pub head: Vec<u8>,
    /// Everything, once the stream grew past `limit`.
    pub spill: Option<NamedTempFile>,
    pub total: u64,
    /// The pipe was still open when kavi stopped reading (held by a process outside the group).
    pub abandoned: bool,
    /// Keep only the head: what a confined process prints past it is counted and dropped,
    /// never spilled, so that a builder, gate or skill cannot fill kavi's disk by printing
    /// (their callers read only the head).
    head_only: bool,
}

impl Captured {
    /// Keeps a chunk of `stream` as it arrived, and shows it to whoever watches live.
    fn keep(&mut self, stream: Stream, chunk: &[u8], options: &CaptureOptions) -> io::Result<()> {
        if chunk.is_empty() {
            return Ok(());
        }
        self.push(chunk, options)?;
        if let Some(live) = &options.live {
            (live.chunks)(stream, chunk);
        }
        Ok(())
    }

    pub(crate) fn push(&mut self, chunk: &[u8], options: &CaptureOptions) -> io::Result<()> {
        self.total += chunk.len() as u64;
        if self.head_only {
            let room = options.limit.saturating_sub(self.head.len());
            self.head.extend_from_slice(&chunk[..room.min(chunk.len())]);
            return Ok(());
        }
        if self.spill.is_none() && self.head.len() + chunk.len() <= options.limit {
            self.head.extend_from_slice(chunk);
            return Ok(());
        }
        if self.spill.is_none() {
            let mut file = spill_file(&options.spill_dir)?;
            file.write_all(&self.head)?;
            self.spill = Some(file);
        }
        let room = options.limit.saturating_sub(self.head.len());
        self.head.extend_from_slice(&chunk[..room.min(chunk.len())]);
        self.spill
            .as_mut()
            .expect("spill file was just created")
            .write_all(chunk)
    }

    pub fn truncated(&self) -> bool {
        self.total > self.head.len() as u64
    }

    /// The whole stream, from its first byte.
    pub fn reader(&mut self) -> io::Result<Box<dyn Read + '_>> {
        match &mut self.spill {
            Some(file) => {
                let file = file.as_file_mut();
                file.seek(SeekFrom::Start(0))?;
                Ok(Box::new(file))
            }
            None => Ok(Box::new(self.head.as_slice())),
        }
    }

    /// The stream passed through `filter` (which copies what it reads to what it writes), as a
    /// new capture under `options`.
    pub fn filtered(
        mut self,
        options: &CaptureOptions,
        filter: impl FnOnce(&mut dyn Read, &mut dyn Write) -> io::Result<()>,
    ) -> io::Result<Self> {
        struct Recapture<'a> {
            captured: Captured,
            options: &'a CaptureOptions,
        }
        impl Write for Recapture<'_> {
            fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
                self.captured.push(bytes, self.options)?;
                Ok(bytes.len())
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let mut out = Recapture {
            captured: Captured {
                abandoned: self.abandoned,
                ..Captured::default()
            },
            options,
        };
        filter(&mut self.reader()?, &mut out)?;
        Ok(out.captured)
    }
}

/// A new spill file in `dir`, which is made with the first one (see
/// [`kavi_foundation::files::temp_file_in`]).
fn spill_file(dir: &Path) -> io::Result<NamedTempFile> {
    kavi_foundation::files::temp_file_in(dir, &tempfile::Builder::new())
}

/// Reads a pipe to its end, or until `DRAIN_GRACE` after `exited` fires.
///
/// What the pipe holds already is read first, without the reactor: after a child's exit that is
/// all of it, and the pipe never wakes kavi.
pub(crate) async fn capture(
    pipe: OwnedFd,
    stream: Stream,
    options: &CaptureOptions,
    exited: &CancellationToken,
    head_only: bool,
) -> io::Result<Captured> {
    let mut captured = Captured {
        head_only,
        ..Captured::default()
    };
    let pipe = std::fs::File::from(pipe);
    if read_held(&pipe, stream, &mut captured, options)? {
        return Ok(captured);
    }
    // Known pipes, their ends made non-blocking by `spawn`: no checking them again.
    let mut pipe = tokio::net::unix::pipe::Receiver::from_owned_fd_unchecked(OwnedFd::from(pipe))?;
    let deadline = async {
        exited.cancelled().await;
        tokio::time::sleep(DRAIN_GRACE).await;
    };
    tokio::pin!(deadline);
    // Read into spare capacity: a zeroed 64 KiB buffer per stream was a memset of 128 KiB on
    // every node, most of which print nothing.
    let mut buffer = Vec::with_capacity(PIPE_CHUNK);
    loop {
        buffer.clear();
        let n = tokio::select! {
            n = pipe.read_buf(&mut buffer) => n?,
            () = &mut deadline => {
                captured.abandoned = true;
                break;
            }
        };
        if n == 0 {
            break;
        }
        captured.keep(stream, &buffer[..n], options)?;
    }
    Ok(captured)
}

/// How much is read from a pipe at a time: its default capacity.
const PIPE_CHUNK: usize = 64 * 1024;

/// Reads what the non-blocking `pipe` holds now, without waiting; `true` once it is at its end
/// (every writer gone).
fn read_held(
    pipe: &std::fs::File,
    stream: Stream,
    captured: &mut Captured,
    options: &CaptureOptions,
) -> io::Result<bool> {
    let mut chunk = Vec::new();
    loop {
        chunk.clear();
        // Bounded: a writer outside the group may keep the pipe full for as long as it likes.
        let read = pipe.take(PIPE_CHUNK as u64).read_to_end(&mut chunk);
        captured.keep(stream, &chunk, options)?;
        match read {
            Ok(_) if chunk.len() < PIPE_CHUNK => return Ok(true),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}
