//! The access analysis: which index of a 2-D or 3-D kernel walks its views with unit
//! stride, so that index can be the fastest-varying GPU thread dimension (neighbouring
//! threads then read neighbouring elements: coalesced loads), whatever its position in the
//! signature.

use std::collections::HashSet;

use crate::ir::{visit_exprs, Body, Expr, ExprKind, Place, Role, Stmt, VarId};

/// How a kernel's indices are mapped to GPU threads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThreadMap {
    /// The dimensions from the strip dimension (walked `rows` at a time by one thread) to
    /// the fastest-varying one (consecutive threads).
    pub order: Vec<usize>,
    /// What was chosen and why, for the launch trace.
    pub note: String,
}

/// An additive term of an index expression.
enum Term {
    /// Index `k` itself (stride 1).
    Unit(usize),
    /// Anything else, with the indices it involves.
    Other(Vec<usize>),
}

/// Additive terms of `e`, looking through casts, parentheses and immutable locals.
fn terms(e: &Expr, body: &Body, depth: usize, out: &mut Vec<Term>) {
    use syn::BinOp;
    match &e.kind {
        ExprKind::Binary(BinOp::Add(_) | BinOp::Sub(_), a, b) => {
            terms(a, body, depth, out);
            terms(b, body, depth, out);
        }
        ExprKind::Cast(a, _) => terms(a, body, depth, out),
        ExprKind::Var(v) => match (&body.vars[*v].role, &body.vars[*v].init) {
            (Role::Index(k), _) => out.push(Term::Unit(*k)),
            (Role::Local, Some(init)) if depth < 8 => terms(init, body, depth + 1, out),
            _ => out.push(Term::Other(Vec::new())),
        },
        _ => {
            let mut idx = Vec::new();
            involved(e, body, depth, &mut idx);
            out.push(Term::Other(idx));
        }
    }
}

/// The indices expression `e` involves.
fn involved(e: &Expr, body: &Body, depth: usize, out: &mut Vec<usize>) {
    let mut visit = |x: &Expr| involved(x, body, depth, out);
    match &e.kind {
        ExprKind::Var(v) => match (&body.vars[*v].role, &body.vars[*v].init) {
            (Role::Index(k), _) => out.push(*k),
            (Role::Local, Some(init)) if depth < 8 => involved(init, body, depth + 1, out),
            _ => {}
        },
        ExprKind::Load { index, .. } => visit(index),
        ExprKind::Field { base, .. } => visit(base),
        ExprKind::Sub { start, end, .. } => {
            visit(start);
            visit(end);
        }
        ExprKind::Neg(a) | ExprKind::Not(a) | ExprKind::Cast(a, _) => visit(a),
        ExprKind::Binary(_, a, b) => {
            visit(a);
            visit(b);
        }
        ExprKind::Select(c, a, b) => {
            visit(c);
            visit(a);
            visit(b);
        }
        ExprKind::Math(_, args) | ExprKind::Call { args, .. } => args.iter().for_each(visit),
        _ => {}
    }
}

/// The index with unit stride in element index `e`, if exactly one has it and appears in
/// no other term.
fn unit_index(e: &Expr, body: &Body) -> Option<usize> {
    let mut ts = Vec::new();
    terms(e, body, 0, &mut ts);
    let units: Vec<usize> =
        ts.iter().filter_map(|t| if let Term::Unit(k) = t { Some(*k) } else { None }).collect();
    let strided: Vec<usize> =
        ts.iter().flat_map(|t| if let Term::Other(v) = t { v.clone() } else { Vec::new() }).collect();
    let mut candidates: Vec<usize> = units.into_iter().filter(|k| !strided.contains(k)).collect();
    candidates.dedup();
    match candidates.as_slice() {
        [k] => Some(*k),
        _ => None,
    }
}

/// Every element index of `stmts` (loads and stores), in order.
fn element_indices<'a>(stmts: &'a [Stmt], out: &mut Vec<&'a Expr>) {
    fn expr<'a>(e: &'a Expr, out: &mut Vec<&'a Expr>) {
        match &e.kind {
            ExprKind::Load { index, .. } => {
                out.push(index);
                expr(index, out);
            }
            ExprKind::Field { base, .. } => expr(base, out),
            ExprKind::Sub { start, end, .. } => {
                expr(start, out);
                expr(end, out);
            }
            ExprKind::Neg(a) | ExprKind::Not(a) | ExprKind::Cast(a, _) => expr(a, out),
            ExprKind::Binary(_, a, b) => {
                expr(a, out);
                expr(b, out);
            }
            ExprKind::Select(c, a, b) => {
                expr(c, out);
                expr(a, out);
                expr(b, out);
            }
            ExprKind::Math(_, args) | ExprKind::Call { args, .. } => args.iter().for_each(|a| expr(a, out)),
            _ => {}
        }
    }
    fn place<'a>(p: &'a Place, out: &mut Vec<&'a Expr>) {
        match p {
            Place::Var(_) => {}
            Place::Elem { index, .. } => {
                out.push(index);
                expr(index, out);
            }
            Place::Field { base, .. } => place(base, out),
        }
    }
    for s in stmts {
        match s {
            Stmt::Let { init, .. } => expr(init, out),
            Stmt::Assign { place: p, value, .. } => {
                place(p, out);
                expr(value, out);
            }
            Stmt::Reduce { value, .. } | Stmt::Expr(value) => expr(value, out),
            Stmt::Return(v, _) => v.iter().for_each(|v| expr(v, out)),
            Stmt::If { cond, then, els } => {
                expr(cond, out);
                element_indices(then, out);
                if let Some(e) = els {
                    element_indices(e, out);
                }
            }
            Stmt::For { start, end, step, body, .. } => {
                expr(start, out);
                expr(end, out);
                step.iter().for_each(|s| expr(s, out));
                element_indices(body, out);
            }
            Stmt::While { cond, body } => {
                expr(cond, out);
                element_indices(body, out);
            }
            Stmt::Loop(b) | Stmt::Block(b) => element_indices(b, out),
            Stmt::Break | Stmt::Continue | Stmt::Barrier => {}
        }
    }
}

/// The thread mapping of a kernel over `names` (its indices): the index with unit stride
/// in most element accesses is the fastest-varying thread dimension (the last index when
/// none has, or on a tie with it); the others keep their order.
pub fn thread_map(body: &Body, names: &[String]) -> ThreadMap {
    let d = names.len();
    let default: Vec<usize> = (0..d).collect();
    if d == 1 {
        return ThreadMap {
            order: default,
            note: format!("1-D: consecutive threads take consecutive `{}`", names[0]),
        };
    }
    let mut indices = Vec::new();
    element_indices(&body.stmts, &mut indices);
    let mut votes = vec![0usize; d];
    for e in &indices {
        if let Some(k) = unit_index(e, body) {
            votes[k] += 1;
        }
    }
    let best = (0..d).max_by_key(|&k| (votes[k], k == d - 1)).unwrap_or(d - 1);
    let fast = if votes[best] > votes[d - 1] { best } else { d - 1 };
    let mut order: Vec<usize> = (0..d).filter(|&k| k != fast).collect();
    order.push(fast);
    let why = if votes[fast] == 0 {
        "no index has unit stride in an element access: the last index".to_string()
    } else {
        format!("unit stride in {} of {} element accesses", votes[fast], indices.len())
    };
    let note = format!(
        "consecutive threads take consecutive `{}` ({why}); each thread walks a strip of `{}`",
        names[fast], names[order[0]]
    );
    ThreadMap { order, note }
}

/// The views the body uses whole (a sub-slice, or passed to a device function), not only
/// element by element and by length: the host twin keeps those as shared slices.
pub fn whole_view_uses(body: &Body) -> HashSet<VarId> {
    let mut out = HashSet::new();
    visit_exprs(&body.stmts, &mut |e| match &e.kind {
        ExprKind::Sub { view, .. } | ExprKind::ViewOf(view) => {
            out.insert(*view);
        }
        _ => {}
    });
    out
}

/// How a written view is indexed when every access of it (load or store) is at the work
/// item's own element, which no other item touches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OwnIndex {
    /// A 1-D kernel's `v[i]`.
    Linear,
    /// A 2-D kernel's `v[row * width + col]`: `row` the outer index, `col` the unit-stride
    /// one, `width` a `usize` parameter (the twin checks per launch that rows do not
    /// overlap: the launch's columns fit in `width`).
    Rows { width: VarId },
    /// A 1-D kernel's `v[i * width + k]`, `k` the variable of a `for k in 0..width` (a row
    /// of `width` elements per item, as a row-wise softmax writes it).
    Block { width: VarId },
    /// A teams kernel's `v[team * width + c]`, every access inside a `while c < width`
    /// before anything in it assigns `c` (a team's block-stride walk of its row): each team
    /// touches only its own row of `width` elements.
    TeamRows { width: VarId },
}

/// The own-element form of every access of view `view`, if all its accesses have it (and
/// there is at least one); `indices` are the kernel's index variables, `order` its thread
/// map's (outer to unit stride).
pub fn own_index(body: &Body, view: VarId, indices: &[VarId], order: &[usize]) -> Option<OwnIndex> {
    own_index_beside(body, view, indices, order).filter(|(_, rows)| rows.is_empty()).map(|(form, _)| form)
}

/// As [`own_index`], but a 2-D kernel may also store (plain `=`, no load) at
/// `r * width + col` (or `col`, row 0) of its own column `col`, `r` made of `usize`
/// parameters and literals only: those rows are given, for the twin to check per launch
/// that none is a launched row (so no task owns what those stores reach).
pub fn own_index_beside<'b>(
    body: &'b Body,
    view: VarId,
    indices: &[VarId],
    order: &[usize],
) -> Option<(OwnIndex, Vec<Option<&'b Expr>>)> {
    let mut forms = Vec::new();
    visit_exprs(&body.stmts, &mut |e| {
        if let ExprKind::Load { view: v, index } = &e.kind {
            if *v == view {
                forms.push(own_form(body, index, indices, order));
            }
        }
    });
    let mut stores = Vec::new();
    stores_of(&body.stmts, view, &mut stores);
    let mut beside = Vec::new();
    for (index, plain) in &stores {
        match own_form(body, index, indices, order) {
            Some(f) => forms.push(Some(f)),
            None if *plain && indices.len() == 2 => beside.push(*index),
            None => return None,
        }
    }
    let first = (*forms.first()?)?;
    if !forms.iter().all(|f| *f == Some(first)) {
        return None;
    }
    let OwnIndex::Rows { width } = first else {
        return beside.is_empty().then_some((first, Vec::new()));
    };
    let col = indices[order[1]];
    let rows = beside.into_iter().map(|e| other_row(body, e, col, width)).collect::<Option<Vec<_>>>()?;
    Some((first, rows))
}

/// Pairs `(c, width)` known to satisfy `c < width` where the analysis stands.
type Bounds = Vec<(VarId, VarId)>;

/// The [`OwnIndex::TeamRows`] form of every access (load or store) of view `view` in a
/// teams kernel whose team index is `team`, if all have it (and there is one).
pub fn team_rows(body: &Body, view: VarId, team: VarId) -> Option<OwnIndex> {
    let mut widths = Vec::new();
    team_row_accesses(body, &body.stmts, view, team, &[], &mut widths);
    let first = (*widths.first()?)?;
    widths.iter().all(|w| *w == Some(first)).then_some(OwnIndex::TeamRows { width: first })
}

/// Pushes to `out`, for each access of `view` in `stmts`, its row width if it has the
/// team-row form under `facts` (pairs `(c, width)` with `c < width` known to hold).
fn team_row_accesses(
    body: &Body,
    stmts: &[Stmt],
    view: VarId,
    team: VarId,
    facts: &[(VarId, VarId)],
    out: &mut Vec<Option<VarId>>,
) {
    let mut facts = facts.to_vec();
    for s in stmts {
        // Accesses in this statement's own expressions (not in nested statements).
        let mut own_exprs: Vec<&Expr> = Vec::new();
        let mut nested: Vec<(&[Stmt], Bounds)> = Vec::new();
        match s {
            Stmt::Let { init, .. } => own_exprs.push(init),
            Stmt::Reduce { value, .. } | Stmt::Expr(value) | Stmt::Return(Some(value), _) => {
                own_exprs.push(value)
            }
            Stmt::Assign { place, value, .. } => {
                own_exprs.push(value);
                let mut root = place;
                while let Place::Field { base, .. } = root {
                    root = base;
                }
                if let Place::Elem { view: v, index } = root {
                    own_exprs.push(index);
                    if *v == view {
                        out.push(team_row_width(body, index, team, &facts));
                    }
                }
            }
            Stmt::If { cond, then, els } => {
                own_exprs.push(cond);
                nested.push((then, facts.clone()));
                nested.push((els.as_deref().unwrap_or_default(), facts.clone()));
            }
            Stmt::For { start, end, step, body: b, .. } => {
                own_exprs.extend([start, end]);
                own_exprs.extend(step);
                let kept = facts.iter().copied().filter(|(c, _)| !assigns_var(b, *c)).collect();
                nested.push((b, kept));
            }
            Stmt::While { cond, body: b } => {
                // The condition runs again after the body: only what the body keeps holds.
                let mut kept: Bounds = facts.iter().copied().filter(|(c, _)| !assigns_var(b, *c)).collect();
                crate::ir::walk_expr(cond, &mut |x| {
                    if let ExprKind::Load { view: v, index } = &x.kind {
                        if *v == view {
                            out.push(team_row_width(body, index, team, &kept));
                        }
                    }
                });
                if let ExprKind::Binary(syn::BinOp::Lt(_), c, w) = &cond.kind {
                    if let (ExprKind::Var(c), Some(w)) = (&c.kind, width_param(body, w)) {
                        if matches!(body.vars[*c].role, Role::Local) {
                            kept.push((*c, w));
                        }
                    }
                }
                // The fact holds in the body until a statement of it assigns `c`.
                nested.push((b, kept));
            }
            Stmt::Loop(b) | Stmt::Block(b) => {
                let kept = facts.iter().copied().filter(|(c, _)| !assigns_var(b, *c)).collect();
                nested.push((b, kept));
            }
            _ => {}
        }
        for e in own_exprs {
            crate::ir::walk_expr(e, &mut |x| {
                if let ExprKind::Load { view: v, index } = &x.kind {
                    if *v == view {
                        out.push(team_row_width(body, index, team, &facts));
                    }
                }
            });
        }
        for (b, f) in nested {
            team_row_accesses(body, b, view, team, &f, out);
        }
        // A statement that assigns `c` ends what was known of it.
        facts.retain(|(c, _)| !assigns_var(std::slice::from_ref(s), *c));
    }
}

/// The width `w` if `index` is `team * w + c` (in any order; through immutable locals
/// whose values name no mutable variable, so they are what they were wherever read) with
/// `(c, w)` among `facts`, `c` named as itself.
fn team_row_width(body: &Body, index: &Expr, team: VarId, facts: &[(VarId, VarId)]) -> Option<VarId> {
    let ExprKind::Binary(syn::BinOp::Add(_), a, b) = &stable(body, index).kind else { return None };
    [(a, b), (b, a)].into_iter().find_map(|(prod, c)| {
        let ExprKind::Var(c) = c.kind else { return None };
        let w = width_param(body, other_operand(stable(body, prod), is_mul, |x| is_var(body, x, team))?)?;
        facts.contains(&(c, w)).then_some(w)
    })
}

/// The other operand of `e` when it is `a op b` (`op` as `is_op` accepts) and one operand
/// is what `is` accepts: `b` for `a`, `a` for `b`.
fn other_operand(e: &Expr, is_op: fn(&syn::BinOp) -> bool, is: impl Fn(&Expr) -> bool) -> Option<&Expr> {
    let ExprKind::Binary(op, a, b) = &e.kind else { return None };
    if !is_op(op) {
        None
    } else if is(a) {
        Some(b)
    } else if is(b) {
        Some(a)
    } else {
        None
    }
}

fn is_add(op: &syn::BinOp) -> bool {
    matches!(op, syn::BinOp::Add(_))
}

fn is_mul(op: &syn::BinOp) -> bool {
    matches!(op, syn::BinOp::Mul(_))
}

/// `e` with immutable locals replaced by their values where those values name no mutable
/// variable (directly or through other locals).
fn stable<'b>(body: &'b Body, e: &'b Expr) -> &'b Expr {
    fn fixed(body: &Body, e: &Expr, depth: usize) -> bool {
        let mut ok = true;
        crate::ir::walk_expr(e, &mut |x| {
            if let ExprKind::Var(v) = x.kind {
                let var = &body.vars[v];
                ok &= !var.mutable
                    && match (&var.role, &var.init) {
                        (Role::Local, Some(init)) => depth < 8 && fixed(body, init, depth + 1),
                        (Role::Local, None) => false,
                        _ => true,
                    };
            }
        });
        ok
    }
    match &e.kind {
        ExprKind::Var(v) => match (&body.vars[*v].role, &body.vars[*v].init, body.vars[*v].mutable) {
            (Role::Local, Some(init), false) if fixed(body, init, 0) => stable(body, init),
            _ => e,
        },
        _ => e,
    }
}

/// Whether `stmts` assign variable `v` anywhere.
fn assigns_var(stmts: &[Stmt], v: VarId) -> bool {
    stmts.iter().any(|s| match s {
        Stmt::Assign { place: Place::Var(x), .. } => *x == v,
        Stmt::Let { var, .. } => *var == v,
        Stmt::If { then, els, .. } => {
            assigns_var(then, v) || assigns_var(els.as_deref().unwrap_or_default(), v)
        }
        Stmt::For { var, body, .. } => *var == v || assigns_var(body, v),
        Stmt::While { body, .. } | Stmt::Loop(body) | Stmt::Block(body) => assigns_var(body, v),
        _ => false,
    })
}

/// The element index of every store to `view` in `stmts` (through fields), and whether it
/// is a plain `=` (no load of the element).
fn stores_of<'b>(stmts: &'b [Stmt], view: VarId, out: &mut Vec<(&'b Expr, bool)>) {
    for s in stmts {
        match s {
            Stmt::Assign { place, op, .. } => {
                let mut root = place;
                let mut field = false;
                while let Place::Field { base, .. } = root {
                    root = base;
                    field = true;
                }
                if let Place::Elem { view: v, index } = root {
                    if *v == view {
                        out.push((index, op.is_none() && !field));
                    }
                }
            }
            Stmt::If { then, els, .. } => {
                stores_of(then, view, out);
                stores_of(els.as_deref().unwrap_or_default(), view, out);
            }
            Stmt::For { body, .. } | Stmt::While { body, .. } | Stmt::Loop(body) | Stmt::Block(body) => {
                stores_of(body, view, out)
            }
            _ => {}
        }
    }
}

/// The row `r` of a store at `r * width + col` (`None` for `col`: row 0), if `r` is made
/// of parameters and literals only.
fn other_row<'b>(body: &'b Body, index: &'b Expr, col: VarId, width: VarId) -> Option<Option<&'b Expr>> {
    let e = resolved(body, index);
    if is_var(body, e, col) {
        return Some(None);
    }
    let prod = other_operand(e, is_add, |x| is_var(body, x, col))?;
    let r = other_operand(resolved(body, prod), is_mul, |x| is_var(body, x, width))?;
    let mut ok = true;
    crate::ir::walk_expr(r, &mut |x| {
        ok &= match &x.kind {
            ExprKind::Var(v) => matches!(body.vars[*v].role, Role::Param(_)),
            ExprKind::Lit(_) | ExprKind::Binary(..) | ExprKind::Cast(..) => true,
            _ => false,
        }
    });
    ok.then_some(Some(r))
}

/// `e` with immutable locals replaced by their values (and casts looked through).
fn resolved<'b>(body: &'b Body, e: &'b Expr) -> &'b Expr {
    match &e.kind {
        ExprKind::Var(v) => match (&body.vars[*v].role, &body.vars[*v].init, body.vars[*v].mutable) {
            (Role::Local, Some(init), false) => resolved(body, init),
            _ => e,
        },
        _ => e,
    }
}

fn is_var(body: &Body, e: &Expr, v: VarId) -> bool {
    matches!(resolved(body, e).kind, ExprKind::Var(x) if x == v)
}

/// The `width` of a `usize` parameter `w`, if `w` is one.
fn width_param(body: &Body, w: &Expr) -> Option<VarId> {
    match resolved(body, w).kind {
        ExprKind::Var(x)
            if matches!(body.vars[x].role, Role::Param(_))
                && !body.vars[x].mutable
                && body.vars[x].ty.scalar() == Some(crate::ty::Ty::Usize) =>
        {
            Some(x)
        }
        _ => None,
    }
}

/// `Some(width)` when `e` is `i * width + k` (in any order), `k` the variable of a
/// `for k in 0..width`.
fn block_form(body: &Body, e: &Expr, i: VarId) -> Option<OwnIndex> {
    let ExprKind::Binary(syn::BinOp::Add(_), a, b) = &resolved(body, e).kind else { return None };
    [(a, b), (b, a)].into_iter().find_map(|(prod, k)| {
        let width = width_param(body, other_operand(resolved(body, prod), is_mul, |x| is_var(body, x, i))?)?;
        let ExprKind::Var(k) = resolved(body, k).kind else { return None };
        (loop_range(&body.stmts, k)? == width).then_some(OwnIndex::Block { width })
    })
}

/// The parameter `w` of loop `for k in 0..w` (exclusive), if `k` is such a loop's variable.
fn loop_range(stmts: &[Stmt], k: VarId) -> Option<VarId> {
    stmts.iter().find_map(|s| match s {
        Stmt::For { var, start, end, inclusive: false, .. }
            if *var == k && matches!(&start.kind, ExprKind::Lit(crate::ir::Lit::Int(z)) if z == "0") =>
        {
            match end.kind {
                ExprKind::Var(w) => Some(w),
                _ => None,
            }
        }
        Stmt::For { body, .. } | Stmt::While { body, .. } | Stmt::Loop(body) | Stmt::Block(body) => {
            loop_range(body, k)
        }
        Stmt::If { then, els, .. } => {
            loop_range(then, k).or_else(|| loop_range(els.as_deref().unwrap_or_default(), k))
        }
        _ => None,
    })
}

fn own_form(body: &Body, index: &Expr, indices: &[VarId], order: &[usize]) -> Option<OwnIndex> {
    match indices.len() {
        1 if is_var(body, index, indices[0]) => Some(OwnIndex::Linear),
        1 => block_form(body, index, indices[0]),
        2 => {
            let (row, col) = (indices[order[0]], indices[order[1]]);
            let product = other_operand(resolved(body, index), is_add, |x| is_var(body, x, col))?;
            let width =
                width_param(body, other_operand(resolved(body, product), is_mul, |x| is_var(body, x, row))?)?;
            Some(OwnIndex::Rows { width })
        }
        _ => None,
    }
}
