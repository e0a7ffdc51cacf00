//! Library halves of the examples, shared with tests and benches: the Jacobi and 3-D
//! stencil solvers and the inference model. The runnable programs are the `[[example]]` targets of this package.

pub mod inference;
pub mod jacobi;
pub mod spin_barrier;
pub mod stencil3d;
