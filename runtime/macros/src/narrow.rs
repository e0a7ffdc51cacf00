//! The 32-bit variant of a kernel body for GPUs: `usize` arithmetic in `unsigned int`
//! where that gives what the 64-bit body gives, in 64 bits where it might not.
//!
//! The runtime launches the variant only when the work-item count and every `usize` value
//! the launch passes (starts, inner lengths, view lengths, the team size, `usize` scalar
//! parameters) are at most 2^30, so every index, length and parameter is below 2^31.
//! From there two facts decide each expression's width:
//!
//! - `+`, `-`, `*`, `&`, `|`, `^`, `!` and `<<` by a literal under 32 commute with
//!   reduction modulo 2^32: computed in 32 bits they give the 64-bit value's low half. An
//!   element index needs no more (an index in range is below 2^30, so its low half is
//!   itself), nor does a narrowing cast (`as u32`, `as i32`).
//! - `/`, `%`, `>>`, comparisons, `min`/`max`, widening casts, loop bounds, sub-slice
//!   ranges, arguments of device functions and stored `usize` values need the value
//!   itself. An operand is computed in 32 bits there only when a bound on it (from the
//!   launch's limit, literals and the operators: `a + b` under 2^(max+1), `a * b` under
//!   2^(sum), `a / b` under `a`'s, `a % b` under `b`'s; a difference has none) shows it
//!   below 2^32; otherwise in 64 bits, as the 64-bit body computes it.
//!
//! A `let` (or `for`) variable is `unsigned int` unless it is read where its value is
//! needed while nothing bounds it under 2^32: then it is `unsigned long long`, and what
//! is stored in it is computed in 64 bits (decided by a fixpoint). The result is a body
//! whose `usize` variables and expressions are retyped `u32` where narrow, with explicit
//! casts between the widths, which the C emitter writes as it writes any body.

use syn::BinOp;

use crate::ir::{
    compound, view_repr, Body, Expr, ExprKind, Lit, Math, Place, Role, Stmt, Type, VarId, ViewRepr,
};
use crate::ty::Ty;

/// Bits of the bound on a value below 2^31 (indices, lengths, parameters, the team size)
/// under the launch's limit of 2^30 on each start, length and parameter.
const LAUNCH_BITS: u32 = 31;

/// "No bound under 2^32 is known."
const UNBOUNDED: u32 = 64;

/// The 32-bit variant of kernel `body`, whose index variables are `index_vars`: narrow
/// variables and expressions typed `u32` (see the module's text).
pub fn narrow(body: &Body, index_vars: &[VarId]) -> Body {
    let n = body.vars.len();
    let eligible: Vec<bool> = body
        .vars
        .iter()
        .map(|v| {
            matches!(v.ty, Type::Scalar(Ty::Usize))
                && matches!(v.role, Role::Local | Role::Index(_) | Role::Param(_))
        })
        .collect();
    let mut bits = vec![0u32; n];
    for (v, var) in body.vars.iter().enumerate() {
        bits[v] = match var.role {
            Role::Index(_) | Role::Param(_) if eligible[v] => LAUNCH_BITS,
            Role::Local if eligible[v] => 0,
            _ => UNBOUNDED,
        };
    }
    for &v in index_vars {
        bits[v] = LAUNCH_BITS;
    }
    let mut pass = Pass { body, bits, narrow: eligible, loop_vars: Vec::new(), promote: Vec::new() };
    // The bounds: the least fixpoint over every store to a variable (each pass can only
    // raise a bound, and a bound over 32 bits is `UNBOUNDED`).
    loop {
        let before = pass.bits.clone();
        pass.bound_stores(&body.stmts);
        if pass.bits == before {
            break;
        }
    }
    // A `for` variable is narrow only when its range is (its `++` must not wrap).
    for v in std::mem::take(&mut pass.loop_vars) {
        if pass.bits[v] > LAUNCH_BITS {
            pass.narrow[v] = false;
        }
    }
    // The widths: a narrow variable read where its value is needed, with no bound under
    // 2^32, becomes 64-bit; what is stored to it is then computed in 64 bits, which may
    // need others' values: repeated until no variable changes.
    loop {
        pass.promote.clear();
        let stmts = pass.stmts(&body.stmts);
        if pass.promote.is_empty() {
            let mut out = Body { stmts, ..body.clone() };
            for (v, var) in out.vars.iter_mut().enumerate() {
                if pass.narrow[v] {
                    var.ty = Type::Scalar(Ty::U32);
                }
            }
            return out;
        }
        for v in std::mem::take(&mut pass.promote) {
            pass.narrow[v] = false;
        }
    }
}

struct Pass<'a> {
    body: &'a Body,
    /// Per variable: bits of a bound on its value (`UNBOUNDED` when none under 2^32).
    bits: Vec<u32>,
    /// Per variable: computed and stored in 32 bits.
    narrow: Vec<bool>,
    /// `for` variables (narrow only over a range below 2^31).
    loop_vars: Vec<VarId>,
    /// Narrow variables a walk found read where their value is needed, unbounded.
    promote: Vec<VarId>,
}

fn is_usize(e: &Expr) -> bool {
    matches!(e.ty, Type::Scalar(Ty::Usize))
}

/// The value of an integer literal.
fn int_value(e: &Expr) -> Option<u128> {
    match &e.kind {
        ExprKind::Lit(Lit::Int(d)) => d.parse().ok(),
        _ => None,
    }
}

/// Bits of `v` (0 for 0).
fn bits_of(v: u128) -> u32 {
    128 - v.leading_zeros()
}

/// `b` if it is at most 32, else `UNBOUNDED`.
fn cap(b: u32) -> u32 {
    if b <= 32 {
        b
    } else {
        UNBOUNDED
    }
}

/// A shift amount a 32-bit shift takes as the 64-bit one does: a literal under 32.
fn small_shift(amount: &Expr) -> bool {
    int_value(amount).is_some_and(|s| s < 32)
}

fn typed(kind: ExprKind, ty: Ty, like: &Expr) -> Expr {
    Expr { kind, ty: Type::Scalar(ty), span: like.span }
}

fn cast(e: Expr, ty: Ty) -> Expr {
    let span = e.span;
    Expr { kind: ExprKind::Cast(Box::new(e), ty), ty: Type::Scalar(ty), span }
}

impl Pass<'_> {
    /// Bits of a bound on `e`'s value (an integer expression), `UNBOUNDED` when none
    /// under 2^32 is known.
    fn bits(&self, e: &Expr) -> u32 {
        use BinOp::*;
        if let Some(v) = int_value(e) {
            return cap(bits_of(v));
        }
        cap(match &e.kind {
            ExprKind::Var(v) => self.bits[*v],
            ExprKind::Len(v) => match view_repr(&self.body.vars[*v], true) {
                ViewRepr::Bare | ViewRepr::Array => LAUNCH_BITS,
                ViewRepr::Boxed => UNBOUNDED,
            },
            ExprKind::TeamSize => LAUNCH_BITS,
            ExprKind::Binary(op, a, b) => {
                let (x, y) = (self.bits(a), self.bits(b));
                match op {
                    Add(_) => x.max(y) + 1,
                    Mul(_) => x + y,
                    Div(_) | Shr(_) => x,
                    Rem(_) | BitAnd(_) => x.min(y),
                    BitOr(_) | BitXor(_) => x.max(y),
                    Shl(_) => int_value(b).map_or(UNBOUNDED, |s| x.saturating_add(s.min(64) as u32)),
                    _ => UNBOUNDED,
                }
            }
            ExprKind::Cast(a, Ty::Usize) => match a.ty {
                Type::Scalar(Ty::U32) => 32,
                Type::Scalar(Ty::Bool) => 1,
                Type::Scalar(Ty::Usize) => self.bits(a),
                _ => UNBOUNDED,
            },
            ExprKind::Select(_, a, b) => self.bits(a).max(self.bits(b)),
            ExprKind::Math(Math::Int("min", _), args) => {
                args.iter().map(|a| self.bits(a)).min().unwrap_or(UNBOUNDED)
            }
            ExprKind::Math(Math::Int("max" | "clamp", _), args) => {
                args.iter().map(|a| self.bits(a)).max().unwrap_or(UNBOUNDED)
            }
            _ => UNBOUNDED,
        })
    }

    /// Raises each narrow-eligible variable's bound by what `stmts` store to it.
    fn bound_stores(&mut self, stmts: &[Stmt]) {
        for s in stmts {
            match s {
                Stmt::Let { var, init } => self.raise(*var, self.bits(init)),
                Stmt::Assign { place: Place::Var(v), op, value, .. } => {
                    let b = match op.as_ref().and_then(compound) {
                        Some(op) => {
                            let whole = Expr {
                                kind: ExprKind::Binary(
                                    op,
                                    Box::new(self.var_expr(*v)),
                                    Box::new(value.clone()),
                                ),
                                ty: self.body.vars[*v].ty.clone(),
                                span: value.span,
                            };
                            self.bits(&whole)
                        }
                        None => self.bits(value),
                    };
                    self.raise(*v, b);
                }
                Stmt::If { then, els, .. } => {
                    self.bound_stores(then);
                    self.bound_stores(els.as_deref().unwrap_or_default());
                }
                Stmt::For { var, start, end, body, .. } => {
                    if !self.loop_vars.contains(var) {
                        self.loop_vars.push(*var);
                    }
                    let b = self.bits(start).max(self.bits(end));
                    self.raise(*var, b);
                    self.bound_stores(body);
                }
                Stmt::While { body, .. } | Stmt::Loop(body) | Stmt::Block(body) => self.bound_stores(body),
                _ => {}
            }
        }
    }

    fn raise(&mut self, v: VarId, b: u32) {
        if matches!(self.body.vars[v].role, Role::Local) && self.bits[v] < b {
            self.bits[v] = cap(b);
        }
    }

    fn var_expr(&self, v: VarId) -> Expr {
        let var = &self.body.vars[v];
        Expr { kind: ExprKind::Var(v), ty: var.ty.clone(), span: var.rust.span() }
    }

    // ---- the rewrite ----------------------------------------------------------------

    /// `e` (of any type) with its `usize` parts narrowed where they may be; a `usize` `e`
    /// keeps its exact value (64-bit).
    fn any(&mut self, e: &Expr) -> Expr {
        if is_usize(e) {
            return self.wide(e);
        }
        match &e.kind {
            // Truncations keep only the low half.
            ExprKind::Cast(a, t @ (Ty::U32 | Ty::I32)) if is_usize(a) => {
                Expr { kind: ExprKind::Cast(Box::new(self.narrow(a)), *t), ..e.clone() }
            }
            _ => self.children(e),
        }
    }

    /// An element index: in range it is its own low half.
    fn index(&mut self, e: &Expr) -> Expr {
        if is_usize(e) {
            self.narrow(e)
        } else {
            self.any(e)
        }
    }

    /// `e` with each direct sub-expression rewritten by [`Pass::any`].
    fn children(&mut self, e: &Expr) -> Expr {
        let mut out = e.clone();
        let b = |p: &mut Self, x: &Expr| Box::new(p.any(x));
        out.kind = match &e.kind {
            ExprKind::Load { view, index } => {
                ExprKind::Load { view: *view, index: Box::new(self.index(index)) }
            }
            ExprKind::Field { base, field } => ExprKind::Field { base: b(self, base), field: field.clone() },
            ExprKind::Sub { view, start, end } => {
                ExprKind::Sub { view: *view, start: b(self, start), end: b(self, end) }
            }
            ExprKind::Neg(a) => ExprKind::Neg(b(self, a)),
            ExprKind::Not(a) => ExprKind::Not(b(self, a)),
            ExprKind::Binary(op, x, y) => ExprKind::Binary(*op, b(self, x), b(self, y)),
            ExprKind::Cast(a, t) => ExprKind::Cast(b(self, a), *t),
            ExprKind::Select(c, x, y) => ExprKind::Select(b(self, c), b(self, x), b(self, y)),
            ExprKind::Math(m, args) => ExprKind::Math(*m, args.iter().map(|a| self.any(a)).collect()),
            ExprKind::Call { path, args } => {
                ExprKind::Call { path: path.clone(), args: args.iter().map(|a| self.any(a)).collect() }
            }
            ExprKind::TeamReduce(op, a) => ExprKind::TeamReduce(*op, b(self, a)),
            ExprKind::Lit(_)
            | ExprKind::Var(_)
            | ExprKind::Len(_)
            | ExprKind::ViewOf(_)
            | ExprKind::Builtin { .. }
            | ExprKind::TeamSize => return out,
        };
        out
    }

    /// `usize` expression `e` in 32 bits (typed `u32`): the low half of its value, and the
    /// value itself when [`Pass::bits`] bounds it under 2^32.
    fn narrow(&mut self, e: &Expr) -> Expr {
        use BinOp::*;
        if !is_usize(e) {
            return self.any(e);
        }
        let exact = |p: &Self, x: &Expr| p.bits(x) <= 32;
        let kind = match &e.kind {
            ExprKind::Lit(Lit::Int(_)) if int_value(e).is_some_and(|v| v < 1 << 32) => e.kind.clone(),
            ExprKind::Var(v) if self.narrow[*v] => e.kind.clone(),
            // A narrow variant declares the team size `unsigned int`.
            ExprKind::TeamSize => e.kind.clone(),
            ExprKind::Binary(op @ (Add(_) | Sub(_) | Mul(_) | BitAnd(_) | BitOr(_) | BitXor(_)), a, b) => {
                ExprKind::Binary(*op, Box::new(self.narrow(a)), Box::new(self.narrow(b)))
            }
            ExprKind::Binary(op @ Shl(_), a, s) if small_shift(s) => {
                ExprKind::Binary(*op, Box::new(self.narrow(a)), Box::new(self.any(s)))
            }
            ExprKind::Binary(op @ Shr(_), a, s) if small_shift(s) && exact(self, a) => {
                ExprKind::Binary(*op, Box::new(self.narrow(a)), Box::new(self.any(s)))
            }
            ExprKind::Binary(op @ (Div(_) | Rem(_)), a, b) if exact(self, a) && exact(self, b) => {
                ExprKind::Binary(*op, Box::new(self.narrow(a)), Box::new(self.narrow(b)))
            }
            ExprKind::Math(m @ Math::Int("min" | "max" | "clamp", _), args)
                if args.iter().all(|a| exact(self, a)) =>
            {
                ExprKind::Math(*m, args.iter().map(|a| self.narrow(a)).collect())
            }
            ExprKind::Not(a) => ExprKind::Not(Box::new(self.narrow(a))),
            ExprKind::Select(c, a, b) => {
                ExprKind::Select(Box::new(self.any(c)), Box::new(self.narrow(a)), Box::new(self.narrow(b)))
            }
            ExprKind::Cast(a, Ty::Usize) => match a.ty {
                Type::Scalar(Ty::Usize) => return self.narrow(a),
                Type::Scalar(Ty::U32) => return self.any(a),
                // Integers wrap to their low half as they widen and truncate.
                Type::Scalar(Ty::I32 | Ty::I64 | Ty::U64 | Ty::Bool) => return cast(self.any(a), Ty::U32),
                _ => return cast(self.wide_node(e), Ty::U32),
            },
            _ => return cast(self.wide_node(e), Ty::U32),
        };
        typed(kind, Ty::U32, e)
    }

    /// `usize` expression `e` with the 64-bit body's value (typed `usize`): computed in
    /// 32 bits and widened when bounded under 2^32, else in 64 bits.
    fn wide(&mut self, e: &Expr) -> Expr {
        match &e.kind {
            ExprKind::Lit(_) | ExprKind::Len(_) => e.clone(),
            ExprKind::Var(v) if !self.narrow[*v] => e.clone(),
            _ if self.bits(e) <= 32 => cast(self.narrow(e), Ty::Usize),
            _ => self.wide_node(e),
        }
    }

    /// `usize` expression `e` computed in 64 bits at its top (its operands by
    /// [`Pass::wide`]).
    fn wide_node(&mut self, e: &Expr) -> Expr {
        use BinOp::*;
        let kind = match &e.kind {
            ExprKind::Var(v) => {
                // Narrow, unbounded and needed whole: it must be 64-bit.
                if self.narrow[*v] && !self.promote.contains(v) {
                    self.promote.push(*v);
                }
                return e.clone();
            }
            ExprKind::Binary(op @ (Shl(_) | Shr(_)), a, s) => {
                ExprKind::Binary(*op, Box::new(self.wide(a)), Box::new(self.any(s)))
            }
            ExprKind::Binary(op, a, b) if is_usize(a) && is_usize(b) => {
                ExprKind::Binary(*op, Box::new(self.wide(a)), Box::new(self.wide(b)))
            }
            ExprKind::Not(a) => ExprKind::Not(Box::new(self.wide(a))),
            ExprKind::Select(c, a, b) => {
                ExprKind::Select(Box::new(self.any(c)), Box::new(self.wide(a)), Box::new(self.wide(b)))
            }
            ExprKind::Math(m, args) => ExprKind::Math(*m, args.iter().map(|a| self.any(a)).collect()),
            _ => return self.children(e),
        };
        Expr { kind, ..e.clone() }
    }

    fn place(&mut self, p: &Place) -> Place {
        match p {
            Place::Var(v) => Place::Var(*v),
            Place::Elem { view, index } => Place::Elem { view: *view, index: self.index(index) },
            Place::Field { base, field } => {
                Place::Field { base: Box::new(self.place(base)), field: field.clone() }
            }
        }
    }

    /// A value stored to variable `v`: narrow for a narrow variable.
    fn stored(&mut self, v: VarId, e: &Expr) -> Expr {
        if self.narrow[v] {
            self.narrow(e)
        } else {
            self.any(e)
        }
    }

    fn stmts(&mut self, stmts: &[Stmt]) -> Vec<Stmt> {
        stmts.iter().map(|s| self.stmt(s)).collect()
    }

    fn stmt(&mut self, s: &Stmt) -> Stmt {
        match s {
            Stmt::Let { var, init } => Stmt::Let { var: *var, init: self.stored(*var, init) },
            // `x op= v` on a narrow variable, as `x = x op v` (the operator decides the
            // operands' widths).
            Stmt::Assign { place: Place::Var(v), op: Some(op), value, span }
                if self.narrow[*v] && compound(op).is_some() =>
            {
                let whole = Expr {
                    kind: ExprKind::Binary(
                        compound(op).unwrap_or(*op),
                        Box::new(self.var_expr(*v)),
                        Box::new(value.clone()),
                    ),
                    ty: self.body.vars[*v].ty.clone(),
                    span: value.span,
                };
                Stmt::Assign { place: Place::Var(*v), op: None, value: self.narrow(&whole), span: *span }
            }
            Stmt::Assign { place: Place::Var(v), op: None, value, span } => {
                Stmt::Assign { place: Place::Var(*v), op: None, value: self.stored(*v, value), span: *span }
            }
            Stmt::Assign { place, op, value, span } => {
                Stmt::Assign { place: self.place(place), op: *op, value: self.any(value), span: *span }
            }
            Stmt::Reduce { var, value, span } => {
                Stmt::Reduce { var: *var, value: self.any(value), span: *span }
            }
            Stmt::Expr(e) => Stmt::Expr(self.any(e)),
            Stmt::If { cond, then, els } => Stmt::If {
                cond: self.any(cond),
                then: self.stmts(then),
                els: els.as_ref().map(|b| self.stmts(b)),
            },
            Stmt::For { var, start, end, inclusive, end_c, step, order, body } => Stmt::For {
                var: *var,
                start: self.any(start),
                end: self.any(end),
                inclusive: *inclusive,
                end_c: end_c.clone(),
                step: step.as_ref().map(|x| self.any(x)),
                order: *order,
                body: self.stmts(body),
            },
            Stmt::While { cond, body } => Stmt::While { cond: self.any(cond), body: self.stmts(body) },
            Stmt::Loop(b) => Stmt::Loop(self.stmts(b)),
            Stmt::Block(b) => Stmt::Block(self.stmts(b)),
            Stmt::Return(v, span) => Stmt::Return(v.as_ref().map(|x| self.any(x)), *span),
            Stmt::Barrier | Stmt::Break | Stmt::Continue => s.clone(),
        }
    }
}
