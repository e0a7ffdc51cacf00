//! The host twin's body: the kernel's body with every slice element access turned into a
//! bounds-checked [`SharedSlice`] load or store, so that iterations running at once never
//! hold aliasing `&mut [T]`.
//!
//! [`SharedSlice`]: ../../offload/__private/struct.SharedSlice.html

use std::collections::HashSet;

use quote::quote_spanned;
use syn::spanned::Spanned;
use syn::visit_mut::{self, VisitMut};
use syn::{BinOp, Block, Expr};

use crate::types::DeviceFnDecl;

struct Rewrite<'a> {
    slices: &'a HashSet<String>,
}

impl Rewrite<'_> {
    /// `(base, index)` when `e` is `x[i]` with `x` a slice parameter.
    fn slice_index(&self, e: &Expr) -> Option<(Expr, Expr)> {
        let Expr::Index(ix) = e else { return None };
        let Expr::Path(p) = &*ix.expr else { return None };
        let id = p.path.get_ident()?;
        self.slices.contains(&id.to_string()).then(|| ((*ix.expr).clone(), (*ix.index).clone()))
    }
}

fn plain_op(op: &BinOp) -> Option<proc_macro2::TokenStream> {
    use BinOp::*;
    let s = op.span();
    Some(match op {
        AddAssign(_) => quote_spanned!(s=> +),
        SubAssign(_) => quote_spanned!(s=> -),
        MulAssign(_) => quote_spanned!(s=> *),
        DivAssign(_) => quote_spanned!(s=> /),
        RemAssign(_) => quote_spanned!(s=> %),
        BitAndAssign(_) => quote_spanned!(s=> &),
        BitOrAssign(_) => quote_spanned!(s=> |),
        BitXorAssign(_) => quote_spanned!(s=> ^),
        ShlAssign(_) => quote_spanned!(s=> <<),
        ShrAssign(_) => quote_spanned!(s=> >>),
        _ => return None,
    })
}

impl VisitMut for Rewrite<'_> {
    fn visit_expr_mut(&mut self, e: &mut Expr) {
        visit_mut::visit_expr_mut(self, e);
        let span = e.span();
        if let Some((base, idx)) = self.slice_index(e) {
            *e = syn::parse_quote_spanned!(span=> #base.get(#idx));
        }
    }
}

/// `body` for the host twin, where the slice parameters named in `slices` are
/// `SharedSlice`s: stores are rewritten in a first pass (their places are still `x[i]`
/// then), loads in a second.
pub fn host_body(body: &Block, slices: &HashSet<String>, device_fns: &[DeviceFnDecl]) -> Block {
    let mut b = body.clone();
    Calls { device_fns }.visit_block_mut(&mut b);
    Places { slices }.visit_block_mut(&mut b);
    Rewrite { slices }.visit_block_mut(&mut b);
    b
}

/// First pass: stores (`x[i] = v`, `x[i] op= v`) become `SharedSlice` calls whose index
/// and value still hold plain reads, which the second pass turns into loads.
struct Places<'a> {
    slices: &'a HashSet<String>,
}

impl VisitMut for Places<'_> {
    fn visit_expr_mut(&mut self, e: &mut Expr) {
        visit_mut::visit_expr_mut(self, e);
        let r = Rewrite { slices: self.slices };
        let span = e.span();
        let new: Option<Expr> = match &*e {
            Expr::Assign(a) => r.slice_index(&a.left).map(|(base, idx)| {
                let value = &a.right;
                syn::parse_quote_spanned!(span=> #base.set(#idx, #value))
            }),
            Expr::Binary(b) => match (plain_op(&b.op), r.slice_index(&b.left)) {
                (Some(op), Some((base, idx))) => {
                    let value = &b.right;
                    Some(syn::parse_quote_spanned!(span=> {
                        let __offload_i: usize = #idx;
                        let __offload_v = #value;
                        #base.set(__offload_i, #base.get(__offload_i) #op __offload_v)
                    }))
                }
                _ => None,
            },
            _ => None,
        };
        if let Some(n) = new {
            *e = n;
        }
    }
}

/// Calls of device functions, written from the kernel's parent module, get paths that
/// work from inside the kernel's module, where the twin is.
struct Calls<'a> {
    device_fns: &'a [DeviceFnDecl],
}

impl VisitMut for Calls<'_> {
    fn visit_expr_call_mut(&mut self, c: &mut syn::ExprCall) {
        visit_mut::visit_expr_call_mut(self, c);
        if let Expr::Path(p) = &*c.func {
            let path = &p.path;
            let text = quote::quote!(#path).to_string();
            if let Some(d) = self.device_fns.iter().find(|d| {
                let dp = &d.path;
                quote::quote!(#dp).to_string() == text
            }) {
                let outer = crate::expand::outer_path(&d.path);
                *c.func = syn::parse_quote_spanned!(p.span()=> #outer);
            }
        }
    }
}
