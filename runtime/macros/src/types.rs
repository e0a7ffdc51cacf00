//! The kernel subset's types and the shape of a kernel's or device function's signature.

use proc_macro2::{Span, TokenStream};
use quote::ToTokens;
use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::{FnArg, Ident, ItemFn, Pat, ReturnType, Token, Type};

/// A scalar type of the subset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ty {
    F32,
    F64,
    I32,
    U32,
    I64,
    U64,
    Usize,
    Bool,
}

impl Ty {
    /// The type named `s` (a Rust type name or literal suffix).
    pub fn from_name(s: &str) -> Option<Ty> {
        Some(match s {
            "f32" => Ty::F32,
            "f64" => Ty::F64,
            "i32" => Ty::I32,
            "u32" => Ty::U32,
            "i64" => Ty::I64,
            "u64" => Ty::U64,
            "usize" => Ty::Usize,
            "bool" => Ty::Bool,
            _ => return None,
        })
    }

    /// The CUDA C type.
    pub fn c(self) -> &'static str {
        match self {
            Ty::F32 => "float",
            Ty::F64 => "double",
            Ty::I32 => "int",
            Ty::U32 => "unsigned int",
            Ty::I64 => "long long",
            Ty::U64 | Ty::Usize => "unsigned long long",
            Ty::Bool => "bool",
        }
    }

    /// The Rust type name.
    pub fn rust_name(self) -> &'static str {
        match self {
            Ty::F32 => "f32",
            Ty::F64 => "f64",
            Ty::I32 => "i32",
            Ty::U32 => "u32",
            Ty::I64 => "i64",
            Ty::U64 => "u64",
            Ty::Usize => "usize",
            Ty::Bool => "bool",
        }
    }

    /// The Rust type, as tokens.
    pub fn rust(self) -> TokenStream {
        Ident::new(self.rust_name(), Span::call_site()).into_token_stream()
    }

    pub fn is_float(self) -> bool {
        matches!(self, Ty::F32 | Ty::F64)
    }

    pub fn is_int(self) -> bool {
        !self.is_float() && self != Ty::Bool
    }
}

/// The subset's scalar type written as `ty`, if it is one.
pub fn scalar_type(ty: &Type) -> Option<Ty> {
    match ty {
        Type::Path(p) if p.qself.is_none() && p.path.segments.len() == 1 => {
            let seg = &p.path.segments[0];
            if seg.arguments.is_empty() {
                Ty::from_name(&seg.ident.to_string())
            } else {
                None
            }
        }
        Type::Paren(p) => scalar_type(&p.elem),
        Type::Group(g) => scalar_type(&g.elem),
        _ => None,
    }
}

/// The operator of a reduction (`reduction(+: x)`, `reduction(min: x)`, `reduction(max: x)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RedOp {
    Add,
    Min,
    Max,
}

impl RedOp {
    /// As written in `reduction(OP: ...)`.
    pub fn text(self) -> &'static str {
        match self {
            RedOp::Add => "+",
            RedOp::Min => "min",
            RedOp::Max => "max",
        }
    }

    /// The CUDA C functor of the prelude that combines two values.
    pub fn c_functor(self) -> &'static str {
        match self {
            RedOp::Add => "offload_op_add()",
            RedOp::Min => "offload_op_min()",
            RedOp::Max => "offload_op_max()",
        }
    }

    /// The value that leaves any other unchanged, as C text of type `t`.
    pub fn c_identity(self, t: Ty) -> &'static str {
        match (self, t) {
            (RedOp::Add, Ty::F32) => "0.0f",
            (RedOp::Add, Ty::F64) => "0.0",
            (RedOp::Add, Ty::I64) => "0ll",
            (RedOp::Add, Ty::U64) => "0ull",
            (RedOp::Add, Ty::U32) => "0u",
            (RedOp::Add, _) => "0",
            (RedOp::Min, Ty::F32) => "__int_as_float(0x7f800000)",
            (RedOp::Min, Ty::F64) => "__longlong_as_double(0x7ff0000000000000ll)",
            (RedOp::Min, Ty::I32) => "2147483647",
            (RedOp::Min, Ty::U32) => "4294967295u",
            (RedOp::Min, Ty::I64) => "9223372036854775807ll",
            (RedOp::Min, _) => "18446744073709551615ull",
            (RedOp::Max, Ty::F32) => "__int_as_float(0xff800000)",
            (RedOp::Max, Ty::F64) => "__longlong_as_double(0xfff0000000000000ull)",
            (RedOp::Max, Ty::I32) => "(-2147483647 - 1)",
            (RedOp::Max, Ty::I64) => "(-9223372036854775807ll - 1ll)",
            (RedOp::Max, _) => "0u",
        }
    }
}

/// The element types a reduction may have.
pub fn reducible(t: Ty) -> bool {
    matches!(t, Ty::F32 | Ty::F64 | Ty::I32 | Ty::U32 | Ty::I64 | Ty::U64)
}

/// How a kernel argument is passed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamKind {
    Scalar(Ty),
    Slice {
        elem: Ty,
        mutable: bool,
    },
    /// A `&mut T` reduction variable (a one-element device view at launch).
    Reduction {
        ty: Ty,
        op: RedOp,
    },
}

/// One argument of a kernel (after its indices) or of a device function.
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

/// A kernel's signature: its name, its index variables and its arguments.
#[derive(Clone, Debug)]
pub struct KernelSig {
    pub name: Ident,
    pub indices: Vec<Ident>,
    pub params: Vec<Param>,
}

pub fn err<T>(tokens: impl ToTokens, what: impl std::fmt::Display) -> syn::Result<T> {
    Err(syn::Error::new_spanned(tokens, format!("offload::kernel: {what}")))
}

fn check_plain_fn(f: &ItemFn) -> syn::Result<()> {
    let s = &f.sig;
    if !s.generics.params.is_empty() || s.generics.where_clause.is_some() {
        return err(
            &s.generics,
            "generic parameters are not in the kernel subset: kernels take concrete types",
        );
    }
    if let Some(a) = &s.asyncness {
        return err(a, "async is not in the kernel subset");
    }
    if let Some(u) = &s.unsafety {
        return err(u, "unsafe is not in the kernel subset: kernels are safe Rust");
    }
    if let Some(v) = &s.variadic {
        return err(v, "variadic parameters are not in the kernel subset");
    }
    Ok(())
}

fn param_name(arg: &FnArg) -> syn::Result<(&Ident, &Type)> {
    let FnArg::Typed(pt) = arg else {
        return err(arg, "`self` is not in the kernel subset: kernels are free functions");
    };
    match &*pt.pat {
        Pat::Ident(p) if p.by_ref.is_none() && p.subpat.is_none() => {
            if let Some(m) = &p.mutability {
                return err(
                    m,
                    "`mut` parameters are not in the kernel subset: iterations share the arguments; copy \
                     into a `let mut` local",
                );
            }
            Ok((&p.ident, &pt.ty))
        }
        other => err(other, "patterns are not in the kernel subset: name each parameter"),
    }
}

fn param_kind(ty: &Type, allow_slices: bool) -> syn::Result<ParamKind> {
    if let Some(t) = scalar_type(ty) {
        return Ok(ParamKind::Scalar(t));
    }
    if let Type::Reference(r) = ty {
        if let Type::Slice(s) = &*r.elem {
            if !allow_slices {
                return err(ty, "slices are not in the subset for device functions: they take scalars");
            }
            return match scalar_type(&s.elem) {
                Some(Ty::Bool) => err(ty, "slices of bool are not in the kernel subset: bool is not DeviceCopy"),
                Some(elem) => Ok(ParamKind::Slice { elem, mutable: r.mutability.is_some() }),
                None => err(&s.elem, "this element type is not in the kernel subset: expected f32, f64, i32, u32, i64, u64 or usize"),
            };
        }
    }
    err(
        ty,
        "this parameter type is not in the kernel subset: expected f32, f64, i32, u32, i64, u64, usize, bool, \
         or a slice `&[T]` / `&mut [T]` of those",
    )
}

/// The scalar type `ty` refers to mutably (`&mut f32`), if it does.
fn mut_scalar(ty: &Type) -> Option<Ty> {
    match ty {
        Type::Reference(r) if r.mutability.is_some() => scalar_type(&r.elem),
        _ => None,
    }
}

/// The signature of kernel `f`: its first `dims` (if given) or its leading `usize`
/// parameters (at most 3) are the indices; `reductions` name its `&mut T` arguments.
pub fn kernel_sig(f: &ItemFn, dims: Option<usize>, reductions: &[(RedOp, Ident)]) -> syn::Result<KernelSig> {
    check_plain_fn(f)?;
    if let ReturnType::Type(_, t) = &f.sig.output {
        return err(t, "a kernel returns nothing: it writes its results into `&mut [T]` arguments");
    }
    let mut indices = Vec::new();
    let mut params = Vec::new();
    for arg in &f.sig.inputs {
        let (name, ty) = param_name(arg)?;
        let leading = params.is_empty() && dims.is_none_or(|d| indices.len() < d);
        let reduction = reductions.iter().find(|(_, r)| r == name);
        if leading && scalar_type(ty) == Some(Ty::Usize) && indices.len() < 3 {
            indices.push(name.clone());
        } else if let Some((op, _)) = reduction {
            let Some(t) = mut_scalar(ty).filter(|t| reducible(*t)) else {
                return err(
                    ty,
                    format!(
                        "`{name}` is listed in `reduction({}: ...)`, so its type is `&mut T` with T one of f32, f64, \
                         i32, u32, i64, u64",
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
            params.push(Param { name: name.clone(), kind: param_kind(ty, true)? });
        }
    }
    for (_, r) in reductions {
        if !params.iter().any(|p| &p.name == r) {
            return err(r, "this reduction variable is not an argument of the kernel");
        }
    }
    if indices.is_empty() || dims.is_some_and(|d| d != indices.len()) {
        return err(
            &f.sig,
            "a kernel's first parameters are its 1, 2 or 3 indices, each `usize` (e.g. `fn k(i: usize, x: &mut [f32])`)",
        );
    }
    Ok(KernelSig { name: f.sig.ident.clone(), indices, params })
}

/// The parameters and return type of device function `f`.
pub fn device_sig(f: &ItemFn) -> syn::Result<(Vec<Param>, Option<Ty>)> {
    check_plain_fn(f)?;
    let mut params = Vec::new();
    for arg in &f.sig.inputs {
        let (name, ty) = param_name(arg)?;
        params.push(Param { name: name.clone(), kind: param_kind(ty, false)? });
    }
    let ret = match &f.sig.output {
        ReturnType::Default => None,
        ReturnType::Type(_, t) => Some(scalar_type(t).ok_or_else(|| {
            syn::Error::new_spanned(
                t,
                "offload::device: a device function returns a scalar of the subset or nothing",
            )
        })?),
    };
    Ok((params, ret))
}

/// A device function a kernel calls, as listed in `device_fns = [...]`: its path and
/// signature, e.g. `lerp(f32, f32, f32) -> f32`.
#[derive(Clone, Debug)]
pub struct DeviceFnDecl {
    pub path: syn::Path,
    pub params: Vec<Ty>,
    pub param_types: Vec<Type>,
    pub ret: Option<Ty>,
    pub ret_type: Option<Type>,
}

impl DeviceFnDecl {
    /// The function's own name (the path's last segment).
    pub fn name(&self) -> String {
        self.path.segments.last().map(|s| s.ident.unraw().to_string()).unwrap_or_default()
    }
}

impl Parse for DeviceFnDecl {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let path: syn::Path = input.parse()?;
        let content;
        syn::parenthesized!(content in input);
        let types: Punctuated<Type, Token![,]> = content.parse_terminated(Type::parse, Token![,])?;
        let mut params = Vec::new();
        for t in &types {
            params.push(scalar_type(t).ok_or_else(|| {
                syn::Error::new_spanned(t, "offload::kernel: device functions take scalars of the subset")
            })?);
        }
        let (ret, ret_type) = if input.peek(Token![->]) {
            input.parse::<Token![->]>()?;
            let t: Type = input.parse()?;
            let r = scalar_type(&t).ok_or_else(|| {
                syn::Error::new_spanned(&t, "offload::kernel: device functions return a scalar of the subset")
            })?;
            (Some(r), Some(t))
        } else {
            (None, None)
        };
        Ok(Self { path, params, param_types: types.into_iter().collect(), ret, ret_type })
    }
}

/// The options of `#[offload::kernel(...)]`.
#[derive(Default, Debug)]
pub struct KernelOptions {
    pub dims: Option<usize>,
    pub device_fns: Vec<DeviceFnDecl>,
    pub reductions: Vec<(RedOp, Ident)>,
    pub checked: Option<bool>,
    /// Outer indices one GPU thread walks in a row (2-D and 3-D), and where it was given.
    pub rows: Option<(u32, Span)>,
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
                "dims" => {
                    let n: syn::LitInt = input.parse()?;
                    let d: usize = n.base10_parse()?;
                    if !(1..=3).contains(&d) {
                        return Err(syn::Error::new_spanned(n, "offload::kernel: dims is 1, 2 or 3"));
                    }
                    o.dims = Some(d);
                }
                "device_fns" => {
                    let content;
                    syn::bracketed!(content in input);
                    let list: Punctuated<DeviceFnDecl, Token![,]> =
                        content.parse_terminated(DeviceFnDecl::parse, Token![,])?;
                    o.device_fns.extend(list);
                }
                _ => {
                    return Err(syn::Error::new_spanned(
                        key,
                        "offload::kernel: unknown option; expected `dims = N`, `device_fns = [f(T, ..) -> R, ..]`, \
                         `reduction(+: x, ..)` (or min, max), `checked = true|false` or `rows = N`",
                    ))
                }
            }
            if !input.is_empty() {
                input.parse::<Token![,]>()?;
            }
        }
        Ok(o)
    }
}
