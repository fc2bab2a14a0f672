//! Generation of the `OutboxEvent` impl, the registered `EventContract` and
//! the compile-time checks on the typed predecessor. Everything is wrapped
//! in `const _: () = { ... };` and names runtime items by absolute path
//! through `<crate>::__private`, so no name leaks into the user's scope.

use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{DeriveInput, LitStr, Path};

use crate::fallback;
use crate::internals::ast::Container;
use crate::internals::{Ctxt, check};

/// Entry point: model, checks, then either the impl or errors + fallback.
pub(crate) fn derive(input: &DeriveInput) -> TokenStream {
    let cx = Ctxt::new();
    let container = Container::from_ast(&cx, input);
    if let Some(container) = &container {
        check::check(&cx, container);
    }
    match (cx.check(), container) {
        (Ok(()), Some(container)) => expand(&container),
        (Err(errors), _) => fallback::expand(input, errors),
        (Ok(()), None) => unreachable!("a missing container always records an error"),
    }
}

fn expand(cont: &Container<'_>) -> TokenStream {
    let attrs = &cont.attrs;
    let krate: Path = match &attrs.krate {
        Some(krate) => krate.value.clone(),
        None => syn::parse_quote!(::outbox_core),
    };
    let private = quote!(#krate::__private);
    let ident = cont.ident;
    let ident_str = LitStr::new(&ident.to_string(), ident.span());
    let event_type = &attrs.event_type.as_ref().expect("checked").value;
    let aggregate = &attrs.aggregate.as_ref().expect("checked").value;
    let version = attrs.version.as_ref().expect("checked").value;
    let redacted = cont.redacted_keys();
    let compatibility = match &attrs.compatibility {
        Some(mode) => {
            let variant = syn::Ident::new(mode.value, proc_macro2::Span::call_site());
            quote!(#private::Option::Some(#private::CompatibilityMode::#variant))
        }
        None => quote!(#private::Option::None),
    };

    let id_field = cont.aggregate_id_field().expect("checked");
    let id_ident = id_field.ident;
    let id_call = quote_spanned! {id_field.ty.span()=>
        #private::AggregateIdField::to_aggregate_id(&self.#id_ident)
    };

    let aggregate_version_fn = cont.aggregate_version_field().map(|field| {
        let field_ident = field.ident;
        let call = quote_spanned! {field.ty.span()=>
            #private::AggregateVersionField::to_aggregate_version(&self.#field_ident)
        };
        quote! {
            fn aggregate_version(&self) -> #private::Option<i64> {
                #private::Option::Some(#call)
            }
        }
    });

    let mut json_steps = attrs.upcasts.iter().collect::<Vec<_>>();
    json_steps.sort_by_key(|step| step.from);

    let (readable_from, decode_older, links, predecessor_check) = match &attrs.upcast_from {
        Some(predecessor) => {
            let prev = &predecessor.value;
            let prev_str = LitStr::new(&quote!(#prev).to_string().replace(' ', ""), prev.span());
            let readable = quote!(<#prev as #krate::OutboxEvent>::READABLE_FROM);
            let convert = quote_spanned! {prev.span()=>
                <Self as #private::UpcastFrom<#prev>>::upcast_from(older)
            };
            let decode = quote! {
                let older = <#prev as #krate::OutboxEvent>::decode(version, payload)?;
                #convert.map_err(|source| #private::DecodeError::Upcast {
                    event_type: #event_type,
                    from: #version - 1,
                    source: #private::UpcastFailure::new(source),
                })
            };
            let link = quote! {
                #private::UpcastLink {
                    from: #version - 1,
                    kind: #private::UpcastKind::Typed {
                        predecessor: ::core::concat!(::core::module_path!(), "::", #prev_str),
                    },
                }
            };
            let wrong_type = format!(
                "`upcast_from = {}`: the predecessor's event_type must be {:?}, the event type of this contract",
                prev_str.value(),
                event_type.value()
            );
            let wrong_version = format!(
                "`upcast_from = {}`: the predecessor must be version {} (this contract is version {version}); \
                 upcasters go one version at a time",
                prev_str.value(),
                version - 1
            );
            let check = quote_spanned! {prev.span()=>
                const _: () = {
                    if !#private::str_eq(<#prev as #krate::OutboxEvent>::EVENT_TYPE, #event_type) {
                        ::core::panic!(#wrong_type);
                    }
                    if <#prev as #krate::OutboxEvent>::SCHEMA_VERSION + 1 != #version {
                        ::core::panic!(#wrong_version);
                    }
                };
            };
            (readable, decode, vec![link], check)
        }
        None if !json_steps.is_empty() => {
            let lowest = json_steps[0].from;
            let fns = json_steps.iter().map(|step| {
                let with = &step.with;
                quote_spanned! {with.span()=>
                    (|value: #private::Value| -> #private::Result<#private::Value, #private::BoxError> {
                        #with(value).map_err(::core::convert::Into::into)
                    }) as #private::JsonUpcastFn
                }
            });
            let decode = quote! {
                #private::decode_json::<Self>(version, payload, #lowest, &[#(#fns),*])
            };
            let links = json_steps
                .iter()
                .map(|step| {
                    let from = step.from;
                    let with = &step.with;
                    let name =
                        LitStr::new(&quote!(#with).to_string().replace(' ', ""), with.span());
                    quote! {
                        #private::UpcastLink {
                            from: #from,
                            kind: #private::UpcastKind::Json { function: #name },
                        }
                    }
                })
                .collect();
            (quote!(#lowest), decode, links, quote!())
        }
        None => {
            let decode = quote! {
                #private::Result::Err(#private::DecodeError::VersionUnreadable {
                    event_type: #event_type,
                    version,
                    readable_from: #version,
                })
            };
            (quote!(#version), decode, Vec::new(), quote!())
        }
    };

    quote! {
        #[doc(hidden)]
        #[allow(non_upper_case_globals, unused_qualifications, clippy::all)]
        const _: () = {
            #[automatically_derived]
            impl #krate::OutboxEvent for #ident {
                const EVENT_TYPE: &'static str = #event_type;
                const AGGREGATE_TYPE: &'static str = #aggregate;
                const SCHEMA_VERSION: u32 = #version;
                const READABLE_FROM: u32 = #readable_from;
                const REDACTED_FIELDS: &'static [&'static str] = &[#(#redacted),*];

                fn aggregate_id(&self) -> #private::String {
                    #id_call
                }

                #aggregate_version_fn

                fn contract() -> &'static #krate::EventContract {
                    &__OUTBOX_CONTRACT
                }

                fn decode_older(
                    version: u32,
                    payload: &#private::RawValue,
                ) -> #private::Result<Self, #krate::DecodeError> {
                    #decode_older
                }
            }

            static __OUTBOX_CONTRACT: #krate::EventContract = #krate::EventContract {
                event_type: #event_type,
                aggregate_type: #aggregate,
                schema_version: #version,
                readable_from: <#ident as #krate::OutboxEvent>::READABLE_FROM,
                rust_type: ::core::concat!(::core::module_path!(), "::", #ident_str),
                redacted_fields: <#ident as #krate::OutboxEvent>::REDACTED_FIELDS,
                upcasts: &[#(#links),*],
                schema: <#ident as #krate::OutboxEvent>::contract_schema,
                defined_at: ::core::concat!(::core::file!(), ":", ::core::line!()),
                compatibility: #compatibility,
            };

            #private::inventory::submit! {
                #private::ContractEntry(&__OUTBOX_CONTRACT)
            }

            #predecessor_check
        };
    }
}
