//! What the attributes expand to: the item as written, and beside it the generated code
//! (a module for a kernel; a twin and a source constant for a device function), assembled
//! from the signature's slots and the emitters' output.

use std::collections::HashMap;

use proc_macro2::TokenStream;
use quote::{format_ident, quote};
use syn::ItemFn;

use crate::access::{thread_map, ThreadMap};
use crate::emit_c::{self, Dialect, Part, Variant};
use crate::emit_host::{twin_name, RustEmitter};
use crate::ir::{Body, VarId};
use crate::lower::{is_reserved, Lowerer, Mode};
use crate::options::{KernelOptions, DEFAULT_ROWS};
use crate::signature::{device_sig, kernel_sig, outer_path, Elem, KernelSig, ParamKind, Ret, Slot};
use crate::ty::{RedOp, Ty};

/// The driver's limit on a launch's parameters, in bytes.
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
struct Lowered {
    sig: KernelSig,
    body: Body,
    index_vars: Vec<VarId>,
    param_vars: Vec<VarId>,
    map: ThreadMap,
    /// Whether the body reduces over its teams (`offload::team_sum`).
    team_reduce: bool,
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

/// Kernel `f`'s source for `dialect` (checked or not) with placeholders for what rustc
/// fills in, and its thread mapping; or the compile error.
#[cfg(test)]
pub fn kernel_c(
    attr: TokenStream,
    f: TokenStream,
    checked: bool,
    dialect: Dialect,
) -> Result<(String, ThreadMap), String> {
    let variant = if checked { Variant::Checked } else { Variant::Plain };
    kernel_c_variant(attr, f, variant, dialect)
}

/// Kernel `f`'s source for `dialect` and `variant` (the narrow variant from the narrowed
/// body), as [`kernel_c`].
#[cfg(test)]
pub fn kernel_c_variant(
    attr: TokenStream,
    f: TokenStream,
    variant: Variant,
    dialect: Dialect,
) -> Result<(String, ThreadMap), String> {
    let f: ItemFn = syn::parse2(f).map_err(|e| e.to_string())?;
    let (_, k, rows) = lower_kernel(attr, &f).map_err(|e| e.to_string())?;
    let narrowed = crate::narrow::narrow(&k.body, &k.index_vars);
    let body = if variant == Variant::Narrow { &narrowed } else { &k.body };
    let parts =
        emit_c::kernel_source(&k.sig, body, &k.index_vars, &k.param_vars, variant, rows, &k.map, dialect);
    Ok((emit_c::joined(&parts), k.map))
}

/// A teams kernel's twin for one team: its per-thread arrays, then its code.
#[cfg(test)]
pub fn teams_twin(attr: TokenStream, f: TokenStream) -> Result<String, String> {
    let f: ItemFn = syn::parse2(f).map_err(|e| e.to_string())?;
    let (_, k, _) = lower_kernel(attr, &f).map_err(|e| e.to_string())?;
    let threads = k.sig.teams.as_ref().ok_or("not a teams kernel")?;
    let twin = crate::emit_teams::TeamsTwin::new(&k.body, threads, &k.sig.name, k.index_vars[1], quote!());
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

/// The items of kernel `f` (read with its aliases resolved), `original` as written.
fn generate(
    f: &ItemFn,
    original: &ItemFn,
    opts: &KernelOptions,
    k: &Lowered,
    rows: u32,
) -> syn::Result<TokenStream> {
    let sig = &k.sig;
    let name = &sig.name;
    let name_str = name.to_string();
    let vis = &f.vis;
    let dims = sig.space_dims();
    let host_fn = format_ident!("__offload_host_{}", name);
    let mut items = Vec::new();
    let mut sources = Vec::new();
    let narrowed = crate::narrow::narrow(&k.body, &k.index_vars);
    for (dialect, variant, tag) in [
        (Dialect::Cuda, Variant::Plain, "CUDA"),
        (Dialect::Cuda, Variant::Checked, "CUDA_CHECKED"),
        (Dialect::Hip, Variant::Plain, "HIP"),
        (Dialect::Hip, Variant::Checked, "HIP_CHECKED"),
        (Dialect::Cuda, Variant::Narrow, "CUDA_NARROW"),
        (Dialect::Hip, Variant::Narrow, "HIP_NARROW"),
    ] {
        let body = if variant == Variant::Narrow { &narrowed } else { &k.body };
        let parts =
            emit_c::kernel_source(sig, body, &k.index_vars, &k.param_vars, variant, rows, &k.map, dialect);
        sources.push(source_expr(&parts, tag, true, &mut items));
    }
    let [cuda, cuda_checked, hip, hip_checked, cuda_narrow, hip_narrow] =
        <[TokenStream; 6]>::try_from(sources).expect("six sources");
    let symbol_checked = emit_c::symbol(sig, Variant::Checked);
    let symbol_narrow = emit_c::symbol(sig, Variant::Narrow);
    // The argument positions the narrow variant reads as 32-bit values: every `usize` of
    // the block but the parameters it keeps 64-bit.
    let unchecked = sig.slots(false);
    let narrow_positions: Vec<TokenStream> = unchecked
        .iter()
        .zip(sig.positions(&unchecked))
        .filter(|(slot, _)| match slot {
            Slot::Start(_) | Slot::TeamSize | Slot::InnerLen(_) | Slot::ViewLen(..) => true,
            Slot::Param(i, _) => {
                matches!(narrowed.vars[k.param_vars[*i]].ty, crate::ir::Type::Scalar(crate::ty::Ty::U32))
                    && matches!(
                        k.body.vars[k.param_vars[*i]].ty,
                        crate::ir::Type::Scalar(crate::ty::Ty::Usize)
                    )
            }
            Slot::Report => false,
        })
        .map(|(_, p)| p)
        .collect();
    let block = match &sig.teams {
        Some(t) => {
            let t = t.rust(name);
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
    // A teams launch runs `block` work items per team.
    let per_item = if sig.teams.is_some() { quote!(__offload_ts) } else { quote!(1usize) };
    // Team-local arrays: their names (a checked launch's report names them after the
    // parameters), element types and lengths.
    // Views the body uses whole (sub-slices, device function arguments): shared slices
    // in the twin; the others may be plain (see below).
    let whole = crate::access::whole_view_uses(&k.body);
    // A team runs on one pool thread: its team-local arrays are plain cells, unless used
    // whole.
    let lens = RustEmitter::new(&k.body, true);
    let team_locals: Vec<(&syn::Ident, TokenStream, TokenStream, bool)> = k
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
                Some((&v.rust, elem.rust_inner(), len, !whole.contains(&id)))
            }
            _ => None,
        })
        .collect();
    // A constant length's size is checked by rustc, beside the kernel (a literal's by the
    // macro), and all the arrays' together: they share the block's static shared memory.
    let (most, too_large) = (crate::lower::SHARED_BYTES, crate::lower::TEAM_LOCAL_TOO_LARGE);
    let mut size_checks: Vec<TokenStream> = Vec::new();
    let mut terms: Vec<TokenStream> = Vec::new();
    for v in &k.body.vars {
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
    let note = &k.map.note;

    // ---- the argument block: its positions, and its size ----
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
    let mut fixed_bytes = 8 * (2 * dims - 1) + 8 + 8; // bounds, n, a checked launch's report
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
        "offload::kernel: the arguments of `{name_str}` take more than {PARAM_LIMIT} bytes (the driver's limit): pass \
         fewer arguments or smaller structs"
    );
    let size_check = (!struct_sizes.is_empty()).then(|| {
        quote!(
            const _: () = ::core::assert!(#fixed_bytes #(+ #struct_sizes)* <= #PARAM_LIMIT, #limit_msg);
        )
    });

    // ---- the host twin ----
    let mut emit = RustEmitter::new(&k.body, true);
    emit.local_reductions = sig.teams.is_none();
    let mut reads = Vec::new();
    let starts: Vec<syn::Ident> = (0..dims).map(|d| format_ident!("__offload_s{}", d)).collect();
    for (s, pos) in slots.iter().zip(&positions) {
        reads.push(match s {
            Slot::Start(d) => {
                let v = format_ident!("__offload_s{}", d);
                quote!(let #v: usize = ::offload::__private::index_arg(__offload_l, #pos)?;)
            }
            Slot::InnerLen(d) => {
                let v = format_ident!("__offload_l{}", d);
                quote!(let #v: usize = ::offload::__private::index_arg(__offload_l, #pos)?;)
            }
            Slot::TeamSize => {
                let most = sig.teams.as_ref().map_or_else(|| quote!(1usize), |t| t.rust(name));
                quote!(let __offload_ts: usize = ::offload::__private::team_size_arg(__offload_l, #pos, #most)?;)
            }
            Slot::Param(i, p) => {
                let pn = &p.name;
                let ps = p.text();
                match &p.kind {
                    ParamKind::Scalar(Ty::Usize) => quote!(let #pn: usize = ::offload::__private::index_arg(__offload_l, #pos)?;),
                    ParamKind::Scalar(Ty::Bool) => quote!(let #pn: bool = ::offload::__private::bool_arg(__offload_l, #pos)?;),
                    ParamKind::Scalar(t) => {
                        let rt = t.rust();
                        quote!(let #pn: #rt = __offload_l.scalar::<#rt>(#pos)?;)
                    }
                    ParamKind::Struct(st) => {
                        let path = outer_path(&st.path);
                        quote!(let #pn: #path = ::offload::__private::struct_arg::<#path>(__offload_l, #pos)?;)
                    }
                    ParamKind::View { elem, mutable } => {
                        let rt = elem.rust_inner();
                        let lp = &len_pos[i];
                        let log = format_ident!("__offload_log_{}", p.name);
                        let logged = mutable.then(|| {
                            quote!(
                                let #log = ::offload::__private::StoreLog::new(__OFFLOAD_CHECK, #pn.len());
                                let #pn = #pn.logged(&#log);
                            )
                        });
                        quote!(
                            let #pn = ::offload::__private::SharedSlice::<#rt>::new(__offload_l, #name_str, #ps, #pos, #lp)?;
                            #logged
                        )
                    }
                    ParamKind::Reduction { ty, .. } => {
                        let rt = ty.rust();
                        let lp = &len_pos[i];
                        let target = format_ident!("__offload_red_{}", p.name);
                        quote!(let #target = ::offload::__private::SharedSlice::<#rt>::new(__offload_l, #name_str, #ps, #pos, #lp)?;)
                    }
                }
            }
            Slot::ViewLen(..) | Slot::Report => quote!(),
        });
    }
    if let (Some(t), false) = (&sig.teams, sig.team_size_at_launch) {
        // A constant: the twin's thread loops keep their known trip count.
        let t = t.rust(name);
        reads.push(quote!(#[allow(non_upper_case_globals)] const __offload_ts: usize = #t;));
    }
    let idx: Vec<&syn::Ident> = sig.indices.iter().collect();
    let len_of = |d: usize| format_ident!("__offload_l{}", d);
    let order = &k.map.order;
    let inner_lens: Vec<syn::Ident> = (1..dims).map(len_of).collect();
    let l0 = (dims > 1 && sig.teams.is_none()).then(|| {
        quote!(
            let __offload_inner: usize = 1 #(* #inner_lens)*;
            let __offload_l0: usize = if __offload_inner == 0 { 0 } else { __offload_l.n() / __offload_inner };
        )
    });
    let body_stmts = emit.stmts(&k.body.stmts);
    let reductions: Vec<(&syn::Ident, Ty, RedOp)> = sig
        .params
        .iter()
        .filter_map(|p| match p.kind {
            ParamKind::Reduction { ty, op } => Some((&p.name, ty, op)),
            _ => None,
        })
        .collect();
    let red = quote!(::offload::__private::Reducible);
    let red_types: Vec<TokenStream> = reductions.iter().map(|(_, t, _)| t.rust()).collect();
    let red_names: Vec<&syn::Ident> = reductions.iter().map(|(n, _, _)| *n).collect();
    let red_targets: Vec<syn::Ident> =
        red_names.iter().map(|n| format_ident!("__offload_red_{}", n)).collect();
    let red_ks: Vec<syn::Index> = (0..reductions.len()).map(syn::Index::from).collect();
    let red_identity: Vec<TokenStream> = reductions
        .iter()
        .map(|(_, t, op)| {
            let t = t.rust();
            match op {
                RedOp::Add => quote!(<#t as #red>::ZERO),
                RedOp::Min => quote!(<#t as #red>::MIN_IDENTITY),
                RedOp::Max => quote!(<#t as #red>::MAX_IDENTITY),
            }
        })
        .collect();
    let red_combine: Vec<TokenStream> = reductions
        .iter()
        .map(|(_, _, op)| match op {
            RedOp::Add => quote!(#red::add),
            RedOp::Min => quote!(#red::min),
            RedOp::Max => quote!(#red::max),
        })
        .collect();
    let reduces = !reductions.is_empty();
    // A task's own copies of what its loops read: locals rustc knows no store can change
    // (captured by reference, they would be reloaded after every store through a cell).
    let copied: Vec<syn::Ident> = sig
        .params
        .iter()
        .filter(|p| !matches!(p.kind, ParamKind::Reduction { .. }))
        .map(|p| p.name.clone())
        .chain(starts.iter().cloned())
        .chain((1..dims).map(len_of))
        .chain((dims > 1 && sig.teams.is_none()).then(|| format_ident!("__offload_l0")))
        .collect();
    let copies = quote!(#(let #copied = #copied;)*);
    let teams_loop = |own_bind: &[TokenStream]| {
        // The team size: the host twin's `__offload_ts` (the count, or the launch's).
        sig.teams.as_ref()?;
        let t = quote!(__offload_ts);
        let (team, thread) = (idx[0], idx[1]);
        let bufs: Vec<syn::Ident> =
            team_locals.iter().map(|(n, ..)| format_ident!("__offload_tl_{}", n)).collect();
        let names: Vec<&syn::Ident> = team_locals.iter().map(|(n, ..)| *n).collect();
        let kinds: Vec<TokenStream> = team_locals
            .iter()
            .map(|(_, t, _, cells)| {
                if *cells {
                    quote!(::offload::__private::OwnView::<#t>)
                } else {
                    quote!(::offload::__private::SharedSlice::<#t>)
                }
            })
            .collect();
        let name_strs: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let types: Vec<&TokenStream> = team_locals.iter().map(|(_, t, ..)| t).collect();
        let lens: Vec<&TokenStream> = team_locals.iter().map(|(_, _, n, _)| n).collect();
        let (rt, rn, rk, ri, rc, rtg) =
            (&red_types, &red_names, &red_ks, &red_identity, &red_combine, &red_targets);
        // Each thread's reduction partials, for all the task's teams, combined in thread order.
        let partials = (!reductions.is_empty()).then(|| {
            quote! {
                let __offload_acc = &mut __offload_accs[__offload_thread];
                #(let #rn: &mut #rt = &mut __offload_acc.#rk;)*
            }
        });
        let enter = quote! {
            if __OFFLOAD_CHECK {
                ::offload::__private::set_item(__offload_q * #t + __offload_thread);
            }
            let #thread: usize = __offload_thread;
            #partials
        };
        let twin =
            crate::emit_teams::TeamsTwin::new(&k.body, sig.teams.as_ref()?, name, k.index_vars[1], enter);
        let (arrays, team_code) = (twin.arrays(), twin.team());
        Some(quote! {
            let __offload_total: (#(#rt,)*) = ::offload::__private::run_chunks(
                __offload_l.n() / #t,
                #t,
                #reduces,
                (#(#ri,)*),
                |__offload_first: usize, __offload_end: usize| {
                    #copies
                    #(#own_bind)*
                    #(let mut #bufs: ::std::vec::Vec<#types> = ::std::vec![::core::default::Default::default(); #lens];)*
                    #(let #names = #kinds::team_local(&mut #bufs, #name_str, #name_strs);)*
                    #arrays
                    let mut __offload_accs: ::std::vec::Vec<(#(#rt,)*)> = ::std::vec![(#(#ri,)*); #t];
                    for __offload_q in __offload_first..__offload_end {
                        let #team: usize = __offload_s0 + __offload_q;
                        #team_code
                    }
                    __offload_accs
                        .into_iter()
                        .fold((#(#ri,)*), |__offload_a, __offload_b| (#(#rc(__offload_a.#rk, __offload_b.#rk),)*))
                },
                |__offload_a: (#(#rt,)*), __offload_b: (#(#rt,)*)| (#(#rc(__offload_a.#rk, __offload_b.#rk),)*),
            );
            #(#rtg.set(0, #rc(#rtg.get(0), __offload_total.#rk));)*
        })
    };
    // The views the twin may read and write plainly: read-only views the body reads element
    // by element, and (outside teams kernels) written views every access of which is at the
    // item's own element. They are plain when no written view overlaps another and the
    // items' own elements stay apart (checked per launch: plain loads and stores rustc can
    // vectorise); otherwise (a C port passing one array as two arguments, columns wider
    // than the row) the shared path runs, as every view does in the other case.
    let mut spans = Vec::new();
    let mut plain = Vec::new();
    let mut own = Vec::new();
    let mut own_reads = Vec::new();
    for (i, p) in sig.params.iter().enumerate() {
        let n = &p.name;
        let var = k.param_vars[i];
        match p.kind {
            ParamKind::View { mutable, .. } => {
                spans.push(quote!((#n.span(), #mutable)));
                if whole.contains(&var) {
                } else if !mutable {
                    plain.push(n);
                    // Read only at the item's own element: each task reads its part.
                    if sig.teams.is_none() {
                        if let Some(form) = crate::access::own_index(&k.body, var, &k.index_vars, order) {
                            own_reads.push((n, form));
                        }
                    }
                } else if sig.teams.is_none() {
                    if let Some((form, rows)) =
                        crate::access::own_index_beside(&k.body, var, &k.index_vars, order)
                    {
                        let rows: Vec<TokenStream> = rows
                            .into_iter()
                            .map(|r| match r {
                                Some(e) => {
                                    let e = emit.expr(e);
                                    quote!((#e) as usize)
                                }
                                None => quote!(0usize),
                            })
                            .collect();
                        own.push((n, form, rows));
                    }
                } else if let Some(form) = crate::access::team_rows(&k.body, var, k.index_vars[0]) {
                    own.push((n, form, Vec::new()));
                }
            }
            ParamKind::Reduction { .. } => {
                let target = format_ident!("__offload_red_{}", n);
                spans.push(quote!((#target.span(), true)));
            }
            _ => {}
        }
    }
    // Each own view's rows: (first row, rows, first column, columns, row width).
    let own_rows = |form: crate::access::OwnIndex| -> [TokenStream; 5] {
        match form {
            crate::access::OwnIndex::Linear => [
                quote!(__offload_s0),
                quote!(__offload_l.n()),
                quote!(0usize),
                quote!(1usize),
                quote!(1usize),
            ],
            crate::access::OwnIndex::Block { width } => {
                let w = &k.body.vars[width].rust;
                [quote!(__offload_s0), quote!(__offload_l.n()), quote!(0usize), quote!(#w), quote!(#w)]
            }
            crate::access::OwnIndex::TeamRows { width } => {
                let w = &k.body.vars[width].rust;
                let t = if sig.teams.is_some() { quote!(__offload_ts) } else { quote!(1usize) };
                [quote!(__offload_s0), quote!((__offload_l.n() / #t)), quote!(0usize), quote!(#w), quote!(#w)]
            }
            crate::access::OwnIndex::Rows { width } => {
                let (a, b) = (order[0], order[1]);
                let (sa, sb, lb) = (&starts[a], &starts[b], len_of(b));
                let w = &k.body.vars[width].rust;
                [quote!(#sa), quote!(__offload_l0), quote!(#sb), quote!(#lb), quote!(#w)]
            }
        }
    };
    let own_fit: Vec<TokenStream> = own
        .iter()
        .map(|(n, form, beside)| {
            let [r0, rows, c0, cols, w] = own_rows(*form);
            let beside = (!beside.is_empty())
                .then(|| quote!(&& ::offload::__private::rows_outside(&[#(#beside),*], #r0, #rows)));
            quote!(::offload::__private::own_rows_fit(#r0, #rows, #c0, #cols, #w, #n.len()) #beside)
        })
        .collect();
    let task_span = |form: crate::access::OwnIndex| {
        let [r0, _, c0, cols, w] = own_rows(form);
        quote!((#r0 + __offload_first) * #w + #c0, (#r0 + __offload_end - 1) * #w + #c0 + #cols)
    };
    let own_bind: Vec<TokenStream> = own
        .iter()
        .map(|(n, form, beside)| {
            let span = task_span(*form);
            let beside = (!beside.is_empty()).then(|| quote!(.with_beside(#n)));
            quote! {
                // SAFETY: this task's rows of `#n`, apart from every other task's and view's
                // (checked for the launch); its items load only their own elements and store
                // there or in rows no task owns (checked for the launch).
                let #n = unsafe { #n.own(#span) } #beside;
            }
        })
        .chain(own_reads.iter().map(|(n, form)| {
            let span = task_span(*form);
            quote!(let #n = #n.part(#span);)
        }))
        .collect();

    // The views a fast path's rows may take windows of: plain reads and own elements.
    let window_vars: Vec<VarId> = sig
        .params
        .iter()
        .enumerate()
        .filter(|(_, p)| plain.contains(&&p.name) || own.iter().any(|(n, ..)| *n == &p.name))
        .map(|(i, _)| k.param_vars[i])
        .collect();
    // `fast`: the plain views are `ReadView`s (their rows may be windows).
    let host_loop = |own_bind: &[TokenStream], fast: bool| match teams_loop(own_bind) {
        Some(teams) => teams,
        None => {
            // Each pool task runs whole rows of the space's outer dimension in order, as nested
            // loops (no division per item), folding its items into its own reduction partials
            // (the body sees them as its `&mut` arguments); the partials are then combined, in
            // order, and into the views.
            let (types, names, targets, ks, identity, combine) =
                (&red_types, &red_names, &red_targets, &red_ks, &red_identity, &red_combine);
            // `return;` ends the item: the body is then a closure called once per item.
            let as_item = |stmts: TokenStream| {
                if k.body.returns {
                    quote!((|| { #stmts })();)
                } else {
                    stmts
                }
            };
            let item = as_item(body_stmts.clone());
            // Rows that need less than the whole body run a copy that does less.
            let inner = k.index_vars[*order.last().unwrap_or(&0)];
            let counter = if dims == 1 { "__offload_k" } else { "__offload_c" };
            let views = if fast { &window_vars[..] } else { &[] };
            let rows = crate::fast_rows::fast_rows(&k.body, inner, counter, views).map(|f| {
                let guards = f.guards.iter().map(|g| {
                    let terms = g.iter().map(|t| emit.expr(t));
                    quote!((#((#terms))&&*))
                });
                let mut fast_emit = RustEmitter::new(&f.body, true);
                fast_emit.local_reductions = emit.local_reductions;
                let windows = f
                    .windows
                    .iter()
                    .map(|(v, start)| (k.body.vars[*v].rust.clone(), emit.expr(start)))
                    .collect();
                FastRowsCode {
                    rare: if f.guards.is_empty() { quote!(false) } else { quote!(#(#guards)||*) },
                    windows,
                    item: as_item(fast_emit.stmts(&f.body.stmts)),
                    deferred: !f.deferred.is_empty(),
                }
            });
            let lanes = Lanes { names, types, identity, combine };
            let (units, per_unit, loops) = item_loops(&idx, order, &starts, &item, rows.as_ref(), &lanes);
            quote! {
                let __offload_total: (#(#types,)*) = ::offload::__private::run_chunks(
                    #units,
                    #per_unit,
                    #reduces,
                    (#(#identity,)*),
                    |__offload_first: usize, __offload_end: usize| {
                        #copies
                        #(#own_bind)*
                        #(let mut #names: #types = #identity;)*
                        #loops
                        (#(#names,)*)
                    },
                    |__offload_a: (#(#types,)*), __offload_b: (#(#types,)*)| (#(#combine(__offload_a.#ks, __offload_b.#ks),)*),
                );
                #(#targets.set(0, #combine(#targets.get(0), __offload_total.#ks));)*
            }
        }
    };
    // What the twin does, for `KERNEL.host_path()` and the launch trace.
    let mut path = Vec::new();
    if let Some(t) = &sig.teams {
        path.push(format!(
            "teams of {} as loops over the threads between barriers, a team per pool thread",
            t.text()
        ));
        let rounds =
            crate::emit_teams::TeamsTwin::new(&k.body, t, name, k.index_vars[1], quote!()).rounds_count();
        if rounds > 0 {
            path.push(format!("{rounds} stretches with block-stride loops in rounds of the team's threads"));
        }
    }
    let names = |v: &[&syn::Ident]| v.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ");
    if !plain.is_empty() {
        path.push(format!("plain loads of {} (read only)", names(&plain)));
    }
    if !own.is_empty() {
        let own_names: Vec<&syn::Ident> = own.iter().map(|(n, ..)| *n).collect();
        let whose = if sig.teams.is_some() {
            "each team only in its own row, unless checked"
        } else {
            "each item only at its own element"
        };
        path.push(format!("plain stores of {} ({whose})", names(&own_names)));
        let beside: Vec<&syn::Ident> = own.iter().filter(|o| !o.2.is_empty()).map(|(n, ..)| *n).collect();
        if !beside.is_empty() {
            path.push(format!(
                "atomic stores of {} beside them, in rows the launch must not own",
                names(&beside)
            ));
        }
    }
    if !plain.is_empty() || !own.is_empty() {
        path.push("when no written view overlaps another (else all atomic)".into());
    }
    if sig.teams.is_none() {
        let inner = k.index_vars[*order.last().unwrap_or(&0)];
        if let Some(f) = crate::fast_rows::fast_rows(&k.body, inner, "__offload_c", &window_vars) {
            if !f.guards.is_empty() {
                path.push(format!(
                    "rows that enter none of {} row-invariant `if`s run the body without them",
                    f.guards.len()
                ));
            }
            let mut seen: Vec<&syn::Ident> = Vec::new();
            for (v, _) in &f.windows {
                if !seen.contains(&&k.body.vars[*v].rust) {
                    seen.push(&k.body.vars[*v].rust);
                }
            }
            if !seen.is_empty() {
                path.push(format!("each row's runs of {} as slices checked once per row", names(&seen)));
            }
            if !f.deferred.is_empty() {
                path.push("each item's reduction values stored per row, then summed in lanes".into());
            }
        }
    }
    if !reductions.is_empty() && sig.teams.is_none() {
        path.push(format!("reductions in {LANES} lanes per task"));
    }
    let atomic: Vec<&syn::Ident> = sig
        .params
        .iter()
        .filter(|p| match p.kind {
            ParamKind::View { .. } => !plain.contains(&&p.name) && !own.iter().any(|(n, ..)| *n == &p.name),
            _ => false,
        })
        .map(|p| &p.name)
        .collect();
    if !atomic.is_empty() {
        let why =
            if sig.teams.is_some() { "written by a team's threads" } else { "not proven each item's own" };
        path.push(format!("relaxed-atomic accesses of {} ({why}, or used whole)", names(&atomic)));
    }
    let host_path = format!("host twin: {}", path.join("; "));
    // A teams kernel's own rows hold each thread's stores unlogged: the checked twin, whose
    // store log names two threads storing one element, keeps them shared.
    let unlogged = (sig.teams.is_some() && !own.is_empty()).then(|| quote!(!__OFFLOAD_CHECK &&));
    let host_loop = if plain.is_empty() && own.is_empty() {
        host_loop(&[], false)
    } else {
        let (fast, shared) = (host_loop(&own_bind, true), host_loop(&[], false));
        quote! {
            if #unlogged ::offload::__private::views_apart(&[#(#spans),*]) #(&& #own_fit)* {
                // SAFETY: no view this launch writes overlaps these, and nothing else runs
                // on the device's memory during the launch.
                #(let #plain = unsafe { #plain.plain() };)*
                #fast
            } else {
                #shared
            }
        }
    };

    // ---- the launcher ----
    let lt = quote!('__offload_a);
    let field_type = |kind: &ParamKind| -> TokenStream {
        match kind {
            ParamKind::Scalar(t) => t.rust(),
            ParamKind::Struct(s) => outer_path(&s.path),
            ParamKind::View { elem, .. } => {
                let t = elem.rust_inner();
                quote!(::offload::DeviceSlice<#lt, #t>)
            }
            ParamKind::Reduction { ty, .. } => {
                let t = ty.rust();
                quote!(::offload::DeviceSlice<#lt, #t>)
            }
        }
    };
    let launch_params: Vec<TokenStream> = sig
        .params
        .iter()
        .map(|p| {
            let (n, t) = (&p.name, field_type(&p.kind));
            quote!(#n: #t)
        })
        .collect();
    let fields: Vec<TokenStream> = sig
        .params
        .iter()
        .map(|p| {
            let (n, t) = (&p.name, field_type(&p.kind));
            match p.kind {
                // `None`: the runtime's slot (a `reduce`).
                ParamKind::Reduction { .. } => quote!(#n: ::core::option::Option<#t>),
                _ => quote!(#n: #t),
            }
        })
        .collect();
    let param_names: Vec<&syn::Ident> = sig.params.iter().map(|p| &p.name).collect();
    let mut visits = Vec::new();
    for s in &slots {
        visits.push(match s {
            Slot::Start(d) => quote!(__offload_c.index(self.__offload_bounds[#d]);),
            // After the starts and inner lengths (a teams kernel has one start and none).
            Slot::TeamSize => quote!(__offload_c.index(self.__offload_bounds[1]);),
            Slot::InnerLen(d) => {
                let at = dims + d - 1;
                quote!(__offload_c.index(self.__offload_bounds[#at]);)
            }
            Slot::Param(_, p) => {
                let n = &p.name;
                match p.kind {
                    ParamKind::Scalar(Ty::Usize) => quote!(__offload_c.index(self.#n as u64);),
                    ParamKind::Scalar(Ty::Bool) => quote!(__offload_c.flag(self.#n);),
                    ParamKind::Scalar(_) => quote!(__offload_c.scalar(self.#n);),
                    ParamKind::Struct(_) => quote!(__offload_c.words(&self.#n);),
                    ParamKind::View { .. } => quote!(__offload_c.view(&self.#n)?;),
                    ParamKind::Reduction { .. } => quote!(match &self.#n {
                        ::core::option::Option::Some(v) => __offload_c.view(v)?,
                        ::core::option::Option::None => __offload_c.runtime_slot(),
                    }),
                }
            }
            Slot::ViewLen(_, p) => {
                let n = &p.name;
                match p.kind {
                    ParamKind::Reduction { .. } => {
                        quote!(__offload_c.index(self.#n.as_ref().map_or(1, |v| v.len()) as u64);)
                    }
                    _ => quote!(__offload_c.index(self.#n.len() as u64);),
                }
            }
            Slot::Report => quote!(),
        });
    }
    let mut checks = Vec::new();
    let mut views = Vec::new();
    for (k, p) in sig.params.iter().enumerate() {
        let (pn, ps) = (&p.name, p.text());
        match p.kind {
            ParamKind::View { mutable, .. } => {
                if mutable {
                    checks.push(quote!(::offload::__private::check_writable(#name_str, #k, #ps, &#pn)?;));
                }
                views.push(quote!(::core::option::Option::Some((#k, #ps, #pn.host_range(), #mutable))));
            }
            ParamKind::Reduction { op, .. } => {
                let opt = op.text();
                checks.push(quote!(if let ::core::option::Option::Some(v) = &#pn {
                    ::offload::__private::check_reduction(#name_str, #k, #ps, #opt, v)?;
                }));
                views.push(quote!(#pn.as_ref().map(|v| (#k, #ps, v.host_range(), true))));
            }
            _ => {}
        }
    }
    if views.len() > 1 {
        checks.push(quote!(::offload::__private::check_disjoint(#name_str, &[#(#views),*])?;));
    }
    let checked = match opts.checked {
        Some(true) => quote!(true),
        Some(false) => quote!(false),
        None => quote!(::core::cfg!(debug_assertions)),
    };
    let param_strs: Vec<String> =
        sig.params.iter().map(|p| p.text()).chain(team_locals.iter().map(|(n, ..)| n.to_string())).collect();
    let param_positions: Vec<&TokenStream> = (0..sig.params.len()).map(|i| &param_pos[&i]).collect();
    let at_launch = sig.team_size_at_launch;
    let nb = 2 * dims - 1 + usize::from(at_launch);
    let bounds: Vec<TokenStream> = (0..dims)
        .map(|d| quote!(__offload_g.starts()[#d] as u64))
        .chain((1..dims).map(|d| quote!(__offload_g.lens()[#d] as u64)))
        .chain(at_launch.then(|| quote!(__offload_ts as u64)))
        .collect();
    // `teams = ..=MAX`: the launchers take the team size after the space, checked (1 to
    // MAX; whole warps with reductions), and the arguments carry it as the GPU block.
    let (ts_param, ts_arg, ts_check, ts_block) = if at_launch {
        let most = sig.teams.as_ref().map_or_else(|| quote!(1usize), |t| t.rust(name));
        let warps = !opts.reductions.is_empty() || k.team_reduce;
        (
            quote!(team_size: usize,),
            quote!(team_size,),
            quote!(let __offload_ts: usize = ::offload::__private::team_size_of(#name_str, team_size, #most, #warps)?;),
            quote!(
                fn block(&self) -> ::core::option::Option<u32> {
                    ::core::option::Option::Some(self.__offload_bounds[1] as u32)
                }
            ),
        )
    } else {
        let fixed = sig.teams.as_ref().map(|t| {
            let t = t.rust(name);
            quote!(let __offload_ts: usize = #t;)
        });
        (quote!(), quote!(), quote!(#fixed), quote!())
    };
    // A teams kernel's space is not the OpenMP shape's `n` either.
    let shape_dims = if sig.teams.is_some() { 0 } else { dims };
    let shape_threads = sig.teams.as_ref().map_or_else(|| quote!(0usize), |t| t.rust(name));
    let shape_warps = !opts.reductions.is_empty() || k.team_reduce;
    let shape_params: Vec<TokenStream> = sig
        .params
        .iter()
        .map(|p| {
            let sp = quote!(::offload::ShapeParam);
            match &p.kind {
                ParamKind::Scalar(_) => quote!(#sp::Value),
                ParamKind::Struct(_) => quote!(#sp::Struct),
                ParamKind::View { elem, .. } => {
                    let t = elem.rust_inner();
                    quote!(#sp::View { elem_bytes: ::core::mem::size_of::<#t>() })
                }
                ParamKind::Reduction { ty, .. } => {
                    let t = ty.rust();
                    quote!(#sp::View { elem_bytes: ::core::mem::size_of::<#t>() })
                }
            }
        })
        .collect();
    // A reduction variable given to `launch` is the field's `Some`.
    let rebind: Vec<TokenStream> = sig
        .params
        .iter()
        .filter(|p| matches!(p.kind, ParamKind::Reduction { .. }))
        .map(|p| {
            let n = &p.name;
            quote!(let #n = ::core::option::Option::Some(#n);)
        })
        .collect();

    let doc = format!(
        "The generated launcher and kernel of `fn {name}` (`#[offload::kernel]`), over a {dims}-D \
         index space.\n\nArguments declared `&mut [T]` take a writable [`offload::DeviceSlice`] (one that comes \
         from an exclusive borrow); a shared one is an `Error::KernelArgument`. A reduction variable \
         (`&mut T` listed in `reduction(..)`) takes a writable view of at least one element: the launch \
         combines every iteration's contributions, and element 0's value, into element 0 (`reduce`, \
         generated for kernels with reduction variables, provides them itself and returns their values). \
         Views the kernel writes may not overlap other views of the launch.\n\nThread mapping on GPUs: {note}."
    );
    let reduce = if reductions.is_empty() {
        quote!()
    } else {
        let reduce_params: Vec<&TokenStream> = sig
            .params
            .iter()
            .zip(&launch_params)
            .filter(|(p, _)| !matches!(p.kind, ParamKind::Reduction { .. }))
            .map(|(_, t)| t)
            .collect();
        let types: Vec<TokenStream> = reductions.iter().map(|(_, t, _)| t.rust()).collect();
        let ks: Vec<usize> = (0..reductions.len()).collect();
        let values = quote!(#(::offload::__private::reduced::<#types>(&__offload_v, #ks, #name_str)?),*);
        let (ret, value) = if reductions.len() == 1 {
            (quote!(#(#types)*), values)
        } else {
            (quote!((#(#types),*)), quote!((#values)))
        };
        let names: Vec<String> =
            reductions.iter().map(|(n, _, op)| format!("`{}: {n}`", op.text())).collect();
        let reduce_doc = format!(
            "Runs the kernel on `device` over `space` as [`launch`] does, with the runtime providing its \
             reduction variables ({}): each starts at its operator's identity (0 for `+`, the type's largest \
             value for `min`, its smallest for `max`; infinities for floats), and the reduced values are \
             returned, in declaration order (a tuple when there are several). The arguments are \
             [`launch`]'s without the reduction variables. An empty space launches nothing and gives the \
             identities. On an offload device the values live in one device allocation, set by one copy \
             and read back by one; on the initial device in host memory. When [`CHECKED`], a GPU launch \
             checks every access as [`launch`] does (its report is read back with the values).",
            names.join(", ")
        );
        let partials: Vec<TokenStream> = sig
            .params
            .iter()
            .enumerate()
            .filter_map(|(i, p)| match p.kind {
                ParamKind::Reduction { ty, op } => {
                    let rt = ty.rust();
                    let red = quote!(::offload::__private::Reducible);
                    let identity = match op {
                        RedOp::Add => quote!(<#rt as #red>::ZERO),
                        RedOp::Min => quote!(<#rt as #red>::MIN_IDENTITY),
                        RedOp::Max => quote!(<#rt as #red>::MAX_IDENTITY),
                    };
                    let pos = &param_pos[&i];
                    Some(quote!((#pos, <#rt as ::offload::KernelScalar>::into_scalar(#identity))))
                }
                _ => None,
            })
            .collect();
        let reduce_fields: Vec<TokenStream> = sig
            .params
            .iter()
            .map(|p| {
                let n = &p.name;
                match p.kind {
                    ParamKind::Reduction { .. } => quote!(#n: ::core::option::Option::None),
                    _ => quote!(#n: #n),
                }
            })
            .collect();
        let reduce_checks: Vec<&TokenStream> = checks.iter().collect();
        let reduce_bindings: Vec<TokenStream> = sig
            .params
            .iter()
            .filter(|p| matches!(p.kind, ParamKind::Reduction { .. }))
            .map(|p| {
                let n = &p.name;
                let t = field_type(&p.kind);
                quote!(let #n: ::core::option::Option<#t> = ::core::option::Option::None;)
            })
            .collect();
        quote! {
            #[doc = #reduce_doc]
            #[allow(clippy::too_many_arguments)]
            #[track_caller]
            pub fn reduce<#lt>(device: &::offload::Device<'_>, space: impl ::offload::IndexSpace<#dims>, #ts_param #(#reduce_params),*) -> ::offload::Result<#ret> {
                let __offload_g = ::offload::index_space::Grid::<#dims>::new(#name_str, space)?;
                #ts_check
                #(#reduce_bindings)*
                #(#reduce_checks)*
                let __offload_v = ::offload::__private::launch_reduce(
                    device,
                    &::offload::__private::Reduction {
                        kernel: if CHECKED { &KERNEL_CHECKED } else { &KERNEL },
                        checked: CHECKED,
                        params: __OFFLOAD_PARAMS,
                        positions: __OFFLOAD_POSITIONS,
                        partials: &[#(#partials),*],
                    },
                    ::offload::__private::work_items(#name_str, __offload_g.items(), #per_item)?,
                    Args { __offload_bounds: [#(#bounds),*], #(#reduce_fields,)* __offload_life: ::core::marker::PhantomData },
                )?;
                ::core::result::Result::Ok(#value)
            }
        }
    };

    // Whole warps: checked on the count here, on the launch's size with `..=MAX`.
    let warps = (!opts.reductions.is_empty() || k.team_reduce) && !sig.team_size_at_launch;
    let threads_item = sig.teams.as_ref().map(|t| t.item(name, warps));
    Ok(quote! {
        #(#size_checks)*
        #total_check
        #threads_item
        #[allow(dead_code)]
        #original

        #[doc = #doc]
        #[allow(dead_code, clippy::all)]
        #vis mod #name {
            #[doc(hidden)]
            #[allow(unused, unused_parens, unused_braces, clippy::all, non_snake_case)]
            fn #host_fn<const __OFFLOAD_CHECK: bool>(__offload_l: &::offload::HostLaunch<'_>) -> ::core::result::Result<(), ::std::string::String> {
                #(#reads)*
                #l0
                #host_loop
                ::core::result::Result::Ok(())
            }

            #(#items)*
            #size_check

            const __OFFLOAD_SHAPE: ::offload::KernelShape = ::offload::KernelShape { dims: #shape_dims, threads: #shape_threads, team_size_at_launch: #at_launch, team_warps: #shape_warps, params: &[#(#shape_params),*] };

            /// The kernel: its CUDA C and HIP C sources and its host twin. Launched in the
            /// OpenMP shape (`offload::omp::target`, one argument per parameter), the runtime
            /// adds its start and its views' lengths.
            pub static KERNEL: ::offload::Kernel = ::offload::Kernel::new(#name_str)
                .with_cuda(#cuda)
                .with_hip(#hip)
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
                .with_hip(#hip_narrow)
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
                .with_hip(#hip_checked)
                .with_host(#host_fn::<true>)
                .with_block(#block)
                #grid_stride
                .with_thread_map(#note)
                .with_host_path(#host_path);

            /// Whether [`launch`] runs [`KERNEL_CHECKED`]: the kernel's `checked` option, or
            /// else whether the crate is built with debug assertions.
            pub const CHECKED: bool = #checked;

            const __OFFLOAD_PARAMS: &[&str] = &[#(#param_strs),*];
            const __OFFLOAD_POSITIONS: &[usize] = &[#(#param_positions),*];

            /// A launch's arguments in the kernel's order, made by [`args`] only (so the
            /// bounds and lengths it carries are those of its views).
            #[derive(Clone, Copy)]
            pub struct Args<#lt> {
                __offload_bounds: [u64; #nb],
                #(#fields,)*
                __offload_life: ::core::marker::PhantomData<&#lt ()>,
            }

            impl Args<'_> {
                fn visit(&self, __offload_c: &mut ::offload::__private::ArgCollector<'_>) -> ::offload::Result<()> {
                    #(#visits)*
                    ::core::result::Result::Ok(())
                }
            }

            impl ::core::fmt::Debug for Args<'_> {
                fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                    f.debug_struct(::core::concat!(#name_str, "::Args")).finish_non_exhaustive()
                }
            }

            // SAFETY: the collector reports every view's launch argument, extent and shared
            // borrow itself, in the order of the kernel's parameters.
            unsafe impl ::offload::KernelArgs for Args<'_> {
                fn launch_args(&self, device: usize, kernel: &::offload::Kernel) -> ::offload::Result<::std::vec::Vec<::offload::LaunchArg>> {
                    let mut c = ::offload::__private::ArgCollector::launching(device, kernel);
                    self.visit(&mut c)?;
                    ::core::result::Result::Ok(c.into_args())
                }
                fn shared_views(&self) -> ::std::vec::Vec<(usize, ::offload::HostRange)> {
                    let mut c = ::offload::__private::ArgCollector::describing();
                    let _ = self.visit(&mut c);
                    c.into_shared()
                }
                #ts_block
                fn view_extents(&self) -> ::std::vec::Vec<::core::option::Option<usize>> {
                    let mut c = ::offload::__private::ArgCollector::describing();
                    let _ = self.visit(&mut c);
                    c.into_extents()
                }
            }

            /// The number of work items of `space` and the launch's arguments, for
            /// `NowaitScope::launch(device, &KERNEL, n, args, after)`. Checks what
            /// [`launch`] checks before it runs; `n` may be 0 (a launch of it does nothing).
            /// Such launches run [`KERNEL`], whose GPU accesses are not bounds-checked.
            #[allow(clippy::too_many_arguments)]
            pub fn args<#lt>(space: impl ::offload::IndexSpace<#dims>, #ts_param #(#launch_params),*) -> ::offload::Result<(usize, Args<#lt>)> {
                let __offload_g = ::offload::index_space::Grid::<#dims>::new(#name_str, space)?;
                #ts_check
                #(#rebind)*
                #(#checks)*
                ::core::result::Result::Ok((::offload::__private::work_items(#name_str, __offload_g.items(), #per_item)?, Args { __offload_bounds: [#(#bounds),*], #(#param_names,)* __offload_life: ::core::marker::PhantomData }))
            }

            /// Runs the kernel on `device` over `space` (see `offload::IndexSpace`); an empty
            /// space launches nothing. When [`CHECKED`], a GPU launch checks every element
            /// access and waits for the launch to report the first one out of range as
            /// `Error::KernelFailed` (naming the argument, the index and the view's length).
            #[allow(clippy::too_many_arguments)]
            #[track_caller]
            pub fn launch<#lt>(device: &::offload::Device<'_>, space: impl ::offload::IndexSpace<#dims>, #ts_param #(#launch_params),*) -> ::offload::Result<()> {
                let (n, a) = args(space, #ts_arg #(#param_names),*)?;
                if n == 0 {
                    return ::core::result::Result::Ok(());
                }
                if CHECKED {
                    ::offload::__private::launch_checked(device, &KERNEL_CHECKED, n, a, __OFFLOAD_PARAMS)
                } else {
                    device.launch(&KERNEL, n, a)
                }
            }

            #reduce
        }
    })
}

/// The fast rows of a host twin's innermost loop ([`crate::fast_rows`]), as code: when a
/// row must run the body as written, each window (its view, and the index of its first
/// element in terms of the innermost index) and the fast body.
struct FastRowsCode {
    rare: TokenStream,
    windows: Vec<(syn::Ident, TokenStream)>,
    item: TokenStream,
    /// Every reduction's update is a store into a row-long scratch, folded into the lanes
    /// after the row ([`crate::fast_rows::FastRows::deferred`]).
    deferred: bool,
}

/// Reduction partials kept in [`LANES`] independent accumulators by the innermost loop:
/// each lane's sum is its own dependency chain (a single one would wait an add's latency
/// per item), and rustc may vectorise the lanes. Name, type and identity of each.
pub(crate) struct Lanes<'a> {
    pub names: &'a [&'a syn::Ident],
    pub types: &'a [TokenStream],
    pub identity: &'a [TokenStream],
    pub combine: &'a [TokenStream],
}

/// Accumulators per reduction variable in the innermost loop of a host twin (8: an AVX
/// register of `f32`, and enough chains to cover an add's latency at two adds a cycle).
const LANES: usize = 8;

impl Lanes<'_> {
    /// The innermost loop: `item` for `counter` in `0..len`, `pre` first (binds the index).
    /// With reductions, whole groups of [`LANES`] items run with lane `k`'s accumulators as
    /// the reduction variables, the rest with the task's; the lanes are folded into the
    /// task's after the loop ([`Lanes::fold`]).
    fn inner(
        &self,
        counter: &syn::Ident,
        len: &TokenStream,
        pre: &TokenStream,
        item: &TokenStream,
    ) -> TokenStream {
        if self.names.is_empty() {
            return quote! {
                for #counter in 0..#len {
                    #pre
                    #item
                }
            };
        }
        let names = self.names;
        let arrays: Vec<syn::Ident> = names.iter().map(|n| format_ident!("__offload_lanes_{}", n)).collect();
        let n = LANES;
        quote! {
            let __offload_groups = #len / #n;
            for __offload_g in 0..__offload_groups {
                for __offload_lane in 0..#n {
                    let #counter = __offload_g * #n + __offload_lane;
                    #(let mut #names = #arrays[__offload_lane];)*
                    #pre
                    #item
                    #(#arrays[__offload_lane] = #names;)*
                }
            }
            for #counter in __offload_groups * #n..#len {
                #pre
                #item
            }
        }
    }

    /// The innermost loop of a fast row whose reduction updates store each item's value
    /// into a scratch of the row's length (`__offload_sv_{name}` over
    /// `__offload_sbuf_{name}`): a loop with no dependency chain, then the scratch folded
    /// into the lanes (item `k` into lane `k % LANES`, the rest into the task's
    /// accumulators), as [`Lanes::inner`] would have.
    fn deferred(
        &self,
        counter: &syn::Ident,
        len: &TokenStream,
        pre: &TokenStream,
        item: &TokenStream,
    ) -> TokenStream {
        let n = LANES;
        let (names, identity, combine) = (self.names, self.identity, self.combine);
        let bufs: Vec<syn::Ident> = names.iter().map(|v| format_ident!("__offload_sbuf_{}", v)).collect();
        let views: Vec<syn::Ident> = names.iter().map(|v| format_ident!("__offload_sv_{}", v)).collect();
        let arrays: Vec<syn::Ident> = names.iter().map(|v| format_ident!("__offload_lanes_{}", v)).collect();
        let strs: Vec<String> = names.iter().map(|v| v.to_string()).collect();
        quote! {
            #(if #bufs.len() != #len {
                #bufs.clear();
                #bufs.resize(#len, #identity);
            })*
            {
                #(let #views = ::offload::__private::OwnView::team_local(&mut #bufs[..], "reduction", #strs);)*
                for #counter in 0..#len {
                    #pre
                    #item
                }
            }
            #({
                let mut __offload_ch = #bufs.chunks_exact(#n);
                for __offload_g in &mut __offload_ch {
                    for __offload_lane in 0..#n {
                        #arrays[__offload_lane] = #combine(#arrays[__offload_lane], __offload_g[__offload_lane]);
                    }
                }
                for __offload_v in __offload_ch.remainder() {
                    #names = #combine(#names, *__offload_v);
                }
            })*
        }
    }

    /// The scratch buffers of [`Lanes::deferred`], before a task's loops.
    fn declare_scratch(&self) -> TokenStream {
        let bufs: Vec<syn::Ident> =
            self.names.iter().map(|v| format_ident!("__offload_sbuf_{}", v)).collect();
        let types = self.types;
        quote!(#(let mut #bufs: ::std::vec::Vec<#types> = ::std::vec::Vec::new();)*)
    }

    /// The lanes' declarations, before a task's loops.
    fn declare(&self) -> TokenStream {
        let (types, identity) = (self.types, self.identity);
        let arrays: Vec<syn::Ident> =
            self.names.iter().map(|n| format_ident!("__offload_lanes_{}", n)).collect();
        let n = LANES;
        quote!(#(let mut #arrays: [#types; #n] = [#identity; #n];)*)
    }

    /// The lanes folded, in order, into the task's accumulators, after its loops.
    fn fold(&self) -> TokenStream {
        let (names, combine) = (self.names, self.combine);
        let arrays: Vec<syn::Ident> = names.iter().map(|n| format_ident!("__offload_lanes_{}", n)).collect();
        quote!(#(for __offload_v in #arrays { #names = #combine(#names, __offload_v); })*)
    }
}

/// A launch's work as nested loops over a task's rows `__offload_first..__offload_end` of
/// the outer dimension (in `order`, outer to unit stride): the rows, the items a row
/// holds, and the loops running `item` for each, its index variables bound; the innermost
/// loop keeps reduction partials in `lanes`.
fn item_loops(
    idx: &[&syn::Ident],
    order: &[usize],
    starts: &[syn::Ident],
    item: &TokenStream,
    rows: Option<&FastRowsCode>,
    lanes: &Lanes<'_>,
) -> (TokenStream, TokenStream, TokenStream) {
    // The innermost loop over `len` items, the first of which has index `first`: twice
    // where some rows can run a fast body.
    let inner =
        |index: &syn::Ident, first: TokenStream, counter: &str, len: TokenStream, pre: &TokenStream| {
            let counter = format_ident!("{}", counter);
            let general = lanes.inner(&counter, &len, pre, item);
            let Some(rows) = rows else { return general };
            let fast = if rows.deferred {
                lanes.deferred(&counter, &len, pre, &rows.item)
            } else {
                lanes.inner(&counter, &len, pre, &rows.item)
            };
            let rare = &rows.rare;
            let names: Vec<syn::Ident> =
                (0..rows.windows.len()).map(|w| format_ident!("__offload_w{}", w)).collect();
            let made = rows
                .windows
                .iter()
                .map(|(view, start)| quote!(#view.window({ let #index: usize = #first; #start }, #len)));
            // The windows are made only for a row that skips the rare `if`s, which may be
            // what keeps their index arithmetic in range (`if d == 0 { return; }`).
            quote! {
                let __offload_windows = if #rare {
                    None
                } else {
                    match (#(#made,)*) {
                        (#(Some(#names),)*) => Some((#(#names,)*)),
                        _ => None,
                    }
                };
                if let Some((#(#names,)*)) = __offload_windows {
                    #fast
                } else {
                    #general
                }
            }
        };
    let len_of = |d: usize| format_ident!("__offload_l{}", d);
    let mark = |t: TokenStream| quote!(if __OFFLOAD_CHECK { ::offload::__private::set_item(#t); });
    let (declare, fold) = (lanes.declare(), lanes.fold());
    let (units, per_unit, loops) = match idx.len() {
        1 => {
            let (i, s) = (idx[0], &starts[0]);
            let mark = mark(quote!(__offload_t));
            // Counted from 0 to the task's length: rustc then sees that the task's parts of
            // the views hold every index and drops their checks.
            let pre = quote! {
                let __offload_t = __offload_first + __offload_k;
                #mark
                let #i: usize = #s + __offload_t;
            };
            let inner = inner(
                i,
                quote!(#s + __offload_first),
                "__offload_k",
                quote!((__offload_end - __offload_first)),
                &pre,
            );
            (quote!(__offload_l.n()), quote!(1usize), inner)
        }
        2 => {
            let (a, b) = (order[0], order[1]);
            let (ia, ib, sa, sb, lb) = (idx[a], idx[b], &starts[a], &starts[b], len_of(b));
            let mark = mark(quote!(__offload_r * #lb + __offload_c));
            let pre = quote! {
                #mark
                let #ib: usize = #sb + __offload_c;
            };
            let inner = inner(ib, quote!(#sb), "__offload_c", quote!(#lb), &pre);
            let loops = quote! {
                for __offload_r in __offload_first..__offload_end {
                    let #ia: usize = #sa + __offload_r;
                    #inner
                }
            };
            (quote!(__offload_l0), quote!(#lb), loops)
        }
        _ => {
            let (a, b, c) = (order[0], order[1], order[2]);
            let (ia, ib, ic) = (idx[a], idx[b], idx[c]);
            let (sa, sb, sc) = (&starts[a], &starts[b], &starts[c]);
            let (lb, lc) = (len_of(b), len_of(c));
            let mark = mark(quote!((__offload_r * #lb + __offload_p) * #lc + __offload_c));
            let pre = quote! {
                #mark
                let #ic: usize = #sc + __offload_c;
            };
            let inner = inner(ic, quote!(#sc), "__offload_c", quote!(#lc), &pre);
            let loops = quote! {
                for __offload_r in __offload_first..__offload_end {
                    let #ia: usize = #sa + __offload_r;
                    for __offload_p in 0..#lb {
                        let #ib: usize = #sb + __offload_p;
                        #inner
                    }
                }
            };
            (quote!(__offload_l0), quote!(#lb * #lc), loops)
        }
    };
    let scratch = rows.filter(|r| r.deferred).map(|_| lanes.declare_scratch());
    (units, per_unit, quote!(#declare #scratch #loops #fold))
}
