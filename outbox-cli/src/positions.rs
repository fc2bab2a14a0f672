//! `positions`: a strict consumer's position on one aggregate, and passing a version the producer skipped.

use outbox_core::ops::LetterStore;

use crate::args::PositionAction;
use crate::output::{Output, ops_error, print_report, request};
use crate::table::when;
use crate::{EXIT_OK, Outcome};

pub(crate) async fn positions(
    ops: &impl LetterStore,
    out: &Output,
    consumer: &str,
    action: PositionAction,
) -> Outcome {
    match action {
        PositionAction::Show { aggregate } => {
            let position = ops
                .position(consumer, &aggregate.aggregate_type, &aggregate.aggregate_id)
                .await
                .map_err(ops_error)?
                .ok_or_else(|| {
                    format!(
                        "consumer {consumer} has no position for {}/{}",
                        aggregate.aggregate_type, aggregate.aggregate_id
                    )
                })?;
            if out.json {
                out.json(&position);
            } else {
                println!(
                    "{consumer} at {}/{}: version {} ({}), moved {}",
                    position.aggregate_type,
                    position.aggregate_id,
                    position.version,
                    if position.pinned {
                        "started"
                    } else {
                        "not started"
                    },
                    when(&position.updated_at)
                );
            }
            Ok(EXIT_OK)
        }
        PositionAction::Pass {
            aggregate,
            version,
            who,
        } => {
            let request = request(&who)?;
            let report = ops
                .pass_version(
                    consumer,
                    &aggregate.aggregate_type,
                    &aggregate.aggregate_id,
                    version,
                    &request,
                )
                .await
                .map_err(ops_error)?;
            Ok(print_report(out, "passed", &report))
        }
    }
}
