//! The key an aggregate's consumer rows are found by.

use sha2::{Digest, Sha256};

/// The SHA-256 of an aggregate's type (after its length in bytes) and its
/// id: the `aggregate_key` column of the consumer's tables. A 255-character
/// type and a 500-character id in `utf8mb4` (3,020 bytes) do not fit one
/// InnoDB key (3,072 bytes) together with the consumer's name; their
/// digest does. The length prefix keeps (`ab`, `c`) and (`a`, `bc`) apart,
/// so two aggregates share a key only by a SHA-256 collision.
pub(crate) fn aggregate_key(aggregate_type: &str, aggregate_id: &str) -> Vec<u8> {
    let mut hasher = Sha256::new();
    hasher.update((aggregate_type.len() as u64).to_be_bytes());
    hasher.update(aggregate_type.as_bytes());
    hasher.update(aggregate_id.as_bytes());
    hasher.finalize().to_vec()
}

#[cfg(test)]
mod tests {
    use super::aggregate_key;

    #[test]
    fn type_and_id_are_kept_apart() {
        assert_eq!(aggregate_key("order", "1").len(), 32);
        assert_eq!(aggregate_key("order", "1"), aggregate_key("order", "1"));
        assert_ne!(aggregate_key("order", "1"), aggregate_key("order1", ""));
        assert_ne!(aggregate_key("order", "1"), aggregate_key("Order", "1"));
    }
}
