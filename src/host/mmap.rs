//! Memory-mapped files for the disk-backed replay storage
//! ([`LazyMemmapStorage`](crate::data::replay::LazyMemmapStorage)).
//!
//! The one `unsafe` call is mapping the file. Tensors never point into a mapping: rows are
//! copied in and out as bytes through the safe slice the mapping derefs to, so no tensor can
//! outlive the memory it reads.

use std::fs::{File, OpenOptions};
use std::path::Path;

use memmap2::MmapMut;

use crate::error::{Error, Result};

/// A file of `len` bytes mapped read-write: a new storage's ([`MappedFile::create`]) or a
/// reopened one's, which must be intact ([`MappedFile::existing`]).
pub(crate) struct MappedFile {
    map: MmapMut,
    /// Kept open for the mapping's lifetime.
    _file: File,
}

impl std::fmt::Debug for MappedFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MappedFile")
            .field("len", &self.map.len())
            .finish()
    }
}

impl MappedFile {
    /// Opens (or creates) `path` with exactly `len` bytes and maps it: a new storage's file
    /// (zero-filled when created, resized when a stray file of another size is there).
    pub(crate) fn create(path: &Path, len: u64) -> Result<Self> {
        Self::open(path, len, true)
    }

    /// Maps the existing file `path`, which must hold exactly `len` bytes: a reopened
    /// storage's file. A missing file or one of another size (truncated by a crash, or not
    /// the layout `meta.json` describes) is an error naming it, and the file is left as it
    /// is.
    pub(crate) fn existing(path: &Path, len: u64) -> Result<Self> {
        Self::open(path, len, false)
    }

    fn open(path: &Path, len: u64, create: bool) -> Result<Self> {
        let op = "LazyMemmapStorage (mapping a file)";
        let io = |e: std::io::Error| Error::Io {
            op,
            path: path.display().to_string(),
            source: e,
        };
        if len == 0 {
            return Err(Error::invalid(
                op,
                format!("{}: a zero-byte leaf cannot be mapped", path.display()),
            ));
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(create)
            .truncate(false)
            .open(path)
            .map_err(io)?;
        let held = file.metadata().map_err(io)?.len();
        if held != len {
            if !create {
                return Err(Error::InvalidFile {
                    op,
                    path: path.display().to_string(),
                    reason: format!(
                        "holds {held} bytes; the layout in meta.json needs {len} \
                         (capacity × item bytes)"
                    ),
                });
            }
            file.set_len(len).map_err(io)?;
        }
        // SAFETY: the file was opened by us read-write and is `len` bytes long; the mapping is
        // only read and written through the `&[u8]` / `&mut [u8]` it derefs to
        // (bounds-checked), and no pointer into it escapes. Another process truncating or
        // rewriting the file while it is mapped is outside this crate's control (memmap2's
        // documented caveat); the storage's folder is its own.
        let map = unsafe { MmapMut::map_mut(&file) }.map_err(io)?;
        Ok(MappedFile { map, _file: file })
    }

    /// The mapped bytes.
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.map
    }

    /// The mapped bytes, writable.
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.map
    }

    /// Writes the mapped bytes back to the file.
    pub(crate) fn flush(&self) -> Result<()> {
        self.map
            .flush()
            .map_err(|e| Error::invalid("LazyMemmapStorage::flush", e.to_string()))
    }
}
