//! Error context: collects every error of one derive input so the user sees
//! all of them in one compile. Dropping it without `check()` is a bug.

use std::cell::RefCell;
use std::fmt::Display;

use quote::ToTokens;

/// Collects spanned errors while the model is built.
#[derive(Default)]
pub(crate) struct Ctxt {
    errors: RefCell<Option<Vec<syn::Error>>>,
}

impl Ctxt {
    pub(crate) fn new() -> Self {
        Ctxt {
            errors: RefCell::new(Some(Vec::new())),
        }
    }

    /// Records an error spanning `tokens`.
    pub(crate) fn error_spanned_by(&self, tokens: impl ToTokens, message: impl Display) {
        self.push(syn::Error::new_spanned(tokens, message));
    }

    /// Records a syn error as is (it already carries its span).
    pub(crate) fn syn_error(&self, error: syn::Error) {
        self.push(error);
    }

    fn push(&self, error: syn::Error) {
        self.errors
            .borrow_mut()
            .as_mut()
            .expect("Ctxt used after check()")
            .push(error);
    }

    /// Consumes the context: `Ok` when no error was recorded, else all of
    /// them combined into one.
    pub(crate) fn check(self) -> syn::Result<()> {
        let errors = self.errors.borrow_mut().take().expect("Ctxt checked twice");
        let mut iter = errors.into_iter();
        let Some(mut combined) = iter.next() else {
            return Ok(());
        };
        for error in iter {
            combined.combine(error);
        }
        Err(combined)
    }
}

impl Drop for Ctxt {
    fn drop(&mut self) {
        if !std::thread::panicking() && self.errors.borrow().is_some() {
            panic!("forgot to check for errors");
        }
    }
}
