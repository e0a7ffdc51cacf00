//! A model's weights from a safetensors file (Hugging Face's format: a little-endian JSON
//! header giving each tensor's dtype, shape and byte range, then the bytes), as PyTorch's
//! `safetensors.torch.save_file` writes it.
//!
//! [`Weights::open`] maps the file and checks the whole header first (every range inside
//! the file, no overlap, no byte missing or left over), so a truncated or damaged file is
//! refused before any tensor is read. A tensor is then taken by name with the shape the
//! model declares ([`Weights::read`] in its stored type, [`Weights::read_converted`]
//! converting among F32, F16 and BF16, [`Weights::to_device`] straight onto a device);
//! every failure is an [`Error::Weights`] that names the file and the tensor.
//!
//! ```
//! use offload::half::bf16;
//! use offload::weights::Weights;
//!
//! # let dir = std::env::temp_dir().join(format!("offload-weights-doc-{}", std::process::id()));
//! # std::fs::create_dir_all(&dir).unwrap();
//! # let path = dir.join("mlp.safetensors");
//! // A file as `safetensors.torch.save_file({"fc.weight": w, "fc.bias": b}, path)` writes it.
//! let w: Vec<f32> = (0..6).map(|i| i as f32 * 0.5).collect();
//! let bytes = offload::weights::serialize(&[("fc.weight", &[2, 3], &w), ("fc.bias", &[2], &[1.0, -1.0])])?;
//! std::fs::write(&path, bytes).unwrap();
//!
//! let weights = Weights::open(&path)?;
//! assert_eq!(weights.names(), ["fc.bias", "fc.weight"]);
//! let fc: Vec<f32> = weights.read("fc.weight", &[2, 3])?;
//! assert_eq!(fc, w);
//! // Stored as F32, wanted in bf16: rounded to nearest even, once.
//! let half: Vec<bf16> = weights.read_converted("fc.weight", &[2, 3])?;
//! assert_eq!(half[1], bf16::from_f32(0.5));
//! // The model declares [3, 2]: a transposed weight is refused, naming it.
//! let e = weights.read::<f32>("fc.weight", &[3, 2]).unwrap_err();
//! assert!(e.to_string().contains("tensor `fc.weight` has shape [2, 3]; the model declares [3, 2]"), "{e}");
//! # std::fs::remove_dir_all(&dir).unwrap();
//! # Ok::<(), offload::Error>(())
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use safetensors::tensor::{Dtype, TensorInfo};
use safetensors::SafeTensors;

use crate::api::{Device, DeviceBuffer};
use crate::error::{Error, Result};
use crate::gemm::{ElementType, GemmElement};
use crate::tensor::{DeviceTensor, HostTensor};

/// The tensors of one safetensors file, mapped read-only.
pub struct Weights {
    path: PathBuf,
    map: memmap2::Mmap,
    /// Where the tensors' bytes start in the file (after the header).
    data: usize,
    tensors: BTreeMap<String, TensorInfo>,
}

impl std::fmt::Debug for Weights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Weights").field("path", &self.path).field("tensors", &self.tensors.len()).finish()
    }
}

/// What a tensor of the file is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorMeta {
    /// Its dtype as safetensors names it (`"F32"`, `"BF16"`, `"I64"`, ...).
    pub dtype: String,
    /// Its shape, outermost first.
    pub shape: Vec<usize>,
}

impl Weights {
    /// Maps safetensors file `path` and checks its header whole (see the module
    /// documentation).
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let fail = |what: String| Error::Weights { path: path.display().to_string(), what };
        let file = std::fs::File::open(&path).map_err(|e| fail(format!("cannot open: {e}")))?;
        // SAFETY: the mapping is read-only and its length fixed here; a file another
        // process changes meanwhile gives other values, never a read outside the mapping
        // (every tensor's range is checked against this length before it is read).
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| fail(format!("cannot map: {e}")))?;
        let (header, metadata) = SafeTensors::read_metadata(&map)
            .map_err(|e| fail(format!("not a safetensors file, or cut short: {e}")))?;
        let tensors = metadata.tensors().into_iter().map(|(name, info)| (name, info.clone())).collect();
        Ok(Self { path, data: 8 + header, map, tensors })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The tensors' names, sorted.
    pub fn names(&self) -> Vec<&str> {
        self.tensors.keys().map(String::as_str).collect()
    }

    /// Tensor `name`'s dtype and shape.
    pub fn meta(&self, name: &str) -> Result<TensorMeta> {
        let info = self.info(name)?;
        Ok(TensorMeta { dtype: format!("{:?}", info.dtype), shape: info.shape.clone() })
    }

    /// Tensor `name` of shape `shape`, stored as `T` (F32 for `f32`, F16 for [`half::f16`],
    /// BF16 for [`half::bf16`]): its values exactly as stored.
    pub fn read<T: GemmElement>(&self, name: &str, shape: &[usize]) -> Result<Vec<T>> {
        let (info, bytes) = self.bytes(name, shape)?;
        let stored = element_type(info.dtype);
        if stored != Some(T::TYPE) {
            return Err(self.error(
                name,
                format!(
                    "is {:?}; expected {} (read_converted converts F32, F16 and BF16)",
                    info.dtype,
                    dtype_name(T::TYPE)
                ),
            ));
        }
        Ok(convert(bytes, T::TYPE))
    }

    /// Tensor `name` of shape `shape`, stored as F32, F16 or BF16, converted to `T`: a
    /// narrower type rounded to nearest even once (as `half::bf16::from_f32` does), a
    /// wider one exactly.
    pub fn read_converted<T: GemmElement>(&self, name: &str, shape: &[usize]) -> Result<Vec<T>> {
        let (info, bytes) = self.bytes(name, shape)?;
        let stored = element_type(info.dtype).ok_or_else(|| {
            self.error(name, format!("is {:?}; expected F32, F16 or BF16 (a float tensor)", info.dtype))
        })?;
        Ok(convert(bytes, stored))
    }

    /// Tensor `name` of shape `shape` ([`Weights::read_converted`]) in a new buffer of
    /// `device`'s memory, copied once.
    pub fn to_device<'rt, T: GemmElement>(
        &self,
        device: &Device<'rt>,
        name: &str,
        shape: &[usize],
    ) -> Result<DeviceBuffer<'rt, T>> {
        let values: Vec<T> = self.read_converted(name, shape)?;
        DeviceBuffer::from_slice(device, &values)
    }

    /// Tensor `name` of the shape the model declares, `dims` ([`Weights::read_converted`]),
    /// as a [`HostTensor`] under its name.
    pub fn tensor<T: GemmElement>(&self, name: &str, dims: &[usize]) -> Result<HostTensor<T>> {
        HostTensor::new(name, dims, self.read_converted(name, dims)?)
    }

    /// Tensor `name` of the shape the model declares, `dims`, converted to `T` and copied
    /// once into a new [`DeviceTensor`] on `device`.
    ///
    /// ```
    /// use offload::half::bf16;
    /// use offload::weights::{serialize, Weights};
    /// use offload::Runtime;
    ///
    /// # let dir = std::env::temp_dir().join(format!("offload-weights-tensor-{}", std::process::id()));
    /// # std::fs::create_dir_all(&dir).unwrap();
    /// # let path = dir.join("fc.safetensors");
    /// std::fs::write(&path, serialize(&[("fc.weight", &[4, 2], &[0.25f32; 8])])?).unwrap();
    /// let rt = Runtime::builder().host_devices(1).build()?;
    /// let w = Weights::open(&path)?.device_tensor::<bf16>(&rt.device(0)?, "fc.weight", &[4, 2])?;
    /// assert_eq!((w.name(), w.dims()), ("fc.weight", &[4, 2][..]));
    /// # std::fs::remove_dir_all(&dir).unwrap();
    /// # Ok::<(), offload::Error>(())
    /// ```
    #[track_caller]
    pub fn device_tensor<'rt, T: GemmElement>(
        &self,
        device: &Device<'rt>,
        name: &str,
        dims: &[usize],
    ) -> Result<DeviceTensor<'rt, T>> {
        DeviceTensor::from_host(device, &self.tensor(name, dims)?)
    }

    fn info(&self, name: &str) -> Result<&TensorInfo> {
        self.tensors.get(name).ok_or_else(|| {
            let names = self.names();
            let shown = names.iter().take(8).copied().collect::<Vec<_>>().join(", ");
            let more = if names.len() > 8 { ", ..." } else { "" };
            self.error(name, format!("is missing (the file has {} tensors: {shown}{more})", names.len()))
        })
    }

    /// Tensor `name`'s metadata and bytes, its shape checked against `shape`.
    fn bytes(&self, name: &str, shape: &[usize]) -> Result<(&TensorInfo, &[u8])> {
        let info = self.info(name)?;
        if info.shape != shape {
            return Err(self.error(name, format!("has shape {:?}; the model declares {shape:?}", info.shape)));
        }
        let (start, end) = info.data_offsets;
        let bytes = start
            .checked_add(self.data)
            .zip(end.checked_add(self.data))
            .and_then(|(s, e)| self.map.get(s..e))
            .ok_or_else(|| self.error(name, format!("bytes {start}..{end} lie outside the file")))?;
        Ok((info, bytes))
    }

    fn error(&self, name: &str, what: String) -> Error {
        Error::Weights { path: self.path.display().to_string(), what: format!("tensor `{name}` {what}") }
    }
}

/// The element type of a float dtype this module converts.
fn element_type(d: Dtype) -> Option<ElementType> {
    match d {
        Dtype::F32 => Some(ElementType::F32),
        Dtype::F16 => Some(ElementType::F16),
        Dtype::BF16 => Some(ElementType::Bf16),
        _ => None,
    }
}

/// The safetensors name of an element type.
fn dtype_name(t: ElementType) -> &'static str {
    match t {
        ElementType::F32 => "F32",
        ElementType::F16 => "F16",
        ElementType::Bf16 => "BF16",
    }
}

/// Little-endian values of type `stored` in `bytes`, as `T` (exact when `T` is `stored`
/// or wider, else rounded once from the exact f32 value).
fn convert<T: GemmElement>(bytes: &[u8], stored: ElementType) -> Vec<T> {
    match stored {
        ElementType::F32 => {
            bytes.chunks_exact(4).map(|b| T::from_f32(f32::from_le_bytes([b[0], b[1], b[2], b[3]]))).collect()
        }
        ElementType::F16 => bytes
            .chunks_exact(2)
            .map(|b| T::from_f32(half::f16::from_le_bytes([b[0], b[1]]).to_f32()))
            .collect(),
        ElementType::Bf16 => bytes
            .chunks_exact(2)
            .map(|b| T::from_f32(half::bf16::from_le_bytes([b[0], b[1]]).to_f32()))
            .collect(),
    }
}

/// A safetensors file's bytes holding `tensors` (name, shape, values), each stored in its
/// own type (F32, F16 or BF16): what `safetensors.torch.save_file` writes for such
/// tensors. For tests and for saving what a program computed.
pub fn serialize<T: GemmElement>(tensors: &[(&str, &[usize], &[T])]) -> Result<Vec<u8>> {
    let fail = |what: String| Error::InvalidArgument { routine: "weights::serialize", what };
    let bytes: Vec<Vec<u8>> = tensors
        .iter()
        .map(|(_, _, values)| {
            values
                .iter()
                .flat_map(|v| match T::TYPE {
                    ElementType::F32 => v.to_f32().to_le_bytes().to_vec(),
                    ElementType::F16 => half::f16::from_f32(v.to_f32()).to_le_bytes().to_vec(),
                    ElementType::Bf16 => half::bf16::from_f32(v.to_f32()).to_le_bytes().to_vec(),
                })
                .collect()
        })
        .collect();
    let dtype = match T::TYPE {
        ElementType::F32 => Dtype::F32,
        ElementType::F16 => Dtype::F16,
        ElementType::Bf16 => Dtype::BF16,
    };
    let views = tensors
        .iter()
        .zip(&bytes)
        .map(|((name, shape, _), b)| {
            safetensors::tensor::TensorView::new(dtype, shape.to_vec(), b)
                .map(|v| (name.to_string(), v))
                .map_err(|e| fail(format!("tensor `{name}` of shape {shape:?}: {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    safetensors::serialize(views, None).map_err(|e| fail(e.to_string()))
}
