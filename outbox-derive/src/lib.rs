//! `#[derive(OutboxEvent)]`: turns an annotated struct into a versioned
//! event contract of the outbox framework.
//!
//! Use it through `outbox-core`, which re-exports it. The pipeline follows
//! serde_derive and thiserror: `internals::ast` builds the model from the
//! syntax tree (every bad attribute becomes an error in one `Ctxt`),
//! `internals::check` runs the cross-cutting rules, `expand` generates the
//! impl, and `fallback` emits a stub impl next to the errors so the user
//! sees the real problem, not a cascade.

mod expand;
mod fallback;
mod internals;

use proc_macro::TokenStream;
use syn::{DeriveInput, parse_macro_input};

/// Derives `outbox_core::OutboxEvent`. Container attribute:
/// `#[outbox(event_type = "order.created", aggregate = "order", version = 2,
/// upcast_from = OrderCreatedV1, upcast(from = 1, with = path::to::fn),
/// crate = "outbox_core")]`; field attributes: `#[outbox(aggregate_id)]`
/// (exactly one), `#[outbox(redact)]`, `#[outbox(aggregate_version)]`.
#[proc_macro_derive(OutboxEvent, attributes(outbox))]
pub fn derive_outbox_event(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    expand::derive(&input).into()
}
