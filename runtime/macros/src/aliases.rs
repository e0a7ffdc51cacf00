//! `types(Real = f32, ..)`: aliases of scalar types (C's `typedef float Real;`, Rust's
//! `type Real = f32;`) that a kernel or device function uses. A macro sees names, not what
//! they stand for: told the alias, it reads the function with the scalar type in each
//! place the alias names a type, and the generated code asserts that the alias is that
//! type, so a wrong entry is a compile error.

use proc_macro2::TokenStream;
use quote::quote_spanned;
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::visit_mut::VisitMut;
use syn::{Ident, ItemFn, Token, Type};

use crate::ty::scalar_type;

/// The aliases of one `types(...)` option.
#[derive(Default, Debug, Clone)]
pub struct Aliases(Vec<(Ident, Type)>);

/// `Real = f32` inside `types(...)`.
struct Alias(Ident, Type);

impl Parse for Alias {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let name: Ident = input.parse()?;
        input.parse::<Token![=]>()?;
        let ty: Type = input.parse()?;
        if scalar_type(&ty).is_none() {
            return Err(syn::Error::new(
                ty.span(),
                "offload: an alias in `types(..)` stands for a scalar type of the kernel language: f32, f64, \
                 i32, u32, i64, u64, usize or bool (a struct is used by its own name)",
            ));
        }
        Ok(Alias(name, ty))
    }
}

impl Aliases {
    /// The list inside `types(...)`, the parentheses' content being `input`.
    pub fn parse_list(input: ParseStream<'_>) -> syn::Result<Self> {
        let list: Punctuated<Alias, Token![,]> = input.parse_terminated(Alias::parse, Token![,])?;
        let mut out: Vec<(Ident, Type)> = Vec::new();
        for Alias(name, ty) in list {
            if out.iter().any(|(n, _)| *n == name) {
                return Err(syn::Error::new(name.span(), "offload: this alias is already in `types(..)`"));
            }
            out.push((name, ty));
        }
        if out.is_empty() {
            return Err(input.error("offload: name the aliases: `types(Real = f32)`"));
        }
        Ok(Self(out))
    }

    /// `f` with every type the aliases name replaced by its scalar type.
    pub fn resolve(&self, f: &ItemFn) -> ItemFn {
        let mut f = f.clone();
        if !self.0.is_empty() {
            let mut visitor = self;
            visitor.visit_item_fn_mut(&mut f);
        }
        f
    }

    /// Items asserting at compile time that each alias is its scalar type.
    pub fn assertions(&self) -> TokenStream {
        self.0
            .iter()
            .map(|(name, ty)| {
                quote_spanned! {name.span()=>
                    const _: () = ::offload::__private::alias_is::<#name, #ty>();
                }
            })
            .collect()
    }
}

impl VisitMut for &Aliases {
    fn visit_type_mut(&mut self, t: &mut Type) {
        if let Type::Path(p) = t {
            if p.qself.is_none() && p.path.segments.len() == 1 && p.path.segments[0].arguments.is_empty() {
                let name = &p.path.segments[0].ident;
                if let Some((_, ty)) = self.0.iter().find(|(n, _)| n == name) {
                    *t = ty.clone();
                    return;
                }
            }
        }
        syn::visit_mut::visit_type_mut(self, t);
    }

    /// `Real::MAX` and the like: the alias as a path's first segment.
    fn visit_expr_path_mut(&mut self, e: &mut syn::ExprPath) {
        if e.qself.is_none() && e.path.segments.len() > 1 {
            let first = &e.path.segments[0];
            if first.arguments.is_empty() {
                if let Some((_, Type::Path(ty))) = self.0.iter().find(|(n, _)| *n == first.ident) {
                    if let Some(scalar) = ty.path.get_ident() {
                        e.path.segments[0].ident = Ident::new(&scalar.to_string(), first.ident.span());
                    }
                }
            }
        }
        syn::visit_mut::visit_expr_path_mut(self, e);
    }
}
