//! Who is acting: the console trusts nothing of a request but what the
//! embedding service (or the standalone tool) says about its operator, and
//! every action carries a CSRF token bound to that operator.

use std::sync::Arc;

use axum::http::HeaderMap;
use axum::http::request::Parts;
use sha2::{Digest, Sha256};

/// The operator of a request, as [`Identify`] named them; every audit row
/// an action writes carries this name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operator(pub String);

/// How a request was refused before any page was rendered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Unidentified {
    /// No operator: answer 401 and ask for HTTP Basic credentials.
    Challenge,
    /// No operator and nothing to ask for: answer 403.
    Refuse,
}

type IdentifyFn = dyn Fn(&Parts) -> Result<Operator, Unidentified> + Send + Sync;

/// How the console learns who the operator of a request is. The embedding
/// service decides: typically from what its auth middleware put in the
/// request's extensions ([`Identify::from_fn`]). A request without an
/// operator sees nothing, not even the status page.
#[derive(Clone)]
pub struct Identify(Arc<IdentifyFn>);

impl std::fmt::Debug for Identify {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Identify(..)")
    }
}

impl Identify {
    /// The operator is what `operator` returns for the request's parts
    /// (headers, extensions); `None` refuses the request with 403.
    ///
    /// ```
    /// # #[derive(Clone)] struct User { login: String }
    /// use outbox_console::Identify;
    /// // The service's auth middleware inserted a `User` extension.
    /// let identify = Identify::from_fn(|parts| {
    ///     parts.extensions.get::<User>().map(|user| user.login.clone())
    /// });
    /// ```
    pub fn from_fn(
        operator: impl Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    ) -> Identify {
        Identify(Arc::new(move |parts| {
            operator(parts)
                .and_then(|name| operator_name(&name))
                .ok_or(Unidentified::Refuse)
        }))
    }

    /// Every request acts as `operator`: for a console only its operator
    /// can reach (the standalone tool on a loopback address; pair it with
    /// [`Console::allowed_hosts`](crate::Console::allowed_hosts), or a page
    /// of another site that rebinds its name to 127.0.0.1 acts too). A name
    /// the audit cannot keep (empty, control or invisible characters, over
    /// 200 characters) refuses every request.
    pub fn fixed(operator: impl Into<String>) -> Identify {
        let operator = operator_name(&operator.into());
        Identify(Arc::new(move |_| {
            operator.clone().ok_or(Unidentified::Refuse)
        }))
    }

    /// HTTP Basic authentication with a shared token as the password; the
    /// user name given is the operator (what the audit records). Wrong or
    /// missing credentials get a 401 challenge. For the standalone tool
    /// with `OUTBOX_CONSOLE_TOKEN`.
    pub fn basic_token(token: impl Into<String>) -> Identify {
        let token = token.into();
        Identify(Arc::new(move |parts| {
            basic_credentials(&parts.headers)
                .filter(|(_, password)| same(password.as_bytes(), token.as_bytes()))
                .and_then(|(user, _)| operator_name(&user))
                .ok_or(Unidentified::Challenge)
        }))
    }

    /// The operator is the value of `header`, set by a proxy in front of
    /// the console that authenticated the user (and strips the header from
    /// what clients send). Use only behind such a proxy.
    pub fn trusted_header(header: &'static str) -> Identify {
        Identify::from_fn(move |parts| {
            parts
                .headers
                .get(header)
                .and_then(|value| value.to_str().ok())
                .map(str::to_owned)
        })
    }

    pub(crate) fn operator(&self, parts: &Parts) -> Result<Operator, Unidentified> {
        (self.0)(parts)
    }
}

/// An operator name as the audit keeps it: trimmed, 1 to 200 characters,
/// none of them control characters or the invisible ones that would let
/// two names look alike (zero-width spaces and joiners, line and paragraph
/// separators, direction marks and overrides, variation selectors, tag
/// characters, interlinear annotation marks, the byte order mark, Hangul
/// fillers).
pub fn operator_name(name: &str) -> Option<Operator> {
    let name = name.trim();
    let invisible = |c: char| {
        c.is_control()
            || matches!(
                c as u32,
                0xAD | 0x034F
                    | 0x061C
                    | 0x115F
                    | 0x1160
                    | 0x17B4
                    | 0x17B5
                    | 0x180B..=0x180F
                    | 0x200B..=0x200F
                    | 0x2028..=0x202E
                    | 0x2060..=0x206F
                    | 0x3164
                    | 0xFE00..=0xFE0F
                    | 0xFEFF
                    | 0xFFA0
                    | 0xFFF9..=0xFFFB
                    | 0xE0000..=0xE007F
                    | 0xE0100..=0xE01EF
            )
    };
    (!name.is_empty() && name.chars().count() <= 200 && !name.chars().any(invisible))
        .then(|| Operator(name.to_owned()))
}

/// The user and password of an `Authorization: Basic` header.
fn basic_credentials(headers: &HeaderMap) -> Option<(String, String)> {
    let value = headers.get("authorization")?.to_str().ok()?;
    let (scheme, encoded) = value.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let encoded = encoded.trim();
    let decoded = String::from_utf8(base64_decode(encoded)?).ok()?;
    let (user, password) = decoded.split_once(':')?;
    Some((user.to_owned(), password.to_owned()))
}

/// Standard base64 (with padding) decoded; `None` for anything else.
fn base64_decode(text: &str) -> Option<Vec<u8>> {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let text = text.trim_end_matches('=');
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let mut buffer = 0u32;
    let mut bits = 0;
    for byte in text.bytes() {
        let value = ALPHABET.iter().position(|&c| c == byte)? as u32;
        buffer = (buffer << 6) | value;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((buffer >> bits) as u8);
            buffer &= (1 << bits) - 1;
        }
    }
    Some(out)
}

/// Compares two secrets in time independent of where they differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    let a = Sha256::digest(a);
    let b = Sha256::digest(b);
    a.iter()
        .zip(b.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0
}

/// CSRF tokens: a secret drawn when the console is built, hashed with the
/// operator's name. A page can only carry the token if it was rendered
/// for that operator by this console; another site's form cannot know it.
#[derive(Clone)]
pub(crate) struct CsrfKey([u8; 32]);

impl CsrfKey {
    /// A fresh random key (two v4 UUIDs: 244 random bits).
    pub(crate) fn random() -> CsrfKey {
        let mut key = [0u8; 32];
        key[..16].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
        key[16..].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
        CsrfKey(key)
    }

    /// The token of `operator`'s forms.
    pub(crate) fn token(&self, operator: &Operator) -> String {
        let mut hasher = Sha256::new();
        hasher.update(self.0);
        hasher.update([0]);
        hasher.update(operator.0.as_bytes());
        hex::encode(hasher.finalize())
    }

    /// Whether `given` is `operator`'s token.
    pub(crate) fn accepts(&self, operator: &Operator, given: Option<&str>) -> bool {
        given.is_some_and(|given| same(given.as_bytes(), self.token(operator).as_bytes()))
    }

    /// The confirmation a preview gives `operator` for `action` on `ids`
    /// (letters: of `letters_of`'s consumer and kind), issued at `issued`
    /// (Unix seconds): `ISSUED.HASH`. A run must carry it within
    /// [`CONFIRMATION_TTL`], so that what runs is exactly what a recent
    /// preview showed. The ids count in any order.
    pub(crate) fn confirmation(
        &self,
        operator: &Operator,
        action: &str,
        letters_of: Option<(&str, &str)>,
        ids: &[String],
        issued: i64,
    ) -> String {
        let mut ids = ids.to_vec();
        ids.sort_unstable();
        ids.dedup();
        let (consumer, kind) = letters_of.unwrap_or_default();
        let issued_text = issued.to_string();
        let mut hasher = Sha256::new();
        hasher.update(self.0);
        hasher.update([1]);
        for part in [operator.0.as_str(), action, consumer, kind, &issued_text] {
            hasher.update(part.as_bytes());
            hasher.update([0]);
        }
        hasher.update(ids.join(",").as_bytes());
        format!("{issued_text}.{}", hex::encode(hasher.finalize()))
    }

    /// Whether `given` is a [`confirmation`](Self::confirmation) of these,
    /// issued no longer than [`CONFIRMATION_TTL`] before `now` (Unix
    /// seconds) and not after it.
    pub(crate) fn confirms(
        &self,
        operator: &Operator,
        action: &str,
        letters_of: Option<(&str, &str)>,
        ids: &[String],
        given: Option<&str>,
        now: i64,
    ) -> bool {
        let Some((issued, _)) = given.and_then(|g| g.split_once('.')) else {
            return false;
        };
        let Ok(issued) = issued.parse::<i64>() else {
            return false;
        };
        let fresh = issued <= now.saturating_add(5)
            && now.saturating_sub(issued) <= CONFIRMATION_TTL.as_secs() as i64;
        let expected = self.confirmation(operator, action, letters_of, ids, issued);
        fresh && given.is_some_and(|given| same(given.as_bytes(), expected.as_bytes()))
    }
}

/// How long a preview's confirmation runs its action (15 minutes): a
/// preview left open longer, or posted again from the history later, is
/// refused and must be previewed again.
pub(crate) const CONFIRMATION_TTL: std::time::Duration = std::time::Duration::from_secs(15 * 60);

/// Whether a POST comes from another site. Browsers that send
/// `Sec-Fetch-Site` decide it alone (a proxy in front may rewrite `Host`,
/// so comparing it with `Origin` would refuse the console's own forms);
/// otherwise an `Origin` that is `null` or names another host than `Host`.
pub(crate) fn cross_site(headers: &HeaderMap) -> bool {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(site) = header("sec-fetch-site") {
        return site != "same-origin" && site != "none";
    }
    match (header("origin"), header("host")) {
        (Some("null"), _) => true,
        (Some(origin), Some(host)) => {
            let origin_host = origin.split_once("://").map_or(origin, |(_, rest)| rest);
            origin_host != host
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basic_credentials_decode() {
        let mut headers = HeaderMap::new();
        // "ada:s3cret"
        headers.insert("authorization", "Basic YWRhOnMzY3JldA==".parse().unwrap());
        assert_eq!(
            basic_credentials(&headers),
            Some(("ada".to_owned(), "s3cret".to_owned()))
        );
        headers.insert("authorization", "basic YWRhOnMzY3JldA==".parse().unwrap());
        assert_eq!(
            basic_credentials(&headers),
            Some(("ada".to_owned(), "s3cret".to_owned()))
        );
        headers.insert("authorization", "Basic !!".parse().unwrap());
        assert_eq!(basic_credentials(&headers), None);
        headers.insert("authorization", "Bearer YWRhOnMzY3JldA==".parse().unwrap());
        assert_eq!(basic_credentials(&headers), None);
    }

    #[test]
    fn operator_names_are_trimmed_and_visible() {
        assert_eq!(operator_name(" ada "), Some(Operator("ada".into())));
        assert_eq!(operator_name("a\u{200B}da"), None);
        assert_eq!(operator_name("ada\u{202E}"), None);
        assert_eq!(operator_name("   "), None);
        assert_eq!(operator_name(&"x".repeat(201)), None);
        assert_eq!(operator_name("Zoë Ñ"), Some(Operator("Zoë Ñ".into())));
    }

    #[test]
    fn tokens_are_per_operator_and_per_key() {
        let key = CsrfKey::random();
        let ada = Operator("ada".into());
        let bob = Operator("bob".into());
        let token = key.token(&ada);
        assert!(key.accepts(&ada, Some(&token)));
        assert!(!key.accepts(&bob, Some(&token)));
        assert!(!key.accepts(&ada, None));
        assert!(!CsrfKey::random().accepts(&ada, Some(&token)));
    }

    #[test]
    fn a_confirmation_binds_operator_action_letters_and_ids_in_any_order() {
        let key = CsrfKey::random();
        let ada = Operator("ada".into());
        let ids = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let billing = Some(("billing", "dead_lettered"));
        let now = 1_800_000_000;
        let given = key.confirmation(&ada, "discard", billing, &ids(&["7", "3"]), now);
        let confirms = |operator: &Operator, action, letters_of, list: &[&str], at| {
            key.confirms(operator, action, letters_of, &ids(list), Some(&given), at)
        };
        assert!(confirms(&ada, "discard", billing, &["3", "7"], now));
        assert!(confirms(
            &ada,
            "discard",
            billing,
            &["3", "7"],
            now + 15 * 60
        ));
        assert!(
            !confirms(&ada, "discard", billing, &["3", "7"], now + 15 * 60 + 1),
            "expired"
        );
        assert!(
            !confirms(&ada, "discard", billing, &["3", "7"], now - 60),
            "issued later"
        );
        assert!(!confirms(&ada, "discard", billing, &["3", "7", "9"], now));
        assert!(!confirms(&ada, "discard", billing, &["3"], now));
        assert!(!confirms(&ada, "replay", billing, &["3", "7"], now));
        let other = Some(("shipping", "dead_lettered"));
        assert!(!confirms(&ada, "discard", other, &["3", "7"], now));
        let bob = Operator("bob".into());
        assert!(!confirms(&bob, "discard", billing, &["3", "7"], now));
        assert!(!key.confirms(&ada, "discard", billing, &ids(&["3", "7"]), None, now));
        // The time is part of what is hashed: moving it breaks the hash.
        let (_, hash) = given.split_once('.').unwrap();
        let moved = format!("{}.{hash}", now + 1);
        assert!(!key.confirms(
            &ada,
            "discard",
            billing,
            &ids(&["3", "7"]),
            Some(&moved),
            now + 1
        ));
        // A time at the ends of i64 from a posted form is refused, not an
        // overflow.
        for issued in [i64::MIN, i64::MAX] {
            let far = format!("{issued}.{hash}");
            assert!(!key.confirms(&ada, "discard", billing, &ids(&["3", "7"]), Some(&far), now));
        }
    }

    #[test]
    fn cross_site_posts_are_recognised() {
        let mut headers = HeaderMap::new();
        headers.insert("host", "127.0.0.1:8080".parse().unwrap());
        assert!(!cross_site(&headers));
        headers.insert("origin", "http://127.0.0.1:8080".parse().unwrap());
        assert!(!cross_site(&headers));
        headers.insert("origin", "https://evil.example".parse().unwrap());
        assert!(cross_site(&headers));
        headers.insert("origin", "null".parse().unwrap());
        assert!(cross_site(&headers));
        // Behind a proxy that rewrote Host, the browser's word decides.
        headers.insert("origin", "https://console.example".parse().unwrap());
        headers.insert("sec-fetch-site", "same-origin".parse().unwrap());
        assert!(!cross_site(&headers));
        for site in ["cross-site", "same-site"] {
            headers.insert("sec-fetch-site", site.parse().unwrap());
            assert!(cross_site(&headers), "{site}");
        }
    }
}
