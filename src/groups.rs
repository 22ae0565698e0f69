//! The group methods of `NativeProtocol` (`docs/delivery.md#group-sends`): they convert and
//! forward; membership, sealing and delivery live in `courier-client`.

use napi_derive::napi;

use crate::error::{client_error, Settled};
use crate::{NativeProtocol, NativeSendInput};

/// `listGroups()`: `GroupInfo` in `js/index.d.ts`.
#[napi(object)]
pub struct NativeGroup {
    pub group_id: String,
    pub name: String,
    pub admin: String,
    /// This device included, sorted.
    pub members: Vec<String>,
    pub relay_synced: bool,
}

/// One member's state of a group message.
#[napi(object)]
pub struct NativeGroupMemberStatus {
    pub member: String,
    /// `'pending'`, `'stored'`, `'delivered'` or `'failed'`.
    pub status: String,
}

/// `getGroupMessageStatus()`: `GroupMessageStatus` in `js/index.d.ts`.
#[napi(object)]
pub struct NativeGroupMessageStatus {
    pub group_id: String,
    pub members: Vec<NativeGroupMemberStatus>,
}

#[napi]
impl NativeProtocol {
    /// Resolves with the group's id once it exists, with every member, durably.
    #[napi(ts_return_type = "Promise<string>")]
    pub async fn create_group(&self, name: String, members: Vec<String>) -> Settled<String> {
        let created = async {
            let client = self.started()?;
            client
                .create_group(name, members)
                .await
                .map_err(client_error)
        };
        created.await.into()
    }

    #[napi(ts_return_type = "Promise<void>")]
    pub async fn add_group_member(&self, group_id: String, member: String) -> Settled<()> {
        let added = async {
            let client = self.started()?;
            client
                .add_group_member(group_id, member)
                .await
                .map_err(client_error)
        };
        added.await.into()
    }

    #[napi(ts_return_type = "Promise<void>")]
    pub async fn remove_group_member(&self, group_id: String, member: String) -> Settled<()> {
        let removed = async {
            let client = self.started()?;
            client
                .remove_group_member(group_id, member)
                .await
                .map_err(client_error)
        };
        removed.await.into()
    }

    #[napi(ts_return_type = "Promise<void>")]
    pub async fn leave_group(&self, group_id: String) -> Settled<()> {
        let left = async {
            let client = self.started()?;
            client.leave_group(group_id).await.map_err(client_error)
        };
        left.await.into()
    }

    /// `input.recipient` is the group; resolves with the message's logical id once it is
    /// durably accepted.
    #[napi(ts_return_type = "Promise<string>")]
    pub async fn send_group_message(&self, input: NativeSendInput) -> Settled<String> {
        let sent = async {
            let client = self.started()?;
            client
                .send_group(input.into_send()?)
                .await
                .map_err(client_error)
        };
        sent.await.into()
    }

    #[napi(ts_return_type = "Promise<NativeGroupMessageStatus | null>")]
    pub async fn get_group_message_status(
        &self,
        id: String,
    ) -> Settled<Option<NativeGroupMessageStatus>> {
        let status = async {
            let client = self.started()?;
            let status = client
                .group_message_status(id)
                .await
                .map_err(client_error)?;
            Ok(status.map(|s| NativeGroupMessageStatus {
                group_id: s.group_id,
                members: s
                    .members
                    .into_iter()
                    .map(|(member, state)| NativeGroupMemberStatus {
                        member,
                        status: state.as_str().to_owned(),
                    })
                    .collect(),
            }))
        };
        status.await.into()
    }

    #[napi(ts_return_type = "Promise<NativeGroup[]>")]
    pub async fn list_groups(&self) -> Settled<Vec<NativeGroup>> {
        let listed = async {
            let client = self.started()?;
            let groups = client.list_groups().await.map_err(client_error)?;
            Ok(groups
                .into_iter()
                .map(|g| NativeGroup {
                    group_id: g.group_id,
                    name: g.name,
                    admin: g.admin,
                    members: g.members,
                    relay_synced: g.relay_synced,
                })
                .collect())
        };
        listed.await.into()
    }
}
