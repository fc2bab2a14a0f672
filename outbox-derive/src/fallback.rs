//! On invalid input: the errors plus a stub impl, so the user's other code
//! that names `OutboxEvent` for this type does not add a cascade of
//! secondary errors. Generic inputs and unions get no stub (a stub would
//! itself fail to type-check).

use proc_macro2::TokenStream;
use quote::quote;
use syn::{Data, DeriveInput, LitStr, Path};

pub(crate) fn expand(input: &DeriveInput, errors: syn::Error) -> TokenStream {
    let errors = errors.into_compile_error();
    if !input.generics.params.is_empty() || matches!(input.data, Data::Union(_)) {
        return errors;
    }
    let ident = &input.ident;
    let krate = crate_path(input);
    quote! {
        #errors

        #[allow(unreachable_code, clippy::all)]
        const _: () = {
            #[automatically_derived]
            impl #krate::OutboxEvent for #ident {
                const EVENT_TYPE: &'static str = "invalid.contract";
                const AGGREGATE_TYPE: &'static str = "invalid";
                const SCHEMA_VERSION: u32 = 1;
                const READABLE_FROM: u32 = 1;
                const REDACTED_FIELDS: &'static [&'static str] = &[];

                fn aggregate_id(&self) -> ::std::string::String {
                    ::core::unreachable!()
                }

                fn contract() -> &'static #krate::EventContract {
                    ::core::unreachable!()
                }

                fn decode_older(
                    _: u32,
                    _: &#krate::__private::RawValue,
                ) -> ::core::result::Result<Self, #krate::DecodeError> {
                    ::core::unreachable!()
                }
            }
        };
    }
}

/// The `crate = "..."` path if it parses, else `::outbox_core`.
fn crate_path(input: &DeriveInput) -> Path {
    let mut found = None;
    for attr in input
        .attrs
        .iter()
        .filter(|attr| attr.path().is_ident("outbox"))
    {
        let _ = attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("crate") {
                if let Ok(lit) = meta.value()?.parse::<LitStr>() {
                    found = lit.parse::<Path>().ok();
                }
            } else if meta.input.peek(syn::Token![=]) {
                meta.value()?.parse::<syn::Expr>()?;
            } else if meta.input.peek(syn::token::Paren) {
                meta.parse_nested_meta(|inner| {
                    if inner.input.peek(syn::Token![=]) {
                        inner.value()?.parse::<syn::Expr>()?;
                    }
                    Ok(())
                })?;
            }
            Ok(())
        });
    }
    found.unwrap_or_else(|| syn::parse_quote!(::outbox_core))
}
