//! Which values of a teams kernel are the same for every thread of a team, so that a
//! barrier (or a team reduction) may stand under a condition or loop bound that reads only
//! them: kernel arguments, constants, the team's index, team reductions' results and locals
//! computed only from those, under conditions that are so too. Everything else (the
//! thread's index, a load from memory, a local assigned from either, or assigned under a
//! condition that reads either, or in a loop a thread may leave early) can differ between
//! threads. A fixpoint over the whole body, flow-insensitive: an assignment anywhere counts.

use std::collections::HashMap;

use proc_macro2::Span;

use crate::ir::{Block, Expr, ExprKind, Place, Role, Stmt, Var, VarId};

/// The locals that can differ between a team's threads, each with why.
pub struct ThreadDependent<'a> {
    vars: &'a [Var],
    why: HashMap<VarId, String>,
}

impl<'a> ThreadDependent<'a> {
    /// The analysis of `stmts` over `vars`.
    pub fn of(vars: &'a [Var], stmts: &Block) -> Self {
        let mut t = Self { vars, why: HashMap::new() };
        loop {
            let before = t.why.len();
            t.stmts(stmts, None);
            if t.why.len() == before {
                return t;
            }
        }
    }

    /// Why `e` can differ between threads, if it can: what it reads.
    pub fn reason(&self, e: &Expr) -> Option<String> {
        let mut found = None;
        self.walk(e, &mut found);
        found
    }

    fn walk(&self, e: &Expr, found: &mut Option<String>) {
        if found.is_some() {
            return;
        }
        match &e.kind {
            // The team's combined value is every thread's.
            ExprKind::TeamReduce(..) => {}
            // A view local's length is the view's: it differs as the view does.
            ExprKind::Var(v) | ExprKind::Len(v) | ExprKind::ViewOf(v) => *found = self.var_reason(*v),
            ExprKind::Sub { view, .. } => {
                *found = self.var_reason(*view);
                crate::ir::walk_children(e, &mut |c| self.walk(c, found));
            }
            ExprKind::Load { view, .. } => {
                *found = Some(format!("`{}[..]`, memory another thread may write", self.vars[*view].rust))
            }
            ExprKind::Call { path, args } => {
                // A device function's result depends only on its arguments (and the memory
                // of the views among them).
                if args.iter().any(|a| matches!(a.kind, ExprKind::ViewOf(_) | ExprKind::Sub { .. })) {
                    let name = path.segments.last().map(|s| s.ident.to_string()).unwrap_or_default();
                    *found = Some(format!("`{name}(..)`, which reads memory"));
                } else {
                    args.iter().for_each(|a| self.walk(a, found));
                }
            }
            _ => crate::ir::walk_children(e, &mut |c| self.walk(c, found)),
        }
    }

    fn var_reason(&self, v: VarId) -> Option<String> {
        let name = &self.vars[v].rust;
        match &self.vars[v].role {
            Role::Index(1) => Some(format!("`{name}`, the thread's index")),
            _ => self.why.get(&v).map(|w| format!("`{name}` ({w})")),
        }
    }

    fn taint(&mut self, v: VarId, why: String) {
        self.why.entry(v).or_insert(why);
    }

    /// Walks `stmts` under `ctx`, the reason the control reaching them can differ.
    fn stmts(&mut self, stmts: &[Stmt], ctx: Option<&str>) {
        for s in stmts {
            match s {
                Stmt::Let { var, init } => {
                    let why = match (&init.kind, ctx) {
                        (_, Some(c)) => Some(format!("set under {c}")),
                        (ExprKind::TeamReduce(..), None) => None,
                        (_, None) => self.reason(init).map(|r| format!("set from {r}")),
                    };
                    if let Some(w) = why {
                        self.taint(*var, w);
                    }
                }
                Stmt::Assign { place, value, .. } => {
                    if let Some(v) = root(place) {
                        let why = match ctx {
                            Some(c) => Some(format!("assigned under {c}")),
                            None => self.reason(value).map(|r| format!("assigned from {r}")),
                        };
                        if let Some(w) = why {
                            self.taint(v, w);
                        }
                    }
                }
                Stmt::If { cond, then, els } => {
                    let c = self.control(ctx, cond, "an `if`");
                    self.stmts(then, c.as_deref());
                    self.stmts(els.as_deref().unwrap_or_default(), c.as_deref());
                }
                Stmt::While { cond, body } => {
                    let c = self.control(ctx, cond, "a `while`").or_else(|| self.leaves_early(body));
                    self.stmts(body, c.as_deref());
                }
                Stmt::For { var, start, end, step, body, .. } => {
                    let mut c = ctx.map(str::to_string);
                    for e in [Some(start), Some(end), step.as_ref()].into_iter().flatten() {
                        c = c.or_else(|| self.reason(e).map(|r| format!("a `for` whose bounds read {r}")));
                    }
                    let c = c.or_else(|| self.leaves_early(body));
                    if let Some(w) = &c {
                        self.taint(*var, format!("a loop variable under {w}"));
                    }
                    self.stmts(body, c.as_deref());
                }
                Stmt::Loop(body) => {
                    let c = ctx.map(str::to_string).or_else(|| self.leaves_early(body));
                    self.stmts(body, c.as_deref());
                }
                Stmt::Block(b) => self.stmts(b, ctx),
                Stmt::Reduce { .. }
                | Stmt::Expr(_)
                | Stmt::Break
                | Stmt::Continue
                | Stmt::Return(..)
                | Stmt::Barrier => {}
            }
        }
    }

    /// The reason control under `cond` can differ: the enclosing one, or what `cond` reads.
    fn control(&self, ctx: Option<&str>, cond: &Expr, what: &str) -> Option<String> {
        ctx.map(str::to_string).or_else(|| self.reason(cond).map(|r| format!("{what} that reads {r}")))
    }

    /// Why a loop with body `body` can run a different number of times per thread: a
    /// `break` or `continue` of it under a condition that can differ.
    fn leaves_early(&self, body: &[Stmt]) -> Option<String> {
        fn exits(t: &ThreadDependent<'_>, stmts: &[Stmt], under: Option<String>) -> Option<String> {
            stmts.iter().find_map(|s| match s {
                Stmt::Break | Stmt::Continue => under.clone(),
                Stmt::If { cond, then, els } => {
                    let u = under.clone().or_else(|| t.reason(cond));
                    exits(t, then, u.clone()).or_else(|| exits(t, els.as_deref().unwrap_or_default(), u))
                }
                Stmt::Block(b) => exits(t, b, under.clone()),
                _ => None,
            })
        }
        exits(self, body, None)
            .map(|r| format!("a loop some threads may leave early (a `break` or `continue` under {r})"))
    }
}

/// The local a place stores to, if it is one (a field's root included).
fn root(p: &Place) -> Option<VarId> {
    match p {
        Place::Var(v) => Some(*v),
        Place::Field { base, .. } => root(base),
        Place::Elem { .. } => None,
    }
}

/// A barrier or team reduction of a teams kernel, with the conditions and loop bounds
/// around it.
pub struct SyncSite {
    pub span: Span,
    /// "a barrier", "a team reduction".
    pub what: &'static str,
    pub around: Vec<Expr>,
}

/// Refuses a site that some threads of a team could skip, naming the value that makes it so.
pub fn check(vars: &[Var], stmts: &Block, sites: &[SyncSite]) -> syn::Result<()> {
    if sites.is_empty() {
        return Ok(());
    }
    let dep = ThreadDependent::of(vars, stmts);
    for s in sites {
        if let Some(r) = s.around.iter().find_map(|e| dep.reason(e)) {
            return Err(syn::Error::new(
                s.span,
                format!(
                    "offload::kernel: {} is reached by every thread of the team or by none, but a condition or \
                     loop bound around it reads {r}, which can differ between threads; conditions over kernel \
                     arguments, constants, `team`, team reductions and locals computed only from those are the \
                     same for all",
                    s.what
                ),
            ));
        }
    }
    Ok(())
}
