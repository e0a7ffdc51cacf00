//! The typed intermediate form of a kernel or device function body: what the emitters
//! (C for CUDA and HIP, Rust for the host twin) and the access analysis read. Built and
//! checked once by `lower`.

use proc_macro2::Span;
use syn::Ident;

use crate::signature::{Elem, StructTy};
use crate::ty::{RedOp, Ty};

/// The type of an expression.
#[derive(Clone, Debug)]
pub enum Type {
    Scalar(Ty),
    /// An unsuffixed literal whose context decided no type (C: `int` / `double`; rustc
    /// infers it in the twin).
    IntLit,
    FloatLit,
    /// A value the macro cannot see the type of (a module constant, a struct field, a
    /// device function's result): rustc knows it, and C names it `decltype(expr)`.
    Opaque(Box<Expr>),
    Struct(StructTy),
    View {
        elem: Elem,
        mutable: bool,
    },
    Unit,
}

impl Type {
    pub fn scalar(&self) -> Option<Ty> {
        match self {
            Type::Scalar(t) => Some(*t),
            _ => None,
        }
    }

    pub fn is_lit(&self) -> bool {
        matches!(self, Type::IntLit | Type::FloatLit)
    }

    pub fn is_unit(&self) -> bool {
        matches!(self, Type::Unit)
    }
}

/// A variable's index in [`Body::vars`].
pub type VarId = usize;

/// What a variable is.
#[derive(Clone, Debug, PartialEq)]
pub enum Role {
    /// A `let` (or `for`) binding.
    Local,
    /// Index variable `k` of the kernel.
    Index(usize),
    /// Parameter `k` of the kernel or device function.
    Param(usize),
    /// A kernel's reduction variable (its C name is the thread's partial).
    Reduction(RedOp),
    /// A constant item outside the body, at this path (as written in the body's module).
    Const(syn::Path),
    /// A `const` item inside the body.
    BodyConst,
    /// A teams kernel's team-local array of this many elements (`__shared__` on GPUs).
    TeamLocal(TeamLen),
}

/// A team-local array's length: a literal, or a constant expression of module constants
/// (`4 * BSIZE * BSIZE`), which rustc and the C compiler evaluate.
#[derive(Clone, Debug)]
pub enum TeamLen {
    Lit(u64),
    /// The expression (a `usize`), and as written (for the size check beside the kernel).
    Const(Box<Expr>, Box<syn::Expr>),
}

impl PartialEq for TeamLen {
    /// The same literal, or the same expression as written.
    fn eq(&self, other: &Self) -> bool {
        use quote::ToTokens;
        match (self, other) {
            (TeamLen::Lit(a), TeamLen::Lit(b)) => a == b,
            (TeamLen::Const(_, a), TeamLen::Const(_, b)) => {
                a.to_token_stream().to_string() == b.to_token_stream().to_string()
            }
            _ => false,
        }
    }
}

#[derive(Clone, Debug)]
pub struct Var {
    pub rust: Ident,
    pub c: String,
    pub ty: Type,
    pub mutable: bool,
    pub role: Role,
    /// An immutable local's value (for the access analysis).
    pub init: Option<Expr>,
}

/// How a view is reached in C: a kernel's view parameter is a bare pointer with a length
/// parameter beside it; any other (a device function's parameter, a sub-slice local) is an
/// `offload_view` value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ViewRepr {
    Bare,
    Boxed,
    /// A team-local array: its length is a constant.
    Array,
}

#[derive(Clone, Debug)]
pub struct Expr {
    pub kind: ExprKind,
    pub ty: Type,
    pub span: Span,
}

/// Math functions, as Rust methods (`x.sqrt()`) or associated functions (`f32::max(a, b)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Math {
    /// Rust method name, and arity besides the receiver.
    Float(&'static str, usize),
    /// Integer `min`, `max`, `abs`.
    Int(&'static str, usize),
}

#[derive(Clone, Debug)]
pub enum Lit {
    /// Decimal digits.
    Int(String),
    /// Digits as Rust wrote them (with a `.` or exponent).
    Float(String),
    Bool(bool),
}

#[derive(Clone, Debug)]
pub enum ExprKind {
    Lit(Lit),
    Var(VarId),
    /// `view[index]`.
    Load {
        view: VarId,
        index: Box<Expr>,
    },
    /// `base.field` of a struct value.
    Field {
        base: Box<Expr>,
        field: Ident,
    },
    /// `view.len()`.
    Len(VarId),
    /// A whole view as a value (an argument of a device function).
    ViewOf(VarId),
    /// `&view[start..end]` (or `..=`), a view.
    Sub {
        view: VarId,
        start: Box<Expr>,
        end: Box<Expr>,
    },
    Neg(Box<Expr>),
    /// `!e`: logical for `bool`, bitwise for integers.
    Not(Box<Expr>),
    Binary(syn::BinOp, Box<Expr>, Box<Expr>),
    Cast(Box<Expr>, Ty),
    /// `if c { a } else { b }` as a value.
    Select(Box<Expr>, Box<Expr>, Box<Expr>),
    /// A math method on a receiver (`args[0]`) of the expression's type.
    Math(Math, Vec<Expr>),
    /// A call of an `#[offload::device]` function.
    Call {
        path: syn::Path,
        args: Vec<Expr>,
    },
    /// An associated constant of a scalar type (`f32::EPSILON`): its C text and Rust path.
    Builtin {
        c: String,
        rust: syn::Path,
    },
    /// `offload::team_sum(value)` (or product, min, max): every thread of the team gets
    /// the combination of every thread's `value`. Only a `let`'s value, where a barrier may
    /// stand.
    TeamReduce(TeamOp, Box<Expr>),
    /// `offload::team_size()`: the threads per team (the host twin's and the C's
    /// `__offload_ts`).
    TeamSize,
}

/// The operator of a team reduction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TeamOp {
    Add,
    Mul,
    Min,
    Max,
}

impl TeamOp {
    /// The operator of `offload::NAME`.
    pub fn of(name: &str) -> Option<TeamOp> {
        Some(match name {
            "team_sum" => TeamOp::Add,
            "team_product" => TeamOp::Mul,
            "team_min" => TeamOp::Min,
            "team_max" => TeamOp::Max,
            _ => return None,
        })
    }

    /// The prelude's functor (`offload_op_add`, ...).
    pub fn c_functor(self) -> &'static str {
        match self {
            TeamOp::Add => "offload_op_add()",
            TeamOp::Mul => "offload_op_mul()",
            TeamOp::Min => "offload_op_min()",
            TeamOp::Max => "offload_op_max()",
        }
    }

    /// The identity in C for type `t`.
    pub fn c_identity(self, t: crate::ty::Ty) -> String {
        match self {
            TeamOp::Add => crate::ty::RedOp::Add.c_identity(t).to_string(),
            TeamOp::Min => crate::ty::RedOp::Min.c_identity(t).to_string(),
            TeamOp::Max => crate::ty::RedOp::Max.c_identity(t).to_string(),
            TeamOp::Mul => format!("({})1", t.c()),
        }
    }
}

/// A place a value is stored to.
#[derive(Clone, Debug)]
pub enum Place {
    Var(VarId),
    Elem { view: VarId, index: Expr },
    Field { base: Box<Place>, field: Ident },
}

/// How a `for` walks its range `start..end` (or `..=`) of values `start`, `start + step`,
/// ... (`step` 1 without `.step_by`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// `a..b`, `(a..b).step_by(s)`: upwards from `start`.
    Up,
    /// `(a..b).rev()`, `(a..b).rev().step_by(s)`: downwards from the range's last value,
    /// by `step`.
    Down,
    /// `(a..b).step_by(s).rev()`: the values of `Up`, last first.
    UpReversed,
}

#[derive(Clone, Debug)]
pub enum Stmt {
    Let {
        var: VarId,
        init: Expr,
    },
    /// `place = value`, or `place op= value`.
    Assign {
        place: Place,
        op: Option<syn::BinOp>,
        value: Expr,
        span: Span,
    },
    /// A reduction variable's update: `*r += v`, `*r = (*r).min(v)`.
    Reduce {
        var: VarId,
        value: Expr,
        span: Span,
    },
    Expr(Expr),
    If {
        cond: Expr,
        then: Block,
        els: Option<Block>,
    },
    For {
        var: VarId,
        start: Expr,
        end: Expr,
        inclusive: bool,
        end_c: String,
        /// `.step_by(step)` (a `usize`), when given.
        step: Option<Expr>,
        /// The order the range is walked in (`.rev()`).
        order: Order,
        body: Block,
    },
    While {
        cond: Expr,
        body: Block,
    },
    Loop(Block),
    Break,
    Continue,
    /// In a kernel `return;` ends the iteration; in a device function it returns.
    Return(Option<Expr>, Span),
    /// `offload::barrier()`: every thread of the team waits for the others.
    Barrier,
    Block(Block),
}

pub type Block = Vec<Stmt>;

/// A lowered body: its statements and every variable they name.
#[derive(Clone, Debug)]
pub struct Body {
    pub vars: Vec<Var>,
    pub stmts: Block,
    /// Whether a kernel body has `return;` (the C emitter then places a label).
    pub returns: bool,
    /// Constants outside the body it reads, by variable.
    pub consts: Vec<VarId>,
    /// Device functions it calls (paths as written).
    pub calls: Vec<syn::Path>,
}

/// How a view variable is reached in C (see [`ViewRepr`]).
pub fn view_repr(v: &Var, kernel: bool) -> ViewRepr {
    match v.role {
        Role::TeamLocal(_) => ViewRepr::Array,
        Role::Param(_) if kernel => ViewRepr::Bare,
        _ => ViewRepr::Boxed,
    }
}

/// The operator of compound assignment `op`, if it is one.
pub fn compound(op: &syn::BinOp) -> Option<syn::BinOp> {
    use syn::BinOp::*;
    Some(match op {
        AddAssign(_) => syn::parse_quote!(+),
        SubAssign(_) => syn::parse_quote!(-),
        MulAssign(_) => syn::parse_quote!(*),
        DivAssign(_) => syn::parse_quote!(/),
        RemAssign(_) => syn::parse_quote!(%),
        BitAndAssign(_) => syn::parse_quote!(&),
        BitOrAssign(_) => syn::parse_quote!(|),
        BitXorAssign(_) => syn::parse_quote!(^),
        ShlAssign(_) => syn::parse_quote!(<<),
        ShrAssign(_) => syn::parse_quote!(>>),
        _ => return None,
    })
}

/// Calls `f` with every variable `e` reads.
pub fn visit_vars(e: &Expr, f: &mut impl FnMut(VarId)) {
    walk_expr(e, &mut |x| match &x.kind {
        ExprKind::Var(v) | ExprKind::Len(v) | ExprKind::ViewOf(v) => f(*v),
        ExprKind::Load { view, .. } | ExprKind::Sub { view, .. } => f(*view),
        _ => {}
    });
}

/// Calls `f` with `e` and every expression inside it.
pub fn walk_expr(e: &Expr, f: &mut impl FnMut(&Expr)) {
    f(e);
    walk_children(e, &mut |c| walk_expr(c, f));
}

/// Calls `f` with each direct sub-expression of `e`.
pub fn walk_children(e: &Expr, f: &mut impl FnMut(&Expr)) {
    match &e.kind {
        ExprKind::Load { index: a, .. }
        | ExprKind::Field { base: a, .. }
        | ExprKind::Neg(a)
        | ExprKind::Not(a)
        | ExprKind::Cast(a, _)
        | ExprKind::TeamReduce(_, a) => f(a),
        ExprKind::Sub { start, end, .. } => {
            f(start);
            f(end);
        }
        ExprKind::Binary(_, a, b) => {
            f(a);
            f(b);
        }
        ExprKind::Select(c, a, b) => {
            f(c);
            f(a);
            f(b);
        }
        ExprKind::Math(_, args) | ExprKind::Call { args, .. } => args.iter().for_each(f),
        ExprKind::Var(_)
        | ExprKind::Len(_)
        | ExprKind::ViewOf(_)
        | ExprKind::Lit(_)
        | ExprKind::Builtin { .. }
        | ExprKind::TeamSize => {}
    }
}

/// Calls `f` with every variable the statements read or store to (at any depth).
pub fn visit_stmt_vars(stmts: &[Stmt], f: &mut impl FnMut(VarId)) {
    for s in stmts {
        match s {
            Stmt::Let { var, init } => {
                f(*var);
                visit_vars(init, f);
            }
            Stmt::Assign { place, value, .. } => {
                visit_place_vars(place, f);
                visit_vars(value, f);
            }
            Stmt::Reduce { var, value, .. } => {
                f(*var);
                visit_vars(value, f);
            }
            Stmt::Expr(e) | Stmt::Return(Some(e), _) => visit_vars(e, f),
            Stmt::If { cond, then, els } => {
                visit_vars(cond, f);
                visit_stmt_vars(then, f);
                visit_stmt_vars(els.as_deref().unwrap_or_default(), f);
            }
            Stmt::For { var, start, end, step, body, .. } => {
                f(*var);
                visit_vars(start, f);
                visit_vars(end, f);
                step.iter().for_each(|s| visit_vars(s, f));
                visit_stmt_vars(body, f);
            }
            Stmt::While { cond, body } => {
                visit_vars(cond, f);
                visit_stmt_vars(body, f);
            }
            Stmt::Loop(b) | Stmt::Block(b) => visit_stmt_vars(b, f),
            Stmt::Barrier | Stmt::Break | Stmt::Continue | Stmt::Return(None, _) => {}
        }
    }
}

fn visit_place_vars(p: &Place, f: &mut impl FnMut(VarId)) {
    match p {
        Place::Var(v) => f(*v),
        Place::Elem { view, index } => {
            f(*view);
            visit_vars(index, f);
        }
        Place::Field { base, .. } => visit_place_vars(base, f),
    }
}

/// Calls `f` with every expression of the statements and every expression inside it.
pub fn visit_exprs(stmts: &[Stmt], f: &mut impl FnMut(&Expr)) {
    use walk_expr as expr;
    fn place(p: &Place, f: &mut impl FnMut(&Expr)) {
        match p {
            Place::Var(_) => {}
            Place::Elem { index, .. } => expr(index, f),
            Place::Field { base, .. } => place(base, f),
        }
    }
    for s in stmts {
        match s {
            Stmt::Let { init: e, .. }
            | Stmt::Reduce { value: e, .. }
            | Stmt::Expr(e)
            | Stmt::Return(Some(e), _) => expr(e, f),
            Stmt::Assign { place: p, value, .. } => {
                place(p, f);
                expr(value, f);
            }
            Stmt::If { cond, then, els } => {
                expr(cond, f);
                visit_exprs(then, f);
                visit_exprs(els.as_deref().unwrap_or_default(), f);
            }
            Stmt::For { start, end, step, body, .. } => {
                expr(start, f);
                expr(end, f);
                step.iter().for_each(|s| expr(s, f));
                visit_exprs(body, f);
            }
            Stmt::While { cond, body } => {
                expr(cond, f);
                visit_exprs(body, f);
            }
            Stmt::Loop(b) | Stmt::Block(b) => visit_exprs(b, f),
            Stmt::Barrier | Stmt::Break | Stmt::Continue | Stmt::Return(None, _) => {}
        }
    }
}
