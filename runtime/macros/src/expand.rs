//! What the attributes expand to: the item as written, and beside it the generated code
//! (a module for a kernel; a twin and a source constant for a device function), assembled
//! from the signature's slots and the emitters' output.

use std::collections::{HashMap, HashSet};

use proc_macro2::TokenStream;
use quote::{format_ident, quote};
use syn::ItemFn;

use crate::access::{thread_map, ThreadMap};
use crate::emit_c::{self, Part, Variant};
use crate::emit_host::{twin_name, RustEmitter};
use crate::ir::{Body, VarId};
use crate::lower::{is_reserved, Lowerer, Mode};
use crate::options::{KernelOptions, DEFAULT_ROWS};
use crate::signature::{device_sig, kernel_sig, outer_path, Elem, KernelSig, ParamKind, Ret, Slot};
use crate::ty::{RedOp, Ty};

/// The driver's limit on a launch's parameters, in bytes (`offload::kernel::PARAM_LIMIT`,
/// which this crate cannot name).
pub const PARAM_LIMIT: usize = 4096;

/// The hidden constant holding device function `name`'s C source.
pub fn device_source_const(name: &syn::Ident) -> syn::Ident {
    use syn::ext::IdentExt;
    format_ident!("__OFFLOAD_DEVICE_FN_{}", name.unraw())
}

/// `parts` as a `&'static str` expression, with `items` holding the constants it needs
/// (a literal when the macro wrote it all; a compile-time concatenation otherwise).
pub fn source_expr(parts: &[Part], prefix: &str, nested: bool, items: &mut Vec<TokenStream>) -> TokenStream {
    // Adjacent text merged.
    let mut merged: Vec<Part> = Vec::new();
    for p in parts {
        match (merged.last_mut(), p) {
            (Some(Part::Text(a)), Part::Text(b)) => a.push_str(b),
            _ => merged.push(p.clone()),
        }
    }
    let path = |p: &syn::Path| if nested { outer_path(p) } else { quote!(#p) };
    if let [Part::Text(t)] = merged.as_slice() {
        return quote!(#t);
    }
    let sp = quote!(::offload::__private::SourcePart);
    let tokens: Vec<TokenStream> = merged
        .iter()
        .map(|p| match p {
            Part::Text(t) => quote!(#sp::Text(#t)),
            Part::Const { name, path: c } => {
                let c = path(c);
                quote!(#sp::Const(::offload::__private::c_const(#name, #c)))
            }
            Part::Struct(s) => {
                let t = path(&s.path);
                quote!(#sp::Text(<#t as ::offload::KernelStruct>::C_SOURCE))
            }
            Part::DeviceFn(f) => {
                let mut f = f.clone();
                if let Some(last) = f.segments.last_mut() {
                    last.ident = device_source_const(&last.ident);
                }
                let f = path(&f);
                quote!(#sp::Text(#f))
            }
        })
        .collect();
    let parts_name = format_ident!("__OFFLOAD_{}_PARTS", prefix);
    let len_name = format_ident!("__OFFLOAD_{}_LEN", prefix);
    let bytes_name = format_ident!("__OFFLOAD_{}_BYTES", prefix);
    items.push(quote! {
        #[doc(hidden)]
        #[allow(non_upper_case_globals)]
        const #parts_name: &[#sp] = &[#(#tokens),*];
        #[doc(hidden)]
        #[allow(non_upper_case_globals)]
        const #len_name: usize = ::offload::__private::source_len(#parts_name);
        #[doc(hidden)]
        #[allow(non_upper_case_globals)]
        const #bytes_name: [u8; #len_name] = ::offload::__private::source_bytes::<#len_name>(#parts_name);
    });
    quote!(::offload::__private::utf8(&#bytes_name))
}

/// `item` with the expansion `expand` makes of it; on an error the item as written stays,
/// with the error beside it, so that rustc reports nothing else about it.
fn expand_item(item: TokenStream, expand: impl FnOnce(&ItemFn) -> syn::Result<TokenStream>) -> TokenStream {
    let f: ItemFn = match syn::parse2(item) {
        Ok(f) => f,
        Err(e) => return e.into_compile_error(),
    };
    match expand(&f) {
        Ok(t) => t,
        Err(e) => {
            let e = e.into_compile_error();
            quote!(#[allow(dead_code, unused)] #f #e)
        }
    }
}

/// `#[offload::device]`.
pub fn device(attr: TokenStream, item: TokenStream) -> TokenStream {
    expand_item(item, |f| device_impl(attr, f))
}

fn device_impl(attr: TokenStream, f: &ItemFn) -> syn::Result<TokenStream> {
    let aliases = device_aliases(attr)?;
    let checks = aliases.assertions();
    device_items(&aliases.resolve(f), f).map(|items| quote!(#checks #items))
}

/// The one option of `#[offload::device(..)]`: `types(Real = f32, ..)`.
fn device_aliases(attr: TokenStream) -> syn::Result<crate::aliases::Aliases> {
    if attr.is_empty() {
        return Ok(Default::default());
    }
    let refused = |t: &dyn quote::ToTokens| {
        syn::Error::new_spanned(
            t,
            "offload::device takes one option, `types(Alias = f32, ..)` (device functions it calls are found \
             by name)",
        )
    };
    syn::parse::Parser::parse2(
        |input: syn::parse::ParseStream<'_>| {
            let key: syn::Ident = input.parse()?;
            if key != "types" {
                return Err(refused(&key));
            }
            let content;
            syn::parenthesized!(content in input);
            let aliases = crate::aliases::Aliases::parse_list(&content)?;
            if !input.is_empty() {
                return Err(input.error("offload::device: nothing after `types(..)`"));
            }
            Ok(aliases)
        },
        attr,
    )
}

/// A device function's items, `f` read with its aliases resolved, `original` as written.
fn device_items(f: &ItemFn, original: &ItemFn) -> syn::Result<TokenStream> {
    let (params, ret) = device_sig(f)?;
    let name = f.sig.ident.to_string();
    if is_reserved(&name) {
        return Err(syn::Error::new_spanned(
            &f.sig.ident,
            "offload::device: this name is reserved in C; rename the function",
        ));
    }
    let mut lower = Lowerer::new(Mode::Device(ret.clone()));
    lower.reserve(&name);
    let param_vars = lower.params(&params);
    let stmts = lower.stmts(&f.block.stmts, true)?;
    let body = lower.finish(stmts);
    let parts = emit_c::device_source(&name, &params, &param_vars, &ret, &body);
    let mut items = Vec::new();
    let src = source_expr(&parts, &format!("DEVICE_FN_{name}"), false, &mut items);
    let konst = device_source_const(&f.sig.ident);
    let vis = &f.vis;

    // The twin: the same function over the twins' views.
    let emit = RustEmitter::new(&body, false);
    let twin = twin_name(&f.sig.ident);
    let twin_params: Vec<TokenStream> = params
        .iter()
        .map(|p| {
            let n = &p.name;
            match &p.kind {
                ParamKind::Scalar(t) => {
                    let t = t.rust();
                    quote!(#n: #t)
                }
                ParamKind::Struct(s) => {
                    let path = &s.path;
                    quote!(#n: #path)
                }
                ParamKind::View { elem, .. } => {
                    let t = match elem {
                        Elem::Scalar(t) => t.rust(),
                        Elem::Struct(s) => {
                            let path = &s.path;
                            quote!(#path)
                        }
                    };
                    quote!(#n: ::offload::__private::SharedSlice<'_, #t>)
                }
                ParamKind::Reduction { .. } => unreachable!("device functions have no reductions"),
            }
        })
        .collect();
    let ret_tokens = match &ret {
        Ret::Unit => quote!(),
        Ret::Scalar(t) => {
            let t = t.rust();
            quote!(-> #t)
        }
        Ret::Struct(s) => {
            let path = &s.path;
            quote!(-> #path)
        }
    };
    let twin_body = emit.stmts(&body.stmts);
    Ok(quote! {
        // The kernel language has `%` but not `is_multiple_of`, which clippy would ask for.
        #[allow(clippy::manual_is_multiple_of)]
        #original
        #[doc(hidden)]
        #[allow(unused, unused_parens, clippy::all, non_snake_case)]
        #vis fn #twin(#(#twin_params),*) #ret_tokens {
            #twin_body
        }
        #(#items)*
        #[doc(hidden)]
        #[allow(non_upper_case_globals)]
        #vis const #konst: &str = #src;
    })
}

/// `#[offload::kernel]`.
pub fn kernel(attr: TokenStream, item: TokenStream) -> TokenStream {
    expand_item(item, |f| kernel_impl(attr, f))
}

/// A kernel, lowered: its signature, body and variables.
pub(crate) struct Lowered {
    pub sig: KernelSig,
    pub body: Body,
    pub index_vars: Vec<VarId>,
    pub param_vars: Vec<VarId>,
    pub map: ThreadMap,
    /// Whether the body reduces over its teams (`offload::team_sum`).
    pub team_reduce: bool,
}

fn kernel_impl(attr: TokenStream, original: &ItemFn) -> syn::Result<TokenStream> {
    let (opts, k, rows) = lower_kernel(attr, original)?;
    // The kernel as read with its aliases resolved (the same types to rustc).
    let f = opts.aliases.resolve(original);
    let checks = opts.aliases.assertions();
    // Each type taken as a struct is asserted one at its place in the signature: a scalar's
    // alias the macro was not told of fails there first, naming the fix.
    let structs = k.sig.params.iter().filter_map(|p| match &p.kind {
        crate::signature::ParamKind::Struct(s)
        | crate::signature::ParamKind::View { elem: crate::signature::Elem::Struct(s), .. } => Some(&s.path),
        _ => None,
    });
    let structs = structs.map(
        |p| quote::quote_spanned!(syn::spanned::Spanned::span(p)=> const _: () = ::offload::__private::is_kernel_struct::<#p>();),
    );
    // The function itself is emitted as written (the aliases are the same types to rustc).
    let generated = generate(&f, original, &opts, &k, rows)?;
    Ok(quote!(#checks #(#structs)* #generated))
}

/// A kernel's options, lowered body and strip length.
fn lower_kernel(attr: TokenStream, f: &ItemFn) -> syn::Result<(KernelOptions, Lowered, u32)> {
    let opts: KernelOptions = syn::parse2(attr)?;
    let f = &opts.aliases.resolve(f);
    let sig = kernel_sig(f, &opts)?;
    let rows = match opts.rows {
        Some((_, span)) if sig.indices.len() == 1 || sig.teams.is_some() => {
            return Err(syn::Error::new(span, "offload::kernel: rows applies to 2-D and 3-D kernels"))
        }
        Some((r, _)) => r,
        None => DEFAULT_ROWS,
    };
    if is_reserved(&sig.name.to_string()) {
        return Err(syn::Error::new_spanned(
            &sig.name,
            "offload::kernel: this name is reserved in C; rename the kernel",
        ));
    }
    let mut lower = Lowerer::new(Mode::Kernel);
    if sig.teams.is_some() {
        lower.set_teams();
    }
    lower.reserve(&sig.name.to_string());
    let param_vars = lower.params(&sig.params);
    let index_vars = lower.indices(&sig.indices);
    let stmts = lower.stmts(&f.block.stmts, false)?;
    lower.check_sync(&stmts)?;
    // A team reduction shuffles within warps on GPUs: the team is whole warps (a constant
    // expression's size is checked by rustc, beside the kernel).
    let team_reduce = lower.team_reduce().is_some();
    if let (Some(span), Some(crate::signature::Threads::Lit(t))) = (lower.team_reduce(), &sig.teams) {
        if t % 32 != 0 && !sig.team_size_at_launch {
            return Err(syn::Error::new(
                span,
                format!("a team reduction needs whole warps: the team's {t} threads (`teams = ...`) a multiple of 32"),
            ));
        }
    }
    let body = lower.finish(stmts);
    let names: Vec<String> = sig.indices.iter().map(|i| i.to_string()).collect();
    let map = match &sig.teams {
        Some(t) => ThreadMap {
            order: vec![0, 1],
            note: format!("teams of {} threads: a block per team, `{}` = threadIdx.x", t.text(), names[1]),
        },
        None => thread_map(&body, &names),
    };
    let k = Lowered { sig, body, index_vars, param_vars, map, team_reduce };
    Ok((opts, k, rows))
}

/// Kernel `f`'s CUDA source (checked or not) with placeholders for what rustc fills in,
/// and its thread mapping; or the compile error.
#[cfg(test)]
pub fn kernel_c(attr: TokenStream, f: TokenStream, checked: bool) -> Result<(String, ThreadMap), String> {
    let variant = if checked { Variant::Checked } else { Variant::Plain };
    kernel_c_variant(attr, f, variant)
}

/// Kernel `f`'s CUDA source for `variant` (the narrow variant from the narrowed body), as
/// [`kernel_c`].
#[cfg(test)]
pub fn kernel_c_variant(
    attr: TokenStream,
    f: TokenStream,
    variant: Variant,
) -> Result<(String, ThreadMap), String> {
    let f: ItemFn = syn::parse2(f).map_err(|e| e.to_string())?;
    let (_, k, rows) = lower_kernel(attr, &f).map_err(|e| e.to_string())?;
    let narrowed = crate::narrow::narrow(&k.body, &k.index_vars);
    let body = if variant == Variant::Narrow { &narrowed } else { &k.body };
    let parts = emit_c::kernel_source(&k.sig, body, &k.index_vars, &k.param_vars, variant, rows, &k.map);
    Ok((emit_c::joined(&parts), k.map))
}

/// A teams kernel's twin for one team: its per-thread arrays, then its code.
#[cfg(test)]
pub fn teams_twin(attr: TokenStream, f: TokenStream) -> Result<String, String> {
    let f: ItemFn = syn::parse2(f).map_err(|e| e.to_string())?;
    let (_, k, _) = lower_kernel(attr, &f).map_err(|e| e.to_string())?;
    let threads = k.sig.teams.as_ref().ok_or("not a teams kernel")?;
    // Every view may take windows, as on the twin's fast path.
    let views: Vec<crate::ir::VarId> = k
        .sig
        .params
        .iter()
        .zip(&k.param_vars)
        .filter(|(p, _)| matches!(p.kind, crate::signature::ParamKind::View { .. }))
        .map(|(_, v)| *v)
        .collect();
    let twin = crate::emit_teams::TeamsTwin::new(&k.body, threads, &k.sig.name, k.index_vars[1], quote!())
        .with_windows(&views);
    Ok(format!("{} {}", twin.arrays(), twin.team()))
}

/// Device function `f`'s source with placeholders, or the compile error.
#[cfg(test)]
pub fn device_c(f: TokenStream) -> Result<String, String> {
    let f: ItemFn = syn::parse2(f).map_err(|e| e.to_string())?;
    let (params, ret) = device_sig(&f).map_err(|e| e.to_string())?;
    let mut lower = Lowerer::new(Mode::Device(ret.clone()));
    let param_vars = lower.params(&params);
    let stmts = lower.stmts(&f.block.stmts, true).map_err(|e| e.to_string())?;
    let body = lower.finish(stmts);
    Ok(emit_c::joined(&emit_c::device_source(&f.sig.ident.to_string(), &params, &param_vars, &ret, &body)))
}

/// What every part of a kernel's generated module reads: the lowered kernel, its options,
/// the argument block's layout, its team-local arrays and its reduction variables.
pub(crate) struct KernelGen<'a> {
    pub opts: &'a KernelOptions,
    pub k: &'a Lowered,
    pub name_str: String,
    /// Dimensions of the index space.
    pub dims: usize,
    /// The argument block of a launch of `KERNEL` (no report), and each slot's position.
    pub slots: Vec<Slot<'a>>,
    pub positions: Vec<TokenStream>,
    /// Each parameter's position, and each view's length's.
    pub param_pos: HashMap<usize, TokenStream>,
    pub len_pos: HashMap<usize, TokenStream>,
    /// Views the body uses whole (sub-slices, device function arguments): shared slices
    /// in the twin.
    pub whole: HashSet<VarId>,
    pub team_locals: Vec<TeamLocal<'a>>,
    /// Reduction variables: name, type, operator.
    pub reductions: Vec<(&'a syn::Ident, Ty, RedOp)>,
    /// Work items per index of the space: a teams launch runs a team's per team.
    pub per_item: TokenStream,
}

/// A teams kernel's team-local array: its name (a checked launch's report names it after
/// the parameters), element type and length, and whether the twin keeps it as plain cells
/// (a team runs on one pool thread; not when the body uses it whole).
pub(crate) struct TeamLocal<'a> {
    pub name: &'a syn::Ident,
    pub elem: TokenStream,
    pub len: TokenStream,
    pub cells: bool,
}

impl<'a> KernelGen<'a> {
    fn new(opts: &'a KernelOptions, k: &'a Lowered) -> Self {
        let sig = &k.sig;
        let slots = sig.slots(false);
        let positions = sig.positions(&slots);
        let mut param_pos: HashMap<usize, TokenStream> = HashMap::new();
        let mut len_pos: HashMap<usize, TokenStream> = HashMap::new();
        for (s, pos) in slots.iter().zip(&positions) {
            match s {
                Slot::Param(i, _) => {
                    param_pos.insert(*i, pos.clone());
                }
                Slot::ViewLen(i, _) => {
                    len_pos.insert(*i, pos.clone());
                }
                _ => {}
            }
        }
        let whole = crate::access::whole_view_uses(&k.body);
        let lens = RustEmitter::new(&k.body, true);
        let team_locals = k
            .body
            .vars
            .iter()
            .enumerate()
            .filter_map(|(id, v)| match (&v.role, &v.ty) {
                (crate::ir::Role::TeamLocal(n), crate::ir::Type::View { elem, .. }) => {
                    let len = match n {
                        crate::ir::TeamLen::Lit(n) => {
                            let n = *n as usize;
                            quote!(#n)
                        }
                        crate::ir::TeamLen::Const(e, _) => {
                            let e = lens.expr(e);
                            quote!(((#e) as usize))
                        }
                    };
                    Some(TeamLocal {
                        name: &v.rust,
                        elem: elem.rust_inner(),
                        len,
                        cells: !whole.contains(&id),
                    })
                }
                _ => None,
            })
            .collect();
        let reductions = sig
            .params
            .iter()
            .filter_map(|p| match p.kind {
                ParamKind::Reduction { ty, op } => Some((&p.name, ty, op)),
                _ => None,
            })
            .collect();
        KernelGen {
            opts,
            k,
            name_str: sig.name.to_string(),
            dims: sig.space_dims(),
            slots,
            positions,
            param_pos,
            len_pos,
            whole,
            team_locals,
            reductions,
            per_item: if sig.teams.is_some() { quote!(__offload_ts) } else { quote!(1usize) },
        }
    }

    /// The kernel's CUDA C sources, plain, checked and narrow, as `&'static str`
    /// expressions (in the order of [`SOURCES`]), with `items` holding the constants they
    /// need.
    fn device_sources(&self, narrowed: &Body, rows: u32, items: &mut Vec<TokenStream>) -> Vec<TokenStream> {
        let k = self.k;
        SOURCES
            .iter()
            .map(|&(variant, tag)| {
                let body = if variant == Variant::Narrow { narrowed } else { &k.body };
                let parts =
                    emit_c::kernel_source(&k.sig, body, &k.index_vars, &k.param_vars, variant, rows, &k.map);
                source_expr(&parts, tag, true, items)
            })
            .collect()
    }

    /// The argument positions the narrow variant reads as 32-bit values: every `usize` of
    /// the block but the parameters it keeps 64-bit.
    fn narrow_positions(&self, narrowed: &Body) -> Vec<TokenStream> {
        let k = self.k;
        self.slots
            .iter()
            .zip(&self.positions)
            .filter(|(slot, _)| match slot {
                Slot::Start(_) | Slot::TeamSize | Slot::InnerLen(_) | Slot::ViewLen(..) => true,
                Slot::Param(i, _) => {
                    matches!(narrowed.vars[k.param_vars[*i]].ty, crate::ir::Type::Scalar(Ty::U32))
                        && matches!(k.body.vars[k.param_vars[*i]].ty, crate::ir::Type::Scalar(Ty::Usize))
                }
                Slot::Report => false,
            })
            .map(|(_, p)| p.clone())
            .collect()
    }

    /// The checks of the team-local arrays' sizes: a constant length's by rustc, beside
    /// the kernel (a literal's by the macro), and all the arrays' together, since they
    /// share the block's static shared memory.
    fn shared_memory_checks(&self) -> TokenStream {
        let name = &self.k.sig.name;
        let (most, too_large) = (crate::lower::SHARED_BYTES, crate::lower::TEAM_LOCAL_TOO_LARGE);
        let mut size_checks: Vec<TokenStream> = Vec::new();
        let mut terms: Vec<TokenStream> = Vec::new();
        for v in &self.k.body.vars {
            let (
                crate::ir::Role::TeamLocal(len),
                crate::ir::Type::View { elem: crate::signature::Elem::Scalar(t), .. },
            ) = (&v.role, &v.ty)
            else {
                continue;
            };
            let bytes = t.bytes();
            match len {
                crate::ir::TeamLen::Lit(n) => terms.push(quote!((#n as u64).saturating_mul(#bytes))),
                crate::ir::TeamLen::Const(_, written) => {
                    let size = quote!(((#written) as u64).saturating_mul(#bytes));
                    size_checks.push(quote::quote_spanned! {syn::spanned::Spanned::span(&**written)=>
                        #[allow(clippy::unnecessary_cast)]
                        const _: () = ::core::assert!(#size <= #most, #too_large);
                    });
                    terms.push(size);
                }
            }
        }
        let total_check = (terms.len() > 1).then(|| {
            quote::quote_spanned! {name.span()=>
                #[allow(clippy::unnecessary_cast)]
                const _: () = ::core::assert!(
                    0u64 #(.saturating_add(#terms))* <= #most,
                    "a teams kernel's team-local arrays hold at most 48 KiB together (a GPU block's static shared memory)"
                );
            }
        });
        quote!(#(#size_checks)* #total_check)
    }

    /// The argument block's size against the driver's limit: a compile error when the
    /// macro can count it, else a check rustc makes (structs' sizes are its to know).
    fn argument_block_check(&self, f: &ItemFn) -> syn::Result<Option<TokenStream>> {
        let sig = &self.k.sig;
        let mut fixed_bytes = 8 * (2 * self.dims - 1) + 8 + 8; // bounds, n, a checked launch's report
        let mut struct_sizes = Vec::new();
        for p in &sig.params {
            match &p.kind {
                ParamKind::Scalar(Ty::F32 | Ty::I32 | Ty::U32 | Ty::Bool) => fixed_bytes += 8, // with padding, at worst
                ParamKind::Scalar(_) => fixed_bytes += 8,
                ParamKind::View { .. } | ParamKind::Reduction { .. } => fixed_bytes += 16,
                ParamKind::Struct(s) => {
                    let path = outer_path(&s.path);
                    struct_sizes.push(quote!(::core::mem::size_of::<#path>() + 8));
                }
            }
        }
        if struct_sizes.is_empty() && fixed_bytes > PARAM_LIMIT {
            return Err(syn::Error::new_spanned(
                &f.sig,
                format!(
                    "offload::kernel: the kernel's argument block would take {fixed_bytes} bytes (each scalar 8 with \
                     padding, each view 16 with its length); the driver's limit is {PARAM_LIMIT}: pass fewer arguments, or \
                     gather scalars into a `#[derive(offload::DeviceCopy)]` struct"
                ),
            ));
        }
        let limit_msg = format!(
            "offload::kernel: the arguments of `{}` take more than {PARAM_LIMIT} bytes (the driver's limit): pass \
             fewer arguments or smaller structs",
            self.name_str
        );
        Ok((!struct_sizes.is_empty()).then(|| {
            quote!(
                const _: () = ::core::assert!(#fixed_bytes #(+ #struct_sizes)* <= #PARAM_LIMIT, #limit_msg);
            )
        }))
    }
}

/// The kernel's CUDA sources: the variant, and the tag of its constants.
const SOURCES: [(Variant, &str); 3] =
    [(Variant::Plain, "CUDA"), (Variant::Checked, "CUDA_CHECKED"), (Variant::Narrow, "CUDA_NARROW")];

/// The items of kernel `f` (read with its aliases resolved), `original` as written, and
/// beside it the generated module: the host twin, the sources, `KERNEL` and its variants,
/// the launchers.
fn generate(
    f: &ItemFn,
    original: &ItemFn,
    opts: &KernelOptions,
    k: &Lowered,
    rows: u32,
) -> syn::Result<TokenStream> {
    let g = KernelGen::new(opts, k);
    let sig = &k.sig;
    let name = &sig.name;
    let vis = &f.vis;
    let host_fn = format_ident!("__offload_host_{}", name);
    let host_fn_avx512 = format_ident!("__offload_host_avx512_{}", name);
    let mut items = Vec::new();
    let narrowed = crate::narrow::narrow(&k.body, &k.index_vars);
    let sources = g.device_sources(&narrowed, rows, &mut items);
    let sources = <[TokenStream; 3]>::try_from(sources).expect("three sources");
    let shared_checks = g.shared_memory_checks();
    let size_check = g.argument_block_check(f)?;
    let twin = crate::twin::host_twin(&g);
    let shape = crate::launcher::shape(&g);
    let kernels = kernel_statics(&g, &host_fn, &twin.path, &narrowed, sources);
    let launchers = crate::launcher::launchers(&g);
    let twin_body = &twin.body;
    let doc = format!(
        "The generated launcher and kernel of `fn {name}` (`#[offload::kernel]`), over a {}-D \
         index space.\n\nArguments declared `&mut [T]` take a writable [`offload::DeviceSlice`] (one that comes \
         from an exclusive borrow); a shared one is an `Error::KernelArgument`. A reduction variable \
         (`&mut T` listed in `reduction(..)`) takes a writable view, or a `DeviceBuffer`'s, of at least one \
         element: the launch \
         combines every iteration's contributions, and element 0's value, into element 0 (`reduce`, \
         generated for kernels with reduction variables, provides them itself and returns their values). \
         Views the kernel writes may not overlap other views of the launch.\n\nThread mapping on GPUs: {}.",
        g.dims, k.map.note
    );
    // Whole warps: checked on the count here, on the launch's size with `..=MAX`.
    let warps = (!opts.reductions.is_empty() || k.team_reduce) && !sig.team_size_at_launch;
    let threads_item = sig.teams.as_ref().map(|t| t.item(name, warps));
    Ok(quote! {
        #shared_checks
        #threads_item
        // The kernel language has `%` but not `is_multiple_of`, which clippy would ask for.
        #[allow(dead_code, clippy::manual_is_multiple_of)]
        #original

        #[doc = #doc]
        #[allow(dead_code, clippy::all)]
        #vis mod #name {
            #[doc(hidden)]
            #[allow(unused, unused_parens, unused_braces, clippy::all, non_snake_case)]
            fn #host_fn<const __OFFLOAD_CHECK: bool>(__offload_l: &::offload::HostLaunch<'_>) -> ::core::result::Result<(), ::std::string::String> {
                #[cfg(all(target_arch = "x86_64", not(debug_assertions)))]
                if !__OFFLOAD_CHECK && __offload_l.avx512() {
                    // SAFETY: the CPU runs x86-64-v4 (`HostLaunch::avx512` checked it).
                    return unsafe { #host_fn_avx512(__offload_l) };
                }
                #twin_body
                ::core::result::Result::Ok(())
            }

            /// The same twin unchecked, compiled for AVX-512 (x86-64-v4), its closures too:
            /// release builds only, as it doubles the twin's code.
            #[doc(hidden)]
            #[cfg(all(target_arch = "x86_64", not(debug_assertions)))]
            #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,bmi1,bmi2,lzcnt,popcnt,f16c")]
            #[allow(unused, unused_parens, unused_braces, clippy::all, non_snake_case)]
            fn #host_fn_avx512(__offload_l: &::offload::HostLaunch<'_>) -> ::core::result::Result<(), ::std::string::String> {
                const __OFFLOAD_CHECK: bool = false;
                #twin_body
                ::core::result::Result::Ok(())
            }

            #(#items)*
            #size_check

            #shape

            #kernels

            #launchers
        }
    })
}

/// `KERNEL`, `KERNEL_NARROW` and `KERNEL_CHECKED`: the kernel's sources (in the order of
/// [`SOURCES`]), host twin and launch settings.
fn kernel_statics(
    g: &KernelGen<'_>,
    host_fn: &syn::Ident,
    host_path: &str,
    narrowed: &Body,
    sources: [TokenStream; 3],
) -> TokenStream {
    let sig = &g.k.sig;
    let [cuda, cuda_checked, cuda_narrow] = sources;
    let name_str = &g.name_str;
    let symbol_checked = emit_c::symbol(sig, Variant::Checked);
    let symbol_narrow = emit_c::symbol(sig, Variant::Narrow);
    let narrow_positions = g.narrow_positions(narrowed);
    let block = match &sig.teams {
        Some(t) => {
            let t = t.rust(&sig.name);
            quote!((#t) as u32)
        }
        None => {
            let b = emit_c::BLOCK;
            quote!(#b)
        }
    };
    // A teams kernel gets a block per team (its blocks loop over the teams all the same):
    // on the H200 the Jacobi teams step took 0.90 ms so, 0.99 ms in one wave of blocks.
    let grid_stride = sig.teams.is_none().then(|| quote!(.with_grid_stride()));
    let note = &g.k.map.note;
    quote! {
        /// The kernel: its CUDA C source (HIP compiles it translated) and its host twin. Launched in the
        /// OpenMP shape (`offload::omp::target`, one argument per parameter), the runtime
        /// adds its start and its views' lengths.
        pub static KERNEL: ::offload::Kernel = ::offload::Kernel::new(#name_str)
            .with_cuda(#cuda)
            .with_host(#host_fn::<false>)
            .with_block(#block)
            #grid_stride
            .with_thread_map(#note)
            .with_host_path(#host_path)
            .with_shape(&__OFFLOAD_SHAPE)
            .with_narrow(&KERNEL_NARROW);

        /// [`KERNEL`] with its `usize` arithmetic in 32 bits wherever that gives the
        /// same values (GPUs only): what a GPU launch of `KERNEL` runs when the
        /// work-item count (at least 1) and every `usize` it passes are at most 2^30.
        /// Launched by name, a launch outside those bounds is refused.
        pub static KERNEL_NARROW: ::offload::Kernel = ::offload::Kernel::new(#name_str)
            .with_symbol(#symbol_narrow)
            .with_bounds(&[#(#narrow_positions),*])
            .with_cuda(#cuda_narrow)
            .with_host(#host_fn::<false>)
            .with_block(#block)
            #grid_stride
            .with_thread_map(#note)
            .with_host_path(#host_path)
            .with_shape(&__OFFLOAD_SHAPE);

        /// The bounds-checked variant of [`KERNEL`]: on GPUs every element access is
        /// checked against its view's length, and the first out of range is reported
        /// (and not made) after the launch. Its last argument before `n` is the
        /// address of a report of 6 `u64`. Its host twin also catches two iterations
        /// storing to one element of a `&mut` view (of at most 2^24 elements).
        pub static KERNEL_CHECKED: ::offload::Kernel = ::offload::Kernel::new(#name_str)
            .with_symbol(#symbol_checked)
            .with_cuda(#cuda_checked)
            .with_host(#host_fn::<true>)
            .with_block(#block)
            #grid_stride
            .with_thread_map(#note)
            .with_host_path(#host_path);
    }
}
