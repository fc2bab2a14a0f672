//! serde's `rename_all` rules applied to a field name, so the derive knows
//! the serialized key of a redacted field. Field names are snake_case by
//! Rust convention; the conversions below assume it, as serde does.

/// A `rename_all` rule.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum RenameRule {
    Lower,
    Upper,
    Pascal,
    Camel,
    Snake,
    ScreamingSnake,
    Kebab,
    ScreamingKebab,
}

impl RenameRule {
    /// Parses the rule names serde accepts.
    pub(crate) fn from_str(name: &str) -> Option<RenameRule> {
        Some(match name {
            "lowercase" => RenameRule::Lower,
            "UPPERCASE" => RenameRule::Upper,
            "PascalCase" => RenameRule::Pascal,
            "camelCase" => RenameRule::Camel,
            "snake_case" => RenameRule::Snake,
            "SCREAMING_SNAKE_CASE" => RenameRule::ScreamingSnake,
            "kebab-case" => RenameRule::Kebab,
            "SCREAMING-KEBAB-CASE" => RenameRule::ScreamingKebab,
            _ => return None,
        })
    }

    /// The serialized key of a snake_case field under this rule.
    pub(crate) fn apply_to_field(self, field: &str) -> String {
        match self {
            RenameRule::Lower | RenameRule::Snake => field.to_owned(),
            RenameRule::Upper | RenameRule::ScreamingSnake => field.to_ascii_uppercase(),
            RenameRule::Pascal => {
                let mut out = String::with_capacity(field.len());
                let mut capitalize = true;
                for ch in field.chars() {
                    if ch == '_' {
                        capitalize = true;
                    } else if capitalize {
                        out.push(ch.to_ascii_uppercase());
                        capitalize = false;
                    } else {
                        out.push(ch);
                    }
                }
                out
            }
            RenameRule::Camel => {
                let pascal = RenameRule::Pascal.apply_to_field(field);
                let mut chars = pascal.chars();
                match chars.next() {
                    Some(first) => first.to_ascii_lowercase().to_string() + chars.as_str(),
                    None => pascal,
                }
            }
            RenameRule::Kebab => field.replace('_', "-"),
            RenameRule::ScreamingKebab => field.to_ascii_uppercase().replace('_', "-"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::RenameRule::*;

    #[test]
    fn converts_like_serde() {
        for (rule, expected) in [
            (Lower, "customer_email"),
            (Upper, "CUSTOMER_EMAIL"),
            (Pascal, "CustomerEmail"),
            (Camel, "customerEmail"),
            (Snake, "customer_email"),
            (ScreamingSnake, "CUSTOMER_EMAIL"),
            (Kebab, "customer-email"),
            (ScreamingKebab, "CUSTOMER-EMAIL"),
        ] {
            assert_eq!(rule.apply_to_field("customer_email"), expected);
        }
    }
}
