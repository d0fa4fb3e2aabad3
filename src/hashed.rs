//! Hashed index keys (a blind index): the secret, the keyed hash of an index value, and the
//! redacted form a record holds instead of the value.
//!
//! An index field marked `hashed` is keyed by `hex(HMAC-SHA-256(key, lower(value)))` instead
//! of its value ([RFC 2104](https://www.rfc-editor.org/rfc/rfc2104) with SHA-256, 64
//! lowercase hex digits), where `value` is the string form every key uses
//! ([`crate::keys::key_string`]) and `lower` the same lowercasing as plaintext keys. No
//! other normalisation: `123-45-6789` and `123456789` are different values, exactly as they
//! are for a plaintext index, so hashing a field never changes which lookups match. A
//! lookup hashes its value the same way, so it stays an exact, case-insensitive match;
//! ranges and prefixes over the value are impossible (the hash does not keep the order).
//!
//! A field marked `redact` (a subset of the hashed ones) is stored as
//! [`REDACTED_PREFIX`]` + hex` (`"hmac-sha256:c362…b4b1"`) instead of its value, in the WAL
//! entry and in every catalog row. A value already in that form is taken as hashed (it is
//! not hashed again), which is what lets the applier key a redacted record, and a WAL
//! filter logged in that form, exactly like the original.
//!
//! The secret comes from `TABLE_CATALOG_HASH_KEY` (in Azure a Key Vault reference the
//! Functions host resolves). It never appears in `Debug`, `Display`, logs or errors; the
//! catalog stores only its [`KeyId`] (first 8 hex digits of SHA-256 of the key), so a process
//! opened with another key fails instead of writing rows no lookup can find.

use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use crate::settings;

/// Shortest secret accepted, in bytes once decoded: the HMAC-SHA-256 output size, as
/// RFC 2104 section 3 recommends ("less than L bytes ... is strongly discouraged").
pub const MIN_KEY_BYTES: usize = 32;

/// What a redacted field holds before the 64 hex digits of the HMAC.
pub const REDACTED_PREFIX: &str = "hmac-sha256:";

/// Number of hex digits of an HMAC-SHA-256.
const HEX_LEN: usize = 64;

/// Why `TABLE_CATALOG_HASH_KEY` was refused. Never contains the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HashKeyError {
    /// Neither hex nor standard base64.
    #[error(
        "{}: not hex (only hex digits, even length) nor standard base64; generate one with `openssl rand -base64 32`",
        settings::HASH_KEY
    )]
    Encoding,
    /// Decoded, but shorter than `MIN_KEY_BYTES`.
    #[error(
        "{}: the key is {len} bytes once decoded ({encoding}); at least {MIN_KEY_BYTES} bytes are required (`openssl rand -base64 32`)",
        settings::HASH_KEY
    )]
    TooShort {
        /// Decoded length in bytes.
        len: usize,
        /// `hex` or `base64`.
        encoding: &'static str,
    },
    /// A Key Vault reference the Functions host did not resolve (it then passes the
    /// reference text itself).
    #[error(
        "{}: the Key Vault reference was not resolved; give the app's identity the Key Vault Secrets User role and check the secret URI",
        settings::HASH_KEY
    )]
    UnresolvedKeyVaultReference,
}

/// Identifies a secret without revealing it: the first 8 hex digits of SHA-256 of the key
/// bytes. Stored with the schema of a catalog with hashed fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyId(String);

impl KeyId {
    /// A stored key id (as read back from the schema row).
    pub fn from_stored(id: &str) -> KeyId {
        KeyId(id.to_string())
    }

    /// The 8 hex digits.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for KeyId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The HMAC secret of hashed index fields. `Debug` and `Display` print `[redacted]`.
#[derive(Clone)]
pub struct HashKey {
    /// The MAC keyed with the secret (cloned per hash); the raw bytes are not kept.
    mac: Hmac<Sha256>,
    id: KeyId,
}

impl std::fmt::Debug for HashKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("[redacted]")
    }
}

impl std::fmt::Display for HashKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("[redacted]")
    }
}

impl PartialEq for HashKey {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}

impl Eq for HashKey {}

impl HashKey {
    /// Parses the setting's value: hex when it is only hex digits of even length, else
    /// standard base64 (padding optional). Surrounding whitespace is ignored. At least
    /// `MIN_KEY_BYTES` bytes once decoded.
    pub fn from_setting(value: &str) -> Result<HashKey, HashKeyError> {
        let value = value.trim();
        if value.starts_with("@Microsoft.KeyVault(") {
            return Err(HashKeyError::UnresolvedKeyVaultReference);
        }
        let is_hex = !value.is_empty() && value.len() % 2 == 0 && value.bytes().all(|b| b.is_ascii_hexdigit());
        let (bytes, encoding) = if is_hex {
            let bytes = (0..value.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&value[i..i + 2], 16))
                .collect::<Result<Vec<u8>, _>>()
                .map_err(|_| HashKeyError::Encoding)?;
            (bytes, "hex")
        } else {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(value)
                .or_else(|_| base64::engine::general_purpose::STANDARD_NO_PAD.decode(value))
                .map_err(|_| HashKeyError::Encoding)?;
            (bytes, "base64")
        };
        if bytes.len() < MIN_KEY_BYTES {
            return Err(HashKeyError::TooShort { len: bytes.len(), encoding });
        }
        // HMAC accepts keys of any length: the error arm is never taken.
        let mac = <Hmac<Sha256> as Mac>::new_from_slice(&bytes).map_err(|_| HashKeyError::Encoding)?;
        let id = KeyId(Sha256::digest(&bytes).iter().take(4).map(|b| format!("{b:02x}")).collect());
        Ok(HashKey { mac, id })
    }

    /// The key id stored with the schema.
    pub fn id(&self) -> &KeyId {
        &self.id
    }

    /// `hex(HMAC-SHA-256(key, value))`, 64 lowercase hex digits. `value` must already be
    /// normalised (see [`HashKey::index_digest`]).
    pub fn hmac_hex(&self, value: &str) -> String {
        let mut mac = self.mac.clone();
        mac.update(value.as_bytes());
        mac.finalize().into_bytes().iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The value a hashed index field contributes to keys: the hex HMAC of the lowercased
    /// string form, or the hex of a value already in redacted form (`parse_redacted`).
    pub fn index_digest(&self, value: &str) -> String {
        match parse_redacted(value) {
            Some(hex) => hex.to_string(),
            None => self.hmac_hex(&value.to_lowercase()),
        }
    }

    /// The redacted form of `value`: `REDACTED_PREFIX` + [`HashKey::index_digest`].
    pub fn redacted(&self, value: &str) -> String {
        format!("{REDACTED_PREFIX}{}", self.index_digest(value))
    }
}

/// The 64 hex digits of a value in redacted form (`hmac-sha256:` + 64 lowercase hex
/// digits), or `None` for any other value.
pub fn parse_redacted(value: &str) -> Option<&str> {
    let hex = value.strip_prefix(REDACTED_PREFIX)?;
    (hex.len() == HEX_LEN && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))).then_some(hex)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes 0x00..=0x1f: `000102…1f` in hex, `AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=`.
    const HEX_KEY: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
    const B64_KEY: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";

    #[test]
    fn hmac_matches_python_hmac_module() {
        // python3 -c "import hmac,hashlib; k=bytes(range(32));
        //   print(hmac.new(k, b'123-45-6789', hashlib.sha256).hexdigest())"
        let key = HashKey::from_setting(HEX_KEY).unwrap();
        let want = "c36200a49b51d6ab68039265bc674b1d0c688fd833eaf123936d026ed25fb4b1";
        assert_eq!(key.hmac_hex("123-45-6789"), want);
        assert_eq!(key.index_digest("123-45-6789"), want);
        // Lowercased first, as plaintext keys are: hmac.new(k, 'straße'.encode(), sha256).
        assert_eq!(key.index_digest("STRAßE"), "0611a912ff68e85b8ae938a1235afa1ced51a83e376974614761551849583b5c");
        // python3 -c "import hashlib; print(hashlib.sha256(bytes(range(32))).hexdigest()[:8])"
        assert_eq!(key.id().as_str(), "630dcd29");
    }

    #[test]
    fn hex_and_base64_give_the_same_key() {
        let hex = HashKey::from_setting(HEX_KEY).unwrap();
        let b64 = HashKey::from_setting(B64_KEY).unwrap();
        assert_eq!(hex, b64);
        assert_eq!(HashKey::from_setting(B64_KEY.trim_end_matches('=')).unwrap(), hex, "padding is optional");
        assert_eq!(HashKey::from_setting(&format!(" {HEX_KEY}\n")).unwrap(), hex, "whitespace is ignored");
    }

    #[test]
    fn short_or_garbled_keys_are_refused_without_echoing_them() {
        let short = "00112233445566778899aabbccddeeff"; // 16 bytes of hex
        let err = HashKey::from_setting(short).unwrap_err();
        assert_eq!(err, HashKeyError::TooShort { len: 16, encoding: "hex" });
        let msg = err.to_string();
        assert!(msg.contains("TABLE_CATALOG_HASH_KEY") && msg.contains("at least 32 bytes"), "{msg}");
        assert!(!msg.contains(short), "{msg}");
        assert_eq!(HashKey::from_setting("not base64 at all!").unwrap_err(), HashKeyError::Encoding);
        assert_eq!(HashKey::from_setting("").unwrap_err(), HashKeyError::TooShort { len: 0, encoding: "base64" });
        let kv = "@Microsoft.KeyVault(SecretUri=https://v.vault.azure.net/secrets/k/)";
        assert_eq!(HashKey::from_setting(kv).unwrap_err(), HashKeyError::UnresolvedKeyVaultReference);
    }

    #[test]
    fn the_key_never_prints() {
        let key = HashKey::from_setting(HEX_KEY).unwrap();
        assert_eq!(format!("{key:?}"), "[redacted]");
        assert_eq!(key.to_string(), "[redacted]");
        assert_eq!(format!("{:?}", Some(key.clone())), "Some([redacted])");
    }

    #[test]
    fn redacted_values_are_not_hashed_again() {
        let key = HashKey::from_setting(HEX_KEY).unwrap();
        let once = key.redacted("123-45-6789");
        assert_eq!(once, "hmac-sha256:c36200a49b51d6ab68039265bc674b1d0c688fd833eaf123936d026ed25fb4b1");
        assert_eq!(key.redacted(&once), once);
        assert_eq!(key.index_digest(&once), key.index_digest("123-45-6789"));
        // Anything else in the prefix is a plain value and is hashed.
        assert_eq!(parse_redacted("hmac-sha256:ABC"), None);
        assert_eq!(parse_redacted(&once.to_uppercase()), None);
        assert_ne!(key.index_digest("hmac-sha256:abc"), "abc");
    }
}
