//! A teams kernel's host twin as loops, not threads (POCL's work-item loops): a team runs
//! on one pool thread, and its threads become a loop over each stretch of the body between
//! barriers. Running every thread to the barrier before any goes on is what a barrier
//! guarantees, so no OS thread and no wake-up is needed.
//!
//! The body is cut at each statement that holds a barrier. Such a statement (a `for` of
//! uniform bounds, a block) is run once by the team, its bounds read for thread 0 (the
//! kernel language makes them the same for every thread), and its body is cut in turn.
//! A `let` whose variable is read after its stretch lives in an array with an element per
//! thread ([`RustEmitter::per_thread`]), unless every later stretch that uses it first
//! assigns it (a block-stride loop's counter, `c = thread; while c < n { .. }`): no value
//! crosses a barrier, and it is one local of the team's code that each thread's turn sets
//! anew ([`RustEmitter::declared_outside`]). Every other local stays a plain local of the
//! thread loop, where rustc optimises it as in any loop.
//!
//! A stretch that is only `if thread < E { .. }` or `if thread == E { .. }` (after lets the
//! same for every thread), with `E` the same for every thread, loops over just the threads
//! that take it: a tree reduction's steps then cost their active threads, not the team.

use std::cell::RefCell;
use std::collections::HashSet;

use proc_macro2::{Ident, TokenStream};
use quote::quote;

use crate::emit_host::{per_thread_array, RustEmitter};
use crate::ir::{visit_stmt_vars, visit_vars, Body, Expr, ExprKind, Role, Stmt, TeamOp, VarId};
use crate::signature::Threads;

/// The independent partial combinations of a team reduction on host devices (a vector of
/// 16 f32 on AVX-512).
const TEAM_LANES: usize = 16;

/// The team-level code of a teams kernel's twin.
pub struct TeamsTwin<'a> {
    emit: RustEmitter<'a>,
    /// The threads per team: the host twin's `__offload_ts` (the count, or the launch's).
    threads: TokenStream,
    /// The most threads per team (the per-thread arrays' length), as a `usize` constant
    /// expression of the kernel's module.
    max: TokenStream,
    /// Which expressions are the team size (a block-stride loop's step).
    size: TeamSize<'a>,
    /// The kernel's thread index.
    thread: VarId,
    /// Locals the same for every thread of the team where the code being emitted reads
    /// them: the loop variables of the team-level loops around it.
    uniform: RefCell<HashSet<VarId>>,
    /// Immutable locals whose value is the same for every thread and reads no memory:
    /// computed once, before their stretch's thread loop.
    hoisted: HashSet<VarId>,
    /// What each thread runs first in each stretch (the thread's index, its reduction
    /// partials, the checked twin's item).
    enter: TokenStream,
    /// The block-stride loops (by address) whose stretches run in rounds ([`Strided`]).
    strided: HashSet<*const Stmt>,
    /// The views whose runs a round may take as windows (`fast_rows::round_windows`): the
    /// twin's fast path's plain reads and each team's own rows; none on its shared path.
    windows: Vec<VarId>,
}

/// What tells the team size in a kernel's body: a literal equal to a literal `teams`, or
/// the constant a `teams = CONST` names.
#[derive(Clone, Copy)]
struct TeamSize<'a> {
    body: &'a Body,
    threads: &'a Threads,
}

impl TeamSize<'_> {
    fn is(&self, e: &Expr) -> bool {
        match (self.threads, &e.kind) {
            (_, ExprKind::TeamSize) => true,
            (Threads::Lit(t), ExprKind::Lit(crate::ir::Lit::Int(n))) => n.parse() == Ok(*t as usize),
            (Threads::Const(syn::Expr::Path(p)), ExprKind::Var(v)) => {
                matches!(&self.body.vars[*v].role, Role::Const(c) if *c == p.path)
            }
            _ => false,
        }
    }
}

/// A run of statements without barriers, or one statement the team runs once.
enum Segment<'s> {
    Stretch(Vec<&'s Stmt>),
    Team(&'s Stmt),
}

impl<'a> TeamsTwin<'a> {
    /// The twin of `body` for teams of `threads`, each thread running `enter` at the start
    /// of each stretch.
    pub fn new(
        body: &'a Body,
        threads: &'a Threads,
        kernel: &Ident,
        thread: VarId,
        enter: TokenStream,
    ) -> Self {
        let size = TeamSize { body, threads };
        let mut emit = RustEmitter::new(body, true);
        let mut hoisted = HashSet::new();
        find_hoisted(body, &body.stmts, &mut HashSet::new(), &mut hoisted);
        let (mut per_thread, mut outside) = (HashSet::new(), HashSet::new());
        find_per_thread(&body.stmts, &mut per_thread, &mut outside);
        per_thread.retain(|v| !hoisted.contains(v));
        outside.retain(|v| !hoisted.contains(v));
        // Stretches that run in rounds: the locals their rounds carry live per thread.
        let mut strided = HashSet::new();
        let find = StridedSearch { body, thread, size, hoisted: &hoisted, per_thread: &per_thread };
        let mut carried = HashSet::new();
        find.walk(&body.stmts, &mut hoisted.clone(), &mut strided, &mut carried);
        per_thread.extend(carried);
        // A carried local lives in its array everywhere, its `let` included.
        outside.retain(|v| !per_thread.contains(v));
        emit.per_thread = per_thread;
        emit.declared_outside = outside;
        let (threads, max) = (quote!(__offload_ts), threads.rust(kernel));
        Self {
            emit,
            threads,
            max,
            size,
            thread,
            uniform: RefCell::new(hoisted.clone()),
            hoisted,
            enter,
            strided,
            windows: Vec::new(),
        }
    }

    /// The same twin, its rounds taking windows of `views`.
    pub fn with_windows(mut self, views: &[VarId]) -> Self {
        self.windows = views.to_vec();
        self
    }

    /// How many stretches run in rounds (for the twin's description).
    pub fn rounds_count(&self) -> usize {
        self.strided.len()
    }

    /// The arrays of the locals that live across a barrier, one element per thread: made
    /// once per pool task, filled anew each time their stretch runs.
    pub fn arrays(&self) -> TokenStream {
        let mut vars: Vec<VarId> = self.emit.per_thread.iter().copied().collect();
        vars.sort_unstable();
        let t = &self.max;
        let decls = vars.iter().map(|&v| {
            let a = per_thread_array(v);
            let ty = &self.emit.body.vars[v].ty;
            // A scalar's array has the team's length: indexing it with a thread number
            // below that needs no check.
            match (ty.scalar(), self.emit.ty(ty)) {
                (Some(_), Some(ty)) => {
                    quote!(let mut #a: [#ty; #t] = [<#ty as ::core::default::Default>::default(); #t];)
                }
                (None, Some(ty)) => {
                    quote!(let mut #a: ::std::vec::Vec<#ty> = ::std::vec::Vec::with_capacity(#t);)
                }
                (_, None) => quote!(let mut #a = ::std::vec::Vec::with_capacity(#t);),
            }
        });
        quote!(#(#decls)*)
    }

    /// One team's code (its index variables bound by the caller).
    pub fn team(&self) -> TokenStream {
        self.list(&self.emit.body.stmts)
    }

    fn list(&self, stmts: &[Stmt]) -> TokenStream {
        let parts = segments(stmts).into_iter().map(|s| match s {
            Segment::Stretch(stmts) => self.stretch(&stmts),
            Segment::Team(s) => self.team_stmt(s),
        });
        quote!(#(#parts)*)
    }

    fn stretch(&self, stmts: &[&Stmt]) -> TokenStream {
        let is_hoisted = |s: &Stmt| matches!(s, Stmt::Let { var, .. } if self.hoisted.contains(var));
        let hoisted: Vec<TokenStream> = stmts
            .iter()
            .filter(|s| is_hoisted(s))
            .map(|s| self.emit.stmts(std::slice::from_ref(*s)))
            .collect();
        let rest: Vec<&Stmt> = stmts.iter().filter(|s| !is_hoisted(s)).copied().collect();
        let looped = self.thread_loop(&rest);
        quote!(#(#hoisted)* #looped)
    }

    fn thread_loop(&self, stmts: &[&Stmt]) -> TokenStream {
        if stmts.is_empty() {
            return quote!();
        }
        if let Some(guarded) = self.guarded(stmts) {
            return guarded;
        }
        if let Some(rounds) = self.rounds(stmts) {
            return rounds;
        }
        let clears = self.clears(stmts);
        let declared = self.declared(stmts);
        let body = stmts.iter().map(|s| self.emit.stmts(std::slice::from_ref(*s)));
        let (t, enter) = (&self.threads, &self.enter);
        let shadows = self.team_slices(stmts.iter().copied(), t);
        quote! {
            #(#clears)*
            #(#declared)*
            {
                #shadows
                for __offload_thread in 0..#t {
                    #enter
                    #(#body)*
                }
            }
        }
    }

    /// The per-thread scalars `stmts` name, as slices of their first `len` threads: indexed
    /// by a thread below `len`, they need no check, and loops over them vectorise.
    fn team_slices<'s>(&self, stmts: impl IntoIterator<Item = &'s Stmt>, len: &TokenStream) -> TokenStream {
        let arrays = self.per_thread_scalars(|named| {
            for s in stmts {
                visit_stmt_vars(std::slice::from_ref(s), &mut |v| named(v));
            }
        });
        quote!(#(let #arrays = &mut #arrays[..#len];)*)
    }

    /// The arrays of the per-thread scalars that `visit` names, each once, in a fixed order.
    fn per_thread_scalars(&self, visit: impl FnOnce(&mut dyn FnMut(VarId))) -> Vec<Ident> {
        let mut named = HashSet::new();
        visit(&mut |v| {
            named.insert(v);
        });
        let mut vars: Vec<VarId> = named
            .into_iter()
            .filter(|v| self.emit.per_thread.contains(v) && self.emit.body.vars[*v].ty.scalar().is_some())
            .collect();
        vars.sort_unstable();
        vars.into_iter().map(per_thread_array).collect()
    }

    /// The declarations, for the team's code, of the locals `stmts` declare that each later
    /// stretch assigns first.
    fn declared(&self, stmts: &[&Stmt]) -> Vec<TokenStream> {
        stmts
            .iter()
            .filter_map(|s| match s {
                Stmt::Let { var, .. } if self.emit.declared_outside.contains(var) => {
                    let id = &self.emit.body.vars[*var].rust;
                    Some(match self.emit.ty(&self.emit.body.vars[*var].ty) {
                        Some(t) => quote!(let mut #id: #t;),
                        None => quote!(let mut #id;),
                    })
                }
                _ => None,
            })
            .collect()
    }

    /// The emptying of the pushed per-thread arrays (not a scalar's, which every thread's
    /// turn overwrites) of the locals `stmts` declare, before their stretch runs again.
    fn clears(&self, stmts: &[&Stmt]) -> Vec<TokenStream> {
        stmts
            .iter()
            .filter_map(|s| match s {
                Stmt::Let { var, .. }
                    if self.emit.per_thread.contains(var)
                        && self.emit.body.vars[*var].ty.scalar().is_none() =>
                {
                    let a = per_thread_array(*var);
                    Some(quote!(#a.clear();))
                }
                _ => None,
            })
            .collect()
    }

    /// A stretch with a block-stride loop ([`Strided`]) run in rounds: every thread's
    /// statements before the loop, then the loop one round at a time (in round `k`, the
    /// threads whose counter `thread + k * T` is below the bound, in order: consecutive
    /// elements, a loop rustc may vectorise), then every thread's statements after it. Each
    /// thread does what it did, in its order; only the interleaving of the threads, which
    /// nothing between two barriers may rely on, differs.
    fn rounds(&self, stmts: &[&Stmt]) -> Option<TokenStream> {
        let w = stmts.iter().find(|s| self.strided.contains(&(**s as *const Stmt)))?;
        let f = strided_form(stmts, self.thread, self.size)?;
        debug_assert!(std::ptr::eq(*w, f.looped));
        let clears = self.clears(stmts);
        let declared = self.declared(stmts);
        let (t, enter) = (&self.threads, &self.enter);
        let each = |part: &[&Stmt]| {
            if part.is_empty() {
                return quote!();
            }
            let body = part.iter().map(|s| self.emit.stmts(std::slice::from_ref(*s)));
            let shadows = self.team_slices(part.iter().copied(), t);
            quote! {
                {
                    #shadows
                    for __offload_thread in 0..#t {
                        #enter
                        #(#body)*
                    }
                }
            }
        };
        let (before, after) = (each(&f.before), each(&f.after));
        let counter = &self.emit.body.vars[f.counter].rust;
        let bound = self.uniform(f.bound);
        let threads = |step: TokenStream| {
            quote! {
                for __offload_thread in 0..__offload_cnt {
                    #enter
                    let #counter: usize = __offload_r + __offload_thread;
                    #step
                }
            }
        };
        let looped = threads(self.emit.stmts(f.step_body));
        let looped = match self.round_windows(&f) {
            Some((makes, fast)) => {
                let names = (0..makes.len()).map(|w| quote::format_ident!("__offload_w{}", w));
                let fast = threads(fast);
                quote! {
                    match (#(#makes,)*) {
                        (#(::core::option::Option::Some(#names),)*) => #fast,
                        _ => #looped,
                    }
                }
            }
            None => looped,
        };
        let shadows = self.team_slices(f.step_body, &quote!(__offload_cnt));
        Some(quote! {
            #(#clears)*
            #(#declared)*
            #before
            {
                let __offload_n: usize = #bound;
                let mut __offload_r: usize = 0;
                while __offload_r < __offload_n {
                    let __offload_cnt: usize = ::core::cmp::min(#t, __offload_n - __offload_r);
                    #shadows
                    #looped
                    __offload_r = match __offload_r.checked_add(#t) {
                        Some(r) => r,
                        None => break,
                    };
                }
            }
            #after
        })
    }

    /// A round's windows ([`crate::fast_rows::round_windows`]): the code making each (an
    /// `Option` of it), and the step's body reading them.
    fn round_windows(&self, f: &Strided<'_>) -> Option<(Vec<TokenStream>, TokenStream)> {
        if self.windows.is_empty() || self.emit.per_thread.contains(&f.counter) {
            return None;
        }
        let (windows, body) = crate::fast_rows::round_windows(
            self.emit.body,
            f.step_body,
            f.counter,
            self.thread,
            &self.windows,
        )?;
        let counter = &self.emit.body.vars[f.counter].rust;
        let makes = windows
            .iter()
            .map(|(view, start)| {
                let v = &self.emit.body.vars[*view].rust;
                let start = self.emit.expr(start);
                quote!(#v.window({ let #counter: usize = __offload_r; #start }, __offload_cnt))
            })
            .collect();
        let mut emit = RustEmitter::new(&body, true);
        emit.per_thread = self.emit.per_thread.clone();
        emit.declared_outside = self.emit.declared_outside.clone();
        emit.local_reductions = self.emit.local_reductions;
        Some((makes, emit.stmts(&body.stmts)))
    }

    /// A stretch of uniform lets then `if thread < E` / `if thread == E` (no `else`): the
    /// lets run once, and the loop covers only the threads that take the branch.
    fn guarded(&self, stmts: &[&Stmt]) -> Option<TokenStream> {
        let (Stmt::If { cond, then, els: None }, lets) = stmts.split_last()? else { return None };
        let mut uniform_lets = Vec::new();
        for s in lets {
            let Stmt::Let { var, init } = s else { return None };
            let v = &self.emit.body.vars[*var];
            if v.mutable || self.emit.per_thread.contains(var) || !self.is_uniform(init, &uniform_lets) {
                return None;
            }
            uniform_lets.push(*var);
        }
        let ExprKind::Binary(op, a, b) = &cond.kind else { return None };
        let is_thread = |e: &Expr| matches!(e.kind, ExprKind::Var(v) if v == self.thread);
        use syn::BinOp;
        let (bound, lt) = match op {
            BinOp::Lt(_) if is_thread(a) => (b, true),
            BinOp::Gt(_) if is_thread(b) => (a, true),
            BinOp::Eq(_) if is_thread(a) => (b, false),
            BinOp::Eq(_) if is_thread(b) => (a, false),
            _ => return None,
        };
        if !self.is_uniform(bound, &uniform_lets) {
            return None;
        }
        let lets: Vec<TokenStream> = lets.iter().map(|s| self.emit.stmts(std::slice::from_ref(*s))).collect();
        let (e, t, enter, body) = (self.emit.expr(bound), &self.threads, &self.enter, self.emit.stmts(then));
        let range = if lt {
            quote!(0..::core::cmp::min(#t, #e))
        } else {
            quote!(({ let __offload_e: usize = #e; __offload_e..if __offload_e < #t { __offload_e + 1 } else { __offload_e } }))
        };
        let shadows = self.team_slices(then, t);
        Some(quote! {
            {
                #(#lets)*
                #shadows
                for __offload_thread in #range {
                    #enter
                    #body
                }
            }
        })
    }

    /// Whether `e` is the same for every thread: it reads only parameters, constants, the
    /// team's index, the team-level loops' variables and `lets` (themselves so).
    fn is_uniform(&self, e: &Expr, lets: &[VarId]) -> bool {
        same_for_every_thread(self.emit.body, e, Memory { params: true, still: &|_| false }, |v| {
            lets.contains(&v) || self.uniform.borrow().contains(&v)
        })
    }

    /// A value the team reads once: the kernel language makes it the same for every
    /// thread, so thread 0's locals give it.
    fn uniform(&self, e: &crate::ir::Expr) -> TokenStream {
        let e = self.emit.expr(e);
        quote!(({ let __offload_thread: usize = 0; #e }))
    }

    fn team_stmt(&self, s: &Stmt) -> TokenStream {
        match s {
            // Every thread has run the stretch before it: that is the barrier.
            Stmt::Barrier => quote!(),
            Stmt::Break => quote!(break;),
            Stmt::Continue => quote!(continue;),
            Stmt::Block(b) => {
                let b = self.list(b);
                quote!({ #b })
            }
            Stmt::For { var, start, end, inclusive, step, order, body, .. } => {
                let id = &self.emit.body.vars[*var].rust;
                let (a, b) = (self.uniform(start), self.uniform(end));
                let step = step.as_ref().map(|s| self.uniform(s));
                self.uniform.borrow_mut().insert(*var);
                let body = self.list(body);
                let range = crate::emit_host::walk(a, b, *inclusive, step, *order);
                quote!(for #id in #range { #body })
            }
            Stmt::If { cond, then, els } => {
                let c = self.uniform(cond);
                let t = self.list(then);
                let e = self.list(els.as_deref().unwrap_or_default());
                quote!(if #c { #t } else { #e })
            }
            Stmt::While { cond, body } => {
                let c = self.uniform(cond);
                let b = self.list(body);
                quote!(while #c { #b })
            }
            Stmt::Loop(b) => {
                let b = self.list(b);
                quote!(loop { #b })
            }
            // A team reduction: every thread's value combined once for the team, thread `t`
            // into lane `t % TEAM_LANES` in thread order, then the lanes in order (each
            // lane's chain independent, so rustc vectorises them); every thread then reads
            // the one result.
            Stmt::Let { var, init: Expr { kind: ExprKind::TeamReduce(op, value), ty, .. } } => {
                let id = &self.emit.body.vars[*var].rust;
                let ty = self.emit.ty(ty);
                let r = quote!(::offload::__private::Reducible);
                let (identity, combine) = match op {
                    TeamOp::Add => (quote!(<#ty as #r>::ZERO), quote!(<#ty as #r>::add)),
                    TeamOp::Mul => (quote!(<#ty as #r>::ONE), quote!(<#ty as #r>::mul)),
                    TeamOp::Min => (quote!(<#ty as #r>::MIN_IDENTITY), quote!(<#ty as #r>::min)),
                    TeamOp::Max => (quote!(<#ty as #r>::MAX_IDENTITY), quote!(<#ty as #r>::max)),
                };
                let (v, t, enter) = (self.emit.expr(value), &self.threads, &self.enter);
                self.uniform.borrow_mut().insert(*var);
                let lanes = TEAM_LANES;
                // The per-thread scalars read, as slices of the team's threads.
                let arrays = self.per_thread_scalars(|named| visit_vars(value, &mut |v| named(v)));
                let per_thread = arrays.iter().map(|a| quote!(let #a = &#a[..#t];));
                quote! {
                    let #id: #ty = {
                        #(#per_thread)*
                        let mut __offload_lanes: [#ty; #lanes] = [#identity; #lanes];
                        let mut __offload_first: usize = 0;
                        while __offload_first < #t {
                            let __offload_cnt: usize = ::core::cmp::min(#lanes, #t - __offload_first);
                            for __offload_lane in 0..__offload_cnt {
                                let __offload_thread: usize = __offload_first + __offload_lane;
                                #enter
                                __offload_lanes[__offload_lane] = #combine(__offload_lanes[__offload_lane], #v);
                            }
                            __offload_first += #lanes;
                        }
                        let mut __offload_acc: #ty = #identity;
                        for __offload_lane in __offload_lanes {
                            __offload_acc = #combine(__offload_acc, __offload_lane);
                        }
                        __offload_acc
                    };
                }
            }
            // Nothing else holds a barrier or leaves a loop.
            other => self.emit.stmts(std::slice::from_ref(other)),
        }
    }
}

/// A stretch whose threads each walk a block-stride loop, as a CUDA block strides over a
/// row: `before`; `c = thread` (or `let mut c = thread`); `while c < n { body; c += T }`
/// with `T` the team's size and `n` the same for every thread; `after`. The body does not
/// assign `c`, leave the loop or end the item, and nothing else in the stretch names `c`
/// or holds a loop.
struct Strided<'s> {
    before: Vec<&'s Stmt>,
    after: Vec<&'s Stmt>,
    /// The `while` statement.
    looped: &'s Stmt,
    counter: VarId,
    bound: &'s Expr,
    /// The loop's body without its step.
    step_body: &'s [Stmt],
}

/// The block-stride form of stretch `stmts` (hoisted lets left out), if it has it; `n`'s
/// uniformity is left to the caller.
fn strided_form<'s>(stmts: &[&'s Stmt], thread: VarId, size: TeamSize<'_>) -> Option<Strided<'s>> {
    use syn::BinOp;
    let at = stmts.iter().position(|s| matches!(s, Stmt::While { .. }))?;
    let (Stmt::While { cond, body }, Some(set)) = (stmts[at], at.checked_sub(1).map(|k| stmts[k])) else {
        return None;
    };
    let is_var = |e: &Expr, v: VarId| matches!(e.kind, ExprKind::Var(x) if x == v);
    let counter = match set {
        Stmt::Let { var, init } if is_var(init, thread) => *var,
        Stmt::Assign { place: crate::ir::Place::Var(var), op: None, value, .. } if is_var(value, thread) => {
            *var
        }
        _ => return None,
    };
    let ExprKind::Binary(BinOp::Lt(_), c, bound) = &cond.kind else { return None };
    let is_team = |e: &Expr| size.is(e);
    let (step, step_body) = body.split_last()?;
    let steps = match step {
        Stmt::Assign { place: crate::ir::Place::Var(v), op: Some(BinOp::AddAssign(_)), value, .. } => {
            *v == counter && is_team(value)
        }
        Stmt::Assign { place: crate::ir::Place::Var(v), op: None, value, .. } => {
            *v == counter
                && matches!(&value.kind, ExprKind::Binary(BinOp::Add(_), a, b) if is_var(a, counter) && is_team(b))
        }
        _ => false,
    };
    if !is_var(c, counter) || !steps {
        return None;
    }
    let (before, after) = (&stmts[..at - 1], &stmts[at + 1..]);
    let names = |s: &Stmt, v: VarId| {
        let mut found = false;
        visit_stmt_vars(std::slice::from_ref(s), &mut |x| found |= x == v);
        found
    };
    let mut bound_reads_counter = false;
    visit_vars(bound, &mut |x| bound_reads_counter |= x == counter);
    let simple = |s: &Stmt| !has_loop_or_exit(std::slice::from_ref(s));
    if bound_reads_counter
        || !step_body.iter().all(|s| !assigns(s, counter) && !has_exit(std::slice::from_ref(s)))
        || !before.iter().chain(after).all(|s| simple(s) && !names(s, counter))
    {
        return None;
    }
    Some(Strided {
        before: before.to_vec(),
        after: after.to_vec(),
        looped: stmts[at],
        counter,
        bound,
        step_body,
    })
}

/// Whether `stmts` hold a loop, a `break`, a `continue` or a `return`.
fn has_loop_or_exit(stmts: &[Stmt]) -> bool {
    stmts.iter().any(|s| match s {
        Stmt::For { .. } | Stmt::While { .. } | Stmt::Loop(_) => true,
        Stmt::If { then, els, .. } => {
            has_loop_or_exit(then) || has_loop_or_exit(els.as_deref().unwrap_or_default())
        }
        Stmt::Block(b) => has_loop_or_exit(b),
        s => has_exit(std::slice::from_ref(s)),
    })
}

/// Whether `stmts` hold a `break` or `continue` of a loop around them, or a `return`.
fn has_exit(stmts: &[Stmt]) -> bool {
    stmts.iter().any(|s| match s {
        Stmt::Break | Stmt::Continue | Stmt::Return(..) => true,
        Stmt::If { then, els, .. } => has_exit(then) || has_exit(els.as_deref().unwrap_or_default()),
        Stmt::Block(b) => has_exit(b),
        // A nested loop's own `break` and `continue` stay inside it.
        Stmt::For { body, .. } | Stmt::While { body, .. } | Stmt::Loop(body) => has_return(body),
        _ => false,
    })
}

fn has_return(stmts: &[Stmt]) -> bool {
    stmts.iter().any(|s| match s {
        Stmt::Return(..) => true,
        Stmt::If { then, els, .. } => has_return(then) || has_return(els.as_deref().unwrap_or_default()),
        Stmt::For { body, .. } | Stmt::While { body, .. } | Stmt::Loop(body) | Stmt::Block(body) => {
            has_return(body)
        }
        _ => false,
    })
}

/// Whether `s` assigns variable `v` (anywhere in it).
fn assigns(s: &Stmt, v: VarId) -> bool {
    let any = |b: &[Stmt]| b.iter().any(|s| assigns(s, v));
    match s {
        Stmt::Assign { place: crate::ir::Place::Var(x), .. } => *x == v,
        Stmt::If { then, els, .. } => any(then) || els.as_deref().is_some_and(any),
        Stmt::For { body, .. } | Stmt::While { body, .. } | Stmt::Loop(body) | Stmt::Block(body) => any(body),
        _ => false,
    }
}

/// Adds to `written` every variable `stmts` declare or assign (anywhere in them, a field's
/// root included), and to `lets` those they declare.
fn written_vars<'s>(
    stmts: impl Iterator<Item = &'s Stmt>,
    written: &mut HashSet<VarId>,
    lets: &mut HashSet<VarId>,
) {
    fn root(p: &crate::ir::Place) -> Option<VarId> {
        match p {
            crate::ir::Place::Var(v) => Some(*v),
            crate::ir::Place::Field { base, .. } => root(base),
            crate::ir::Place::Elem { .. } => None,
        }
    }
    for s in stmts {
        match s {
            Stmt::Let { var, .. } => {
                written.insert(*var);
                lets.insert(*var);
            }
            Stmt::Assign { place, .. } => written.extend(root(place)),
            Stmt::If { then, els, .. } => {
                written_vars(then.iter(), written, lets);
                written_vars(els.iter().flatten(), written, lets);
            }
            Stmt::For { var, body, .. } => {
                written.insert(*var);
                lets.insert(*var);
                written_vars(body.iter(), written, lets);
            }
            Stmt::While { body, .. } | Stmt::Loop(body) | Stmt::Block(body) => {
                written_vars(body.iter(), written, lets)
            }
            _ => {}
        }
    }
}

/// The search, before emitting, for the stretches that run in rounds.
struct StridedSearch<'b> {
    body: &'b Body,
    thread: VarId,
    size: TeamSize<'b>,
    hoisted: &'b HashSet<VarId>,
    /// Locals that already live per thread (across barriers).
    per_thread: &'b HashSet<VarId>,
}

impl StridedSearch<'_> {
    /// Records in `loops` the block-stride loops of `stmts` whose stretch runs in rounds,
    /// and in `carried` the locals of their stretches that live from one phase into
    /// another (each then per thread); `uniform` holds the team-level loops' variables.
    fn walk(
        &self,
        stmts: &[Stmt],
        uniform: &mut HashSet<VarId>,
        loops: &mut HashSet<*const Stmt>,
        carried: &mut HashSet<VarId>,
    ) {
        for seg in segments(stmts) {
            match seg {
                Segment::Stretch(stmts) => {
                    let rest: Vec<&Stmt> = stmts
                        .into_iter()
                        .filter(|s| !matches!(s, Stmt::Let { var, .. } if self.hoisted.contains(var)))
                        .collect();
                    let Some(f) = strided_form(&rest, self.thread, self.size) else { continue };
                    let uniform_bound = same_for_every_thread(
                        self.body,
                        f.bound,
                        Memory { params: false, still: &|_| false },
                        |v| uniform.contains(&v) || self.hoisted.contains(&v),
                    );
                    if !uniform_bound || self.per_thread.contains(&f.counter) {
                        continue;
                    }
                    // A local a thread sets before the loop or in it and reads in a later
                    // phase (the loop's next round, or after it) is the thread's own:
                    // other threads run between the phases.
                    let mut later = HashSet::new();
                    for s in f.step_body.iter().chain(f.after.iter().copied()) {
                        visit_stmt_vars(std::slice::from_ref(s), &mut |v| {
                            later.insert(v);
                        });
                    }
                    let mut written = HashSet::new();
                    let (mut inner_lets, mut none) = (HashSet::new(), HashSet::new());
                    written_vars(f.before.iter().copied(), &mut written, &mut none);
                    written_vars(f.step_body.iter(), &mut written, &mut inner_lets);
                    for v in written {
                        let local = matches!(self.body.vars[v].role, Role::Local);
                        if local && v != f.counter && later.contains(&v) && !inner_lets.contains(&v) {
                            carried.insert(v);
                        }
                    }
                    loops.insert(f.looped as *const Stmt);
                }
                Segment::Team(Stmt::For { var, body, .. }) => {
                    uniform.insert(*var);
                    self.walk(body, uniform, loops, carried);
                }
                Segment::Team(Stmt::While { body, .. } | Stmt::Loop(body) | Stmt::Block(body)) => {
                    self.walk(body, uniform, loops, carried)
                }
                Segment::Team(Stmt::If { then, els, .. }) => {
                    self.walk(then, uniform, loops, carried);
                    self.walk(els.as_deref().unwrap_or_default(), uniform, loops, carried);
                }
                Segment::Team(_) => {}
            }
        }
    }
}

/// `stmts` cut into stretches and the statements the team runs once.
fn segments(stmts: &[Stmt]) -> Vec<Segment<'_>> {
    let mut out = Vec::new();
    let mut stretch = Vec::new();
    for s in stmts {
        if team_level(s) {
            if !stretch.is_empty() {
                out.push(Segment::Stretch(std::mem::take(&mut stretch)));
            }
            out.push(Segment::Team(s));
        } else {
            stretch.push(s);
        }
    }
    if !stretch.is_empty() {
        out.push(Segment::Stretch(stretch));
    }
    out
}

/// Whether the team runs `s` once: it holds a barrier, or leaves the loop around it (a
/// `break` inside a thread loop would leave the thread loop instead).
fn team_level(s: &Stmt) -> bool {
    has_barrier(std::slice::from_ref(s)) || leaves_loop(s)
}

fn has_barrier(stmts: &[Stmt]) -> bool {
    stmts.iter().any(|s| match s {
        // A team reduction waits for the team as a barrier does.
        Stmt::Barrier | Stmt::Let { init: Expr { kind: ExprKind::TeamReduce(..), .. }, .. } => true,
        Stmt::If { then, els, .. } => has_barrier(then) || has_barrier(els.as_deref().unwrap_or_default()),
        Stmt::For { body, .. } | Stmt::While { body, .. } | Stmt::Loop(body) | Stmt::Block(body) => {
            has_barrier(body)
        }
        _ => false,
    })
}

/// Whether `s` holds a `break` or `continue` of the loop around it.
fn leaves_loop(s: &Stmt) -> bool {
    match s {
        Stmt::Break | Stmt::Continue => true,
        Stmt::Block(b) => b.iter().any(leaves_loop),
        Stmt::If { then, els, .. } => then.iter().chain(els.iter().flatten()).any(leaves_loop),
        _ => false,
    }
}

/// Adds to `out` the locals of `stmts` (and of the team-level statements in it) that are
/// read or stored after the stretch that declares them, and to `outside` those of them
/// that every later stretch using them assigns first (no value crosses a barrier).
fn find_per_thread(stmts: &[Stmt], out: &mut HashSet<VarId>, outside: &mut HashSet<VarId>) {
    let segs = segments(stmts);
    for (k, seg) in segs.iter().enumerate() {
        match seg {
            Segment::Stretch(stmts) => {
                let lets: HashSet<VarId> = stmts
                    .iter()
                    .filter_map(|s| match s {
                        Stmt::Let { var, .. } => Some(*var),
                        _ => None,
                    })
                    .collect();
                if lets.is_empty() {
                    continue;
                }
                let mut later = HashSet::new();
                for after in &segs[k + 1..] {
                    match after {
                        Segment::Stretch(s) => s.iter().for_each(|s| {
                            visit_stmt_vars(std::slice::from_ref(*s), &mut |v| {
                                later.insert(v);
                            })
                        }),
                        Segment::Team(s) => visit_stmt_vars(std::slice::from_ref(*s), &mut |v| {
                            later.insert(v);
                        }),
                    }
                }
                for &v in lets.intersection(&later) {
                    if assigned_first(v, &segs[k + 1..]) {
                        outside.insert(v);
                    } else {
                        out.insert(v);
                    }
                }
            }
            Segment::Team(s) => match s {
                Stmt::For { body, .. } | Stmt::While { body, .. } | Stmt::Loop(body) | Stmt::Block(body) => {
                    find_per_thread(body, out, outside)
                }
                Stmt::If { then, els, .. } => {
                    find_per_thread(then, out, outside);
                    find_per_thread(els.as_deref().unwrap_or_default(), out, outside);
                }
                _ => {}
            },
        }
    }
}

/// What a value [`same_for_every_thread`] may read besides values: parameters' elements
/// (`params`), and elements of the team-local arrays `still` accepts (ones no thread
/// stores to where the value is read).
struct Memory<'f> {
    params: bool,
    still: &'f dyn Fn(VarId) -> bool,
}

/// Whether `e` is the same for every thread of a team: it reads only parameters (their
/// values, lengths and elements as `memory` allows), team-local arrays' elements as
/// `memory` allows, constants, the team's index and locals `uniform_local` accepts, and
/// calls no device function (one may store through a view).
fn same_for_every_thread(
    body: &Body,
    e: &Expr,
    memory: Memory<'_>,
    uniform_local: impl Fn(VarId) -> bool,
) -> bool {
    let param = |v: VarId| matches!(body.vars[v].role, Role::Param(_));
    let mut ok = true;
    crate::ir::walk_expr(e, &mut |x| {
        ok &= match &x.kind {
            ExprKind::Var(v) => match body.vars[*v].role {
                Role::Param(_) | Role::Const(_) | Role::BodyConst | Role::Index(0) => true,
                Role::Local => uniform_local(*v),
                _ => false,
            },
            ExprKind::Len(v) => param(*v),
            ExprKind::Load { view, .. } => match body.vars[*view].role {
                Role::Param(_) => memory.params,
                Role::TeamLocal(_) => (memory.still)(*view),
                _ => false,
            },
            ExprKind::Call { .. } | ExprKind::Sub { .. } | ExprKind::ViewOf(_) => false,
            _ => true,
        }
    });
    ok
}

/// Adds to `out` the immutable locals declared directly in a stretch of `stmts` (or of
/// its team-level statements) whose value reads only parameters' values and lengths,
/// constants, the team's index, team-level loops' variables and other such locals: the same
/// for every thread, and the same wherever in the stretch it is computed.
fn find_hoisted(body: &Body, stmts: &[Stmt], uniform: &mut HashSet<VarId>, out: &mut HashSet<VarId>) {
    for seg in segments(stmts) {
        match seg {
            Segment::Stretch(stmts) => {
                // Team-local arrays no thread of the stretch stores to (or hands to a device
                // function): what the barrier before it left, the same for every thread.
                let stored = stored_team_locals(body, &stmts);
                let still = |v: VarId| !stored.contains(&v);
                for s in stmts {
                    let Stmt::Let { var, init } = s else { continue };
                    let memory = Memory { params: false, still: &still };
                    let ok = !body.vars[*var].mutable
                        && same_for_every_thread(body, init, memory, |v| {
                            uniform.contains(&v) || out.contains(&v)
                        });
                    if ok {
                        out.insert(*var);
                    }
                }
            }
            Segment::Team(Stmt::For { var, body: b, .. }) => {
                uniform.insert(*var);
                find_hoisted(body, b, uniform, out);
            }
            Segment::Team(Stmt::While { body: b, .. } | Stmt::Loop(b) | Stmt::Block(b)) => {
                find_hoisted(body, b, uniform, out)
            }
            Segment::Team(Stmt::If { then, els, .. }) => {
                find_hoisted(body, then, uniform, out);
                find_hoisted(body, els.as_deref().unwrap_or_default(), uniform, out);
            }
            Segment::Team(_) => {}
        }
    }
}

/// The team-local arrays `stmts` may store to: assigned elements, and arrays handed whole
/// or as sub-slices to a device function.
fn stored_team_locals(body: &Body, stmts: &[&Stmt]) -> HashSet<VarId> {
    fn place_view(p: &crate::ir::Place) -> Option<VarId> {
        match p {
            crate::ir::Place::Elem { view, .. } => Some(*view),
            crate::ir::Place::Field { base, .. } => place_view(base),
            crate::ir::Place::Var(_) => None,
        }
    }
    fn assigned(stmts: &[Stmt], out: &mut HashSet<VarId>) {
        for s in stmts {
            match s {
                Stmt::Assign { place, .. } => out.extend(place_view(place)),
                Stmt::If { then, els, .. } => {
                    assigned(then, out);
                    assigned(els.as_deref().unwrap_or_default(), out);
                }
                Stmt::For { body, .. } | Stmt::While { body, .. } | Stmt::Loop(body) | Stmt::Block(body) => {
                    assigned(body, out)
                }
                _ => {}
            }
        }
    }
    let mut out = HashSet::new();
    for s in stmts {
        let s = std::slice::from_ref(*s);
        assigned(s, &mut out);
        crate::ir::visit_exprs(s, &mut |x| {
            if let ExprKind::ViewOf(v) | ExprKind::Sub { view: v, .. } = &x.kind {
                out.insert(*v);
            }
        });
    }
    out.retain(|v| matches!(body.vars[*v].role, Role::TeamLocal(_)));
    out
}

/// Whether every stretch of `segs` that uses `v` first assigns it (`v = e`, `e` not
/// reading `v`, as a statement of the stretch itself), and no team-level statement uses it.
fn assigned_first(v: VarId, segs: &[Segment<'_>]) -> bool {
    let uses = |s: &Stmt| {
        let mut found = false;
        visit_stmt_vars(std::slice::from_ref(s), &mut |x| found |= x == v);
        found
    };
    segs.iter().all(|seg| match seg {
        Segment::Team(s) => !uses(s),
        Segment::Stretch(stmts) => match stmts.iter().find(|s| uses(s)) {
            None => true,
            Some(Stmt::Assign { place: crate::ir::Place::Var(x), op: None, value, .. }) => {
                let mut reads = false;
                visit_vars(value, &mut |y| reads |= y == v);
                *x == v && !reads
            }
            Some(_) => false,
        },
    })
}
