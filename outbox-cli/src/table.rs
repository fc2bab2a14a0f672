//! Human output: left-aligned columns separated by two spaces, a header
//! row, `-` for empty cells. Written by hand rather than with a table
//! crate: fixed, terminal-independent output is what the golden tests and
//! scripts that grep it need, and it is a few lines.

use outbox_core::ops::format;

/// A table being built.
pub(crate) struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub(crate) fn new(header: &[&str]) -> Table {
        Table {
            header: header.iter().map(|h| (*h).to_owned()).collect(),
            rows: Vec::new(),
        }
    }

    pub(crate) fn row(&mut self, cells: Vec<String>) {
        self.rows.push(
            cells
                .into_iter()
                .map(|c| if c.is_empty() { "-".to_owned() } else { c })
                .collect(),
        );
    }

    pub(crate) fn render(&self) -> String {
        let columns = self.header.len();
        let mut widths: Vec<usize> = self.header.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (index, cell) in row.iter().enumerate().take(columns) {
                widths[index] = widths[index].max(cell.chars().count());
            }
        }
        let mut out = String::new();
        for row in std::iter::once(&self.header).chain(&self.rows) {
            let line: Vec<String> = row
                .iter()
                .enumerate()
                .map(|(index, cell)| {
                    if index + 1 == columns {
                        cell.clone()
                    } else {
                        format!("{cell:<width$}", width = widths[index])
                    }
                })
                .collect();
            out.push_str(line.join("  ").trim_end());
            out.push('\n');
        }
        out
    }
}

/// A cell for an optional value.
pub(crate) fn opt<T: std::fmt::Display>(value: &Option<T>) -> String {
    value.as_ref().map(ToString::to_string).unwrap_or_default()
}

/// An age in seconds as a short duration (`42s`, `3m 12s`, `2h 5m`, `3d 4h`),
/// worded as the console words it.
pub(crate) fn age(seconds: Option<f64>) -> String {
    format::short_age(seconds)
}

/// A long text on one line, cut to `max` characters with `…`.
pub(crate) fn cut(text: &str, max: usize) -> String {
    let line = format::one_line(text);
    format::cut_chars(&line, max).unwrap_or(line)
}

/// A point in time as tables show it (UTC, to the second).
pub(crate) fn when(at: &chrono::DateTime<chrono::Utc>) -> String {
    format::utc_time(at)
}
