//! A host twin's fast rows: a copy of the body for the rows of the innermost loop that
//! need less than the whole body, chosen once per row.
//!
//! - **Row-invariant `if`s.** An `if` without `else` whose condition (or its leading `&&`
//!   terms) names only parameters, the outer indices and constants is false for a whole
//!   row or true for it. Jacobi's `if wrap { if iy == 1 { .. } }` and
//!   `if iy == 1 && ix == 1 { .. }` are such: almost every row enters none of them, and
//!   runs a copy of the body without them (no branch per item). The row evaluates the same
//!   terms, in the same order and under the same enclosing conditions, as its items would.
//! - **Windows.** A load `v[e]` of a read-only view that every item makes (at the body's
//!   top level, before anything that may end the item), with `e` the innermost index plus
//!   terms the same for the whole row, reads one run of consecutive elements per row. The
//!   row takes that run as a slice of the row's length, checked once (`ReadView::window`),
//!   and the load becomes `window[counter]`, which rustc need not check: the loop then
//!   looks like a hand-written one (the tuned Jacobi's row slices). A row whose run is not
//!   inside the view runs the body as written, which fails at the item that reads outside.

use proc_macro2::Span;
use syn::BinOp;

use crate::ir::{Body, Expr, ExprKind, Place, Role, Stmt, Type, Var, VarId};

/// The fast rows of a body: when a row takes them, and the body they run.
pub struct FastRows {
    /// Per skipped `if`: the conjunction (enclosing conditions first) under which a row
    /// must run it, and so the body as written.
    pub guards: Vec<Vec<Expr>>,
    /// Per window: the view, and its first element's index (at the row's first item) as
    /// an expression of parameters and indices, the innermost index standing for that item.
    pub windows: Vec<(VarId, Expr)>,
    /// The body of the fast rows: without the skipped `if`s, with window loads, and with a
    /// variable per window (`__offload_w{k}`) and one for the loop counter.
    pub body: Body,
    /// Reduction variables whose one update became a store of the item's value into a
    /// row-long scratch (`__offload_sv_{name}`, a view variable of `body`), folded after the
    /// row: the row's loop then holds no dependency chain. Empty unless every reduction
    /// variable is updated once, unconditionally, by the body's top level.
    pub deferred: Vec<VarId>,
}

/// The fast rows of `body` for a loop whose counter is `counter` (`0..` the row's length)
/// and whose index is `inner`, with `views` the views whose rows may be windows (read
/// only as plain slices, or each task's own elements); `None` when every row needs the
/// whole body.
pub fn fast_rows(body: &Body, inner: VarId, counter: &str, views: &[VarId]) -> Option<FastRows> {
    let mut guards = Vec::new();
    let stmts = prune(body, inner, &body.stmts, &[], &mut guards);
    let (mut fast, windows) =
        with_windows(body, stmts, counter, Names { inner, varying: None }, views, false);
    // The loop counter's variable.
    let count = body.vars.len();
    let deferred = if windows.is_empty() { Vec::new() } else { defer_reductions(&mut fast, count) };
    (!guards.is_empty() || !windows.is_empty()).then_some(FastRows { guards, windows, body: fast, deferred })
}

/// A teams twin's round of a block-stride loop (`emit_teams`), with windows: the step
/// body `step` for the round's threads, its accesses of `views` at the loop's counter
/// (`counter`, which is the round's first plus the thread's place in the round) plus terms
/// the same for the whole team, as loads and stores of a window of the round's length at
/// the thread's place (`__offload_thread`). Accesses in branches take windows too (the
/// round makes every window or none). `thread`: the kernel's thread index, which is not
/// the same for the round. The windows (each view and its start, the counter standing for
/// the round's first), and the step's body; `None` without windows.
pub fn round_windows(
    body: &Body,
    step: &[Stmt],
    counter: VarId,
    thread: VarId,
    views: &[VarId],
) -> Option<(Vec<(VarId, Expr)>, Body)> {
    let names = Names { inner: counter, varying: Some(thread) };
    let (fast, windows) = with_windows(body, step.to_vec(), "__offload_thread", names, views, true);
    (!windows.is_empty()).then_some((windows, fast))
}

/// `stmts` (of `body`) with their accesses of `views` one run per row rewritten as window
/// accesses ([`Windows`]), up to the first statement that may end the item: the body (its
/// variables `body`'s, then the loop counter named `counter`, then the windows) and the
/// windows, each view and its start.
fn with_windows(
    body: &Body,
    mut stmts: Vec<Stmt>,
    counter: &str,
    names: Names,
    views: &[VarId],
    branches: bool,
) -> (Body, Vec<(VarId, Expr)>) {
    let mut fast = body.clone();
    let count = fast.vars.len();
    fast.vars.push(Var {
        rust: syn::Ident::new(counter, Span::call_site()),
        c: String::new(),
        ty: Type::Scalar(crate::ty::Ty::Usize),
        mutable: false,
        role: Role::Local,
        init: None,
    });
    let mut windows = Vec::new();
    let mut w = Windows {
        body,
        names,
        views,
        count,
        windows: &mut windows,
        new_vars: Vec::new(),
        branches,
        in_branch: false,
    };
    for s in &mut stmts {
        if may_end(s) {
            break;
        }
        w.stmt(s);
    }
    let new_vars = std::mem::take(&mut w.new_vars);
    fast.stmts = stmts;
    fast.vars.extend(new_vars);
    (fast, windows)
}

/// Turns each reduction update `*r op= v` of `fast`'s top level into a store of `v` at the
/// loop counter (variable `count`) of a scratch view, when every reduction variable is
/// named exactly once, by such an update before anything that may end the item; returns
/// the reduction variables so deferred (none otherwise).
fn defer_reductions(fast: &mut Body, count: VarId) -> Vec<VarId> {
    let reductions: Vec<VarId> =
        (0..fast.vars.len()).filter(|&v| matches!(fast.vars[v].role, Role::Reduction(_))).collect();
    if reductions.is_empty() {
        return Vec::new();
    }
    let mut uses = vec![0usize; fast.vars.len()];
    crate::ir::visit_stmt_vars(&fast.stmts, &mut |v| uses[v] += 1);
    let mut updates = Vec::new();
    for (k, s) in fast.stmts.iter().enumerate() {
        if may_end(s) {
            break;
        }
        if let Stmt::Reduce { var, .. } = s {
            updates.push((k, *var));
        }
    }
    let once = |r: VarId| uses[r] == 1 && updates.iter().filter(|(_, v)| *v == r).count() == 1;
    if !reductions.iter().all(|&r| once(r)) {
        return Vec::new();
    }
    for (k, r) in updates {
        let scratch = fast.vars.len();
        let var = &fast.vars[r];
        fast.vars.push(Var {
            rust: quote::format_ident!("__offload_sv_{}", var.rust),
            c: String::new(),
            ty: var.ty.clone(),
            mutable: false,
            role: Role::Local,
            init: None,
        });
        let Stmt::Reduce { value, span, .. } = fast.stmts[k].clone() else { continue };
        let index = Expr { kind: ExprKind::Var(count), ty: Type::Scalar(crate::ty::Ty::Usize), span };
        fast.stmts[k] = Stmt::Assign { place: Place::Elem { view: scratch, index }, op: None, value, span };
    }
    reductions
}

/// `stmts` without its skippable `if`s, whose guards go to `out` (`enclosing`: the
/// conditions of the row-invariant `if`s around `stmts`).
fn prune(
    body: &Body,
    inner: VarId,
    stmts: &[Stmt],
    enclosing: &[Expr],
    out: &mut Vec<Vec<Expr>>,
) -> Vec<Stmt> {
    let mut kept = Vec::new();
    // After a statement that may end the item, a row's items might all skip an `if` whose
    // condition the row would then evaluate for nothing (and, in a debug build, might
    // overflow): those are kept.
    let mut ended = false;
    for s in stmts {
        let lead = match s {
            Stmt::If { cond, els: None, .. } if !ended => {
                let terms = conjuncts(cond);
                let lead: Vec<&Expr> =
                    terms.iter().copied().take_while(|t| invariant(body, inner, t)).collect();
                (!lead.is_empty()).then_some((lead, terms.len()))
            }
            _ => None,
        };
        let (Some((lead, terms)), Stmt::If { cond, then, .. }) = (lead, s) else {
            ended |= may_end(s);
            kept.push(s.clone());
            continue;
        };
        let mut guard: Vec<Expr> = enclosing.to_vec();
        guard.extend(lead.iter().map(|t| (*t).clone()));
        // A row-invariant `if` that holds only `if`s: its inner ones may be skippable
        // where it is not (Jacobi's `if wrap { if iy == 1 { .. } }`, `wrap` true).
        if lead.len() == terms && then.iter().all(|t| matches!(t, Stmt::If { .. })) {
            let before = out.len();
            let inner_kept = prune(body, inner, then, &guard, out);
            if out.len() > before {
                let kept_if = Stmt::If { cond: cond.clone(), then: inner_kept, els: None };
                ended |= may_end(&kept_if);
                kept.push(kept_if);
                continue;
            }
        }
        out.push(guard);
    }
    kept
}

/// Whether `s` may end the item (a `return;` anywhere in it).
fn may_end(s: &Stmt) -> bool {
    let any = |b: &[Stmt]| b.iter().any(may_end);
    match s {
        Stmt::Return(..) => true,
        Stmt::If { then, els, .. } => any(then) || els.as_deref().is_some_and(any),
        Stmt::For { body, .. } | Stmt::While { body, .. } | Stmt::Loop(body) | Stmt::Block(body) => any(body),
        _ => false,
    }
}

/// The terms of `a && b && ..`, in order.
fn conjuncts(e: &Expr) -> Vec<&Expr> {
    match &e.kind {
        ExprKind::Binary(BinOp::And(_), a, b) => {
            let mut v = conjuncts(a);
            v.extend(conjuncts(b));
            v
        }
        _ => vec![e],
    }
}

/// Whether variable `v` is a value fixed for the launch or the row: a parameter, an index
/// (`inner` only where `with_inner`) or a constant.
fn fixed(body: &Body, v: VarId) -> bool {
    let var = &body.vars[v];
    !var.mutable
        && matches!(var.role, Role::Param(_) | Role::Index(_) | Role::Const(_) | Role::BodyConst)
        && var.ty.scalar().is_some()
}

/// Whether `e` is the same for every item of a row: made of literals, constants,
/// parameters, and indices other than `inner`, through arithmetic, comparisons, logic and
/// casts (nothing that loads, calls or reads a local).
fn invariant(body: &Body, inner: VarId, e: &Expr) -> bool {
    match &e.kind {
        ExprKind::Lit(_) | ExprKind::Builtin { .. } => true,
        ExprKind::Var(v) => *v != inner && fixed(body, *v),
        ExprKind::Neg(a) | ExprKind::Not(a) | ExprKind::Cast(a, _) => invariant(body, inner, a),
        ExprKind::Binary(_, a, b) => invariant(body, inner, a) && invariant(body, inner, b),
        _ => false,
    }
}

/// What an index may name besides fixed values: the innermost index (or a teams round's
/// counter, a local), and an index that is not fixed for the row (a teams kernel's thread).
#[derive(Clone, Copy)]
struct Names {
    inner: VarId,
    varying: Option<VarId>,
}

/// `e` with every immutable local replaced by its value, if it then names only fixed
/// values and the innermost index (through arithmetic and casts).
fn inlined(body: &Body, e: &Expr, depth: usize, names: Names) -> Option<Expr> {
    let inl = |a: &Expr| inlined(body, a, depth, names).map(Box::new);
    let kind = match &e.kind {
        ExprKind::Lit(_) | ExprKind::Builtin { .. } => return Some(e.clone()),
        ExprKind::Var(v) if *v == names.inner => return Some(e.clone()),
        ExprKind::Var(v) if Some(*v) == names.varying => return None,
        ExprKind::Var(v) => {
            let var = &body.vars[*v];
            return match (&var.role, &var.init) {
                (Role::Local, Some(init)) if !var.mutable && depth < 16 => {
                    inlined(body, init, depth + 1, names)
                }
                _ if fixed(body, *v) => Some(e.clone()),
                _ => None,
            };
        }
        ExprKind::Neg(a) => ExprKind::Neg(inl(a)?),
        ExprKind::Not(a) => ExprKind::Not(inl(a)?),
        ExprKind::Cast(a, t) => ExprKind::Cast(inl(a)?, *t),
        ExprKind::Binary(op, a, b) => ExprKind::Binary(*op, inl(a)?, inl(b)?),
        _ => return None,
    };
    Some(Expr { kind, ty: e.ty.clone(), span: e.span })
}

/// Whether `e` may wrap below zero (a `-` or a negation in it).
fn subtracts(e: &Expr) -> bool {
    let mut found = false;
    crate::ir::walk_expr(e, &mut |x| {
        found |= matches!(x.kind, ExprKind::Neg(_) | ExprKind::Binary(BinOp::Sub(_), ..))
    });
    found
}

/// How often `inner` occurs in `e`, and whether every occurrence is a plain `+` term
/// (through `+`, and the left side of `-`): `e` is then `inner` plus the same for the row.
fn unit_term(e: &Expr, inner: VarId) -> (usize, bool) {
    match &e.kind {
        ExprKind::Var(v) if *v == inner => (1, true),
        ExprKind::Binary(BinOp::Add(_), a, b) => {
            let ((na, ua), (nb, ub)) = (unit_term(a, inner), unit_term(b, inner));
            (na + nb, ua && ub)
        }
        ExprKind::Binary(BinOp::Sub(_), a, b) => {
            let ((na, ua), (nb, _)) = (unit_term(a, inner), unit_term(b, inner));
            (na + nb, ua && nb == 0)
        }
        _ => {
            let mut n = 0;
            crate::ir::walk_expr(e, &mut |x| {
                n += usize::from(matches!(x.kind, ExprKind::Var(v) if v == inner))
            });
            (n, n == 0)
        }
    }
}

/// The rewriting of a fast body's loads into window loads.
struct Windows<'b, 'w> {
    body: &'b Body,
    names: Names,
    views: &'b [VarId],
    /// The loop counter's variable.
    count: VarId,
    windows: &'w mut Vec<(VarId, Expr)>,
    new_vars: Vec<Var>,
    /// Whether accesses that only some items make (in an `if`, a `match` arm, the right
    /// side of `&&`) may take windows too, where their start cannot wrap: a teams round,
    /// whose windows all lie inside the row's run or the round runs as written.
    branches: bool,
    /// Whether the access being rewritten is one that only some items make.
    in_branch: bool,
}

impl Windows<'_, '_> {
    fn stmt(&mut self, s: &mut Stmt) {
        match s {
            Stmt::Let { init, .. } => self.expr(init),
            Stmt::Assign { place, value, .. } => {
                self.expr(value);
                if let Place::Elem { view, index } = place {
                    self.expr(index);
                    if let Some(w) = self.window(*view, index) {
                        *index = self.counter(index);
                        *view = w;
                    }
                }
            }
            Stmt::Reduce { value, .. } => self.expr(value),
            Stmt::Expr(e) => self.expr(e),
            Stmt::If { cond, then, els } if self.branches => {
                self.expr(cond);
                let was = std::mem::replace(&mut self.in_branch, true);
                then.iter_mut().chain(els.iter_mut().flatten()).for_each(|s| self.stmt(s));
                self.in_branch = was;
            }
            Stmt::Block(b) if self.branches => b.iter_mut().for_each(|s| self.stmt(s)),
            // What runs only for some items stays as written.
            _ => {}
        }
    }

    /// Rewrites the loads of `e` that every evaluation of `e` makes (and, with `branches`,
    /// the others).
    fn expr(&mut self, e: &mut Expr) {
        match &mut e.kind {
            ExprKind::Load { view, index } => {
                self.expr(index);
                if let Some(w) = self.window(*view, index) {
                    e.kind = ExprKind::Load { view: w, index: Box::new(self.counter(index)) };
                }
            }
            ExprKind::Field { base, .. } => self.expr(base),
            ExprKind::Neg(a) | ExprKind::Not(a) | ExprKind::Cast(a, _) => self.expr(a),
            // The right side of `&&` and `||` runs only for some items.
            ExprKind::Binary(BinOp::And(_) | BinOp::Or(_), a, b) => {
                self.expr(a);
                self.branch(b);
            }
            ExprKind::Binary(_, a, b) => {
                self.expr(a);
                self.expr(b);
            }
            ExprKind::Select(c, a, b) => {
                self.expr(c);
                self.branch(a);
                self.branch(b);
            }
            ExprKind::Math(_, args) => args.iter_mut().for_each(|a| self.expr(a)),
            _ => {}
        }
    }

    /// Rewrites `e`, evaluated only by some items, where `branches` allows.
    fn branch(&mut self, e: &mut Expr) {
        if self.branches {
            let was = std::mem::replace(&mut self.in_branch, true);
            self.expr(e);
            self.in_branch = was;
        }
    }

    /// The loop counter, where `index` was.
    fn counter(&self, index: &Expr) -> Expr {
        Expr { kind: ExprKind::Var(self.count), ty: index.ty.clone(), span: index.span }
    }

    /// The window variable for `view[index]`, if the access is one run per row.
    fn window(&mut self, view: VarId, index: &Expr) -> Option<VarId> {
        if !self.views.contains(&view) {
            return None;
        }
        let start = inlined(self.body, index, 0, self.names)?;
        // A start that only some items compute must not wrap (a debug build would panic
        // where the body as written does not).
        if unit_term(&start, self.names.inner) != (1, true) || (self.in_branch && subtracts(&start)) {
            return None;
        }
        let id = self.body.vars.len() + 1 + self.new_vars.len();
        self.new_vars.push(Var {
            rust: quote::format_ident!("__offload_w{}", self.windows.len()),
            c: String::new(),
            ty: self.body.vars[view].ty.clone(),
            mutable: false,
            role: Role::Local,
            init: None,
        });
        self.windows.push((view, start));
        Some(id)
    }
}
