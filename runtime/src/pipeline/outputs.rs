//! What one batch of a [`Pipeline`](super::Pipeline) writes: one output, or a tuple of
//! outputs of their own element types (probabilities `f32` and classes `u32`), each
//! mapped `from` on the batch's device and copied back on its copy-out lane; and what each
//! request of a server ([`Pipeline::serve`](super::Pipeline::serve)) gets back of them
//! ([`RowOutputs`]).

use std::marker::PhantomData;

use crate::api::{DeviceSlice, HostBuffer, Map, MapList};
use crate::data_env::MapType;
use crate::kernel::DeviceCopy;
use crate::nowait::ExitList;

/// One output of a batch: the host memory its device view is copied back into.
pub trait BatchOutput: Send {
    /// The element type.
    type Elem: DeviceCopy;
    /// The memory copied back into.
    fn out_slice(&mut self) -> &mut [Self::Elem];
}

impl<T: DeviceCopy> BatchOutput for Vec<T> {
    type Elem = T;
    fn out_slice(&mut self) -> &mut [T] {
        self
    }
}

impl<T: DeviceCopy> BatchOutput for Box<[T]> {
    type Elem = T;
    fn out_slice(&mut self) -> &mut [T] {
        self
    }
}

impl<T: DeviceCopy> BatchOutput for &mut [T] {
    type Elem = T;
    fn out_slice(&mut self) -> &mut [T] {
        self
    }
}

impl<T: DeviceCopy, const N: usize> BatchOutput for [T; N] {
    type Elem = T;
    fn out_slice(&mut self) -> &mut [T] {
        self
    }
}

impl<T: DeviceCopy> BatchOutput for HostBuffer<T> {
    type Elem = T;
    fn out_slice(&mut self) -> &mut [T] {
        self
    }
}

/// Everything one batch writes: a [`BatchOutput`] (its view a [`DeviceSlice`]), or a tuple
/// of two or three (their views a tuple of [`DeviceSlice`]s in the same order).
pub trait BatchOutputs: Send {
    /// The views' types, which name no lifetime of the outputs themselves: [`One`] or a
    /// tuple of them.
    type Shape: OutputShape;
    /// The outputs' `from` maps, in order.
    type Maps<'a>: MapList<'a, Views = OutputViews<'a, Self>> + Send + 'a
    where
        Self: 'a;
    /// Maps every output `from` (over an exclusive borrow: copied back after the batch).
    fn maps(&mut self) -> Self::Maps<'_>;
    /// Every output's length in elements, in order.
    fn lens(&mut self) -> Vec<usize>;
}

/// The device views of outputs `O` that a batch's `compute` receives.
pub type OutputViews<'a, O> = <<O as BatchOutputs>::Shape as OutputShape>::Views<'a>;

/// The device views of a batch's outputs, by their element types: [`One<T>`] for one
/// output, a tuple for several. (Apart from [`BatchOutputs`] so that `compute`'s bound can
/// name the views for every lifetime without the outputs living for all of them.)
pub trait OutputShape {
    /// The views.
    type Views<'a>: ExitList + Copy + Send + 'a;
}

/// One output of elements `T`, as an [`OutputShape`].
#[derive(Debug)]
pub struct One<T>(PhantomData<T>);

impl<T: DeviceCopy> OutputShape for One<T> {
    type Views<'a> = DeviceSlice<'a, T>;
}

impl<O: BatchOutput> BatchOutputs for O {
    type Shape = One<O::Elem>;
    type Maps<'a>
        = Map<'a, O::Elem>
    where
        O: 'a;
    fn maps(&mut self) -> Self::Maps<'_> {
        Map::exclusive(self.out_slice(), MapType::FROM)
    }
    fn lens(&mut self) -> Vec<usize> {
        vec![self.out_slice().len()]
    }
}

macro_rules! outputs_tuple {
    ($($n:ident : $i:tt),+) => {
        impl<$($n: OutputShape),+> OutputShape for ($($n,)+) {
            type Views<'a> = ($($n::Views<'a>,)+);
        }

        impl<$($n: BatchOutput),+> BatchOutputs for ($($n,)+) {
            type Shape = ($(One<$n::Elem>,)+);
            type Maps<'a> = ($(Map<'a, $n::Elem>,)+) where Self: 'a;
            fn maps(&mut self) -> Self::Maps<'_> {
                ($(Map::exclusive(self.$i.out_slice(), MapType::FROM),)+)
            }
            fn lens(&mut self) -> Vec<usize> {
                vec![$(self.$i.out_slice().len()),+]
            }
        }
    };
}
outputs_tuple!(A: 0, B: 1);
outputs_tuple!(A: 0, B: 1, C: 2);

/// What each request of a [`Pipeline::serve`](super::Pipeline::serve) gets back, named by
/// the outputs' element types: `T` for one output, `(A, B)` or `(A, B, C)` for several
/// (probabilities `f32` and a class `u32`). Each output of a batch is mapped `from` and
/// copied back on the copy-out lane, then cut into the requests' rows. Implemented for
/// every [`DeviceCopy`] type with a [`Default`] (the value a batch's buffers start with)
/// and tuples of two or three of them; sealed.
pub trait RowOutputs: Send + Sized + sealed::Sealed {
    /// Elements of each request's row of every output: a `usize`, or a tuple of them in
    /// the outputs' order (each at least 1).
    type RowLens: Copy + std::fmt::Debug + Eq + Send + Sync;
    /// A request's rows: a `Vec`, or a tuple of them in the outputs' order.
    type Rows: Send;
    /// The device views of a batch's outputs that `compute` receives, as for
    /// [`BatchOutputs`] (of element types only, so it outlives any borrow).
    type Shape: OutputShape + 'static;
    /// A batch's outputs on the host, copied back into.
    type Buffers: BatchOutputs<Shape = Self::Shape>;
    /// Each output's row length, in order.
    fn lens(lens: Self::RowLens) -> Vec<usize>;
    /// Outputs for `rows` rows (`rows * len` elements each).
    fn buffers(rows: usize, lens: Self::RowLens) -> Self::Buffers;
    /// `buffers` cut or grown to `rows` rows, keeping their memory.
    fn resize(buffers: &mut Self::Buffers, rows: usize, lens: Self::RowLens);
    /// Rows `first..first + count` of every output (a request's rows), one after another.
    fn rows(buffers: &Self::Buffers, first: usize, count: usize, lens: Self::RowLens) -> Self::Rows;
}

mod sealed {
    /// Keeps [`RowOutputs`](super::RowOutputs) to the element types and tuples of this module.
    pub trait Sealed {}
    impl<T: crate::kernel::DeviceCopy + Default> Sealed for T {}
    impl<A, B> Sealed for (A, B) {}
    impl<A, B, C> Sealed for (A, B, C) {}
}

/// Row `i` of `len` elements of `buffer`.
fn row_of<T: Copy>(buffer: &[T], first: usize, count: usize, len: usize) -> Vec<T> {
    buffer[first * len..(first + count) * len].to_vec()
}

impl<T: DeviceCopy + Default> RowOutputs for T {
    type RowLens = usize;
    type Rows = Vec<T>;
    type Shape = One<T>;
    type Buffers = Vec<T>;
    fn lens(lens: usize) -> Vec<usize> {
        vec![lens]
    }
    fn buffers(rows: usize, lens: usize) -> Vec<T> {
        vec![T::default(); rows * lens]
    }
    fn resize(buffers: &mut Vec<T>, rows: usize, lens: usize) {
        buffers.resize(rows * lens, T::default());
    }
    fn rows(buffers: &Vec<T>, first: usize, count: usize, lens: usize) -> Vec<T> {
        row_of(buffers, first, count, lens)
    }
}

macro_rules! row_outputs_tuple {
    ($($n:ident : $i:tt),+) => {
        impl<$($n: DeviceCopy + Default),+> RowOutputs for ($($n,)+) {
            type RowLens = ($(row_outputs_tuple!(@usize $n),)+);
            type Rows = ($(Vec<$n>,)+);
            type Shape = ($(One<$n>,)+);
            type Buffers = ($(Vec<$n>,)+);
            fn lens(lens: Self::RowLens) -> Vec<usize> {
                vec![$(lens.$i),+]
            }
            fn buffers(rows: usize, lens: Self::RowLens) -> Self::Buffers {
                ($(vec![$n::default(); rows * lens.$i],)+)
            }
            fn resize(buffers: &mut Self::Buffers, rows: usize, lens: Self::RowLens) {
                $(buffers.$i.resize(rows * lens.$i, $n::default());)+
            }
            fn rows(buffers: &Self::Buffers, first: usize, count: usize, lens: Self::RowLens) -> Self::Rows {
                ($(row_of(&buffers.$i, first, count, lens.$i),)+)
            }
        }
    };
    (@usize $n:ident) => { usize };
}
row_outputs_tuple!(A: 0, B: 1);
row_outputs_tuple!(A: 0, B: 1, C: 2);
