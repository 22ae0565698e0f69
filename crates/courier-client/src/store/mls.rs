//! The end-to-end session state (`docs/architecture.md#end-to-end-sessions`): the rows
//! `courier-crypto` hands over after each step, written in that step's transaction, sealed at
//! rest.
//!
//! Each value is sealed with ChaCha20-Poly1305 under a key derived from the identity seed, with
//! the row's key as associated data (a row cannot be moved under another key). Whatever seals
//! the identity at rest therefore covers the MLS secrets too, and resealing the identity under
//! a stronger key needs no rewrite here.

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce};
use courier_crypto::{Change, RowKey};
use rand_core::{OsRng, RngCore};
use rusqlite::{Connection, Transaction};
use sha2::{Digest, Sha256};
use zeroize::Zeroizing;

use super::StoreError;

const KEY_DOMAIN: &[u8] = b"offline-courier mls state key v1";
const AAD_DOMAIN: &[u8] = b"offline-courier mls state v1:";
const NONCE_LEN: usize = 12;

/// The key that seals the session rows, derived from the identity seed.
pub(crate) struct RestKey(Zeroizing<[u8; 32]>);

impl RestKey {
    pub(crate) fn from_seed(seed: &[u8; 32]) -> Self {
        let mut hash = Sha256::new();
        hash.update(KEY_DOMAIN);
        hash.update(seed);
        Self(Zeroizing::new(hash.finalize().into()))
    }

    fn cipher(&self) -> ChaCha20Poly1305 {
        ChaCha20Poly1305::new(Key::from_slice(self.0.as_slice()))
    }
}

fn aad(key: &[u8]) -> Vec<u8> {
    [AAD_DOMAIN, key].concat()
}

/// Every row, opened.
pub(super) fn load(
    conn: &Connection,
    rest: &RestKey,
) -> Result<Vec<(RowKey, Vec<u8>)>, StoreError> {
    let cipher = rest.cipher();
    let mut stmt = conn.prepare_cached("SELECT key, nonce, value FROM mls_state")?;
    let rows = stmt.query_map([], |r| {
        Ok((
            r.get::<_, Vec<u8>>(0)?,
            r.get::<_, Vec<u8>>(1)?,
            r.get::<_, Vec<u8>>(2)?,
        ))
    })?;
    let mut out = Vec::new();
    for row in rows {
        let (key, nonce, sealed) = row?;
        if nonce.len() != NONCE_LEN {
            return Err(StoreError::Corrupt(
                "a session row has a malformed nonce".into(),
            ));
        }
        let value = cipher
            .decrypt(
                Nonce::from_slice(&nonce),
                Payload {
                    msg: &sealed,
                    aad: &aad(&key),
                },
            )
            .map_err(|_| {
                StoreError::Corrupt("a session row does not open with this identity".into())
            })?;
        out.push((key, value));
    }
    Ok(out)
}

/// Writes `changes` in `tx`: each value sealed under a fresh nonce, a `None` deleted.
pub(super) fn apply(
    tx: &Transaction<'_>,
    rest: &RestKey,
    changes: &[Change],
) -> Result<(), StoreError> {
    let cipher = rest.cipher();
    let mut put = tx.prepare_cached(
        "INSERT INTO mls_state (key, nonce, value) VALUES (?1, ?2, ?3)
         ON CONFLICT (key) DO UPDATE SET nonce = excluded.nonce, value = excluded.value",
    )?;
    let mut delete = tx.prepare_cached("DELETE FROM mls_state WHERE key = ?1")?;
    for Change { key, value } in changes {
        let Some(value) = value else {
            delete.execute([key])?;
            continue;
        };
        let mut nonce = [0u8; NONCE_LEN];
        OsRng
            .try_fill_bytes(&mut nonce)
            .map_err(|e| StoreError::Corrupt(format!("cannot draw a nonce: {e}")))?;
        let sealed = cipher
            .encrypt(
                Nonce::from_slice(&nonce),
                Payload {
                    msg: value,
                    aad: &aad(key),
                },
            )
            .map_err(|_| StoreError::Corrupt("cannot seal a session row".into()))?;
        put.execute(rusqlite::params![key, nonce.as_slice(), sealed])?;
    }
    Ok(())
}
