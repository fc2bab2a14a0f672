//! The model of a derive input: the struct, its attributes and its fields.
//! Shapes the derive cannot accept (enums, unions, tuple and unit structs)
//! are reported here with what to do instead.

use syn::{Data, DeriveInput, Fields, Generics, Ident, Type};

use super::{Ctxt, attr};

/// A struct with named fields, with its parsed attributes.
pub(crate) struct Container<'a> {
    pub(crate) ident: &'a Ident,
    pub(crate) attrs: attr::Container,
    pub(crate) fields: Vec<Field<'a>>,
    pub(crate) generics: &'a Generics,
}

/// One named field with its parsed attributes.
pub(crate) struct Field<'a> {
    pub(crate) ident: &'a Ident,
    pub(crate) ty: &'a Type,
    pub(crate) attrs: attr::Field,
}

impl<'a> Container<'a> {
    /// Builds the model, or `None` when the input is not a struct with
    /// named fields (the reason is recorded in `cx`). Container attributes
    /// are parsed either way so all their errors show up in one compile.
    pub(crate) fn from_ast(cx: &Ctxt, input: &'a DeriveInput) -> Option<Container<'a>> {
        let attrs = attr::Container::from_ast(cx, &input.attrs);
        let ident = &input.ident;
        let fields = match &input.data {
            Data::Struct(data) => match &data.fields {
                Fields::Named(named) => named
                    .named
                    .iter()
                    .map(|field| Field {
                        ident: field.ident.as_ref().expect("named field has an ident"),
                        ty: &field.ty,
                        attrs: attr::Field::from_ast(cx, &field.attrs),
                    })
                    .collect(),
                Fields::Unnamed(unnamed) => {
                    cx.error_spanned_by(
                        unnamed,
                        format!(
                            "OutboxEvent needs named fields: a tuple struct has no field names for the payload; \
                             write `struct {ident} {{ order_id: ..., ... }}` and mark the id with #[outbox(aggregate_id)]"
                        ),
                    );
                    return None;
                }
                Fields::Unit => {
                    cx.error_spanned_by(
                        ident,
                        "OutboxEvent needs named fields: a unit struct carries no aggregate id; \
                         add a field such as `{ #[outbox(aggregate_id)] order_id: Uuid }`",
                    );
                    return None;
                }
            },
            Data::Enum(data) => {
                cx.error_spanned_by(
                    data.enum_token,
                    "OutboxEvent cannot be derived for an enum: each event type is its own contract with its own version; \
                     make every variant a struct with #[derive(OutboxEvent)] (an enum may still be a field type)",
                );
                return None;
            }
            Data::Union(data) => {
                cx.error_spanned_by(
                    data.union_token,
                    "OutboxEvent cannot be derived for a union; use a struct with named fields",
                );
                return None;
            }
        };
        Some(Container {
            ident,
            attrs,
            fields,
            generics: &input.generics,
        })
    }

    /// The field marked `#[outbox(aggregate_id)]` (the first, if several).
    pub(crate) fn aggregate_id_field(&self) -> Option<&Field<'a>> {
        self.fields.iter().find(|f| f.attrs.aggregate_id.is_some())
    }

    /// The field marked `#[outbox(aggregate_version)]`, if any.
    pub(crate) fn aggregate_version_field(&self) -> Option<&Field<'a>> {
        self.fields
            .iter()
            .find(|f| f.attrs.aggregate_version.is_some())
    }

    /// Serialized keys of the fields marked `#[outbox(redact)]`.
    pub(crate) fn redacted_keys(&self) -> Vec<String> {
        self.fields
            .iter()
            .filter(|f| f.attrs.redact.is_some())
            .map(|f| f.serialized_key(self.attrs.rename_all))
            .collect()
    }
}

impl Field<'_> {
    /// The key serde writes for this field.
    pub(crate) fn serialized_key(&self, rename_all: Option<super::case::RenameRule>) -> String {
        if let Some(rename) = &self.attrs.rename {
            return rename.clone();
        }
        let name = self.ident.to_string();
        let name = name.strip_prefix("r#").unwrap_or(&name);
        match rename_all {
            Some(rule) => rule.apply_to_field(name),
            None => name.to_owned(),
        }
    }
}
