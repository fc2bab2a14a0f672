//! The model of a contract and the passes that build and check it.

pub(crate) mod ast;
pub(crate) mod attr;
pub(crate) mod case;
pub(crate) mod check;
mod ctxt;
pub(crate) mod symbol;

pub(crate) use ctxt::Ctxt;
