//! `audit`: who repaired what, when and why.

use outbox_core::ops::OperationsStore;

use crate::output::{Output, ops_error, print_next};
use crate::table::{Table, cut, when};
use crate::{EXIT_OK, Outcome};

pub(crate) async fn audit(
    ops: &impl OperationsStore,
    out: &Output,
    limit: Option<i64>,
    before: Option<i64>,
) -> Outcome {
    let page = ops.audit(before, limit).await.map_err(ops_error)?;
    if out.json {
        out.json(&page);
        return Ok(EXIT_OK);
    }
    let mut table = Table::new(&["ID", "AT", "OPERATOR", "ACTION", "TARGET", "IDS", "REASON"]);
    for a in &page.items {
        table.row(vec![
            a.id.to_string(),
            when(&a.at),
            a.operator.clone(),
            a.action.clone(),
            a.target.clone(),
            cut(&a.ids.join(","), 40),
            cut(&a.reason, 60),
        ]);
    }
    print!("{}", table.render());
    print_next(page.next, "--before");
    Ok(EXIT_OK)
}
