//! Key packages as the relay's directory carries them (`docs/protocol.md#key-package-directory`):
//! opaque bytes to the relay, 1 byte to 16 KiB each, base64 on the wire, at most 100 in one
//! `PublishKeyPackages`. The bounds are checked while a frame decodes, so a frame carrying a
//! package out of bounds is an invalid frame and nothing past the decoder holds one.

use std::fmt;

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::encoding::{b64_decode_at_most, b64_encode};
use crate::limits::{MAX_KEY_PACKAGES_PER_FRAME, MAX_KEY_PACKAGE_BYTES};

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum KeyPackageError {
    #[error("a key package is empty")]
    Empty,
    #[error("a key package is over {MAX_KEY_PACKAGE_BYTES} bytes or not canonical base64")]
    Undecodable,
    #[error("a key package is over {MAX_KEY_PACKAGE_BYTES} bytes")]
    TooLarge,
    #[error("more than {MAX_KEY_PACKAGES_PER_FRAME} key packages in one frame")]
    TooMany,
}

/// One key package: 1 to [`MAX_KEY_PACKAGE_BYTES`] opaque bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct KeyPackage(Vec<u8>);

impl KeyPackage {
    pub fn new(bytes: Vec<u8>) -> Result<Self, KeyPackageError> {
        if bytes.is_empty() {
            return Err(KeyPackageError::Empty);
        }
        if bytes.len() > MAX_KEY_PACKAGE_BYTES {
            return Err(KeyPackageError::TooLarge);
        }
        Ok(Self(bytes))
    }

    /// Decodes the wire form: canonical base64 of 1 to 16 KiB.
    pub fn from_base64(s: &str) -> Result<Self, KeyPackageError> {
        let bytes =
            b64_decode_at_most(s, MAX_KEY_PACKAGE_BYTES).ok_or(KeyPackageError::Undecodable)?;
        Self::new(bytes)
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

/// The length only: a package is opaque, and a log line should not grow with one.
impl fmt::Debug for KeyPackage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyPackage({} bytes)", self.0.len())
    }
}

impl Serialize for KeyPackage {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&b64_encode(&self.0))
    }
}

impl<'de> Deserialize<'de> for KeyPackage {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::from_base64(&s).map_err(D::Error::custom)
    }
}

/// The one-time packages of one `PublishKeyPackages`, oldest first: at most
/// [`MAX_KEY_PACKAGES_PER_FRAME`], possibly none.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct KeyPackageBatch(Vec<KeyPackage>);

impl KeyPackageBatch {
    pub fn new(packages: Vec<KeyPackage>) -> Result<Self, KeyPackageError> {
        if packages.len() > MAX_KEY_PACKAGES_PER_FRAME {
            return Err(KeyPackageError::TooMany);
        }
        Ok(Self(packages))
    }

    pub fn as_slice(&self) -> &[KeyPackage] {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl<'de> Deserialize<'de> for KeyPackageBatch {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Self::new(Vec::deserialize(d)?).map_err(D::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_package_is_one_byte_to_16_kib_of_canonical_base64() {
        for n in [1, MAX_KEY_PACKAGE_BYTES] {
            let package = KeyPackage::new(vec![5; n]).unwrap();
            let wire = serde_json::to_string(&package).unwrap();
            assert_eq!(serde_json::from_str::<KeyPackage>(&wire).unwrap(), package);
        }
        assert_eq!(KeyPackage::new(Vec::new()), Err(KeyPackageError::Empty));
        assert_eq!(
            KeyPackage::new(vec![5; MAX_KEY_PACKAGE_BYTES + 1]),
            Err(KeyPackageError::TooLarge)
        );
        assert_eq!(KeyPackage::from_base64(""), Err(KeyPackageError::Empty));
        let over = b64_encode(&vec![5; MAX_KEY_PACKAGE_BYTES + 1]);
        assert_eq!(
            KeyPackage::from_base64(&over),
            Err(KeyPackageError::Undecodable)
        );
        for bad in ["AQ", "AQ==\n", "AR==", "-_-_", "not base64!"] {
            assert_eq!(
                KeyPackage::from_base64(bad),
                Err(KeyPackageError::Undecodable),
                "{bad:?}"
            );
        }
        assert_eq!(
            format!("{:?}", KeyPackage::new(vec![1; 300]).unwrap()),
            "KeyPackage(300 bytes)"
        );
    }

    #[test]
    fn a_batch_holds_at_most_100() {
        let one = KeyPackage::new(vec![1]).unwrap();
        let full = vec![one.clone(); MAX_KEY_PACKAGES_PER_FRAME];
        assert_eq!(
            KeyPackageBatch::new(full.clone()).unwrap().as_slice().len(),
            100
        );
        let mut over = full;
        over.push(one);
        assert_eq!(KeyPackageBatch::new(over), Err(KeyPackageError::TooMany));
        assert!(KeyPackageBatch::default().is_empty());
    }
}
