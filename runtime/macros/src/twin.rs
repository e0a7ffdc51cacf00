//! A kernel's host twin: the function a host device runs for a launch. It reads the
//! argument block, then runs the work items in pool tasks, each over whole rows of the
//! outer dimension (a teams kernel: whole teams, its threads as loops between barriers),
//! with views read and written plainly where that is proven safe and per launch checked,
//! and reduction partials kept in lanes. Also what it does, in words, for
//! `KERNEL.host_path()`. The body's statements come from `emit_host.rs` and
//! `emit_teams.rs`; this module assembles them.

use proc_macro2::TokenStream;
use quote::{format_ident, quote};

use crate::access::OwnIndex;
use crate::emit_host::RustEmitter;
use crate::expand::KernelGen;
use crate::ir::VarId;
use crate::signature::{outer_path, ParamKind, Slot};
use crate::ty::{RedOp, Ty};

/// The twin's body (arguments read, the loops) and its description.
pub(crate) struct HostTwin {
    pub body: TokenStream,
    /// "host twin: ...", for `KERNEL.host_path()` and the launch trace.
    pub path: String,
}

/// The host twin of the kernel `g` generates.
pub(crate) fn host_twin(g: &KernelGen<'_>) -> HostTwin {
    let (k, sig) = (g.k, &g.k.sig);
    let mut emit = RustEmitter::new(&k.body, true);
    emit.local_reductions = sig.teams.is_none();
    let reads = arg_reads(g);
    let l0 = (g.dims > 1 && sig.teams.is_none()).then(|| {
        let inner_lens: Vec<syn::Ident> = (1..g.dims).map(len_of).collect();
        quote!(
            let __offload_inner: usize = 1 #(* #inner_lens)*;
            let __offload_l0: usize = if __offload_inner == 0 { 0 } else { __offload_l.n() / __offload_inner };
        )
    });
    let red = Reductions::of(g);
    let views = ViewPaths::of(g, &emit);
    let copies = task_copies(g);
    let run = |own_bind: &[TokenStream], fast: bool| {
        let windows = if fast { &views.window_vars[..] } else { &[] };
        match teams_loop(g, &red, &copies, own_bind, windows) {
            Some(teams) => teams,
            None => flat_loop(g, &emit, &red, &copies, own_bind, windows),
        }
    };
    // A teams kernel's own rows hold each thread's stores unlogged: the checked twin, whose
    // store log names two threads storing one element, keeps them shared.
    let unlogged = (sig.teams.is_some() && !views.own.is_empty()).then(|| quote!(!__OFFLOAD_CHECK &&));
    let run = if views.plain.is_empty() && views.own.is_empty() {
        run(&[], false)
    } else {
        let (fast, shared) = (run(&views.own_bind(g), true), run(&[], false));
        let (spans, plain, own_fit) = (&views.spans, &views.plain, views.own_fit(g));
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
    HostTwin { body: quote!(#(#reads)* #l0 #run), path: describe(g, &views) }
}

fn start_of(d: usize) -> syn::Ident {
    format_ident!("__offload_s{}", d)
}

fn len_of(d: usize) -> syn::Ident {
    format_ident!("__offload_l{}", d)
}

/// The twin's first statements: each slot of the argument block read into the variable the
/// body uses (views as bounds-checked shared slices, logged in a checked launch).
fn arg_reads(g: &KernelGen<'_>) -> Vec<TokenStream> {
    let sig = &g.k.sig;
    let (name, name_str) = (&sig.name, &g.name_str);
    let mut reads = Vec::new();
    for (s, pos) in g.slots.iter().zip(&g.positions) {
        reads.push(match s {
            Slot::Start(d) => {
                let v = start_of(*d);
                quote!(let #v: usize = ::offload::__private::index_arg(__offload_l, #pos)?;)
            }
            Slot::InnerLen(d) => {
                let v = len_of(*d);
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
                    ParamKind::Scalar(t) if t.is_half() => {
                        let rt = t.rust();
                        quote!(let #pn: #rt = #rt::from_bits(::offload::__private::bits16_arg(__offload_l, #pos)?);)
                    }
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
                        let lp = &g.len_pos[i];
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
                        let lp = &g.len_pos[i];
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
    reads
}

/// The reduction variables as the twin's tasks keep them: types, names, the views they
/// end in, tuple indices, identities and combining functions.
struct Reductions<'a> {
    types: Vec<TokenStream>,
    names: Vec<&'a syn::Ident>,
    targets: Vec<syn::Ident>,
    ks: Vec<syn::Index>,
    identity: Vec<TokenStream>,
    combine: Vec<TokenStream>,
}

impl<'a> Reductions<'a> {
    fn of(g: &KernelGen<'a>) -> Self {
        let red = quote!(::offload::__private::Reducible);
        let names: Vec<&syn::Ident> = g.reductions.iter().map(|(n, _, _)| *n).collect();
        Self {
            types: g.reductions.iter().map(|(_, t, _)| t.rust()).collect(),
            targets: names.iter().map(|n| format_ident!("__offload_red_{}", n)).collect(),
            names,
            ks: (0..g.reductions.len()).map(syn::Index::from).collect(),
            identity: g.reductions.iter().map(|(_, t, op)| identity(t.rust(), *op)).collect(),
            combine: g
                .reductions
                .iter()
                .map(|(_, _, op)| match op {
                    RedOp::Add => quote!(#red::add),
                    RedOp::Min => quote!(#red::min),
                    RedOp::Max => quote!(#red::max),
                })
                .collect(),
        }
    }
}

impl Reductions<'_> {
    /// The launch's `units` (of `per_unit` items each) run by pool tasks, each `task`
    /// (over its units `__offload_first..__offload_end`, giving its reduction partials);
    /// the partials combined in order, and into the reduction views.
    fn run_tasks(&self, units: TokenStream, per_unit: &TokenStream, task: TokenStream) -> TokenStream {
        let (rt, rk, ri, rc, rtg) = (&self.types, &self.ks, &self.identity, &self.combine, &self.targets);
        let reduces = !self.names.is_empty();
        quote! {
            let __offload_total: (#(#rt,)*) = ::offload::__private::run_chunks(
                #units,
                #per_unit,
                #reduces,
                (#(#ri,)*),
                |__offload_first: usize, __offload_end: usize| {
                    #task
                },
                |__offload_a: (#(#rt,)*), __offload_b: (#(#rt,)*)| (#(#rc(__offload_a.#rk, __offload_b.#rk),)*),
            );
            #(#rtg.set(0, #rc(#rtg.get(0), __offload_total.#rk));)*
        }
    }
}

/// Operator `op`'s identity for values of type `t`.
pub(crate) fn identity(t: TokenStream, op: RedOp) -> TokenStream {
    let red = quote!(::offload::__private::Reducible);
    match op {
        RedOp::Add => quote!(<#t as #red>::ZERO),
        RedOp::Min => quote!(<#t as #red>::MIN_IDENTITY),
        RedOp::Max => quote!(<#t as #red>::MAX_IDENTITY),
    }
}

/// A task's own copies of what its loops read: locals rustc knows no store can change
/// (captured by reference, they would be reloaded after every store through a cell).
fn task_copies(g: &KernelGen<'_>) -> TokenStream {
    let sig = &g.k.sig;
    let copied: Vec<syn::Ident> = sig
        .params
        .iter()
        .filter(|p| !matches!(p.kind, ParamKind::Reduction { .. }))
        .map(|p| p.name.clone())
        .chain((0..g.dims).map(start_of))
        .chain((1..g.dims).map(len_of))
        .chain((g.dims > 1 && sig.teams.is_none()).then(|| format_ident!("__offload_l0")))
        .collect();
    quote!(#(let #copied = #copied;)*)
}

/// A teams kernel's tasks: each runs whole teams, their threads as loops between barriers
/// ([`crate::emit_teams`]), with team-local arrays of their own; `None` for other kernels.
fn teams_loop(
    g: &KernelGen<'_>,
    red: &Reductions<'_>,
    copies: &TokenStream,
    own_bind: &[TokenStream],
    windows: &[VarId],
) -> Option<TokenStream> {
    let (k, sig) = (g.k, &g.k.sig);
    // The team size: the host twin's `__offload_ts` (the count, or the launch's).
    sig.teams.as_ref()?;
    let t = quote!(__offload_ts);
    let (team, thread) = (&sig.indices[0], &sig.indices[1]);
    let bufs: Vec<syn::Ident> =
        g.team_locals.iter().map(|l| format_ident!("__offload_tl_{}", l.name)).collect();
    let names: Vec<&syn::Ident> = g.team_locals.iter().map(|l| l.name).collect();
    let kinds: Vec<TokenStream> = g
        .team_locals
        .iter()
        .map(|l| {
            let t = &l.elem;
            if l.cells {
                quote!(::offload::__private::OwnView::<#t>)
            } else {
                quote!(::offload::__private::SharedSlice::<#t>)
            }
        })
        .collect();
    let name_strs: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let name_str = &g.name_str;
    let types: Vec<&TokenStream> = g.team_locals.iter().map(|l| &l.elem).collect();
    let lens: Vec<&TokenStream> = g.team_locals.iter().map(|l| &l.len).collect();
    let (rt, rn, rk, ri, rc) = (&red.types, &red.names, &red.ks, &red.identity, &red.combine);
    // Each thread's reduction partials, for all the task's teams, combined in thread order.
    let partials = (!g.reductions.is_empty()).then(|| {
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
        crate::emit_teams::TeamsTwin::new(&k.body, sig.teams.as_ref()?, &sig.name, k.index_vars[1], enter)
            .with_windows(windows);
    let (arrays, team_code) = (twin.arrays(), twin.team());
    let task = quote! {
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
    };
    Some(red.run_tasks(quote!(__offload_l.n() / #t), &t, task))
}

/// Any other kernel's tasks: each runs whole rows of the space's outer dimension in order,
/// as nested loops (no division per item), folding its items into its own reduction
/// partials (the body sees them as its `&mut` arguments); the partials are then combined,
/// in order, and into the views. `windows`: the views a fast row may take windows of (the
/// plain views are `ReadView`s).
fn flat_loop(
    g: &KernelGen<'_>,
    emit: &RustEmitter<'_>,
    red: &Reductions<'_>,
    copies: &TokenStream,
    own_bind: &[TokenStream],
    windows: &[VarId],
) -> TokenStream {
    let (k, sig) = (g.k, &g.k.sig);
    let order = &k.map.order;
    let (types, names, identity, combine) = (&red.types, &red.names, &red.identity, &red.combine);
    // `return;` ends the item: the body is then a closure called once per item.
    let as_item = |stmts: TokenStream| {
        if k.body.returns {
            quote!((|| { #stmts })();)
        } else {
            stmts
        }
    };
    let item = as_item(emit.stmts(&k.body.stmts));
    // Rows that need less than the whole body run a copy that does less.
    let inner = k.index_vars[*order.last().unwrap_or(&0)];
    let counter = if g.dims == 1 { "__offload_k" } else { "__offload_c" };
    let rows = crate::fast_rows::fast_rows(&k.body, inner, counter, windows).map(|f| {
        let guards = f.guards.iter().map(|g| {
            let terms = g.iter().map(|t| emit.expr(t));
            quote!((#((#terms))&&*))
        });
        let mut fast_emit = RustEmitter::new(&f.body, true);
        fast_emit.local_reductions = emit.local_reductions;
        let windows =
            f.windows.iter().map(|(v, start)| (k.body.vars[*v].rust.clone(), emit.expr(start))).collect();
        FastRowsCode {
            rare: if f.guards.is_empty() { quote!(false) } else { quote!(#(#guards)||*) },
            windows,
            item: as_item(fast_emit.stmts(&f.body.stmts)),
            deferred: !f.deferred.is_empty(),
        }
    });
    let lanes = Lanes { names, types, identity, combine };
    let idx: Vec<&syn::Ident> = sig.indices.iter().collect();
    let starts: Vec<syn::Ident> = (0..g.dims).map(start_of).collect();
    let (units, per_unit, loops) = item_loops(&idx, order, &starts, &item, rows.as_ref(), &lanes);
    let task = quote! {
        #copies
        #(#own_bind)*
        #(let mut #names: #types = #identity;)*
        #loops
        (#(#names,)*)
    };
    red.run_tasks(units, &per_unit, task)
}

/// The views the twin may read and write plainly: read-only views the body reads element
/// by element, and (outside teams kernels) written views every access of which is at the
/// item's own element. They are plain when no written view overlaps another and the
/// items' own elements stay apart (checked per launch: plain loads and stores rustc can
/// vectorise); otherwise (a C port passing one array as two arguments, columns wider
/// than the row) the shared path runs, as every view does in the other case.
struct ViewPaths<'a> {
    /// Each view's (span, written), for the overlap check.
    spans: Vec<TokenStream>,
    /// Read-only views read plainly.
    plain: Vec<&'a syn::Ident>,
    /// Written views each item (team) stores only in its own element (row), with the rows
    /// it also stores into beside them.
    own: Vec<(&'a syn::Ident, OwnIndex, Vec<TokenStream>)>,
    /// Read-only views read only at the item's own element: each task reads its part.
    own_reads: Vec<(&'a syn::Ident, OwnIndex)>,
    /// The views a fast path's rows may take windows of: plain reads and own elements.
    window_vars: Vec<VarId>,
}

impl<'a> ViewPaths<'a> {
    fn of(g: &KernelGen<'a>, emit: &RustEmitter<'_>) -> Self {
        let (k, sig) = (g.k, &g.k.sig);
        let (whole, order) = (&g.whole, &k.map.order);
        let mut v = ViewPaths {
            spans: Vec::new(),
            plain: Vec::new(),
            own: Vec::new(),
            own_reads: Vec::new(),
            window_vars: Vec::new(),
        };
        for (i, p) in sig.params.iter().enumerate() {
            let n = &p.name;
            let var = k.param_vars[i];
            match p.kind {
                ParamKind::View { mutable, .. } => {
                    v.spans.push(quote!((#n.span(), #mutable)));
                    if whole.contains(&var) {
                    } else if !mutable {
                        v.plain.push(n);
                        // Read only at the item's own element: each task reads its part.
                        if sig.teams.is_none() {
                            if let Some(form) = crate::access::own_index(&k.body, var, &k.index_vars, order) {
                                v.own_reads.push((n, form));
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
                            v.own.push((n, form, rows));
                        }
                    } else if let Some(form) = crate::access::team_rows(&k.body, var, k.index_vars[0]) {
                        v.own.push((n, form, Vec::new()));
                    }
                }
                ParamKind::Reduction { .. } => {
                    let target = format_ident!("__offload_red_{}", n);
                    v.spans.push(quote!((#target.span(), true)));
                }
                _ => {}
            }
        }
        v.window_vars = sig
            .params
            .iter()
            .enumerate()
            .filter(|(_, p)| v.plain.contains(&&p.name) || v.own.iter().any(|(n, ..)| *n == &p.name))
            .map(|(i, _)| k.param_vars[i])
            .collect();
        v
    }

    /// Whether each own view's rows fit it (and stay apart from the rows stored beside).
    fn own_fit(&self, g: &KernelGen<'_>) -> Vec<TokenStream> {
        self.own
            .iter()
            .map(|(n, form, beside)| {
                let [r0, rows, c0, cols, w] = own_rows(g, *form);
                let beside = (!beside.is_empty())
                    .then(|| quote!(&& ::offload::__private::rows_outside(&[#(#beside),*], #r0, #rows)));
                quote!(::offload::__private::own_rows_fit(#r0, #rows, #c0, #cols, #w, #n.len()) #beside)
            })
            .collect()
    }

    /// A task's own rows of each own view, and its part of each view read at its own
    /// elements, bound over the view's name.
    fn own_bind(&self, g: &KernelGen<'_>) -> Vec<TokenStream> {
        let task_span = |form: OwnIndex| {
            let [r0, _, c0, cols, w] = own_rows(g, form);
            quote!((#r0 + __offload_first) * #w + #c0, (#r0 + __offload_end - 1) * #w + #c0 + #cols)
        };
        self.own
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
            .chain(self.own_reads.iter().map(|(n, form)| {
                let span = task_span(*form);
                quote!(let #n = #n.part(#span);)
            }))
            .collect()
    }
}

/// An own view's rows: (first row, rows, first column, columns, row width).
fn own_rows(g: &KernelGen<'_>, form: OwnIndex) -> [TokenStream; 5] {
    let (k, sig) = (g.k, &g.k.sig);
    let order = &k.map.order;
    match form {
        OwnIndex::Linear => {
            [quote!(__offload_s0), quote!(__offload_l.n()), quote!(0usize), quote!(1usize), quote!(1usize)]
        }
        OwnIndex::Block { width } => {
            let w = &k.body.vars[width].rust;
            [quote!(__offload_s0), quote!(__offload_l.n()), quote!(0usize), quote!(#w), quote!(#w)]
        }
        OwnIndex::TeamRows { width } => {
            let w = &k.body.vars[width].rust;
            let t = if sig.teams.is_some() { quote!(__offload_ts) } else { quote!(1usize) };
            [quote!(__offload_s0), quote!((__offload_l.n() / #t)), quote!(0usize), quote!(#w), quote!(#w)]
        }
        OwnIndex::Rows { width } => {
            let (a, b) = (order[0], order[1]);
            let (sa, sb, lb) = (start_of(a), start_of(b), len_of(b));
            let w = &k.body.vars[width].rust;
            [quote!(#sa), quote!(__offload_l0), quote!(#sb), quote!(#lb), quote!(#w)]
        }
    }
}

/// What the twin does, in words.
fn describe(g: &KernelGen<'_>, views: &ViewPaths<'_>) -> String {
    let (k, sig) = (g.k, &g.k.sig);
    let (plain, own) = (&views.plain, &views.own);
    let mut path = Vec::new();
    if let Some(t) = &sig.teams {
        path.push(format!(
            "teams of {} as loops over the threads between barriers, a team per pool thread",
            t.text()
        ));
        let rounds = crate::emit_teams::TeamsTwin::new(&k.body, t, &sig.name, k.index_vars[1], quote!())
            .rounds_count();
        if rounds > 0 {
            path.push(format!("{rounds} stretches with block-stride loops in rounds of the team's threads"));
        }
    }
    let names = |v: &[&syn::Ident]| v.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ");
    if !plain.is_empty() {
        path.push(format!("plain loads of {} (read only)", names(plain)));
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
        let inner = k.index_vars[*k.map.order.last().unwrap_or(&0)];
        if let Some(f) = crate::fast_rows::fast_rows(&k.body, inner, "__offload_c", &views.window_vars) {
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
    if !g.reductions.is_empty() && sig.teams.is_none() {
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
    format!("host twin: {}", path.join("; "))
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
        dims => {
            // The outer index over the task's rows, the unit-stride one innermost, and a 3-D
            // space's middle one between them.
            let (a, c) = (order[0], order[dims - 1]);
            let middle = (dims == 3).then(|| order[1]);
            let (ia, ic, sa, sc, lc) = (idx[a], idx[c], &starts[a], &starts[c], len_of(c));
            let row = match middle {
                Some(b) => {
                    let lb = len_of(b);
                    quote!((__offload_r * #lb + __offload_p))
                }
                None => quote!(__offload_r),
            };
            let mark = mark(quote!(#row * #lc + __offload_c));
            let pre = quote! {
                #mark
                let #ic: usize = #sc + __offload_c;
            };
            let inner = inner(ic, quote!(#sc), "__offload_c", quote!(#lc), &pre);
            let (inner, per_row) = match middle {
                Some(b) => {
                    let (ib, sb, lb) = (idx[b], &starts[b], len_of(b));
                    let nest = quote! {
                        for __offload_p in 0..#lb {
                            let #ib: usize = #sb + __offload_p;
                            #inner
                        }
                    };
                    (nest, quote!(#lb * #lc))
                }
                None => (inner, quote!(#lc)),
            };
            let loops = quote! {
                for __offload_r in __offload_first..__offload_end {
                    let #ia: usize = #sa + __offload_r;
                    #inner
                }
            };
            (quote!(__offload_l0), per_row, loops)
        }
    };
    let scratch = rows.filter(|r| r.deferred).map(|_| lanes.declare_scratch());
    (units, per_unit, quote!(#declare #scratch #loops #fold))
}
