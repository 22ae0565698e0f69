//! Application messages of a chat group: sealed in the group's epoch, opened as their MLS
//! sender's address, held when they are of an epoch whose commit has not arrived.

use courier_proto::Address;
use openmls::framing::errors::MessageDecryptionError;
use openmls::prelude::{
    ContentType, ProcessMessageError, ProcessedMessageContent, ProtocolMessage, Sender,
    ValidationError,
};

use super::{
    mls, parse_as, serialize, ChatId, GroupError, GroupMessage, GroupOpened, HeldKind,
    MAX_PAST_EPOCHS,
};
use crate::sessions::{named, spent, Sessions};

impl Sessions {
    /// `plaintext` sealed for group `group_id` in its current epoch.
    pub fn seal_group(&mut self, group_id: &str, plaintext: &[u8]) -> Result<Vec<u8>, GroupError> {
        let id = ChatId::parse(group_id)?;
        self.member_of(&id)?;
        self.atomically(&id, |this| {
            let message = this
                .groups
                .touch(&id)?
                .mls
                .create_message(&this.provider, &this.signer, plaintext)
                .map_err(mls)?;
            serialize(message, "group message")
        })
    }

    /// Opens a group message `from` sent: the MLS sender must be `from` itself. One of a later
    /// epoch is held until its commit arrives.
    pub fn open_group(
        &mut self,
        from: &Address,
        ciphertext: &[u8],
    ) -> Result<GroupOpened, GroupError> {
        let (id, message) = parse_as(ciphertext, ContentType::Application, "group message")?;
        let epoch = message.epoch().as_u64();
        let current = self.member_of(&id)?.mls.epoch().as_u64();
        self.atomically(&id, |this| {
            if epoch > current {
                this.hold(&id, HeldKind::Message, epoch, *from, ciphertext)?;
                return Ok(GroupOpened::Buffered);
            }
            this.open_in_group(&id, from, message)
                .map(GroupOpened::Opened)
        })
    }

    pub(super) fn open_bytes(
        &mut self,
        id: &ChatId,
        from: &Address,
        bytes: &[u8],
    ) -> Result<GroupMessage, GroupError> {
        let (_, message) = parse_as(bytes, ContentType::Application, "group message")?;
        self.open_in_group(id, from, message)
    }

    fn open_in_group(
        &mut self,
        id: &ChatId,
        from: &Address,
        message: ProtocolMessage,
    ) -> Result<GroupMessage, GroupError> {
        let epoch = message.epoch().as_u64();
        let group = self.groups.touch(id)?;
        let past = || GroupError::PastEpoch {
            group_id: id.0.clone(),
            epoch,
        };
        // openmls tells a dropped epoch and a spent key apart by neither words nor type.
        let kept = group.mls.epoch().as_u64().saturating_sub(MAX_PAST_EPOCHS);
        if epoch < group.membership.joined || epoch < kept {
            return Err(past());
        }
        let processed =
            group
                .mls
                .process_message(&self.provider, message)
                .map_err(|e| match e {
                    ProcessMessageError::ValidationError(ValidationError::UnableToDecrypt(
                        MessageDecryptionError::SecretTreeError(tree),
                    )) if spent(&tree) => GroupError::Spent {
                        group_id: id.0.clone(),
                        from: *from,
                    },
                    e => mls(e),
                })?;
        let sender = match processed.sender() {
            Sender::Member(_) => named(processed.credential()),
            _ => None,
        };
        if sender != Some(*from) {
            return Err(GroupError::NotBound {
                what: "group message",
                peer: *from,
            });
        }
        let ProcessedMessageContent::ApplicationMessage(message) = processed.into_content() else {
            return Err(GroupError::NotBound {
                what: "group message",
                peer: *from,
            });
        };
        Ok(GroupMessage {
            group_id: id.0.clone(),
            sender: *from,
            plaintext: message.into_bytes(),
        })
    }
}
