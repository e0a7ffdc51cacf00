//! The options of `#[offload::kernel(...)]`.

use proc_macro2::Span;
use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::{Ident, Token};

use crate::ty::RedOp;

/// The options of `#[offload::kernel(...)]`.
#[derive(Default, Debug)]
pub struct KernelOptions {
    /// How many leading `usize` parameters are indices, and where it was said.
    pub dims: Option<(usize, Span)>,
    pub reductions: Vec<(RedOp, Ident)>,
    pub checked: Option<bool>,
    /// Outer indices one GPU thread walks in a row (2-D and 3-D), and where it was given.
    pub rows: Option<(u32, Span)>,
    /// A teams kernel's threads per team (the most, with `teams = ..=MAX`), and where it
    /// was given.
    pub teams: Option<(crate::signature::Threads, Span)>,
    /// `teams = ..=MAX`: the team size is given at launch, up to the count above.
    pub team_size_at_launch: bool,
    /// `types(Real = f32, ..)`: aliases of scalar types the kernel uses.
    pub aliases: crate::aliases::Aliases,
}

/// Outer indices a GPU thread of a 2-D or 3-D kernel walks unless `rows = N` says.
pub const DEFAULT_ROWS: u32 = 4;

/// `+: a, b` inside `reduction(...)`.
fn parse_reduction(input: ParseStream<'_>, out: &mut Vec<(RedOp, Ident)>) -> syn::Result<()> {
    let op = if input.peek(Token![+]) {
        input.parse::<Token![+]>()?;
        RedOp::Add
    } else {
        let id: Ident = input.parse()?;
        match id.to_string().as_str() {
            "min" => RedOp::Min,
            "max" => RedOp::Max,
            _ => {
                return Err(syn::Error::new_spanned(
                    id,
                    "offload::kernel: a reduction's operator is `+`, `min` or `max`",
                ))
            }
        }
    };
    input.parse::<Token![:]>()?;
    let names: Punctuated<Ident, Token![,]> = input.parse_terminated(Ident::parse_any, Token![,])?;
    if names.is_empty() {
        return Err(input.error("offload::kernel: name the reduction variables: `reduction(+: sum)`"));
    }
    for n in names {
        if out.iter().any(|(_, o)| *o == n) {
            return Err(syn::Error::new_spanned(n, "offload::kernel: this variable is already a reduction"));
        }
        out.push((op, n));
    }
    Ok(())
}

impl Parse for KernelOptions {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let mut o = KernelOptions::default();
        while !input.is_empty() {
            let key: Ident = input.parse()?;
            if key == "reduction" {
                let content;
                syn::parenthesized!(content in input);
                parse_reduction(&content, &mut o.reductions)?;
                if !input.is_empty() {
                    input.parse::<Token![,]>()?;
                }
                continue;
            }
            if key == "types" {
                let content;
                syn::parenthesized!(content in input);
                o.aliases = crate::aliases::Aliases::parse_list(&content)?;
                if !input.is_empty() {
                    input.parse::<Token![,]>()?;
                }
                continue;
            }
            if key == "device_fns" {
                return Err(syn::Error::new_spanned(
                    key,
                    "offload::kernel: `device_fns` is no longer needed: call `#[offload::device]` functions by \
                     name (their signatures are not repeated)",
                ));
            }
            input.parse::<Token![=]>()?;
            match key.to_string().as_str() {
                "checked" => {
                    let b: syn::LitBool = input.parse()?;
                    o.checked = Some(b.value);
                }
                "rows" => {
                    let n: syn::LitInt = input.parse()?;
                    let r: u32 = n.base10_parse()?;
                    if !(1..=64).contains(&r) {
                        return Err(syn::Error::new_spanned(n, "offload::kernel: rows is 1 to 64"));
                    }
                    o.rows = Some((r, n.span()));
                }
                "teams" => {
                    // A literal is checked here; a constant expression by rustc, beside
                    // the kernel.
                    let mut e: syn::Expr = input.parse()?;
                    let span = syn::spanned::Spanned::span(&e);
                    // `..=MAX`: a team size given at launch, up to MAX.
                    if let syn::Expr::Range(r) = &e {
                        match (&r.start, &r.limits, &r.end) {
                            (None, syn::RangeLimits::Closed(_), Some(end)) => {
                                o.team_size_at_launch = true;
                                e = (**end).clone();
                            }
                            _ => {
                                return Err(syn::Error::new(
                                    span,
                                    "offload::kernel: `teams = THREADS`, or `teams = ..=MAX` for a team size given at \
                                     launch (up to MAX)",
                                ))
                            }
                        }
                    }
                    let threads = match &e {
                        syn::Expr::Lit(syn::ExprLit { lit: syn::Lit::Int(n), .. }) => {
                            let t: u32 = n.base10_parse()?;
                            if !(1..=1024).contains(&t) {
                                return Err(syn::Error::new_spanned(
                                    n,
                                    "offload::kernel: a team has 1 to 1024 threads",
                                ));
                            }
                            crate::signature::Threads::Lit(t)
                        }
                        _ => crate::signature::Threads::Const(e),
                    };
                    o.teams = Some((threads, span));
                }
                "dims" => {
                    let n: syn::LitInt = input.parse()?;
                    let d: usize = n.base10_parse()?;
                    if !(1..=3).contains(&d) {
                        return Err(syn::Error::new_spanned(n, "offload::kernel: dims is 1, 2 or 3"));
                    }
                    o.dims = Some((d, n.span()));
                }
                _ => return Err(syn::Error::new_spanned(
                    key,
                    "offload::kernel: unknown option; expected `dims = N`, `teams = THREADS`, `reduction(+: x, \
                     ..)` (or min, max), `checked = true|false`, `rows = N` or `types(Alias = f32, ..)`",
                )),
            }
            if !input.is_empty() {
                input.parse::<Token![,]>()?;
            }
        }
        Ok(o)
    }
}
