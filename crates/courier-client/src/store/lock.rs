//! One writer per database file, across processes.
//!
//! SQLite's own locking only serialises transactions; it would happily let two `Protocol`s
//! drive the same outbox and send every message twice. So `Store::open` first takes an
//! exclusive advisory lock (`flock` on Unix, `LockFileEx` on Windows, through std's
//! `File::try_lock`) on a sidecar file `<db path>.lock` and holds it for the store's lifetime.
//!
//! Properties this relies on:
//! - the lock belongs to the open file description, so a second open of the same path in the
//!   *same* process conflicts too (unlike POSIX `fcntl` record locks);
//! - the OS releases it when the process dies, however it dies (SIGKILL, crash, power cut), so
//!   a stale lock file never blocks a restart; the file itself is left in place and reused;
//! - the lock is taken before SQLite touches the database, so a refused open never reads,
//!   migrates or checkpoints a database another process is driving.
//!
//! The sidecar name is derived from the path as given (no symlink resolution): open the store
//! through one canonical path.

use std::ffi::OsString;
use std::fs::{File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};

use super::StoreError;

/// An exclusive lock on `<db path>.lock`, released when dropped.
#[derive(Debug)]
pub(crate) struct LockFile {
    _file: File,
    path: PathBuf,
}

impl LockFile {
    /// The sidecar lock path of a database path: the same path with `.lock` appended.
    pub(crate) fn path_for(db_path: &Path) -> PathBuf {
        let mut name: OsString = db_path.as_os_str().to_owned();
        name.push(".lock");
        PathBuf::from(name)
    }

    /// Takes the lock without waiting. `StoreError::Locked(db_path)` when someone holds it.
    pub(crate) fn acquire(db_path: &Path) -> Result<Self, StoreError> {
        let path = Self::path_for(db_path);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)?;
        match file.try_lock() {
            Ok(()) => Ok(Self { _file: file, path }),
            Err(TryLockError::WouldBlock) => Err(StoreError::Locked(db_path.to_path_buf())),
            Err(TryLockError::Error(e)) => Err(StoreError::Io(e)),
        }
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}
