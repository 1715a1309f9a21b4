//! What the store keeps for a key at a revision. Both the head ([`crate::kv`]) and its
//! history ([`crate::history`]) hold these, so the type sits below both of them.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::command::KeyValue;

/// What the store keeps for a key (the key itself is the map key).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Value {
    pub create_revision: i64,
    pub mod_revision: i64,
    pub version: i64,
    pub value: Bytes,
    pub lease: i64,
}

impl Value {
    pub fn to_key_value(&self, key: &Bytes) -> KeyValue {
        KeyValue {
            key: key.clone(),
            create_revision: self.create_revision,
            mod_revision: self.mod_revision,
            version: self.version,
            value: self.value.clone(),
            lease: self.lease,
        }
    }
}
