//! What one batch of a [`Pipeline`](super::Pipeline) writes: one output, or a tuple of
//! outputs of their own element types (probabilities `f32` and classes `u32`), each
//! mapped `from` on the batch's device and copied back on its copy-out lane.

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
        }
    };
}
outputs_tuple!(A: 0, B: 1);
outputs_tuple!(A: 0, B: 1, C: 2);
