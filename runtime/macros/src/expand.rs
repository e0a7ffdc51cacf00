//! What the attributes expand to.

use std::collections::HashSet;

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote};
use syn::{ItemFn, LitStr};

use crate::types::{device_sig, kernel_sig, DeviceFnDecl, KernelOptions, ParamKind, RedOp, Ty};

/// The hidden constant holding device function `name`'s CUDA C source.
pub fn device_source_const(name: &syn::Ident) -> syn::Ident {
    format_ident!("__OFFLOAD_CUDA_{}", name)
}

/// The path, from inside a kernel's module, of the source constant of `d`.
fn device_source_path(d: &DeviceFnDecl) -> TokenStream {
    let mut path = d.path.clone();
    if let Some(last) = path.segments.last_mut() {
        last.ident = device_source_const(&last.ident);
    }
    outer_path(&path)
}

/// `path`, written in a kernel's parent module, as seen from inside the kernel's module.
pub fn outer_path(path: &syn::Path) -> TokenStream {
    let path = path.clone();
    let absolute = path.leading_colon.is_some()
        || path
            .segments
            .first()
            .is_some_and(|s| s.ident == "crate" || s.ident == "super" || s.ident == "self");
    if absolute && path.segments.first().is_some_and(|s| s.ident == "self") {
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

/// `#[offload::device]`.
pub fn device(attr: TokenStream, item: TokenStream) -> syn::Result<TokenStream> {
    let opts: KernelOptions = syn::parse2(attr)?;
    if opts.dims.is_some() || !opts.reductions.is_empty() || opts.checked.is_some() || opts.rows.is_some() {
        return Err(syn::Error::new(
            Span::call_site(),
            "offload::device: the only option is `device_fns = [g(T, ..) -> R, ..]` (the device functions it calls)",
        ));
    }
    let f: ItemFn = syn::parse2(item)?;
    let (params, ret) = device_sig(&f)?;
    if crate::cuda::is_reserved(&f.sig.ident.to_string()) {
        return Err(syn::Error::new_spanned(
            &f.sig.ident,
            "offload::device: this name is reserved in CUDA C; rename the function",
        ));
    }
    let src = crate::cuda::device_source(&f, &params, ret, &opts.device_fns)?;
    let konst = device_source_const(&f.sig.ident);
    let vis = &f.vis;
    let lit = LitStr::new(&src, Span::call_site());
    if opts.device_fns.is_empty() {
        return Ok(quote! {
            #f
            #[doc(hidden)]
            #[allow(non_upper_case_globals)]
            #vis const #konst: &str = #lit;
        });
    }
    // The callees' sources first (each guarded, so a kernel that lists both gets one copy),
    // joined at compile time; rustc checks each listed signature against the function.
    let parts: Vec<TokenStream> = opts
        .device_fns
        .iter()
        .map(|d| {
            let mut path = d.path.clone();
            if let Some(last) = path.segments.last_mut() {
                last.ident = device_source_const(&last.ident);
            }
            quote!(#path)
        })
        .collect();
    let checks = opts.device_fns.iter().map(|d| {
        let path = &d.path;
        let params = &d.param_types;
        let ret = d.ret_type.as_ref().map(|t| quote!(-> #t));
        quote!(let _: fn(#(#params),*) #ret = #path;)
    });
    let parts_name = format_ident!("__OFFLOAD_PARTS_{}", f.sig.ident);
    let len_name = format_ident!("__OFFLOAD_LEN_{}", f.sig.ident);
    let bytes_name = format_ident!("__OFFLOAD_BYTES_{}", f.sig.ident);
    Ok(quote! {
        #f
        #[doc(hidden)]
        #[allow(non_upper_case_globals)]
        const #parts_name: &[&str] = &[#(#parts,)* #lit];
        #[doc(hidden)]
        #[allow(non_upper_case_globals)]
        const #len_name: usize = ::offload::__private::concat_len(#parts_name);
        #[doc(hidden)]
        #[allow(non_upper_case_globals)]
        const #bytes_name: [u8; #len_name] = ::offload::__private::concat::<#len_name>(#parts_name);
        #[doc(hidden)]
        #[allow(non_upper_case_globals)]
        #vis const #konst: &str = {
            #[allow(unused)]
            fn __offload_signatures() { #(#checks)* }
            ::offload::__private::utf8(&#bytes_name)
        };
    })
}

/// `#[offload::kernel]`.
pub fn kernel(attr: TokenStream, item: TokenStream) -> syn::Result<TokenStream> {
    let opts: KernelOptions = syn::parse2(attr)?;
    let f: ItemFn = syn::parse2(item)?;
    let sig = kernel_sig(&f, opts.dims, &opts.reductions)?;
    let rows = match opts.rows {
        Some((_, span)) if sig.indices.len() == 1 => {
            return Err(syn::Error::new(span, "offload::kernel: rows applies to 2-D and 3-D kernels"))
        }
        Some((r, _)) => r,
        None => crate::types::DEFAULT_ROWS,
    };
    if crate::cuda::is_reserved(&sig.name.to_string()) || sig.name.to_string().starts_with("__") {
        return Err(syn::Error::new_spanned(
            &sig.name,
            "offload::kernel: this name is reserved in CUDA C; rename the kernel",
        ));
    }
    let mut seen = HashSet::new();
    for d in &opts.device_fns {
        if !seen.insert(d.name()) {
            return Err(syn::Error::new_spanned(
                &d.path,
                "offload::kernel: device functions are listed once, with distinct names",
            ));
        }
    }
    let cuda = crate::cuda::kernel_source(&sig, &f.block, &opts.device_fns, false, rows)?;
    let cuda_checked = crate::cuda::kernel_source(&sig, &f.block, &opts.device_fns, true, rows)?;
    let symbol_checked = crate::cuda::symbol(&sig, true);
    let block = crate::cuda::BLOCK;

    let name = &sig.name;
    let name_str = name.to_string();
    let vis = &f.vis;
    let dims = sig.indices.len();
    let host_fn = format_ident!("__offload_host_{}", name);

    // ---- the host twin ----
    let mut reads = Vec::new();
    // Positions: the starts, the inner lengths, the arguments, then the slices' lengths.
    let first = 2 * dims - 1;
    let mut len_pos = first + sig.params.len();
    let mut slices = HashSet::new();
    for (pos, p) in (first..).zip(&sig.params) {
        let pn = &p.name;
        let ps = p.text();
        reads.push(match p.kind {
            ParamKind::Scalar(Ty::Usize) => {
                quote!(let #pn: usize = ::offload::__private::index_arg(__offload_l, #pos)?;)
            }
            ParamKind::Scalar(Ty::Bool) => {
                quote!(let #pn: bool = ::offload::__private::bool_arg(__offload_l, #pos)?;)
            }
            ParamKind::Scalar(t) => {
                let rt = t.rust();
                quote!(let #pn: #rt = __offload_l.scalar::<#rt>(#pos)?;)
            }
            ParamKind::Slice { elem, .. } => {
                slices.insert(pn.to_string());
                let rt = elem.rust();
                let r = quote!(let #pn = ::offload::__private::SharedSlice::<#rt>::new(
                    __offload_l, #name_str, #ps, #pos, #len_pos)?;);
                len_pos += 1;
                r
            }
            ParamKind::Reduction { ty, .. } => {
                let rt = ty.rust();
                let target = format_ident!("__offload_red_{}", pn);
                let r = quote!(let #target = ::offload::__private::SharedSlice::<#rt>::new(
                    __offload_l, #name_str, #ps, #pos, #len_pos)?;);
                len_pos += 1;
                r
            }
        });
    }
    let reductions: Vec<(&syn::Ident, Ty, RedOp)> = sig
        .params
        .iter()
        .filter_map(|p| match p.kind {
            ParamKind::Reduction { ty, op } => Some((&p.name, ty, op)),
            _ => None,
        })
        .collect();
    let idx = &sig.indices;
    let starts: Vec<_> = (0..dims).map(|k| format_ident!("__offload_s{}", k)).collect();
    let lens: Vec<_> = (1..dims).map(|k| format_ident!("__offload_l{}", k)).collect();
    let start_pos: Vec<usize> = (0..dims).collect();
    let len_read_pos: Vec<usize> = (dims..2 * dims - 1).collect();
    let decode = match dims {
        1 => quote!(let #(#idx)*: usize = __offload_s0 + __offload_t;),
        2 => {
            let (i, j) = (&idx[0], &idx[1]);
            quote!(
                let #i: usize = __offload_s0 + __offload_t / __offload_l1;
                let #j: usize = __offload_s1 + __offload_t % __offload_l1;
            )
        }
        _ => {
            let (i, j, k) = (&idx[0], &idx[1], &idx[2]);
            quote!(
                let #i: usize = __offload_s0 + __offload_t / (__offload_l1 * __offload_l2);
                let #j: usize = __offload_s1 + (__offload_t / __offload_l2) % __offload_l1;
                let #k: usize = __offload_s2 + __offload_t % __offload_l2;
            )
        }
    };
    let body = crate::host::host_body(&f.block, &slices, &opts.device_fns);
    let stmts = &body.stmts;
    let host_loop = if reductions.is_empty() {
        quote! {
            ::offload::__private::par_for(__offload_l.n(), |__offload_t: usize| {
                #decode
                #(#stmts)*
            });
        }
    } else {
        // Each rayon task folds its items into its own partials (the body sees them as
        // its `&mut` arguments); the partials are then combined, and into the views.
        let red = quote!(::offload::__private::Reducible);
        let types: Vec<TokenStream> = reductions.iter().map(|(_, t, _)| t.rust()).collect();
        let names: Vec<&syn::Ident> = reductions.iter().map(|(n, _, _)| *n).collect();
        let targets: Vec<syn::Ident> = names.iter().map(|n| format_ident!("__offload_red_{}", n)).collect();
        let ks: Vec<syn::Index> = (0..reductions.len()).map(syn::Index::from).collect();
        let identity: Vec<TokenStream> = reductions
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
        let combine: Vec<TokenStream> = reductions
            .iter()
            .map(|(_, _, op)| match op {
                RedOp::Add => quote!(#red::add),
                RedOp::Min => quote!(#red::min),
                RedOp::Max => quote!(#red::max),
            })
            .collect();
        quote! {
            let __offload_total: (#(#types,)*) = ::offload::__private::par_reduce(
                __offload_l.n(),
                (#(#identity,)*),
                |mut __offload_acc: (#(#types,)*), __offload_t: usize| {
                    {
                        #(let #names: &mut #types = &mut __offload_acc.#ks;)*
                        let mut __offload_item = || {
                            #decode
                            #(#stmts)*
                        };
                        __offload_item();
                    }
                    __offload_acc
                },
                |__offload_a: (#(#types,)*), __offload_b: (#(#types,)*)| (#(#combine(__offload_a.#ks, __offload_b.#ks),)*),
            );
            #(#targets.set(0, #combine(#targets.get(0), __offload_total.#ks));)*
        }
    };
    let fn_checks = opts.device_fns.iter().map(|d| {
        let path = outer_path(&d.path);
        let params = &d.param_types;
        let ret = d.ret_type.as_ref().map(|t| quote!(-> #t));
        quote!(let _: fn(#(#params),*) #ret = #path;)
    });

    // ---- the launcher ----
    let lt = quote!('__offload_a);
    let launch_params: Vec<TokenStream> = sig
        .params
        .iter()
        .map(|p| {
            let pn = &p.name;
            match p.kind {
                ParamKind::Scalar(t) => {
                    let rt = t.rust();
                    quote!(#pn: #rt)
                }
                ParamKind::Slice { elem: t, .. } | ParamKind::Reduction { ty: t, .. } => {
                    let rt = t.rust();
                    quote!(#pn: ::offload::DeviceSlice<#lt, #rt>)
                }
            }
        })
        .collect();
    let param_names: Vec<_> = sig.params.iter().map(|p| &p.name).collect();
    let mut tuple_types: Vec<TokenStream> = vec![quote!(u64); 2 * dims - 1];
    let mut tuple_values: Vec<TokenStream> =
        (0..dims).map(|k| quote!(__offload_g.starts()[#k] as u64)).collect();
    tuple_values.extend((1..dims).map(|k| quote!(__offload_g.lens()[#k] as u64)));
    let mut checks = Vec::new();
    let mut len_values = Vec::new();
    // Every view with its name and whether the kernel writes it, for the overlap check.
    let mut views = Vec::new();
    // The same for `reduce`, whose reduction variables are the runtime's slots: a null
    // `DevicePtr` placeholder each (`launch_reduce` puts the slot's address there), of one
    // element.
    let mut red_values = tuple_values.clone();
    let mut red_checks = Vec::new();
    let mut red_len_values = Vec::new();
    let mut red_views = Vec::new();
    let mut partials = Vec::new();
    for (k, p) in sig.params.iter().enumerate() {
        let pn = &p.name;
        let ps = p.text();
        match p.kind {
            ParamKind::Scalar(Ty::Usize) => {
                tuple_types.push(quote!(u64));
                tuple_values.push(quote!(#pn as u64));
            }
            ParamKind::Scalar(Ty::Bool) => {
                tuple_types.push(quote!(u32));
                tuple_values.push(quote!(u32::from(#pn)));
            }
            ParamKind::Scalar(t) => {
                tuple_types.push(t.rust());
                tuple_values.push(quote!(#pn));
            }
            ParamKind::Slice { elem, mutable } => {
                let rt = elem.rust();
                tuple_types.push(quote!(::offload::DeviceSlice<#lt, #rt>));
                tuple_values.push(quote!(#pn));
                len_values.push(quote!(#pn.len() as u64));
                if mutable {
                    checks.push(quote!(::offload::__private::check_writable(#name_str, #k, #ps, &#pn)?;));
                }
                views.push(quote!((#k, #ps, #pn.host_range(), #mutable)));
            }
            ParamKind::Reduction { ty, op } => {
                let rt = ty.rust();
                let opt = op.text();
                tuple_types.push(quote!(::offload::DeviceSlice<#lt, #rt>));
                tuple_values.push(quote!(#pn));
                len_values.push(quote!(#pn.len() as u64));
                checks.push(quote!(::offload::__private::check_reduction(#name_str, #k, #ps, #opt, &#pn)?;));
                views.push(quote!((#k, #ps, #pn.host_range(), true)));
                // The launch position of the placeholder, and the operator's identity.
                let red = quote!(::offload::__private::Reducible);
                let identity = match op {
                    RedOp::Add => quote!(<#rt as #red>::ZERO),
                    RedOp::Min => quote!(<#rt as #red>::MIN_IDENTITY),
                    RedOp::Max => quote!(<#rt as #red>::MAX_IDENTITY),
                };
                let pos = 2 * dims - 1 + k;
                partials.push(quote!((#pos, <#rt as ::offload::KernelScalar>::into_scalar(#identity))));
                red_values.push(quote!(::offload::DevicePtr::NULL));
                red_len_values.push(quote!(1u64));
                continue;
            }
        }
        // Everything but a reduction variable is passed to `reduce` as to `launch`.
        if let Some(v) = tuple_values.last() {
            red_values.push(v.clone());
        }
        if let ParamKind::Slice { mutable, .. } = p.kind {
            red_len_values.push(quote!(#pn.len() as u64));
            if mutable {
                red_checks.push(quote!(::offload::__private::check_writable(#name_str, #k, #ps, &#pn)?;));
            }
            red_views.push(quote!((#k, #ps, #pn.host_range(), #mutable)));
        }
    }
    if views.len() > 1 {
        checks.push(quote!(::offload::__private::check_disjoint(#name_str, &[#(#views),*])?;));
    }
    if red_views.len() > 1 {
        red_checks.push(quote!(::offload::__private::check_disjoint(#name_str, &[#(#red_views),*])?;));
    }
    red_values.extend(red_len_values);
    let checked = match opts.checked {
        Some(true) => quote!(true),
        Some(false) => quote!(false),
        None => quote!(::core::cfg!(debug_assertions)),
    };
    let param_strs: Vec<String> = sig.params.iter().map(|p| p.text()).collect();
    tuple_types.extend(len_values.iter().map(|_| quote!(u64)));
    tuple_values.extend(len_values);
    if tuple_types.len() > 16 {
        return Err(syn::Error::new_spanned(
            &f.sig,
            "offload::kernel: too many arguments: the indices' bounds, the arguments and one length per slice \
             must be at most 16",
        ));
    }

    let doc = format!(
        "The generated launcher and kernel of `fn {name}` (`#[offload::kernel]`), over a {dims}-D \
         index space.\n\nArguments declared `&mut [T]` take a writable [`offload::DeviceSlice`] (one that comes \
         from an exclusive borrow); a shared one is an `Error::KernelArgument`. A reduction variable \
         (`&mut T` listed in `reduction(..)`) takes a writable view of at least one element: the launch \
         combines every iteration's contributions, and element 0's value, into element 0 (`reduce`, \
         generated for kernels with reduction variables, provides them itself and returns their values). \
         Views the kernel writes may not overlap other views of the launch."
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
        let first = 2 * dims - 1;
        quote! {
            #[doc = #reduce_doc]
            #[allow(clippy::too_many_arguments)]
            #[track_caller]
            pub fn reduce<#lt>(device: &::offload::Device<'_>, space: impl ::offload::IndexSpace<#dims>, #(#reduce_params),*) -> ::offload::Result<#ret> {
                let __offload_g = ::offload::index_space::Grid::<#dims>::new(#name_str, space)?;
                #(#red_checks)*
                let __offload_v = ::offload::__private::launch_reduce(
                    device,
                    &::offload::__private::Reduction {
                        kernel: if CHECKED { &KERNEL_CHECKED } else { &KERNEL },
                        checked: CHECKED,
                        params: __OFFLOAD_PARAMS,
                        first_param: #first,
                        partials: &[#(#partials),*],
                    },
                    __offload_g.items(),
                    (#(#red_values,)*),
                )?;
                ::core::result::Result::Ok(#value)
            }
        }
    };
    let cuda_lit = LitStr::new(&cuda, Span::call_site());
    let cuda_checked_lit = LitStr::new(&cuda_checked, Span::call_site());
    let parts: Vec<TokenStream> = opts.device_fns.iter().map(device_source_path).collect();

    Ok(quote! {
            #[allow(dead_code)]
            #f

            #[doc = #doc]
            #[allow(dead_code, clippy::all)]
            #vis mod #name {
    #[doc(hidden)]
                #[allow(unused, clippy::all, non_snake_case)]
                fn #host_fn(__offload_l: &::offload::HostLaunch<'_>) -> ::core::result::Result<(), ::std::string::String> {
                    #(#fn_checks)*
                    #(let #starts: usize = ::offload::__private::index_arg(__offload_l, #start_pos)?;)*
                    #(let #lens: usize = ::offload::__private::index_arg(__offload_l, #len_read_pos)?;)*
                    #(#reads)*
                    #host_loop
                    ::core::result::Result::Ok(())
                }

                const __OFFLOAD_PARTS: &[&str] = &[#(#parts,)* #cuda_lit];
                const __OFFLOAD_LEN: usize = ::offload::__private::concat_len(__OFFLOAD_PARTS);
                const __OFFLOAD_BYTES: [u8; __OFFLOAD_LEN] = ::offload::__private::concat::<__OFFLOAD_LEN>(__OFFLOAD_PARTS);
                const __OFFLOAD_PARTS_CHECKED: &[&str] = &[#(#parts,)* #cuda_checked_lit];
                const __OFFLOAD_LEN_CHECKED: usize = ::offload::__private::concat_len(__OFFLOAD_PARTS_CHECKED);
                const __OFFLOAD_BYTES_CHECKED: [u8; __OFFLOAD_LEN_CHECKED] =
                    ::offload::__private::concat::<__OFFLOAD_LEN_CHECKED>(__OFFLOAD_PARTS_CHECKED);

                /// The kernel: its CUDA C source (with the device functions it calls) and its host twin.
                pub static KERNEL: ::offload::Kernel = ::offload::Kernel::new(#name_str)
                    .with_cuda(::offload::__private::utf8(&__OFFLOAD_BYTES))
                    .with_host(#host_fn)
                    .with_block(#block)
                    .with_grid_stride();

                /// The bounds-checked variant of [`KERNEL`]: on GPUs every element access is
                /// checked against its view's length, and the first out of range is reported
                /// (and not made) after the launch. Its last argument before `n` is the
                /// address of a report of 6 `u64`. The host twin is checked either way.
                pub static KERNEL_CHECKED: ::offload::Kernel = ::offload::Kernel::new(#name_str)
                    .with_symbol(#symbol_checked)
                    .with_cuda(::offload::__private::utf8(&__OFFLOAD_BYTES_CHECKED))
                    .with_host(#host_fn)
                    .with_block(#block)
                    .with_grid_stride();

                /// Whether [`launch`] runs [`KERNEL_CHECKED`]: the kernel's `checked` option, or
                /// else whether the crate is built with debug assertions.
                pub const CHECKED: bool = #checked;

                const __OFFLOAD_PARAMS: &[&str] = &[#(#param_strs),*];

                /// A launch's arguments in the kernel's order, made by [`args`] only (so the
                /// bounds and lengths it carries are those of its views).
                #[derive(Clone, Copy)]
                pub struct Args<#lt>((#(#tuple_types,)*), ::core::marker::PhantomData<&#lt ()>);

                impl ::core::fmt::Debug for Args<'_> {
                    fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                        f.debug_struct(::core::concat!(#name_str, "::Args")).finish_non_exhaustive()
                    }
                }

                // SAFETY: the arguments are the checked views and scalars `args` made.
                unsafe impl ::offload::KernelArgs for Args<'_> {
                    fn launch_args(&self, device: usize, kernel: &::offload::Kernel) -> ::offload::Result<::std::vec::Vec<::offload::LaunchArg>> {
                        ::offload::KernelArgs::launch_args(&self.0, device, kernel)
                    }
                    fn shared_views(&self) -> ::std::vec::Vec<(usize, ::offload::HostRange)> {
                        ::offload::KernelArgs::shared_views(&self.0)
                    }
                    fn view_extents(&self) -> ::std::vec::Vec<::core::option::Option<usize>> {
                        ::offload::KernelArgs::view_extents(&self.0)
                    }
                }

                /// The number of work items of `space` and the launch's arguments, for
                /// `NowaitScope::launch(device, &KERNEL, n, args, after)`. Checks what
                /// [`launch`] checks before it runs; `n` may be 0 (a launch of it does nothing).
                /// Such launches run [`KERNEL`], whose GPU accesses are not bounds-checked.
                #[allow(clippy::too_many_arguments)]
                pub fn args<#lt>(space: impl ::offload::IndexSpace<#dims>, #(#launch_params),*) -> ::offload::Result<(usize, Args<#lt>)> {
                    let __offload_g = ::offload::index_space::Grid::<#dims>::new(#name_str, space)?;
                    #(#checks)*
                    ::core::result::Result::Ok((__offload_g.items(), Args((#(#tuple_values,)*), ::core::marker::PhantomData)))
                }

                /// Runs the kernel on `device` over `space` (see `offload::IndexSpace`); an empty
                /// space launches nothing. When [`CHECKED`], a GPU launch checks every element
                /// access and waits for the launch to report the first one out of range as
                /// `Error::KernelFailed` (naming the argument, the index and the view's length).
                #[allow(clippy::too_many_arguments)]
                #[track_caller]
                pub fn launch<#lt>(device: &::offload::Device<'_>, space: impl ::offload::IndexSpace<#dims>, #(#launch_params),*) -> ::offload::Result<()> {
                    let (n, a) = args(space, #(#param_names),*)?;
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
