//! Parsing of `#[outbox(...)]` attributes (and the few `#[serde(...)]` keys
//! that change a payload's key names). Functions here return no `Result`:
//! every problem becomes a spanned error in the [`Ctxt`] and parsing goes
//! on, so one compile shows all mistakes. Value rules (what an event type
//! may look like, which combinations are allowed) live in `check.rs`.

use proc_macro2::{Span, TokenStream};
use quote::ToTokens;
use syn::meta::ParseNestedMeta;
use syn::{Attribute, Expr, ExprLit, ExprPath, Lit, LitInt, LitStr, Path, Token};

use super::Ctxt;
use super::case::RenameRule;
use super::symbol::*;

/// A container value together with the tokens that set it (for spans).
pub(crate) struct Spanned<T> {
    pub(crate) value: T,
    pub(crate) tokens: TokenStream,
}

/// One attribute value that may be set once.
struct Once<'c, T> {
    cx: &'c Ctxt,
    name: Symbol,
    value: Option<Spanned<T>>,
    /// The key appeared, possibly with a value that was rejected.
    seen: bool,
}

impl<'c, T> Once<'c, T> {
    fn none(cx: &'c Ctxt, name: Symbol) -> Self {
        Once {
            cx,
            name,
            value: None,
            seen: false,
        }
    }

    /// Notes that the key appeared even though its value was rejected, so
    /// no "missing key" error follows the real one.
    fn mark_seen(&mut self) {
        self.seen = true;
    }

    fn set(&mut self, tokens: impl ToTokens, value: T) {
        let tokens = tokens.into_token_stream();
        if self.value.is_some() {
            self.cx.error_spanned_by(
                tokens,
                format!("duplicate outbox attribute `{}`: set it once", self.name),
            );
        } else {
            self.value = Some(Spanned { value, tokens });
        }
    }

    fn get(self) -> Option<Spanned<T>> {
        self.value
    }

    fn was_seen(&self) -> bool {
        self.seen || self.value.is_some()
    }
}

/// One `upcast(from = N, with = path)` entry.
pub(crate) struct JsonUpcast {
    pub(crate) from: u32,
    pub(crate) from_lit: LitInt,
    pub(crate) with: Path,
    pub(crate) tokens: TokenStream,
}

/// The container attributes.
pub(crate) struct Container {
    pub(crate) event_type: Option<Spanned<LitStr>>,
    pub(crate) aggregate: Option<Spanned<LitStr>>,
    pub(crate) version: Option<Spanned<u32>>,
    pub(crate) upcast_from: Option<Spanned<Path>>,
    pub(crate) upcasts: Vec<JsonUpcast>,
    pub(crate) krate: Option<Spanned<Path>>,
    /// `compatibility = "…"`: the variant name of `CompatibilityMode`.
    pub(crate) compatibility: Option<Spanned<&'static str>>,
    /// The first `#[outbox(...)]` attribute, for errors about missing keys.
    pub(crate) outbox_attr: Option<TokenStream>,
    /// Required keys that appeared, valid or not (`event_type`, `aggregate`, `version`).
    pub(crate) seen_required: [bool; 3],
    /// serde's `rename_all` (serialize side).
    pub(crate) rename_all: Option<RenameRule>,
}

impl Container {
    pub(crate) fn from_ast(cx: &Ctxt, attrs: &[Attribute]) -> Container {
        let mut event_type = Once::none(cx, EVENT_TYPE);
        let mut aggregate = Once::none(cx, AGGREGATE);
        let mut version = Once::none(cx, VERSION);
        let mut upcast_from = Once::none(cx, UPCAST_FROM);
        let mut krate = Once::none(cx, CRATE);
        let mut compatibility = Once::none(cx, COMPATIBILITY);
        let mut upcasts = Vec::new();
        let mut outbox_attr = None;
        let mut rename_all = None;

        for attr in attrs {
            if attr.path() == SERDE {
                read_serde_container(attr, &mut rename_all);
                continue;
            }
            if attr.path() != OUTBOX {
                continue;
            }
            if outbox_attr.is_none() {
                outbox_attr = Some(attr.to_token_stream());
            }
            if let syn::Meta::Path(_) = attr.meta {
                cx.error_spanned_by(
                    attr,
                    "expected `#[outbox(event_type = \"...\", aggregate = \"...\", version = N)]`",
                );
                event_type.mark_seen();
                aggregate.mark_seen();
                version.mark_seen();
                continue;
            }
            let result = attr.parse_nested_meta(|meta| {
                if meta.path == EVENT_TYPE {
                    event_type.mark_seen();
                    if let Some(lit) = string_value(cx, &meta, EVENT_TYPE, "\"order.created\"")? {
                        event_type.set(&meta.path, lit);
                    }
                } else if meta.path == AGGREGATE {
                    aggregate.mark_seen();
                    if let Some(lit) = string_value(cx, &meta, AGGREGATE, "\"order\"")? {
                        aggregate.set(&meta.path, lit);
                    }
                } else if meta.path == VERSION {
                    version.mark_seen();
                    if let Some(lit) = int_value(cx, &meta, VERSION, "2")? {
                        match lit.base10_parse::<u32>() {
                            Ok(number) => version.set(&lit, number),
                            Err(_) => cx.error_spanned_by(
                                &lit,
                                "`version` must be a whole number from 1 to 4294967295",
                            ),
                        }
                    }
                } else if meta.path == UPCAST_FROM {
                    if let Some(path) = path_value(cx, &meta, UPCAST_FROM, "OrderCreatedV1")? {
                        upcast_from.set(&path, path.clone());
                    }
                } else if meta.path == UPCAST {
                    if let Some(upcast) = json_upcast(cx, &meta)? {
                        upcasts.push(upcast);
                    }
                } else if meta.path == COMPATIBILITY {
                    if let Some(lit) = string_value(cx, &meta, COMPATIBILITY, "\"backward\"")? {
                        match COMPATIBILITY_MODES.iter().find(|(name, _)| *name == lit.value()) {
                            Some((_, variant)) => compatibility.set(&lit, *variant),
                            None => cx.error_spanned_by(
                                &lit,
                                format!(
                                    "unknown compatibility mode {:?}; expected one of {}",
                                    lit.value(),
                                    COMPATIBILITY_MODES
                                        .iter()
                                        .map(|(name, _)| format!("\"{name}\""))
                                        .collect::<Vec<_>>()
                                        .join(", ")
                                ),
                            ),
                        }
                    }
                } else if meta.path == CRATE {
                    if let Some(lit) = string_value(cx, &meta, CRATE, "\"outbox_core\"")? {
                        match lit.parse::<Path>() {
                            Ok(path) => krate.set(&meta.path, path),
                            Err(_) => cx.error_spanned_by(
                                &lit,
                                format!("`crate` must name a crate path, e.g. `crate = \"outbox_core\"`; got {:?}", lit.value()),
                            ),
                        }
                    }
                } else if is_field_key(&meta.path) {
                    let key = meta.path.to_token_stream().to_string();
                    cx.error_spanned_by(
                        &meta.path,
                        format!("`{key}` belongs on a field, not on the struct: put `#[outbox({key})]` on the field"),
                    );
                    skip_value(&meta)?;
                } else {
                    let key = meta.path.to_token_stream().to_string().replace(' ', "");
                    cx.error_spanned_by(
                        &meta.path,
                        format!("unknown outbox attribute `{key}`; expected one of {CONTAINER_KEYS}"),
                    );
                    skip_value(&meta)?;
                }
                Ok(())
            });
            if let Err(error) = result {
                cx.syn_error(error);
            }
        }

        let seen_required = [
            event_type.was_seen(),
            aggregate.was_seen(),
            version.was_seen(),
        ];
        Container {
            seen_required,
            event_type: event_type.get(),
            aggregate: aggregate.get(),
            version: version.get(),
            upcast_from: upcast_from.get(),
            upcasts,
            krate: krate.get(),
            compatibility: compatibility.get(),
            outbox_attr,
            rename_all,
        }
    }
}

/// The field attributes.
pub(crate) struct Field {
    pub(crate) aggregate_id: Option<TokenStream>,
    pub(crate) aggregate_version: Option<TokenStream>,
    pub(crate) redact: Option<TokenStream>,
    /// serde's `rename` (serialize side).
    pub(crate) rename: Option<String>,
    /// serde's `flatten`, with its tokens.
    pub(crate) flatten: Option<TokenStream>,
}

impl Field {
    pub(crate) fn from_ast(cx: &Ctxt, attrs: &[Attribute]) -> Field {
        let mut aggregate_id = Once::none(cx, AGGREGATE_ID);
        let mut aggregate_version = Once::none(cx, AGGREGATE_VERSION);
        let mut redact = Once::none(cx, REDACT);
        let mut rename = None;
        let mut flatten = None;

        for attr in attrs {
            if attr.path() == SERDE {
                read_serde_field(attr, &mut rename, &mut flatten);
                continue;
            }
            if attr.path() != OUTBOX {
                continue;
            }
            let result = attr.parse_nested_meta(|meta| {
                let slot = if meta.path == AGGREGATE_ID {
                    Some(&mut aggregate_id)
                } else if meta.path == AGGREGATE_VERSION {
                    Some(&mut aggregate_version)
                } else if meta.path == REDACT {
                    Some(&mut redact)
                } else {
                    None
                };
                let key = meta.path.to_token_stream().to_string().replace(' ', "");
                match slot {
                    Some(slot) => {
                        if meta.input.peek(Token![=]) || meta.input.peek(syn::token::Paren) {
                            cx.error_spanned_by(
                                &meta.path,
                                format!("`{key}` is a flag and takes no value: write `#[outbox({key})]`"),
                            );
                            skip_value(&meta)?;
                        }
                        slot.set(&meta.path, ());
                    }
                    None if is_container_key(&meta.path) => {
                        cx.error_spanned_by(
                            &meta.path,
                            format!("`{key}` belongs on the struct, not on a field: put it in the struct's `#[outbox(...)]`"),
                        );
                        skip_value(&meta)?;
                    }
                    None => {
                        cx.error_spanned_by(
                            &meta.path,
                            format!("unknown outbox field attribute `{key}`; expected one of {FIELD_KEYS}"),
                        );
                        skip_value(&meta)?;
                    }
                }
                Ok(())
            });
            if let Err(error) = result {
                cx.syn_error(error);
            }
        }

        Field {
            aggregate_id: aggregate_id.get().map(|s| s.tokens),
            aggregate_version: aggregate_version.get().map(|s| s.tokens),
            redact: redact.get().map(|s| s.tokens),
            rename,
            flatten,
        }
    }
}

fn is_field_key(path: &Path) -> bool {
    path == AGGREGATE_ID || path == AGGREGATE_VERSION || path == REDACT
}

fn is_container_key(path: &Path) -> bool {
    path == EVENT_TYPE
        || path == AGGREGATE
        || path == VERSION
        || path == UPCAST_FROM
        || path == UPCAST
        || path == CRATE
}

/// Parses `= <expr>` and returns the string literal, or records an error
/// naming the key and an example when the value has another form.
fn string_value(
    cx: &Ctxt,
    meta: &ParseNestedMeta<'_>,
    key: Symbol,
    example: &str,
) -> syn::Result<Option<LitStr>> {
    let Some(expr) = value_expr(cx, meta, key, example)? else {
        return Ok(None);
    };
    match expr {
        Expr::Lit(ExprLit {
            lit: Lit::Str(lit), ..
        }) => Ok(Some(lit)),
        other => {
            cx.error_spanned_by(
                &other,
                format!("`{key}` expects a string literal, e.g. `{key} = {example}`"),
            );
            Ok(None)
        }
    }
}

fn int_value(
    cx: &Ctxt,
    meta: &ParseNestedMeta<'_>,
    key: Symbol,
    example: &str,
) -> syn::Result<Option<LitInt>> {
    let Some(expr) = value_expr(cx, meta, key, example)? else {
        return Ok(None);
    };
    match expr {
        Expr::Lit(ExprLit {
            lit: Lit::Int(lit), ..
        }) => Ok(Some(lit)),
        other => {
            cx.error_spanned_by(
                &other,
                format!("`{key}` expects an integer literal, e.g. `{key} = {example}`"),
            );
            Ok(None)
        }
    }
}

fn path_value(
    cx: &Ctxt,
    meta: &ParseNestedMeta<'_>,
    key: Symbol,
    example: &str,
) -> syn::Result<Option<Path>> {
    let Some(expr) = value_expr(cx, meta, key, example)? else {
        return Ok(None);
    };
    match expr {
        Expr::Path(ExprPath {
            path, qself: None, ..
        }) => Ok(Some(path)),
        other => {
            cx.error_spanned_by(
                &other,
                format!("`{key}` expects a path without quotes, e.g. `{key} = {example}`"),
            );
            Ok(None)
        }
    }
}

/// Reads `= <expr>`; a missing `=` is reported with the key and an example.
fn value_expr(
    cx: &Ctxt,
    meta: &ParseNestedMeta<'_>,
    key: Symbol,
    example: &str,
) -> syn::Result<Option<Expr>> {
    if !meta.input.peek(Token![=]) {
        cx.error_spanned_by(
            &meta.path,
            format!("`{key}` needs a value, e.g. `{key} = {example}`"),
        );
        skip_value(meta)?;
        return Ok(None);
    }
    Ok(Some(meta.value()?.parse::<Expr>()?))
}

/// Parses `upcast(from = N, with = path)`.
fn json_upcast(cx: &Ctxt, meta: &ParseNestedMeta<'_>) -> syn::Result<Option<JsonUpcast>> {
    let tokens = meta.path.to_token_stream();
    if !meta.input.peek(syn::token::Paren) {
        cx.error_spanned_by(
            &meta.path,
            "`upcast` expects a list: `upcast(from = 1, with = path::to::function)`",
        );
        skip_value(meta)?;
        return Ok(None);
    }
    let mut from: Option<LitInt> = None;
    let mut with: Option<Path> = None;
    meta.parse_nested_meta(|inner| {
        if inner.path == FROM {
            if let Some(lit) = int_value(cx, &inner, FROM, "1")? {
                if from.is_some() {
                    cx.error_spanned_by(&inner.path, "duplicate `from` in `upcast(...)`");
                }
                from = Some(lit);
            }
        } else if inner.path == WITH {
            if let Some(path) = path_value(cx, &inner, WITH, "path::to::function")? {
                if with.is_some() {
                    cx.error_spanned_by(&inner.path, "duplicate `with` in `upcast(...)`");
                }
                with = Some(path);
            }
        } else {
            let key = inner.path.to_token_stream().to_string().replace(' ', "");
            cx.error_spanned_by(
                &inner.path,
                format!("unknown key `{key}` in `upcast(...)`; expected `from` and `with`"),
            );
            skip_value(&inner)?;
        }
        Ok(())
    })?;
    let (Some(from_lit), Some(with)) = (from, with) else {
        cx.error_spanned_by(
            &tokens,
            "`upcast` needs both keys: `upcast(from = 1, with = path::to::function)`",
        );
        return Ok(None);
    };
    let Ok(from) = from_lit.base10_parse::<u32>() else {
        cx.error_spanned_by(&from_lit, "`from` must be a whole number of at least 1");
        return Ok(None);
    };
    Ok(Some(JsonUpcast {
        from,
        from_lit,
        with,
        tokens,
    }))
}

/// Consumes whatever value follows a key (`= expr` or `(...)`) so parsing
/// can continue after an error.
fn skip_value(meta: &ParseNestedMeta<'_>) -> syn::Result<()> {
    if meta.input.peek(Token![=]) {
        meta.value()?.parse::<Expr>()?;
    } else if meta.input.peek(syn::token::Paren) {
        let content;
        syn::parenthesized!(content in meta.input);
        content.parse::<TokenStream>()?;
    }
    Ok(())
}

/// Reads `rename_all` from `#[serde(...)]`; other keys are serde's business.
fn read_serde_container(attr: &Attribute, rename_all: &mut Option<RenameRule>) {
    let _ = attr.parse_nested_meta(|meta| {
        if meta.path == RENAME_ALL {
            if let Some(parsed) = serialize_side_string(&meta)?
                .as_deref()
                .and_then(RenameRule::from_str)
            {
                *rename_all = Some(parsed);
            }
        } else {
            skip_value(&meta)?;
        }
        Ok(())
    });
}

/// Reads `rename` and `flatten` from a field's `#[serde(...)]`.
fn read_serde_field(
    attr: &Attribute,
    rename: &mut Option<String>,
    flatten: &mut Option<TokenStream>,
) {
    let _ = attr.parse_nested_meta(|meta| {
        if meta.path == RENAME {
            if let Some(name) = serialize_side_string(&meta)? {
                *rename = Some(name);
            }
        } else if meta.path == FLATTEN {
            *flatten = Some(meta.path.to_token_stream());
        } else {
            skip_value(&meta)?;
        }
        Ok(())
    });
}

/// `key = "x"` or `key(serialize = "x", deserialize = "y")`: the serialize side.
fn serialize_side_string(meta: &ParseNestedMeta<'_>) -> syn::Result<Option<String>> {
    if meta.input.peek(Token![=]) {
        let lit: LitStr = meta.value()?.parse()?;
        return Ok(Some(lit.value()));
    }
    let mut found = None;
    if meta.input.peek(syn::token::Paren) {
        meta.parse_nested_meta(|inner| {
            if inner.path == SERIALIZE {
                let lit: LitStr = inner.value()?.parse()?;
                found = Some(lit.value());
            } else {
                skip_value(&inner)?;
            }
            Ok(())
        })?;
    }
    Ok(found)
}

/// The span to blame for a container-level problem with no better place.
pub(crate) fn blame(container: &Container, fallback: Span) -> TokenStream {
    match &container.outbox_attr {
        Some(tokens) => tokens.clone(),
        None => {
            let ident = proc_macro2::Ident::new("struct_", fallback);
            ident.to_token_stream()
        }
    }
}
