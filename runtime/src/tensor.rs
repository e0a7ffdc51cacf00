//! Tensors: a name, a shape and row-major strides over elements of one type, wherever the
//! elements live.
//!
//! * [`Tensor`]: a view of device memory (a mapped view inside a region, a
//!   [`DeviceBuffer`], device scratch) with its shape: what the ready kernels of
//!   `offload_kernels::ops` take. Cheap to clone; [`Tensor::t`], [`Tensor::narrow`],
//!   [`Tensor::reshape`] and [`Tensor::rows`] make other views of the same elements.
//! * [`DeviceTensor`]: a [`DeviceBuffer`] that knows its shape (weights placed once,
//!   activations, scratch).
//! * [`HostTensor`]: a `Vec` that knows its shape (what [`crate::weights::Weights::tensor`]
//!   reads, what a program copies back).
//!
//! Every shape is checked when a tensor is made (the elements hold it exactly) and when an
//! op takes it; an error is an [`Error::Shape`] that names the routine and the tensor.
//!
//! ```
//! use offload::tensor::{DeviceTensor, HostTensor};
//! use offload::Runtime;
//!
//! let rt = Runtime::builder().host_devices(1).build()?;
//! let dev = rt.device(0)?;
//! let w = HostTensor::new("fc.weight", &[2, 3], vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0])?;
//! let w = DeviceTensor::from_host(&dev, &w)?;
//! let view = w.view();
//! assert_eq!(view.dims(), [2, 3]);
//! // The transpose is a view with swapped strides, no copy.
//! let t = view.t()?;
//! assert_eq!((t.dims(), t.strides()), (&[3, 2][..], &[1, 3][..]));
//! assert_eq!(t.name(), "fc.weight^T");
//! // An op declares the shape it wants; the error names the tensor.
//! let e = view.expect_dims("linear", &[3, 2], "out_features x in_features").unwrap_err();
//! assert_eq!(
//!     e.to_string(),
//!     "linear: tensor `fc.weight` has shape [2, 3]; expected [3, 2] (out_features x in_features)"
//! );
//! # Ok::<(), offload::Error>(())
//! ```

use std::fmt;
use std::sync::Arc;

use crate::api::{Device, DeviceBuffer, DeviceSlice};
use crate::error::{Error, Result};
use crate::kernel::DeviceCopy;

/// A tensor's dimensions (outermost first) and the step in elements between neighbours
/// along each (row-major: the last dimension's step is 1).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Shape {
    dims: Vec<usize>,
    strides: Vec<usize>,
}

impl Shape {
    /// The row-major shape of `dims`. An error when the element count overflows.
    pub fn new(dims: &[usize]) -> Result<Self> {
        let mut strides = vec![0; dims.len()];
        let mut step = 1usize;
        for (s, &d) in strides.iter_mut().zip(dims).rev() {
            *s = step;
            step = step.checked_mul(d).ok_or_else(|| Error::Overflow {
                routine: "Shape::new",
                what: format!("the element count of {dims:?}"),
            })?;
        }
        Ok(Self { dims: dims.to_vec(), strides })
    }

    /// The dimensions, outermost first.
    pub fn dims(&self) -> &[usize] {
        &self.dims
    }

    /// The steps in elements, one per dimension.
    pub fn strides(&self) -> &[usize] {
        &self.strides
    }

    /// The number of dimensions.
    pub fn rank(&self) -> usize {
        self.dims.len()
    }

    /// The number of elements (1 for a scalar's empty shape).
    pub fn numel(&self) -> usize {
        // Cannot overflow: every shape is made from a checked row-major one by steps that
        // only narrow or permute it.
        self.dims.iter().product()
    }

    /// Whether the elements lie in row-major order with no gaps.
    pub fn is_contiguous(&self) -> bool {
        let mut step = 1;
        for (&d, &s) in self.dims.iter().zip(&self.strides).rev() {
            if d != 1 && s != step {
                return false;
            }
            step *= d;
        }
        true
    }

    /// Elements from the first to just past the last one the shape reaches (0 when it has
    /// none).
    pub fn span(&self) -> usize {
        if self.numel() == 0 {
            return 0;
        }
        1 + self.dims.iter().zip(&self.strides).map(|(&d, &s)| (d - 1) * s).sum::<usize>()
    }

    /// The last dimension (1 for a scalar).
    pub fn last(&self) -> usize {
        self.dims.last().copied().unwrap_or(1)
    }

    /// The elements over all but the last dimension: the rows a row-wise op works.
    pub fn rows(&self) -> usize {
        self.dims.iter().rev().skip(1).product()
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.dims)
    }
}

impl fmt::Debug for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_contiguous() {
            write!(f, "{:?}", self.dims)
        } else {
            write!(f, "{:?} (strides {:?})", self.dims, self.strides)
        }
    }
}

/// A shape error of tensor `tensor` in `routine`.
fn shape_error(routine: &'static str, tensor: &str, what: String) -> Error {
    Error::Shape { routine, tensor: tensor.to_string(), what }
}

/// What an op takes as a tensor: a [`Tensor`] view, or a [`DeviceTensor`] viewed whole.
pub trait AsTensor<T> {
    /// The tensor as a view.
    fn as_tensor(&self) -> Tensor<'_, T>;
}

impl<T> AsTensor<T> for Tensor<'_, T> {
    fn as_tensor(&self) -> Tensor<'_, T> {
        self.clone()
    }
}

impl<T: DeviceCopy> AsTensor<T> for DeviceTensor<'_, T> {
    fn as_tensor(&self) -> Tensor<'_, T> {
        self.view()
    }
}

/// A named, shaped view of elements in one device's memory: what the ready kernels take.
/// It borrows what it views (a mapped region's view, a [`DeviceBuffer`]) as a
/// [`DeviceSlice`] does; cloning it is cheap.
pub struct Tensor<'a, T> {
    name: Arc<str>,
    /// From the tensor's first element to at least the last one its shape reaches.
    data: DeviceSlice<'a, T>,
    shape: Shape,
}

impl<T> Clone for Tensor<'_, T> {
    fn clone(&self) -> Self {
        Self { name: self.name.clone(), data: self.data, shape: self.shape.clone() }
    }
}

impl<T> fmt::Debug for Tensor<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tensor `{}` {:?} on device {}", self.name, self.shape, self.data.device())
    }
}

impl<'a, T> Tensor<'a, T> {
    /// View `data` as a row-major tensor of `dims` called `name` (the name errors give).
    /// An error unless `data` holds exactly the elements of `dims`.
    ///
    /// ```
    /// use offload::tensor::Tensor;
    /// use offload::{map, Runtime};
    ///
    /// let rt = Runtime::builder().host_devices(1).build()?;
    /// let dev = rt.device(0)?;
    /// let x = vec![0.5f32; 12];
    /// dev.data(map::to(&x), |xv| {
    ///     let x = Tensor::new("x", xv, &[3, 4])?;
    ///     assert_eq!((x.rows(), x.last()), (3, 4));
    ///     let e = Tensor::new("x", xv, &[4, 4]).unwrap_err();
    ///     assert!(e.to_string().contains("tensor `x` of shape [4, 4] needs 16 elements; its view holds 12"), "{e}");
    ///     Ok(())
    /// })?;
    /// # Ok::<(), offload::Error>(())
    /// ```
    pub fn new(name: impl Into<Arc<str>>, data: DeviceSlice<'a, T>, dims: &[usize]) -> Result<Self> {
        let name = name.into();
        let shape = Shape::new(dims)?;
        if shape.numel() != data.len() {
            return Err(shape_error(
                "Tensor::new",
                &name,
                format!("of shape {shape} needs {} elements; its view holds {}", shape.numel(), data.len()),
            ));
        }
        Ok(Self { name, data, shape })
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The same view under another name.
    pub fn named(mut self, name: impl Into<Arc<str>>) -> Self {
        self.name = name.into();
        self
    }

    /// Its shape.
    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    /// Its dimensions, outermost first.
    pub fn dims(&self) -> &[usize] {
        self.shape.dims()
    }

    /// Its strides in elements.
    pub fn strides(&self) -> &[usize] {
        self.shape.strides()
    }

    /// Its element count.
    pub fn numel(&self) -> usize {
        self.shape.numel()
    }

    /// Its last dimension ([`Shape::last`]).
    pub fn last(&self) -> usize {
        self.shape.last()
    }

    /// The rows a row-wise op works ([`Shape::rows`]).
    pub fn rows(&self) -> usize {
        self.shape.rows()
    }

    /// The device whose memory it views.
    pub fn device(&self) -> usize {
        self.data.device()
    }

    /// The view from its first element on, to at least the last one its shape reaches
    /// (further, for a view [`Tensor::narrow`]ed along an inner dimension).
    pub fn storage(&self) -> DeviceSlice<'a, T> {
        self.data
    }

    /// Its elements as a flat view, for a row-major tensor; `routine` (named in the error)
    /// refuses a strided one (a transpose, an inner narrowing).
    pub fn contiguous(&self, routine: &'static str) -> Result<DeviceSlice<'a, T>> {
        if !self.shape.is_contiguous() {
            return Err(shape_error(
                routine,
                &self.name,
                format!("is a strided view ({:?}); expected a row-major tensor", self.shape),
            ));
        }
        self.data.slice(..self.numel())
    }

    /// An error, from `routine`, unless the tensor's dimensions are `want` (`what` says
    /// what they are, for the message).
    pub fn expect_dims(&self, routine: &'static str, want: &[usize], what: &str) -> Result<()> {
        if self.dims() != want {
            return Err(shape_error(
                routine,
                &self.name,
                format!("has shape {}; expected {want:?} ({what})", self.shape),
            ));
        }
        Ok(())
    }

    /// The transpose of the last two dimensions: the same elements with those strides
    /// swapped, named `name^T`. An error for a tensor of fewer than two dimensions.
    pub fn t(&self) -> Result<Self> {
        let r = self.shape.rank();
        if r < 2 {
            return Err(shape_error(
                "Tensor::t",
                &self.name,
                format!("has shape {}; expected 2 dimensions or more", self.shape),
            ));
        }
        let mut shape = self.shape.clone();
        shape.dims.swap(r - 2, r - 1);
        shape.strides.swap(r - 2, r - 1);
        Ok(Self { name: format!("{}^T", self.name).into(), data: self.data, shape })
    }

    /// Elements `start..start + len` of dimension `dim`, as `x.narrow(dim, start, len)` in
    /// PyTorch: the first `kv_len` positions of a KV cache, say.
    pub fn narrow(&self, dim: usize, start: usize, len: usize) -> Result<Self> {
        let in_range =
            dim < self.shape.rank() && start.checked_add(len).is_some_and(|e| e <= self.dims()[dim]);
        if !in_range {
            return Err(shape_error(
                "Tensor::narrow",
                &self.name,
                format!("has shape {}; expected dimension {dim} to hold {start}..{start}+{len}", self.shape),
            ));
        }
        let mut shape = self.shape.clone();
        shape.dims[dim] = len;
        // A narrowed tensor with no elements keeps its view's start: nothing is read.
        let offset = if len == 0 { 0 } else { start * shape.strides[dim] };
        Ok(Self { name: self.name.clone(), data: self.data.slice(offset..)?, shape })
    }

    /// Rows `range` of the outermost dimension (a micro-batch of a batch, say).
    pub fn rows_range(&self, range: std::ops::Range<usize>) -> Result<Self> {
        if self.shape.rank() == 0 || range.start > range.end {
            return Err(shape_error(
                "Tensor::rows_range",
                &self.name,
                format!("has shape {}; expected rows {range:?} of its first dimension", self.shape),
            ));
        }
        self.narrow(0, range.start, range.end - range.start)
    }

    /// The same elements as a row-major tensor of `dims` (of the same element count), as
    /// `x.view(dims)` in PyTorch; an error for a strided view.
    pub fn reshape(&self, dims: &[usize]) -> Result<Self> {
        let flat = self.contiguous("Tensor::reshape")?;
        let shape = Shape::new(dims)?;
        if shape.numel() != self.numel() {
            return Err(shape_error(
                "Tensor::reshape",
                &self.name,
                format!("has shape {} ({} elements); cannot view it as {dims:?}", self.shape, self.numel()),
            ));
        }
        Ok(Self { name: self.name.clone(), data: flat, shape })
    }
}

/// A [`DeviceBuffer`] that knows its name and shape.
pub struct DeviceTensor<'rt, T: DeviceCopy> {
    name: Arc<str>,
    buffer: DeviceBuffer<'rt, T>,
    shape: Shape,
}

impl<T: DeviceCopy> fmt::Debug for DeviceTensor<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DeviceTensor `{}` {:?} on device {}", self.name, self.shape, self.buffer.device().number())
    }
}

impl<'rt, T: DeviceCopy> DeviceTensor<'rt, T> {
    /// A tensor of `dims` in `device`'s memory with unspecified contents (see
    /// [`DeviceBuffer::new`]): scratch and outputs.
    #[track_caller]
    pub fn new(device: &Device<'rt>, name: impl Into<Arc<str>>, dims: &[usize]) -> Result<Self> {
        let shape = Shape::new(dims)?;
        Ok(Self { name: name.into(), buffer: DeviceBuffer::new(device, shape.numel())?, shape })
    }

    /// A device copy of `host`, under its name and shape.
    #[track_caller]
    pub fn from_host(device: &Device<'rt>, host: &HostTensor<T>) -> Result<Self> {
        Ok(Self {
            name: host.name.clone(),
            buffer: DeviceBuffer::from_slice(device, &host.data)?,
            shape: host.shape.clone(),
        })
    }

    /// `buffer` as a tensor of `dims` called `name`; an error unless it holds exactly the
    /// elements of `dims`.
    pub fn from_buffer(
        name: impl Into<Arc<str>>,
        buffer: DeviceBuffer<'rt, T>,
        dims: &[usize],
    ) -> Result<Self> {
        let name = name.into();
        let shape = Shape::new(dims)?;
        if shape.numel() != buffer.len() {
            return Err(shape_error(
                "DeviceTensor::from_buffer",
                &name,
                format!(
                    "of shape {shape} needs {} elements; its buffer holds {}",
                    shape.numel(),
                    buffer.len()
                ),
            ));
        }
        Ok(Self { name, buffer, shape })
    }

    /// The tensor as a view for the ops and kernels.
    pub fn view(&self) -> Tensor<'_, T> {
        Tensor { name: self.name.clone(), data: self.buffer.view(), shape: self.shape.clone() }
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its dimensions.
    pub fn dims(&self) -> &[usize] {
        self.shape.dims()
    }

    /// Its buffer.
    pub fn buffer(&self) -> &DeviceBuffer<'rt, T> {
        &self.buffer
    }

    /// Its buffer, for writes from the host ([`DeviceBuffer::write`]).
    pub fn buffer_mut(&mut self) -> &mut DeviceBuffer<'rt, T> {
        &mut self.buffer
    }

    /// Its elements copied to the host, with its name and shape.
    pub fn to_host(&self) -> Result<HostTensor<T>> {
        Ok(HostTensor { name: self.name.clone(), data: self.buffer.to_vec()?, shape: self.shape.clone() })
    }
}

/// Elements in host memory with a name and a row-major shape.
#[derive(Clone, PartialEq)]
pub struct HostTensor<T> {
    name: Arc<str>,
    data: Vec<T>,
    shape: Shape,
}

impl<T> fmt::Debug for HostTensor<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HostTensor `{}` {:?}", self.name, self.shape)
    }
}

impl<T> HostTensor<T> {
    /// `data` as a row-major tensor of `dims` called `name`; an error unless it holds
    /// exactly the elements of `dims`.
    pub fn new(name: impl Into<Arc<str>>, dims: &[usize], data: Vec<T>) -> Result<Self> {
        let name = name.into();
        let shape = Shape::new(dims)?;
        if shape.numel() != data.len() {
            return Err(shape_error(
                "HostTensor::new",
                &name,
                format!("of shape {shape} needs {} elements; {} were given", shape.numel(), data.len()),
            ));
        }
        Ok(Self { name, data, shape })
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its dimensions.
    pub fn dims(&self) -> &[usize] {
        self.shape.dims()
    }

    /// Its elements, row-major.
    pub fn data(&self) -> &[T] {
        &self.data
    }

    /// Its elements, row-major, to change in place.
    pub fn data_mut(&mut self) -> &mut [T] {
        &mut self.data
    }

    /// Its elements, row-major.
    pub fn into_vec(self) -> Vec<T> {
        self.data
    }
}
