//! The key-package directory, `key_directory_v1` (`docs/protocol.md#key-package-directory`): a
//! connection that declared its address publishes key packages for that address, so that a sender
//! can start an end-to-end session with it while it is offline; any connection takes one.
//! Packages are opaque here; the decoder has already bounded them (courier-proto).

use courier_proto::{Address, KeyPackage, KeyPackageBatch, RelayFrame};

use crate::dispatch::{error_frame, Session};
use crate::store::{KeyPackagesHeld, StoreError, TakenKeyPackage};

/// PublishKeyPackages: only for the connection's own declared address; before a declaration
/// it is refused and changes nothing.
pub async fn publish(
    session: &Session,
    packages: KeyPackageBatch,
    last_resort: Option<KeyPackage>,
) -> RelayFrame {
    const FRAME: &str = "PublishKeyPackages";
    let Some(address) = session.declared() else {
        return error_frame("address_required", FRAME, None);
    };
    let ctx = &session.ctx;
    let published = tokio::time::timeout(
        ctx.timings.answer_deadline,
        ctx.store
            .publish_key_packages(&address, packages, last_resort, crate::now_ms()),
    )
    .await;
    match settled(published, FRAME) {
        Some(KeyPackagesHeld {
            available,
            last_resort,
        }) => RelayFrame::KeyPackagesPublished {
            available,
            last_resort,
        },
        None => error_frame("internal", FRAME, None),
    }
}

/// FetchKeyPackage: any authenticated connection, for any address. A one-time package whose
/// answer is lost (a timeout here, a dropped connection) is still spent: handing one out twice
/// would be worse, and the last-resort package stays for the next asker.
pub async fn fetch(session: &Session, address: Address) -> RelayFrame {
    const FRAME: &str = "FetchKeyPackage";
    let ctx = &session.ctx;
    let taken = tokio::time::timeout(
        ctx.timings.answer_deadline,
        ctx.store.take_key_package(&address),
    )
    .await;
    match settled(taken, FRAME) {
        Some(Some(TakenKeyPackage {
            package,
            last_resort,
        })) => RelayFrame::KeyPackage {
            address,
            package,
            last_resort,
        },
        Some(None) => RelayFrame::KeyPackageUnavailable { address },
        None => error_frame("internal", FRAME, None),
    }
}

/// The store's answer, or `None` (logged) when it failed or missed the deadline.
fn settled<T>(
    answer: Result<Result<T, StoreError>, tokio::time::error::Elapsed>,
    frame_type: &str,
) -> Option<T> {
    match answer {
        Ok(Ok(value)) => Some(value),
        Ok(Err(e)) => {
            tracing::error!(%frame_type, error = %e, "key-package directory request failed");
            None
        }
        Err(_) => {
            tracing::error!(%frame_type, "key-package directory request timed out");
            None
        }
    }
}
