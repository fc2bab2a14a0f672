//! Items the derive's generated code names through
//! `::outbox_core::__private`. Not public API: users never import these.

pub use core::option::Option;
pub use core::result::Result;
pub use inventory;
pub use serde_json::Value;
pub use serde_json::value::RawValue;
pub use std::string::String;
pub use uuid::Uuid;

pub use crate::contract::{CompatibilityMode, EventContract, UpcastKind, UpcastLink};
pub use crate::registry::ContractEntry;
pub use crate::upcast::{
    BoxError, DecodeError, JsonUpcastFn, UpcastFailure, UpcastFrom, decode_json,
};

/// Renders the field marked `#[outbox(aggregate_id)]` as the string id.
#[diagnostic::on_unimplemented(
    message = "the `#[outbox(aggregate_id)]` field has type `{Self}`, which cannot be rendered as a string id",
    label = "this type does not implement `Display`",
    note = "use a type that implements `std::fmt::Display` (String, Uuid, an integer, or a newtype that implements Display)"
)]
pub trait AggregateIdField {
    /// The id as a string.
    fn to_aggregate_id(&self) -> String;
}

impl<T: core::fmt::Display + ?Sized> AggregateIdField for T {
    fn to_aggregate_id(&self) -> String {
        self.to_string()
    }
}

/// Reads the field marked `#[outbox(aggregate_version)]` as an i64.
#[diagnostic::on_unimplemented(
    message = "the `#[outbox(aggregate_version)]` field has type `{Self}`, which is not an aggregate version",
    label = "expected an integer type that fits in i64",
    note = "use i64, i32, i16, u32 or u16 (the store keeps versions as bigint)"
)]
pub trait AggregateVersionField {
    /// The version as i64.
    fn to_aggregate_version(&self) -> i64;
}

macro_rules! version_field {
    ($($ty:ty),*) => {$(
        impl AggregateVersionField for $ty {
            fn to_aggregate_version(&self) -> i64 {
                i64::from(*self)
            }
        }
    )*};
}
version_field!(i64, i32, i16, u32, u16);

/// `a == b` for string slices, usable in const context.
pub const fn str_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut index = 0;
    while index < a.len() {
        if a[index] != b[index] {
            return false;
        }
        index += 1;
    }
    true
}
