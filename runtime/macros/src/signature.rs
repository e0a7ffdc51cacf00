//! The shape of a kernel or device function: its indices and its parameters, written once.
//! The C declarations, the host twin's reads and the launcher's argument list are all
//! derived from [`KernelSig::slots`].

use proc_macro2::TokenStream;
use quote::{quote, quote_spanned, ToTokens};
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{FnArg, Ident, ItemFn, Pat, ReturnType, Type};

use crate::options::KernelOptions;
use crate::ty::{reducible, scalar_type, RedOp, Ty};

/// A `#[derive(offload::DeviceCopy)]` struct as a kernel sees it: the path written in the
/// kernel's module, and its C name (the struct's own name).
#[derive(Clone, Debug)]
pub struct StructTy {
    pub path: syn::Path,
    pub c_name: String,
}

impl PartialEq for StructTy {
    fn eq(&self, other: &Self) -> bool {
        self.c_name == other.c_name
            && self.path.to_token_stream().to_string() == other.path.to_token_stream().to_string()
    }
}

/// An element of a view: a scalar or a struct.
#[derive(Clone, Debug, PartialEq)]
pub enum Elem {
    Scalar(Ty),
    Struct(StructTy),
}

impl Elem {
    /// The C type.
    pub fn c(&self) -> String {
        match self {
            Elem::Scalar(t) => t.c().to_string(),
            Elem::Struct(s) => s.c_name.clone(),
        }
    }

    /// The Rust type as written from inside the kernel's module.
    pub fn rust_inner(&self) -> TokenStream {
        match self {
            Elem::Scalar(t) => t.rust(),
            Elem::Struct(s) => outer_path(&s.path),
        }
    }
}

/// How a parameter is passed.
#[derive(Clone, Debug, PartialEq)]
pub enum ParamKind {
    Scalar(Ty),
    /// A struct by value (its words in the argument block).
    Struct(StructTy),
    View {
        elem: Elem,
        mutable: bool,
    },
    /// A `&mut T` reduction variable (a one-element device view at launch).
    Reduction {
        ty: Ty,
        op: RedOp,
    },
}

/// One parameter of a kernel (after its indices) or of a device function.
#[derive(Clone, Debug)]
pub struct Param {
    pub name: Ident,
    pub kind: ParamKind,
}

impl Param {
    /// The parameter's name without `r#`.
    pub fn text(&self) -> String {
        self.name.unraw().to_string()
    }
}

/// A kernel's signature: its name, its index variables and its parameters.
#[derive(Clone, Debug)]
pub struct KernelSig {
    pub name: Ident,
    pub indices: Vec<Ident>,
    pub params: Vec<Param>,
    /// A teams kernel's threads per team (its indices are the team and the thread; its
    /// space is the teams'): the count, or the most with [`KernelSig::team_size_at_launch`].
    pub teams: Option<Threads>,
    /// `teams = ..=MAX`: the launch gives the team size (a slot of the argument block).
    pub team_size_at_launch: bool,
}

/// A teams kernel's threads per team: a literal (`teams = 256`), or a constant expression of
/// module constants (`teams = BSIZE * BSIZE`) that rustc evaluates into a constant beside
/// the kernel ([`Threads::item`]), which the generated Rust and C name.
#[derive(Clone, Debug)]
pub enum Threads {
    Lit(u32),
    Const(syn::Expr),
}

impl Threads {
    /// The constant holding a constant expression's value, beside kernel `kernel`.
    fn const_name(kernel: &Ident) -> Ident {
        quote::format_ident!("__OFFLOAD_THREADS_{}", syn::ext::IdentExt::unraw(kernel))
    }

    /// The count as a `usize` expression inside the kernel's module.
    pub fn rust(&self, kernel: &Ident) -> TokenStream {
        match self {
            Threads::Lit(t) => {
                let t = *t as usize;
                quote!(#t)
            }
            Threads::Const(_) => {
                let c = Self::const_name(kernel);
                quote!(super::#c)
            }
        }
    }

    /// The count in C: a literal, or the file-scope constant [`Threads::c_decl`] declares.
    pub fn c(&self, symbol: &str) -> String {
        match self {
            Threads::Lit(t) => t.to_string(),
            Threads::Const(_) => format!("__offload_threads_{symbol}"),
        }
    }

    /// The count in C as an `unsigned long long`.
    pub fn c_ull(&self, symbol: &str) -> String {
        match self {
            Threads::Lit(t) => format!("{t}ull"),
            Threads::Const(_) => self.c(symbol),
        }
    }

    /// The C declaration of a constant expression's value (before the kernel function), as
    /// a source part; none for a literal.
    pub fn c_decl(&self, kernel: &Ident, symbol: &str) -> Option<crate::emit_c::Part> {
        match self {
            Threads::Lit(_) => None,
            Threads::Const(_) => Some(crate::emit_c::Part::Const {
                name: self.c(symbol),
                path: Self::const_name(kernel).into(),
            }),
        }
    }

    /// How the kernel's text says it (`256`, `BSIZE * BSIZE`).
    pub fn text(&self) -> String {
        match self {
            Threads::Lit(t) => t.to_string(),
            Threads::Const(e) => quote!(#e).to_string(),
        }
    }

    /// The constant beside the kernel, with rustc's checks of its value (1 to 1024; whole
    /// warps with `reductions`); nothing for a literal (the macro checked it).
    pub fn item(&self, kernel: &Ident, reductions: bool) -> TokenStream {
        let Threads::Const(e) = self else { return TokenStream::new() };
        let c = Self::const_name(kernel);
        let warps = reductions.then(|| {
            quote_spanned! {e.span()=>
                const _: () = ::core::assert!(
                    #c % 32 == 0,
                    "offload::kernel: a teams kernel with reductions has whole warps: THREADS a multiple of 32"
                );
            }
        });
        quote_spanned! {e.span()=>
            #[doc(hidden)]
            #[allow(non_upper_case_globals, clippy::unnecessary_cast)]
            const #c: usize = (#e) as usize;
            const _: () = ::core::assert!(
                #c >= 1 && #c <= 1024,
                "offload::kernel: a team has 1 to 1024 threads"
            );
            #warps
        }
    }
}

/// One value of a launch's argument block, in order (the runtime appends the work-item
/// count). A struct takes as many positions as it has words. The runtime states the same
/// order on its side in `offload::kernel::abi` (`expand_c_shaped` builds it for launches in
/// the OpenMP shape, `LaunchParams` packs it for the drivers): a change here changes both.
#[derive(Clone, Copy, Debug)]
pub enum Slot<'a> {
    /// The first index of dimension `k`.
    Start(usize),
    /// A teams kernel's team size, given at launch (`teams = ..=MAX`).
    TeamSize,
    /// The length of inner dimension `k` (1 or 2).
    InnerLen(usize),
    /// Parameter `k` itself.
    Param(usize, &'a Param),
    /// The length of view (or reduction) parameter `k`.
    ViewLen(usize, &'a Param),
    /// A checked launch's report address.
    Report,
}

impl KernelSig {
    /// Dimensions of the launch's index space (a teams kernel's is its teams).
    pub fn space_dims(&self) -> usize {
        if self.teams.is_some() {
            1
        } else {
            self.indices.len()
        }
    }

    /// The argument block's values in order: the indices' starts, the inner lengths, the
    /// parameters, each view's length, then (checked) the report.
    pub fn slots(&self, checked: bool) -> Vec<Slot<'_>> {
        let d = self.space_dims();
        let mut v: Vec<Slot<'_>> = (0..d).map(Slot::Start).collect();
        if self.team_size_at_launch {
            v.push(Slot::TeamSize);
        }
        v.extend((1..d).map(Slot::InnerLen));
        v.extend(self.params.iter().enumerate().map(|(k, p)| Slot::Param(k, p)));
        v.extend(
            self.params
                .iter()
                .enumerate()
                .filter(|(_, p)| matches!(p.kind, ParamKind::View { .. } | ParamKind::Reduction { .. }))
                .map(|(k, p)| Slot::ViewLen(k, p)),
        );
        if checked {
            v.push(Slot::Report);
        }
        v
    }

    /// The launch position of each slot, as a constant expression (a struct's width is
    /// rustc's to know).
    pub fn positions(&self, slots: &[Slot<'_>]) -> Vec<TokenStream> {
        let mut fixed = 0usize;
        let mut widths: Vec<TokenStream> = Vec::new();
        let mut out = Vec::new();
        for s in slots {
            out.push(if widths.is_empty() { quote!(#fixed) } else { quote!((#fixed #(+ #widths)*)) });
            match s {
                Slot::Param(_, Param { kind: ParamKind::Struct(st), .. }) => {
                    let path = outer_path(&st.path);
                    widths.push(quote!(::offload::__private::words::<#path>()));
                }
                _ => fixed += 1,
            }
        }
        out
    }
}

pub fn err<T>(tokens: impl ToTokens, what: impl std::fmt::Display) -> syn::Result<T> {
    Err(syn::Error::new_spanned(tokens, format!("offload::kernel: {what}")))
}

fn check_plain_fn(f: &ItemFn) -> syn::Result<()> {
    let s = &f.sig;
    if !s.generics.params.is_empty() || s.generics.where_clause.is_some() {
        return err(
            &s.generics,
            "generic parameters are not in the kernel language: kernels take concrete types",
        );
    }
    if let Some(a) = &s.asyncness {
        return err(a, "async is not in the kernel language");
    }
    if let Some(u) = &s.unsafety {
        return err(u, "unsafe is not in the kernel language: kernels are safe Rust");
    }
    if let Some(v) = &s.variadic {
        return err(v, "variadic parameters are not in the kernel language");
    }
    Ok(())
}

fn param_name(arg: &FnArg) -> syn::Result<(&Ident, &Type)> {
    let FnArg::Typed(pt) = arg else {
        return err(arg, "`self` is not in the kernel language: kernels are free functions");
    };
    match &*pt.pat {
        Pat::Ident(p) if p.by_ref.is_none() && p.subpat.is_none() => {
            if let Some(m) = &p.mutability {
                return err(
                    m,
                    "`mut` parameters are not in the kernel language: iterations share the arguments; copy \
                     into a `let mut` local",
                );
            }
            Ok((&p.ident, &pt.ty))
        }
        other => err(other, "patterns are not in the kernel language: name each parameter"),
    }
}

/// The struct a plain path type names (anything but the scalars), if it is one.
pub fn struct_type(ty: &Type) -> Option<StructTy> {
    match ty {
        Type::Path(p) if p.qself.is_none() && scalar_type(ty).is_none() => {
            let last = p.path.segments.last()?;
            if !last.arguments.is_empty() || p.path.segments.iter().any(|s| !s.arguments.is_empty()) {
                return None;
            }
            Some(StructTy { path: p.path.clone(), c_name: last.ident.unraw().to_string() })
        }
        Type::Paren(p) => struct_type(&p.elem),
        Type::Group(g) => struct_type(&g.elem),
        _ => None,
    }
}

const PARAM_TYPES: &str =
    "expected f32, f64, i32, u32, i64, u64, usize, bool, bf16, f16, a `#[derive(offload::DeviceCopy)]` \
                           struct, or a slice `&[T]` / `&mut [T]` of those (not of bool)";

pub fn param_kind(ty: &Type) -> syn::Result<ParamKind> {
    if let Some(t) = scalar_type(ty) {
        return Ok(ParamKind::Scalar(t));
    }
    if let Some(s) = struct_type(ty) {
        return Ok(ParamKind::Struct(s));
    }
    if let Type::Reference(r) = ty {
        if let Type::Slice(s) = &*r.elem {
            let mutable = r.mutability.is_some();
            return match (scalar_type(&s.elem), struct_type(&s.elem)) {
                (Some(Ty::Bool), _) => {
                    err(ty, "slices of bool are not in the kernel language: bool is not DeviceCopy")
                }
                (Some(t), _) => Ok(ParamKind::View { elem: Elem::Scalar(t), mutable }),
                (None, Some(st)) => Ok(ParamKind::View { elem: Elem::Struct(st), mutable }),
                (None, None) => {
                    err(&s.elem, format!("this element type is not in the kernel language: {PARAM_TYPES}"))
                }
            };
        }
    }
    err(ty, format!("this parameter type is not in the kernel language: {PARAM_TYPES}"))
}

/// The scalar type `ty` refers to mutably (`&mut f32`), if it does.
fn mut_scalar(ty: &Type) -> Option<Ty> {
    match ty {
        Type::Reference(r) if r.mutability.is_some() => scalar_type(&r.elem),
        _ => None,
    }
}

/// The signature of kernel `f`. Its indices are its first `dims` parameters when the
/// options say `dims`, else its one leading `usize` parameter; more than one leading
/// `usize` without `dims` is ambiguous, and an error.
pub fn kernel_sig(f: &ItemFn, opts: &KernelOptions) -> syn::Result<KernelSig> {
    check_plain_fn(f)?;
    if let ReturnType::Type(_, t) = &f.sig.output {
        return err(t, "a kernel returns nothing: it writes its results into `&mut [T]` arguments");
    }
    let typed: Vec<(&Ident, &Type)> = f.sig.inputs.iter().map(param_name).collect::<syn::Result<_>>()?;
    let leading = typed.iter().take_while(|(_, t)| scalar_type(t) == Some(Ty::Usize)).count();
    let dims = match (&opts.teams, opts.dims) {
        (Some(_), Some((_, span))) => {
            return Err(syn::Error::new(
                span,
                "offload::kernel: a teams kernel's indices are its team and its thread: leave out `dims`",
            ))
        }
        (Some((Threads::Lit(t), span)), None)
            if !opts.reductions.is_empty() && t % 32 != 0 && !opts.team_size_at_launch =>
        {
            return Err(syn::Error::new(
                *span,
                "offload::kernel: a teams kernel with reductions has whole warps: THREADS a multiple of 32",
            ))
        }
        (Some(_), None) if leading < 2 => {
            return err(
                &f.sig,
                "a teams kernel's first parameters are its team and its thread, each `usize` (e.g. `fn k(team: usize, \
                 thread: usize, x: &mut [f32])`)",
            )
        }
        (Some(_), None) => 2,
        (None, Some((d, span))) => {
            if leading < d {
                return Err(syn::Error::new(
                    span,
                    format!(
                        "offload::kernel: `dims = {d}` but the kernel has {leading} leading `usize` parameters: its \
                         first {d} parameters are its indices, each `usize`"
                    ),
                ));
            }
            d
        }
        (None, None) if leading == 1 => 1,
        (None, None) if leading == 0 => {
            return err(
                &f.sig,
                "a kernel's first parameters are its 1, 2 or 3 indices, each `usize` (e.g. `fn k(i: usize, x: &mut [f32])`)",
            )
        }
        (None, None) => {
            let names: Vec<String> = typed.iter().take(leading).map(|(n, _)| format!("`{n}`")).collect();
            return err(
                &f.sig,
                format!(
                    "{} are `usize`: say how many are indices with `#[offload::kernel(dims = N)]` (e.g. `dims = 1` for \
                     an index followed by a `usize` argument, `dims = 2` for a 2-D kernel)",
                    names.join(", ")
                ),
            );
        }
    };
    let mut indices = Vec::new();
    let mut params = Vec::new();
    for (k, (name, ty)) in typed.into_iter().enumerate() {
        if k < dims {
            indices.push(name.clone());
            continue;
        }
        if let Some((op, _)) = opts.reductions.iter().find(|(_, r)| r == name) {
            let Some(t) = mut_scalar(ty).filter(|t| reducible(*t)) else {
                return err(
                    ty,
                    format!(
                        "`{name}` is listed in `reduction({}: ...)`, so its type is `&mut T` with T one of f32, f64, \
                         i32, u32, i64, u64 (a bf16 or f16 sum: reduce `x.to_f32()` into an f32)",
                        op.text()
                    ),
                );
            };
            params.push(Param { name: name.clone(), kind: ParamKind::Reduction { ty: t, op: *op } });
        } else if let Some(t) = mut_scalar(ty) {
            return err(
                ty,
                format!(
                    "a `&mut {}` argument is a reduction variable: list it as \
                     `#[offload::kernel(reduction(+: {name}))]` (or `min`, `max`)",
                    t.rust_name()
                ),
            );
        } else {
            params.push(Param { name: name.clone(), kind: param_kind(ty)? });
        }
    }
    for (_, r) in &opts.reductions {
        if !params.iter().any(|p| &p.name == r) {
            return err(r, "this reduction variable is not an argument of the kernel");
        }
    }
    Ok(KernelSig {
        name: f.sig.ident.clone(),
        indices,
        params,
        teams: opts.teams.clone().map(|(t, _)| t),
        team_size_at_launch: opts.team_size_at_launch,
    })
}

/// What a device function returns.
#[derive(Clone, Debug, PartialEq)]
pub enum Ret {
    Unit,
    Scalar(Ty),
    Struct(StructTy),
}

/// The parameters and return type of device function `f`.
pub fn device_sig(f: &ItemFn) -> syn::Result<(Vec<Param>, Ret)> {
    check_plain_fn(f)?;
    let mut params = Vec::new();
    for arg in &f.sig.inputs {
        let (name, ty) = param_name(arg)?;
        let kind = match param_kind(ty) {
            Ok(k) => k,
            Err(_) if mut_scalar(ty).is_some() => {
                return Err(syn::Error::new_spanned(
                    ty,
                    "offload::device: `&mut T` parameters are not in the kernel language: return the value, or take \
                     a `&mut [T]`",
                ))
            }
            Err(e) => return Err(e),
        };
        params.push(Param { name: name.clone(), kind });
    }
    let ret = match &f.sig.output {
        ReturnType::Default => Ret::Unit,
        ReturnType::Type(_, t) => match (scalar_type(t), struct_type(t)) {
            (Some(s), _) => Ret::Scalar(s),
            (None, Some(s)) => Ret::Struct(s),
            _ => {
                return Err(syn::Error::new_spanned(
                    t,
                    "offload::device: a device function returns a scalar, a DeviceCopy struct or nothing",
                ))
            }
        },
    };
    Ok((params, ret))
}

/// `path`, written in a kernel's parent module, as seen from inside the kernel's module.
pub fn outer_path(path: &syn::Path) -> TokenStream {
    let path = path.clone();
    let first = path.segments.first().map(|s| s.ident.to_string());
    let absolute = path.leading_colon.is_some()
        || matches!(
            first.as_deref(),
            Some("crate" | "super" | "self" | "std" | "core" | "alloc" | "offload")
        );
    if first.as_deref() == Some("self") && path.leading_colon.is_none() {
        // `self::` from the kernel's module is the kernel's parent.
        let rest: Vec<_> = path.segments.iter().skip(1).collect();
        return quote!(super::#(#rest)::*);
    }
    if absolute {
        quote!(#path)
    } else {
        quote!(super::#path)
    }
}
