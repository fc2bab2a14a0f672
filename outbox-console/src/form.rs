//! Form bodies and query strings as the ordered pairs they are (a form may
//! repeat a field: one `id` per ticked row).

use chrono::{DateTime, NaiveDate, NaiveDateTime, Utc};

use crate::ConsoleError;

/// The fields of a form body or a query string.
#[derive(Debug, Default, Clone)]
pub(crate) struct Fields(Vec<(String, String)>);

impl Fields {
    /// Parses `application/x-www-form-urlencoded` text. A NUL character
    /// (`%00`) in a name or value is refused: no store's filters can hold
    /// one (PostgreSQL's `text` refuses it), and the page would otherwise
    /// answer with a database error.
    pub(crate) fn parse(text: &[u8]) -> Result<Fields, ConsoleError> {
        let fields: Vec<(String, String)> = form_urlencoded::parse(text)
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        if let Some((name, _)) = fields
            .iter()
            .find(|(k, v)| k.contains('\0') || v.contains('\0'))
        {
            return Err(ConsoleError::BadRequest(format!(
                "field {:?} contains a NUL character",
                name.replace('\0', "\\0")
            )));
        }
        Ok(Fields(fields))
    }

    /// The first non-empty value of `name`, trimmed.
    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .filter(|(k, _)| k == name)
            .map(|(_, v)| v.trim())
            .find(|v| !v.is_empty())
    }

    /// Every non-empty value of `name`, in order.
    pub(crate) fn all(&self, name: &str) -> Vec<&str> {
        self.0
            .iter()
            .filter(|(k, _)| k == name)
            .map(|(_, v)| v.trim())
            .filter(|v| !v.is_empty())
            .collect()
    }

    /// `name` as a number, when given.
    pub(crate) fn number(&self, name: &str) -> Result<Option<i64>, ConsoleError> {
        self.get(name)
            .map(|v| {
                v.parse().map_err(|_| {
                    ConsoleError::BadRequest(format!("{name} must be a whole number, not {v:?}"))
                })
            })
            .transpose()
    }

    /// `name` as a point in time: RFC 3339, or `YYYY-MM-DD[ T]HH:MM[:SS]`
    /// read as UTC, or `YYYY-MM-DD` alone (the start of that day, UTC).
    pub(crate) fn time(&self, name: &str) -> Result<Option<DateTime<Utc>>, ConsoleError> {
        let Some(text) = self.get(name) else {
            return Ok(None);
        };
        if let Ok(at) = DateTime::parse_from_rfc3339(text) {
            return Ok(Some(at.with_timezone(&Utc)));
        }
        [
            "%Y-%m-%dT%H:%M:%S",
            "%Y-%m-%dT%H:%M",
            "%Y-%m-%d %H:%M:%S",
            "%Y-%m-%d %H:%M",
        ]
        .iter()
        .find_map(|format| NaiveDateTime::parse_from_str(text, format).ok())
        .or_else(|| {
            // A date alone: the start of that day.
            NaiveDate::parse_from_str(text, "%Y-%m-%d")
                .ok()
                .and_then(|day| day.and_hms_opt(0, 0, 0))
        })
        .map(|at| Some(at.and_utc()))
        .ok_or_else(|| {
            ConsoleError::BadRequest(format!(
                "{name} must be a time like 2026-12-06 05:40 (UTC), a date like 2026-12-06, or RFC 3339, not {text:?}"
            ))
        })
    }
}

/// A query string built from pairs, empty values left out.
pub(crate) fn query<'a>(pairs: impl IntoIterator<Item = (&'a str, String)>) -> String {
    let mut out = form_urlencoded::Serializer::new(String::new());
    for (name, value) in pairs {
        if !value.is_empty() {
            out.append_pair(name, &value);
        }
    }
    out.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_fields_and_times() {
        let fields = Fields::parse(b"id=a&id=&id=b&since=2026-12-06T05%3A40&limit=x").unwrap();
        assert_eq!(fields.all("id"), vec!["a", "b"]);
        assert_eq!(
            fields.time("since").unwrap().unwrap().to_rfc3339(),
            "2026-12-06T05:40:00+00:00"
        );
        assert!(fields.number("limit").is_err());
        let day = Fields::parse(b"since=2026-12-06&until=06.12.2026").unwrap();
        assert_eq!(
            day.time("since").unwrap().unwrap().to_rfc3339(),
            "2026-12-06T00:00:00+00:00",
            "a date alone is the start of that day"
        );
        assert!(day.time("until").is_err());
        // %00 would reach the store's filter and fail there (a 500 on
        // PostgreSQL): refused as a bad request.
        let nul = Fields::parse(b"event_type=a%00b").unwrap_err().to_string();
        assert!(nul.contains("event_type") && nul.contains("NUL"), "{nul}");
        assert_eq!(query([("a", "x y".into()), ("b", String::new())]), "a=x+y");
    }
}
