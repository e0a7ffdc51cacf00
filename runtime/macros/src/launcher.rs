//! A kernel's launchers, in its generated module: the `Args` struct that carries a launch's
//! arguments in the argument block's order (`KernelArgs`), `args` and `launch` with every
//! check a launch makes before it runs, `reduce` for kernels with reduction variables, and
//! the kernel's OpenMP shape (`offload::omp::target`).

use proc_macro2::TokenStream;
use quote::quote;

use crate::expand::KernelGen;
use crate::signature::{outer_path, ParamKind, Slot};
use crate::twin::identity;
use crate::ty::Ty;

/// The launch lifetime of the generated items.
fn lifetime() -> TokenStream {
    quote!('__offload_a)
}

/// The launchers' type for a parameter of `kind`: its value, or a view.
fn field_type(kind: &ParamKind) -> TokenStream {
    let lt = lifetime();
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
}

/// `const __OFFLOAD_SHAPE`: what `offload::omp::target` needs to launch the kernel in the
/// OpenMP shape (one argument per parameter).
pub(crate) fn shape(g: &KernelGen<'_>) -> TokenStream {
    let (k, sig) = (g.k, &g.k.sig);
    // A teams kernel's space is not the OpenMP shape's `n` either.
    let shape_dims = if sig.teams.is_some() { 0 } else { g.dims };
    let shape_threads = sig.teams.as_ref().map_or_else(|| quote!(0usize), |t| t.rust(&sig.name));
    let shape_warps = !g.opts.reductions.is_empty() || k.team_reduce;
    let at_launch = sig.team_size_at_launch;
    let shape_params: Vec<TokenStream> = sig
        .params
        .iter()
        .map(|p| {
            let sp = quote!(::offload::ShapeParam);
            match &p.kind {
                ParamKind::Scalar(_) => quote!(#sp::Value),
                ParamKind::Struct(_) => quote!(#sp::Struct),
                ParamKind::View { elem, mutable } => {
                    let t = elem.rust_inner();
                    quote!(#sp::View { elem_bytes: ::core::mem::size_of::<#t>(), writes: #mutable })
                }
                ParamKind::Reduction { ty, .. } => {
                    let t = ty.rust();
                    quote!(#sp::View { elem_bytes: ::core::mem::size_of::<#t>(), writes: true })
                }
            }
        })
        .collect();
    quote! {
        const __OFFLOAD_SHAPE: ::offload::KernelShape = ::offload::KernelShape { dims: #shape_dims, threads: #shape_threads, team_size_at_launch: #at_launch, team_warps: #shape_warps, params: &[#(#shape_params),*] };
    }
}

/// How `Args::visit` hands each slot of the argument block to the collector.
fn visits(g: &KernelGen<'_>) -> Vec<TokenStream> {
    let dims = g.dims;
    g.slots
        .iter()
        .map(|s| match s {
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
                    ParamKind::Scalar(t) if t.is_half() => quote!(__offload_c.bits16(self.#n.to_bits());),
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
        })
        .collect()
}

/// What `args` (and `reduce`) check of the views before a launch: written views writable,
/// reduction views of their operator, and written views apart from the others.
fn view_checks(g: &KernelGen<'_>) -> Vec<TokenStream> {
    let name_str = &g.name_str;
    let mut checks = Vec::new();
    let mut views = Vec::new();
    for (k, p) in g.k.sig.params.iter().enumerate() {
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
    checks
}

/// A team size given at launch (`teams = ..=MAX`): the launchers' parameter, the argument
/// passing it on, its check (1 to MAX; whole warps with reductions) and `KernelArgs::block`,
/// which gives it as the GPU block. Otherwise only the team size's constant, if any.
struct TeamSize {
    param: TokenStream,
    arg: TokenStream,
    check: TokenStream,
    block: TokenStream,
}

impl TeamSize {
    fn of(g: &KernelGen<'_>) -> Self {
        let (k, sig) = (g.k, &g.k.sig);
        let name_str = &g.name_str;
        if sig.team_size_at_launch {
            let most = sig.teams.as_ref().map_or_else(|| quote!(1usize), |t| t.rust(&sig.name));
            let warps = !g.opts.reductions.is_empty() || k.team_reduce;
            TeamSize {
                param: quote!(team_size: usize,),
                arg: quote!(team_size,),
                check: quote!(let __offload_ts: usize = ::offload::__private::team_size_of(#name_str, team_size, #most, #warps)?;),
                block: quote!(
                    fn block(&self) -> ::core::option::Option<u32> {
                        ::core::option::Option::Some(self.__offload_bounds[1] as u32)
                    }
                ),
            }
        } else {
            let fixed = sig.teams.as_ref().map(|t| {
                let t = t.rust(&sig.name);
                quote!(let __offload_ts: usize = #t;)
            });
            TeamSize { param: quote!(), arg: quote!(), check: quote!(#fixed), block: quote!() }
        }
    }
}

/// The launch's bounds as `Args` carries them: the starts, the inner lengths, and a team
/// size given at launch.
fn bounds(g: &KernelGen<'_>) -> Vec<TokenStream> {
    let dims = g.dims;
    (0..dims)
        .map(|d| quote!(__offload_g.starts()[#d] as u64))
        .chain((1..dims).map(|d| quote!(__offload_g.lens()[#d] as u64)))
        .chain(g.k.sig.team_size_at_launch.then(|| quote!(__offload_ts as u64)))
        .collect()
}

/// The launchers' parameters (`name: type`), in the kernel's order.
fn launch_params(g: &KernelGen<'_>) -> Vec<TokenStream> {
    g.k.sig
        .params
        .iter()
        .map(|p| {
            let (n, t) = (&p.name, field_type(&p.kind));
            quote!(#n: #t)
        })
        .collect()
}

/// The launcher items of the kernel's module: `CHECKED`, `Args` and its `KernelArgs`,
/// `args`, `launch`, and `reduce` for kernels with reduction variables.
pub(crate) fn launchers(g: &KernelGen<'_>) -> TokenStream {
    let sig = &g.k.sig;
    let (name_str, dims, per_item) = (&g.name_str, g.dims, &g.per_item);
    let lt = lifetime();
    let launch_params = launch_params(g);
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
    let visits = visits(g);
    let checks = view_checks(g);
    let checked = match g.opts.checked {
        Some(true) => quote!(true),
        Some(false) => quote!(false),
        None => quote!(::core::cfg!(debug_assertions)),
    };
    let param_strs: Vec<String> =
        sig.params.iter().map(|p| p.text()).chain(g.team_locals.iter().map(|l| l.name.to_string())).collect();
    let param_positions: Vec<&TokenStream> = (0..sig.params.len()).map(|i| &g.param_pos[&i]).collect();
    let nb = 2 * dims - 1 + usize::from(sig.team_size_at_launch);
    let bounds = bounds(g);
    let TeamSize { param: ts_param, arg: ts_arg, check: ts_check, block: ts_block } = TeamSize::of(g);
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
    let reduce = reduce_fn(g, &launch_params, &checks);
    quote! {
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
}

/// `reduce`, for a kernel with reduction variables: [`launchers`]' `launch` with the
/// runtime providing them, returning their values. Nothing for other kernels.
fn reduce_fn(g: &KernelGen<'_>, launch_params: &[TokenStream], checks: &[TokenStream]) -> TokenStream {
    let (sig, reductions) = (&g.k.sig, &g.reductions);
    if reductions.is_empty() {
        return quote!();
    }
    let (name_str, dims, per_item) = (&g.name_str, g.dims, &g.per_item);
    let lt = lifetime();
    let TeamSize { param: ts_param, check: ts_check, .. } = TeamSize::of(g);
    let bounds = bounds(g);
    let reduce_params: Vec<&TokenStream> = sig
        .params
        .iter()
        .zip(launch_params)
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
    let names: Vec<String> = reductions.iter().map(|(n, _, op)| format!("`{}: {n}`", op.text())).collect();
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
                let identity = identity(rt.clone(), op);
                let pos = &g.param_pos[&i];
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
            #(#checks)*
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
}
