//! Cross-cutting rules on the model, run after parsing: required keys,
//! value formats, field roles and the upcast chain's shape. Every violation
//! is recorded in the [`Ctxt`] with a span on the culprit and a fix.

use proc_macro2::Span;
use quote::ToTokens;

use super::Ctxt;
use super::ast::Container;
use super::attr;

/// Runs every check.
pub(crate) fn check(cx: &Ctxt, cont: &Container<'_>) {
    check_required_keys(cx, cont);
    check_event_type(cx, cont);
    check_aggregate(cx, cont);
    check_version_and_upcasts(cx, cont);
    check_generics(cx, cont);
    check_field_roles(cx, cont);
}

fn check_required_keys(cx: &Ctxt, cont: &Container<'_>) {
    let attrs = &cont.attrs;
    if attrs.outbox_attr.is_none() {
        cx.error_spanned_by(
            cont.ident,
            "missing #[outbox(...)] on the struct: add \
             #[outbox(event_type = \"order.created\", aggregate = \"order\", version = 1)]",
        );
        return;
    }
    let blame = attr::blame(attrs, Span::call_site());
    let [event_type, aggregate, version] = attrs.seen_required;
    for (present, key, example) in [
        (event_type, "event_type", "event_type = \"order.created\""),
        (aggregate, "aggregate", "aggregate = \"order\""),
        (version, "version", "version = 1"),
    ] {
        if !present {
            cx.error_spanned_by(
                &blame,
                format!("missing `{key}` in #[outbox(...)]: add `{example}`"),
            );
        }
    }
}

/// `order.created`: two or more segments, each `[a-z][a-z0-9_]*`.
pub(crate) fn is_valid_event_type(value: &str) -> bool {
    let segments: Vec<&str> = value.split('.').collect();
    segments.len() >= 2 && segments.iter().all(|s| is_valid_segment(s))
}

fn is_valid_segment(segment: &str) -> bool {
    let mut chars = segment.chars();
    matches!(chars.next(), Some('a'..='z'))
        && chars.all(|c| matches!(c, 'a'..='z' | '0'..='9' | '_'))
}

fn check_event_type(cx: &Ctxt, cont: &Container<'_>) {
    if let Some(event_type) = &cont.attrs.event_type {
        let value = event_type.value.value();
        if !is_valid_event_type(&value) {
            cx.error_spanned_by(
                &event_type.value,
                format!(
                    "invalid event_type {value:?}: use lowercase dot-separated segments such as \"order.created\" \
                     (at least two segments; each starts with a-z and holds only a-z, 0-9 and _)"
                ),
            );
        }
    }
}

fn check_aggregate(cx: &Ctxt, cont: &Container<'_>) {
    if let Some(aggregate) = &cont.attrs.aggregate {
        let value = aggregate.value.value();
        if !is_valid_segment(&value) {
            cx.error_spanned_by(
                &aggregate.value,
                format!(
                    "invalid aggregate {value:?}: use one lowercase word such as \"order\" \
                     (starts with a-z, holds only a-z, 0-9 and _)"
                ),
            );
        }
    }
}

fn check_version_and_upcasts(cx: &Ctxt, cont: &Container<'_>) {
    let attrs = &cont.attrs;
    let Some(version) = &attrs.version else {
        return;
    };
    let version_number = version.value;
    if version_number == 0 {
        cx.error_spanned_by(
            &version.tokens,
            "version starts at 1: the first version of a contract is `version = 1`",
        );
        return;
    }
    if let (Some(upcast_from), 1) = (&attrs.upcast_from, version_number) {
        cx.error_spanned_by(
            &upcast_from.tokens,
            "version 1 has no predecessor: remove `upcast_from`, or raise `version`",
        );
    }
    let mut seen: Vec<u32> = Vec::new();
    for upcast in &attrs.upcasts {
        if upcast.from == 0 || upcast.from >= version_number {
            cx.error_spanned_by(
                &upcast.from_lit,
                format!(
                    "`upcast(from = {})` must read an older version: from = 1 ..= {} for a contract at version {version_number}",
                    upcast.from,
                    version_number.saturating_sub(1),
                ),
            );
            continue;
        }
        if seen.contains(&upcast.from) {
            cx.error_spanned_by(
                &upcast.from_lit,
                format!(
                    "duplicate `upcast(from = {})`: one upcaster per version",
                    upcast.from
                ),
            );
            continue;
        }
        if let Some(upcast_from) = &attrs.upcast_from {
            let predecessor = upcast_from
                .value
                .to_token_stream()
                .to_string()
                .replace(' ', "");
            cx.error_spanned_by(
                &upcast.tokens,
                format!(
                    "`upcast(from = {})` conflicts with `upcast_from = {predecessor}`: steps below v{version_number} \
                     belong to the predecessor; move this upcaster to `{predecessor}`",
                    upcast.from
                ),
            );
            continue;
        }
        seen.push(upcast.from);
    }
    if !seen.is_empty() && attrs.upcast_from.is_none() {
        seen.sort_unstable();
        let lowest = seen[0];
        let missing: Vec<String> = (lowest..version_number)
            .filter(|v| !seen.contains(v))
            .map(|v| format!("upcast(from = {v}, ...)"))
            .collect();
        if !missing.is_empty() {
            cx.error_spanned_by(
                &attrs.upcasts[0].tokens,
                format!(
                    "the JSON upcast chain has a hole: v{lowest} cannot reach v{version_number}; add {}",
                    missing.join(", ")
                ),
            );
        }
    }
}

fn check_generics(cx: &Ctxt, cont: &Container<'_>) {
    if !cont.generics.params.is_empty() {
        cx.error_spanned_by(
            &cont.generics.params,
            "an event contract cannot be generic: each (event_type, version) has exactly one schema; \
             use a concrete struct (one contract per event type)",
        );
    }
}

fn check_field_roles(cx: &Ctxt, cont: &Container<'_>) {
    let mut id_field: Option<&syn::Ident> = None;
    let mut version_field: Option<&syn::Ident> = None;
    for field in &cont.fields {
        let attrs = &field.attrs;
        if let Some(tokens) = &attrs.aggregate_id {
            match id_field {
                Some(first) => cx.error_spanned_by(
                    tokens,
                    format!(
                        "a contract has exactly one aggregate id, and `{first}` is already marked; \
                         remove #[outbox(aggregate_id)] from one of the fields"
                    ),
                ),
                None => id_field = Some(field.ident),
            }
            if let Some(redact) = &attrs.redact {
                cx.error_spanned_by(
                    redact,
                    "the aggregate id cannot be redacted: it travels unmasked in headers, subjects and keys; \
                     use an opaque id (a UUID) and redact the personal data fields instead",
                );
            }
            if let Some(flatten) = &attrs.flatten {
                cx.error_spanned_by(
                    flatten,
                    "the aggregate id cannot be a #[serde(flatten)] field; mark a plain field",
                );
            }
        }
        if let Some(tokens) = &attrs.aggregate_version {
            match version_field {
                Some(first) => cx.error_spanned_by(
                    tokens,
                    format!(
                        "only one field can carry the aggregate version, and `{first}` is already marked; \
                         remove #[outbox(aggregate_version)] from one of the fields"
                    ),
                ),
                None => version_field = Some(field.ident),
            }
            if attrs.aggregate_id.is_some() {
                cx.error_spanned_by(
                    tokens,
                    "one field cannot be both the aggregate id and the aggregate version",
                );
            }
        }
        if let (Some(redact), Some(_)) = (&attrs.redact, &attrs.flatten) {
            cx.error_spanned_by(
                redact,
                "#[outbox(redact)] cannot be combined with #[serde(flatten)]: the flattened keys are not known \
                 at compile time; mark the sensitive fields of the flattened type's parent explicitly or stop flattening",
            );
        }
    }
    if id_field.is_none() {
        cx.error_spanned_by(
            cont.ident,
            format!(
                "`{}` has no aggregate id: mark exactly one field with #[outbox(aggregate_id)]",
                cont.ident
            ),
        );
    }
}
