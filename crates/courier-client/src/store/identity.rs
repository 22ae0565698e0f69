//! The identity seed at rest (`docs/protocol.md#identity-key`).
//!
//! The 32-byte Ed25519 seed is the identity, so the database never holds it in the clear: it is
//! sealed with ChaCha20-Poly1305 under a key that lives somewhere else — the app's own key
//! (`storage.identitySealKey`, typically kept by the OS keychain: Electron `safeStorage`,
//! keytar), or else a random key file beside the database (`<db>.identity-key`, mode 0600), so a
//! copy of the database alone does not carry the identity. An in-memory store has nothing at
//! rest and keeps the seed as is.
//!
//! A seed is never replaced: a seal that does not open, a missing key file or a missing app key
//! fail the start with the reason, and the stored row is left untouched.
//!
//! Nor is one slipped in: a key file is used only if it is a regular file, not reached through
//! a symlink, owned by this process's user and closed to everyone else, since whoever can swap
//! or read it holds the identity; and a file store whose key file exists has sealed its
//! identity, so a row in the clear there was written from outside and is refused.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Read, Write};
use std::path::{Path, PathBuf};

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce};
use rand_core::{OsRng, RngCore};
use rusqlite::{OptionalExtension, Transaction};
use zeroize::Zeroizing;

use super::StoreError;

/// Binds a sealed seed to its purpose: the same key sealing anything else cannot be swapped in.
const AAD: &[u8] = b"offline-courier identity seed v1";
const NONCE_LEN: usize = 12;
pub type Seed = [u8; 32];

/// The keys that can seal the identity seed: the app's, and the key file of a file store.
pub struct SealKeys {
    /// The app's 32-byte key (`storage.identitySealKey`): seals when present.
    pub app: Option<Zeroizing<[u8; 32]>>,
    /// `<db>.identity-key`: seals a file store's seed when the app supplies no key, and opens
    /// one sealed that way before an app key reseals it. `None` for an in-memory store.
    pub key_file: Option<PathBuf>,
}

impl SealKeys {
    /// The key file for a database at `db`.
    pub fn key_file_for(db: &Path) -> PathBuf {
        let mut name = db.as_os_str().to_owned();
        name.push(".identity-key");
        PathBuf::from(name)
    }

    /// The strongest key at hand, which seals new and resealed seeds.
    fn sealer(&self) -> Sealer<'_> {
        match (&self.app, &self.key_file) {
            (Some(app), _) => Sealer::App(app),
            (None, Some(path)) => Sealer::KeyFile(path),
            (None, None) => Sealer::Volatile,
        }
    }
}

enum Sealer<'a> {
    App(&'a [u8; 32]),
    KeyFile(&'a Path),
    /// An in-memory store: nothing is at rest.
    Volatile,
}

impl Sealer<'_> {
    fn label(&self) -> &'static str {
        match self {
            Self::App(_) => "app_key",
            Self::KeyFile(_) => "key_file",
            Self::Volatile => "none",
        }
    }
}

/// A stored row, as read.
struct Row {
    sealed_by: String,
    nonce: Option<Vec<u8>>,
    seed: Vec<u8>,
}

/// The stored seed, opened; or — when there is none — `generate()`'s, sealed and inserted. A row
/// sealed by a weaker key than `key` (none → key file → app key) is resealed under `key` in the
/// same transaction; a row sealed by the app key is never downgraded.
pub(super) fn load_or_create(
    tx: &Transaction<'_>,
    keys: &SealKeys,
    now: i64,
    generate: impl FnOnce() -> Result<Seed, String>,
) -> Result<Seed, StoreError> {
    let row = tx
        .query_row(
            "SELECT sealed_by, nonce, seed FROM identity WHERE id = 1",
            [],
            |r| {
                Ok(Row {
                    sealed_by: r.get(0)?,
                    nonce: r.get(1)?,
                    seed: r.get(2)?,
                })
            },
        )
        .optional()?;
    let Some(row) = row else {
        let seed = Zeroizing::new(generate().map_err(StoreError::Corrupt)?);
        let sealer = keys.sealer();
        let (nonce, sealed) = seal(&sealer, &seed)?;
        tx.execute(
            "INSERT INTO identity (id, sealed_by, nonce, seed, created_at) VALUES (1, ?1, ?2, ?3, ?4)",
            rusqlite::params![sealer.label(), nonce, sealed, now],
        )?;
        return Ok(*seed);
    };
    let seed = open(&row, keys)?;
    let sealer = keys.sealer();
    if rank(sealer.label()) > rank(&row.sealed_by) {
        let (nonce, sealed) = seal(&sealer, &seed)?;
        tx.execute(
            "UPDATE identity SET sealed_by = ?1, nonce = ?2, seed = ?3 WHERE id = 1",
            rusqlite::params![sealer.label(), nonce, sealed],
        )?;
    }
    Ok(*seed)
}

fn rank(label: &str) -> u8 {
    match label {
        "app_key" => 2,
        "key_file" => 1,
        _ => 0,
    }
}

fn open(row: &Row, keys: &SealKeys) -> Result<Zeroizing<Seed>, StoreError> {
    let corrupt = |why: &str| StoreError::Corrupt(format!("the identity seed {why}"));
    let plain = match (row.sealed_by.as_str(), &row.nonce) {
        // A version 3 row, which the first start after the upgrade seals; once it has, the key
        // file is there.
        ("none", None) if keys.key_file.as_deref().is_some_and(present) => {
            return Err(StoreError::CleartextIdentity)
        }
        ("none", None) => Zeroizing::new(row.seed.clone()),
        ("app_key", Some(nonce)) => {
            let Some(app) = &keys.app else {
                return Err(StoreError::Identity(
                    "the identity seed is sealed with the app's storage.identitySealKey, which \
                     this start did not supply; the identity is kept and not replaced"
                        .into(),
                ));
            };
            unseal(app, nonce, &row.seed).ok_or_else(|| {
                StoreError::Identity(
                    "storage.identitySealKey does not open the identity seed (a different key, \
                     or a damaged row); the identity is kept and not replaced"
                        .into(),
                )
            })?
        }
        ("key_file", Some(nonce)) => {
            let Some(path) = &keys.key_file else {
                return Err(corrupt("names a key file in an in-memory store"));
            };
            let file_key = read_key_file(path)?;
            unseal(&file_key, nonce, &row.seed).ok_or_else(|| {
                StoreError::Identity(format!(
                    "the key file {} does not open the identity seed; the identity is kept and \
                     not replaced",
                    path.display()
                ))
            })?
        }
        _ => return Err(corrupt("row is malformed")),
    };
    let seed: Seed = plain
        .as_slice()
        .try_into()
        .map_err(|_| corrupt("is not 32 bytes"))?;
    Ok(Zeroizing::new(seed))
}

/// Seals `seed` under `sealer`, creating the key file on first use. A key file left by a start
/// that crashed before its row committed is reused.
fn seal(sealer: &Sealer<'_>, seed: &Seed) -> Result<(Option<Vec<u8>>, Vec<u8>), StoreError> {
    let cipher_key = match sealer {
        Sealer::Volatile => return Ok((None, seed.to_vec())),
        Sealer::App(app) => Zeroizing::new(**app),
        Sealer::KeyFile(path) if present(path) => read_key_file(path)?,
        Sealer::KeyFile(path) => create_key_file_at(path)?,
    };
    let mut nonce = [0u8; NONCE_LEN];
    OsRng.try_fill_bytes(&mut nonce).map_err(|e| {
        StoreError::Corrupt(format!("cannot draw a nonce for the identity seed: {e}"))
    })?;
    let cipher = ChaCha20Poly1305::new(Key::from_slice(cipher_key.as_slice()));
    let sealed = cipher
        .encrypt(
            Nonce::from_slice(&nonce),
            Payload {
                msg: seed,
                aad: AAD,
            },
        )
        .map_err(|_| StoreError::Corrupt("cannot seal the identity seed".into()))?;
    Ok((Some(nonce.to_vec()), sealed))
}

fn unseal(key: &[u8; 32], nonce: &[u8], sealed: &[u8]) -> Option<Zeroizing<Vec<u8>>> {
    if nonce.len() != NONCE_LEN {
        return None;
    }
    let cipher = ChaCha20Poly1305::new(Key::from_slice(key));
    cipher
        .decrypt(
            Nonce::from_slice(nonce),
            Payload {
                msg: sealed,
                aad: AAD,
            },
        )
        .ok()
        .map(Zeroizing::new)
}

/// Whether anything is at `path`, a symlink included (even one that leads nowhere).
fn present(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok()
}

/// Why an identity key file is not used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyFileProblem {
    /// A symlink, which could lead to a key someone else controls.
    Symlink,
    /// A directory, a device, a pipe…
    NotAFile,
    /// Owned by another user, who could replace it.
    ForeignOwner { owner: u32 },
    /// Readable or writable by the group or others (the permission bits).
    OpenMode { mode: u32 },
}

impl fmt::Display for KeyFileProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Symlink => f.write_str("is a symbolic link"),
            Self::NotAFile => f.write_str("is not a regular file"),
            Self::ForeignOwner { owner } => {
                write!(f, "is owned by uid {owner}, not by this process's user")
            }
            Self::OpenMode { mode } => {
                write!(
                    f,
                    "has mode {mode:03o}: it must be closed to group and others (0600)"
                )
            }
        }
    }
}

/// Opens the key file without following a symlink, and checks what was opened (not the path,
/// which could change in between).
fn open_key_file(path: &Path) -> Result<File, StoreError> {
    let unsafe_file = |problem| StoreError::UnsafeKeyFile {
        path: path.to_owned(),
        problem,
    };
    let mut options = OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::custom_flags(&mut options, libc::O_NOFOLLOW);
    let file = options.open(path).map_err(|e| {
        #[cfg(unix)]
        if e.raw_os_error() == Some(libc::ELOOP) {
            return unsafe_file(KeyFileProblem::Symlink);
        }
        StoreError::Identity(format!(
            "cannot read the identity key file {}: {e}; the identity is kept and not replaced",
            path.display()
        ))
    })?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(unsafe_file(KeyFileProblem::NotAFile));
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        // SAFETY: geteuid has no preconditions and cannot fail.
        let me = unsafe { libc::geteuid() };
        if meta.uid() != me {
            return Err(unsafe_file(KeyFileProblem::ForeignOwner {
                owner: meta.uid(),
            }));
        }
        let mode = meta.mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(unsafe_file(KeyFileProblem::OpenMode { mode }));
        }
    }
    Ok(file)
}

fn read_key_file(path: &Path) -> Result<Zeroizing<[u8; 32]>, StoreError> {
    let mut file = open_key_file(path)?;
    let mut key = Zeroizing::new([0u8; 32]);
    let mut extra = [0u8; 1];
    file.read_exact(key.as_mut_slice())
        .and_then(|()| match file.read(&mut extra)? {
            0 => Ok(()),
            _ => Err(ErrorKind::InvalidData.into()),
        })
        .map_err(|_| {
            StoreError::Identity(format!(
                "the identity key file {} is not 32 bytes; the identity is kept and not replaced",
                path.display()
            ))
        })?;
    Ok(key)
}

/// A fresh random key, durable (file and directory entry synced) before any seal uses it.
fn create_key_file_at(path: &Path) -> Result<Zeroizing<[u8; 32]>, StoreError> {
    let mut key = Zeroizing::new([0u8; 32]);
    OsRng
        .try_fill_bytes(key.as_mut_slice())
        .map_err(|e| StoreError::Corrupt(format!("cannot draw an identity key: {e}")))?;
    let mut options = OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(path)?;
    file.write_all(key.as_slice())?;
    file.sync_all()?;
    #[cfg(unix)]
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        File::open(dir)?.sync_all()?;
    }
    Ok(key)
}
