//! Properties of the address parser (fuzz target `address_parse`).

use courier_proto::address::ADDRESS_STR_LEN;
use courier_proto::{Address, AddressError};

/// `Address::parse`: exactly one string names each address. Whatever parses is the canonical
/// rendering of its hash; a string that parses only once lowercased is refused as uppercase;
/// and the address any 20 hash bytes make parses back to itself.
pub fn address_parse(data: &[u8]) {
    if let Some(hash) = data.first_chunk::<20>() {
        let address = Address::from_hash(*hash);
        let rendered = address.to_string();
        assert_eq!(rendered.len(), ADDRESS_STR_LEN);
        assert_eq!(Address::parse(&rendered), Ok(address), "{rendered}");
    }
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match Address::parse(text) {
        Ok(address) => {
            assert_eq!(address.to_string(), text, "a second spelling parsed");
            assert_eq!(Address::from_hash(*address.hash_bytes()), address);
            let json = serde_json::to_string(&address).expect("addresses serialize");
            assert_eq!(
                serde_json::from_str::<Address>(&json).ok(),
                Some(address),
                "{json}"
            );
        }
        Err(error) => {
            let lower = text.to_ascii_lowercase();
            if lower != text && Address::parse(&lower).is_ok() {
                assert_eq!(
                    error,
                    AddressError::Uppercase,
                    "{text:?} spells an address in another case"
                );
            }
        }
    }
}
