//! `/audit`: who repaired what, when and why, newest first.

use axum::Extension;
use axum::extract::{RawQuery, State};
use maud::{Markup, html};

use outbox_core::ops::page_limit;

use super::{audit_table, frame};
use crate::form::Fields;
use crate::{ConsoleError, ConsoleStore, Ctx, Operator};

/// The page (`?before=` a row id for older rows, `?limit=`).
pub(crate) async fn page<S: ConsoleStore>(
    State(shared): Ctx<S>,
    Extension(operator): Extension<Operator>,
    RawQuery(raw): RawQuery,
) -> Result<Markup, ConsoleError> {
    let fields = Fields::parse(raw.unwrap_or_default().as_bytes())?;
    let page = shared
        .store
        .audit(fields.number("before")?, fields.number("limit")?)
        .await?;
    let base = &shared.base;
    let rows = page_limit(fields.number("limit")?);
    let body = html! {
        form.filters method="get" action={ (base) "/audit" } {
            @if let Some(before) = fields.get("before") { input type="hidden" name="before" value=(before); }
            (super::rows_select(rows))
            button type="submit" { "Show" }
        }
        (audit_table(&page.items))
        @if let Some(next) = page.next {
            p.pager { a #next href={ (base) "/audit?" (crate::form::query([("before", next.to_string()), ("limit", fields.get("limit").unwrap_or_default().to_owned())])) } { "Older" } }
        }
    };
    Ok(frame(&shared, &operator, "Audit log", body))
}
