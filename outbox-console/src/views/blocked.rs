//! `/blocked`: aggregates whose later events wait behind a retrying or
//! failed head, and the repairs of their heads.

use axum::Extension;
use axum::extract::{RawQuery, State};
use maud::{Markup, html};

use super::{csrf_field, cut, frame, time};
use crate::form::Fields;
use crate::{ConsoleError, ConsoleStore, Ctx, Operator};

/// The page (`?limit=`, default 100, at most 1,000).
pub(crate) async fn page<S: ConsoleStore>(
    State(shared): Ctx<S>,
    Extension(operator): Extension<Operator>,
    RawQuery(raw): RawQuery,
) -> Result<Markup, ConsoleError> {
    let fields = Fields::parse(raw.unwrap_or_default().as_bytes())?;
    let limit = fields.number("limit")?.unwrap_or(100).clamp(1, 1000);
    let blocked = shared.store.blocked(limit).await?;
    let base = &shared.base;
    let selectable = !shared.read_only && !blocked.is_empty();
    let body = html! {
        form.filters method="get" action={ (base) "/blocked" } {
            (super::rows_select(limit))
            button type="submit" { "Show" }
        }
        p.note {
            "An aggregate is blocked while its oldest unpublished event (its head) retries or has failed: "
            "its later events wait, in order. Retry a failed head once its cause is fixed, skip it if it must never be published, "
            "or try a retrying head now instead of at its next backoff."
        }
        form.confirm method="post" action={ (base) "/actions/preview" } {
            (csrf_field(&shared, &operator))
            table #blocked {
                thead { tr {
                    @if selectable { th { input.select-all type="checkbox" title="all"; } }
                    th { "aggregate" } th { "head" } th { "head status" } th { "last error" } th { "blocked since" }
                } }
                tbody {
                    @for b in &blocked {
                        tr {
                            @if selectable { td { input type="checkbox" name="id" value=(b.head_event_id); } }
                            td { (b.aggregate_type) " / " (b.aggregate_id) }
                            td { a href={ (base) "/events/" (b.head_event_id) } { code { (b.head_event_id) } } }
                            td { (b.head_status) }
                            td { (cut(b.last_error.as_deref().unwrap_or(""), 100)) }
                            td { (time(&b.blocked_since)) }
                        }
                    }
                }
            }
            @if blocked.is_empty() { p.empty #none { "No aggregate is blocked." } }
            @if selectable {
                div.actions {
                    "With the ticked heads: "
                    button type="submit" name="action" value="retry-failed" { "Retry failed heads" }
                    button type="submit" name="action" value="skip-failed" { "Skip failed heads" }
                    button type="submit" name="action" value="retry-blocked" { "Try retrying heads now" }
                }
            }
        }
        @if blocked.len() as i64 == limit {
            p.note { "Showing the oldest " (limit) "; choose more rows above (at most 1,000)." }
        }
    };
    Ok(frame(&shared, &operator, "Blocked aggregates", body))
}
