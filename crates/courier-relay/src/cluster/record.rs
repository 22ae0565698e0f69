//! A JSON record in a bucket: read, written, or changed by compare-and-set (read, changed,
//! written only if nobody wrote it since, else read again), which keeps changes made through
//! several nodes at once from losing one another.

use async_nats::jetstream::kv;
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::journal::contention_backoff;
use super::{lost_race, request, ClusterError};

/// The record under `key`, `None` when there is none.
pub(super) async fn read_record<T: DeserializeOwned>(
    bucket: &kv::Store,
    key: &str,
) -> Result<Option<T>, ClusterError> {
    let Some(value) = bucket.get(key).await.map_err(request)? else {
        return Ok(None);
    };
    serde_json::from_slice(&value)
        .map(Some)
        .map_err(|e| ClusterError::Corrupt(e.to_string()))
}

/// Writes `record` under `key`, whatever was there.
pub(super) async fn put_record<T: Serialize>(
    bucket: &kv::Store,
    key: &str,
    record: &T,
) -> Result<(), ClusterError> {
    let value = serde_json::to_vec(record).map_err(request)?;
    bucket.put(key, value.into()).await.map_err(request)?;
    Ok(())
}

/// Applies `change` to the record under `key` (the default when there is none) and writes the
/// result when `change` asks for it, on the revision it read. A write another one came before
/// is tried again, after a random while so racing changes fall out of step, on the record read
/// anew. Answers what `change` answered for the record written (or read, without a write).
pub(super) async fn change_record<T, A>(
    bucket: &kv::Store,
    key: &str,
    mut change: impl FnMut(&mut T) -> (A, bool),
) -> Result<A, ClusterError>
where
    T: Serialize + DeserializeOwned + Default,
{
    let mut lost = 0;
    loop {
        let entry = bucket.entry(key).await.map_err(request)?;
        let (mut record, revision) = match entry {
            Some(entry) if entry.operation == kv::Operation::Put => (
                serde_json::from_slice::<T>(&entry.value)
                    .map_err(|e| ClusterError::Corrupt(e.to_string()))?,
                Some(entry.revision),
            ),
            Some(entry) => (T::default(), Some(entry.revision)),
            None => (T::default(), None),
        };
        let (answer, write) = change(&mut record);
        if !write {
            return Ok(answer);
        }
        let value = serde_json::to_vec(&record).map_err(request)?;
        if write_on_revision(bucket, key, value, revision).await? {
            return Ok(answer);
        }
        lost += 1;
        tokio::time::sleep(contention_backoff(lost)).await;
    }
}

/// Writes `value` under `key` only if the key's latest revision is still `revision` (`None`:
/// the key was never written). Answers whether it was written; `false` when another write came
/// first.
pub(super) async fn write_on_revision(
    bucket: &kv::Store,
    key: &str,
    value: Vec<u8>,
    revision: Option<u64>,
) -> Result<bool, ClusterError> {
    let written = match revision {
        Some(revision) => bucket
            .update(key, value.into(), revision)
            .await
            .map_err(|e| {
                let lost = e.kind() == kv::UpdateErrorKind::WrongLastRevision || lost_race(&e);
                (lost, request(e))
            }),
        None => bucket.create(key, value.into()).await.map_err(|e| {
            let lost = e.kind() == kv::CreateErrorKind::AlreadyExists || lost_race(&e);
            (lost, request(e))
        }),
    };
    match written {
        Ok(_) => Ok(true),
        Err((true, _)) => Ok(false),
        Err((false, e)) => Err(e),
    }
}
