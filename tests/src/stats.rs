//! Small statistics for the benchmarks: medians, percentiles, and the
//! one-line summary of per-round ratios.

/// The median (sorts `values`).
pub fn median(values: &mut [f64]) -> f64 {
    percentile(values, 0.5)
}

/// The `p` quantile, 0.0 to 1.0, nearest rank (sorts `values`).
pub fn percentile(values: &mut [f64], p: f64) -> f64 {
    assert!(!values.is_empty(), "no values");
    values.sort_by(|a, b| a.total_cmp(b));
    let index = ((values.len() as f64 - 1.0) * p).round() as usize;
    values[index]
}

/// `name: median M (min A, max B, n=N)`.
pub fn summary(name: &str, values: &[f64]) -> String {
    let mut sorted = values.to_vec();
    let med = median(&mut sorted);
    format!(
        "{name}: median {med:.3} (min {:.3}, max {:.3}, n={})",
        sorted[0],
        sorted[sorted.len() - 1],
        sorted.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_percentiles_pick_ranks() {
        let mut values = vec![5.0, 1.0, 3.0, 2.0, 4.0];
        assert_eq!(median(&mut values), 3.0);
        assert_eq!(percentile(&mut values, 0.0), 1.0);
        assert_eq!(percentile(&mut values, 1.0), 5.0);
        assert_eq!(
            summary("r", &[2.0, 1.0, 3.0]),
            "r: median 2.000 (min 1.000, max 3.000, n=3)"
        );
    }
}
