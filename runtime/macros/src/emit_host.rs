//! The Rust emitter: a lowered body as the host twin's Rust. Every view is an
//! `offload::__private::SharedSlice` (bounds-checked relaxed atomic loads and stores, never
//! a `&mut [T]`), so iterations running at once cannot hold aliasing references.

use std::collections::HashSet;

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::BinOp;

use crate::ir::{Body, Expr, ExprKind, Lit, Math, Place, Role, Stmt, Type, VarId};
use crate::ty::{RedOp, Ty};

pub struct RustEmitter<'a> {
    pub body: &'a Body,
    /// The code sits in the kernel's module (paths written in the parent get `super::`).
    pub nested: bool,
    /// A teams twin's locals that live across a barrier: each is an array with an element
    /// per thread of the team (`__offload_pt_N[__offload_thread]`), see `emit_teams`.
    pub per_thread: HashSet<VarId>,
    /// A teams twin's locals that every later stretch assigns before reading: declared
    /// before their stretch's thread loop, so their `let` is an assignment.
    pub declared_outside: HashSet<VarId>,
    /// The kernel's reduction variables are plain `let mut` locals of the twin's task (kept
    /// in registers), not `&mut` partials.
    pub local_reductions: bool,
}

/// The twin of device function `path` (as written), for calling it.
pub fn twin_path(path: &syn::Path) -> syn::Path {
    let mut p = path.clone();
    if let Some(last) = p.segments.last_mut() {
        last.ident = twin_name(&last.ident);
    }
    p
}

/// The name of device function `name`'s twin.
pub fn twin_name(name: &syn::Ident) -> syn::Ident {
    use syn::ext::IdentExt;
    format_ident!("__offload_twin_{}", name.unraw())
}

impl<'a> RustEmitter<'a> {
    /// An emitter of `body`'s statements (in the kernel's module when `nested`).
    pub fn new(body: &'a Body, nested: bool) -> Self {
        Self {
            body,
            nested,
            per_thread: HashSet::new(),
            declared_outside: HashSet::new(),
            local_reductions: false,
        }
    }

    fn path(&self, p: &syn::Path) -> TokenStream {
        if self.nested {
            crate::signature::outer_path(p)
        } else {
            quote!(#p)
        }
    }

    /// The Rust type of `t` where it is known.
    pub fn ty(&self, t: &Type) -> Option<TokenStream> {
        match t {
            Type::Scalar(t) => Some(t.rust()),
            Type::Struct(s) => Some(self.path(&s.path)),
            _ => None,
        }
    }

    fn var(&self, v: VarId, span: Span) -> TokenStream {
        let var = &self.body.vars[v];
        match &var.role {
            Role::Const(path) => {
                let p = self.path(path);
                quote_spanned!(span=> #p)
            }
            _ if self.per_thread.contains(&v) => {
                let a = per_thread_array(v);
                quote_spanned!(span=> #a[__offload_thread])
            }
            _ => {
                let id = &var.rust;
                quote_spanned!(span=> #id)
            }
        }
    }

    pub fn expr(&self, e: &Expr) -> TokenStream {
        let s = e.span;
        match &e.kind {
            ExprKind::Lit(l) => lit(l, &e.ty, s),
            ExprKind::Var(v) => self.var(*v, s),
            ExprKind::Load { view, index } => {
                let (x, i) = (self.var(*view, s), self.expr(index));
                quote_spanned!(s=> #x.get(#i))
            }
            ExprKind::Field { base, field } => {
                let b = self.expr(base);
                quote_spanned!(s=> (#b).#field)
            }
            ExprKind::Len(v) => {
                let x = self.var(*v, s);
                quote_spanned!(s=> #x.len())
            }
            ExprKind::ViewOf(v) => self.var(*v, s),
            ExprKind::Sub { view, start, end } => {
                let (x, a, b) = (self.var(*view, s), self.expr(start), self.expr(end));
                quote_spanned!(s=> #x.sub(#a, #b))
            }
            ExprKind::Neg(a) => {
                let a = self.expr(a);
                quote_spanned!(s=> (-#a))
            }
            ExprKind::Not(a) => {
                let a = self.expr(a);
                quote_spanned!(s=> (!#a))
            }
            ExprKind::Binary(op, a, b) => {
                let (a, b) = (self.expr(a), self.expr(b));
                quote_spanned!(s=> (#a #op #b))
            }
            // The 16-bit floats' conversions (Rust has no `as` for them).
            ExprKind::Cast(a, t) if t.is_half() => {
                let a = self.expr(a);
                if *t == Ty::Bf16 {
                    // half's rounding, without its branches, so that loops storing bf16
                    // vectorise.
                    return quote_spanned!(s=> ::offload::__private::bf16_from_f32(#a));
                }
                let t = t.rust();
                quote_spanned!(s=> #t::from_f32(#a))
            }
            ExprKind::Cast(a, t) if a.ty.scalar().is_some_and(Ty::is_half) => {
                let to = format_ident!("to_{}", t.rust_name(), span = s);
                let a = self.expr(a);
                quote_spanned!(s=> #a.#to())
            }
            ExprKind::Cast(a, t) => {
                let (a, t) = (self.expr(a), t.rust());
                quote_spanned!(s=> (#a as #t))
            }
            ExprKind::Select(c, a, b) => {
                let (c, a, b) = (self.expr(c), self.expr(a), self.expr(b));
                quote_spanned!(s=> (if #c { #a } else { #b }))
            }
            ExprKind::Math(m, args) => {
                let name = match m {
                    Math::Float(n, _) | Math::Int(n, _) => format_ident!("{}", n, span = s),
                };
                let recv = self.expr(&args[0]);
                if name == "erf" || name == "erfc" {
                    return quote_spanned!(s=> ::offload::#name(#recv));
                }
                if name == "exp" && matches!(e.ty, Type::Scalar(Ty::F32)) {
                    // An exp without a call or a branch (2 ulp, as CUDA's `expf`), so that a
                    // twin's loops over it vectorise; libm's is a call per element.
                    return quote_spanned!(s=> ::offload::__private::exp_f32(#recv));
                }
                let rest: Vec<TokenStream> = args[1..].iter().map(|a| self.expr(a)).collect();
                quote_spanned!(s=> #recv.#name(#(#rest),*))
            }
            ExprKind::Call { path, args } => {
                let f = self.path(&twin_path(path));
                let args: Vec<TokenStream> = args.iter().map(|a| self.expr(a)).collect();
                quote_spanned!(s=> #f(#(#args),*))
            }
            ExprKind::Builtin { rust, .. } => quote_spanned!(s=> #rust),
            // One thread's own value: the teams twin combines the team's threads around it
            // (a team reduction is a `let`'s value, which the twin runs at team level).
            ExprKind::TeamReduce(_, value) => self.expr(value),
            ExprKind::TeamSize => quote_spanned!(s=> __offload_ts),
        }
    }

    /// A store of `value` (already combined with the old value for compound assignment)
    /// into `place`.
    fn store(&self, place: &Place, op: Option<&BinOp>, value: TokenStream, span: Span) -> TokenStream {
        // The place's root: a local, or an element (loaded, changed, stored back).
        let mut fields = Vec::new();
        let mut root = place;
        while let Place::Field { base, field } = root {
            fields.insert(0, field.clone());
            root = base;
        }
        let binop = op.and_then(crate::ir::compound);
        match root {
            Place::Var(v) => {
                let x = self.var(*v, span);
                match binop {
                    None => quote_spanned!(span=> #x #(.#fields)* = #value;),
                    Some(op) => {
                        quote_spanned!(span=> { let __offload_v = #value; #x #(.#fields)* = #x #(.#fields)* #op __offload_v; })
                    }
                }
            }
            Place::Elem { view, index } => {
                let (x, i) = (self.var(*view, span), self.expr(index));
                let new = match binop {
                    None => quote_spanned!(span=> __offload_v),
                    Some(op) => quote_spanned!(span=> __offload_e #(.#fields)* #op __offload_v),
                };
                if fields.is_empty() && binop.is_none() {
                    // A plain store loads nothing (a view stored beside its own elements can
                    // load only those).
                    quote_spanned!(span=> {
                        let __offload_i: usize = #i;
                        let __offload_v = #value;
                        #x.set(__offload_i, __offload_v);
                    })
                } else if fields.is_empty() {
                    quote_spanned!(span=> {
                        let __offload_i: usize = #i;
                        let __offload_v = #value;
                        let __offload_e = #x.get(__offload_i);
                        #x.set(__offload_i, #new);
                    })
                } else {
                    quote_spanned!(span=> {
                        let __offload_i: usize = #i;
                        let __offload_v = #value;
                        let mut __offload_e = #x.get(__offload_i);
                        __offload_e #(.#fields)* = #new;
                        #x.set(__offload_i, __offload_e);
                    })
                }
            }
            Place::Field { .. } => unreachable!("fields were peeled"),
        }
    }

    pub fn stmts(&self, b: &[Stmt]) -> TokenStream {
        let s: Vec<TokenStream> = b.iter().map(|s| self.stmt(s)).collect();
        quote!(#(#s)*)
    }

    fn stmt(&self, s: &Stmt) -> TokenStream {
        match s {
            Stmt::Let { var, init } => {
                let v = &self.body.vars[*var];
                let id = &v.rust;
                let m = v.mutable.then(|| quote!(mut));
                let value = self.expr(init);
                if self.declared_outside.contains(var) {
                    return quote!(#id = #value;);
                }
                if self.per_thread.contains(var) {
                    // The thread's element: an array's for a scalar; else pushed (threads
                    // run in order, each once per stretch).
                    let a = per_thread_array(*var);
                    return match (v.ty.scalar(), self.ty(&v.ty)) {
                        (Some(_), Some(t)) => {
                            quote!({ let __offload_v: #t = #value; #a[__offload_thread] = __offload_v; })
                        }
                        (None, Some(t)) => quote!({ let __offload_v: #t = #value; #a.push(__offload_v); }),
                        (_, None) => quote!(#a.push(#value);),
                    };
                }
                match (&v.role, self.ty(&v.ty)) {
                    (Role::BodyConst, Some(t)) => quote!(let #id: #t = #value;),
                    (_, Some(t)) => quote!(let #m #id: #t = #value;),
                    (_, None) => quote!(let #m #id = #value;),
                }
            }
            Stmt::Assign { place, op, value, span } => {
                let v = self.expr(value);
                self.store(place, op.as_ref(), v, *span)
            }
            Stmt::Reduce { var, value, span } => {
                let id = &self.body.vars[*var].rust;
                let v = self.expr(value);
                let id = if self.local_reductions { quote!(#id) } else { quote!((*#id)) };
                match self.body.vars[*var].role {
                    Role::Reduction(RedOp::Add) => quote_spanned!(*span=> #id += #v;),
                    Role::Reduction(RedOp::Min) => {
                        quote_spanned!(*span=> #id = ::offload::__private::Reducible::min(#id, #v);)
                    }
                    _ => quote_spanned!(*span=> #id = ::offload::__private::Reducible::max(#id, #v);),
                }
            }
            Stmt::Expr(e) => {
                let e = self.expr(e);
                quote!(#e;)
            }
            Stmt::If { cond, then, els } => {
                let c = self.expr(cond);
                let t = self.stmts(then);
                match els {
                    None => quote!(if #c { #t }),
                    Some(e) => {
                        let e = self.stmts(e);
                        quote!(if #c { #t } else { #e })
                    }
                }
            }
            Stmt::For { var, start, end, inclusive, step, order, body, .. } => {
                let id = &self.body.vars[*var].rust;
                let (a, b) = (self.expr(start), self.expr(end));
                let step = step.as_ref().map(|s| self.expr(s));
                let body = self.stmts(body);
                let range = walk(a, b, *inclusive, step, *order);
                quote!(for #id in #range { #body })
            }
            Stmt::While { cond, body } => {
                let c = self.expr(cond);
                let b = self.stmts(body);
                quote!(while #c { #b })
            }
            Stmt::Loop(b) => {
                let b = self.stmts(b);
                quote!(loop { #b })
            }
            Stmt::Barrier => quote!(__offload_barrier.wait();),
            Stmt::Break => quote!(break;),
            Stmt::Continue => quote!(continue;),
            Stmt::Return(None, span) => quote_spanned!(*span=> return;),
            Stmt::Return(Some(v), span) => {
                let v = self.expr(v);
                quote_spanned!(*span=> return #v;)
            }
            Stmt::Block(b) => {
                let b = self.stmts(b);
                quote!({ #b })
            }
        }
    }
}

/// The array holding a teams twin's per-thread local `v`.
pub fn per_thread_array(v: VarId) -> syn::Ident {
    format_ident!("__offload_pt_{}", v)
}

/// A literal: with its type's suffix where the macro knows the type, bare otherwise
/// (rustc infers it from its context, as in the function as written).
fn lit(l: &Lit, ty: &Type, span: Span) -> TokenStream {
    match (l, ty) {
        (Lit::Bool(b), _) => {
            let b = syn::LitBool::new(*b, span);
            quote!(#b)
        }
        (Lit::Int(d), Type::Scalar(t)) if *t != Ty::Bool => {
            let l = syn::LitInt::new(&format!("{d}{}", t.rust_name()), span);
            quote!(#l)
        }
        (Lit::Float(d), Type::Scalar(t)) if t.is_float() => {
            let l = syn::LitFloat::new(&format!("{d}{}", t.rust_name()), span);
            quote!(#l)
        }
        (Lit::Int(d), _) => {
            let l = syn::LitInt::new(d, span);
            quote!(#l)
        }
        (Lit::Float(d), _) => {
            let text = if d.contains(['.', 'e', 'E']) { d.clone() } else { format!("{d}.0") };
            let l = syn::LitFloat::new(&text, span);
            quote!(#l)
        }
    }
}

/// The Rust iterator of a `for` over `a..b` (or `a..=b`) walked in `order`, by `step`.
pub(crate) fn walk(
    a: TokenStream,
    b: TokenStream,
    inclusive: bool,
    step: Option<TokenStream>,
    order: crate::ir::Order,
) -> TokenStream {
    use crate::ir::Order;
    let range = if inclusive { quote!(#a..=#b) } else { quote!(#a..#b) };
    match (order, step) {
        (Order::Up, None) => range,
        (Order::Up, Some(s)) => quote!((#range).step_by(#s)),
        (Order::Down | Order::UpReversed, None) => quote!((#range).rev()),
        (Order::Down, Some(s)) => quote!((#range).rev().step_by(#s)),
        (Order::UpReversed, Some(s)) => quote!((#range).step_by(#s).rev()),
    }
}
