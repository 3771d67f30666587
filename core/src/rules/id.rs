//! The id of a rule or a door, as rule files write it.

use serde::Deserialize;

/// A rule's or a door's id: lowercase letters, digits, '-', '_' and '.'.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct RuleId(pub String);

impl TryFrom<String> for RuleId {
    type Error = String;
    fn try_from(id: String) -> Result<Self, String> {
        let ok = !id.is_empty()
            && id.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_' || b == b'.');
        if ok {
            Ok(RuleId(id))
        } else {
            Err(format!("bad rule id {id:?}: use lowercase letters, digits, '-', '_' and '.'"))
        }
    }
}
