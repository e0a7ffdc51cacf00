//! A model's weights from a safetensors file (Hugging Face's format: a JSON header naming
//! each tensor's dtype, shape and byte range, then the bytes): the file is memory-mapped,
//! and every tensor the model needs is checked for its name, dtype and shape before any
//! of it is used, each failure an error that names the tensor.
//!
//! The [`Mlp`]'s layout is `layers.{l}.weight` (`[width, width]`, `nn.Linear`'s `[out,
//! in]`) and `layers.{l}.bias` (`[width]`), F32, for `l` from 0 while a weight is present.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use safetensors::tensor::{Dtype, SafeTensorError, TensorView};
use safetensors::SafeTensors;

use crate::inference::Mlp;

/// Why weights could not be loaded: each names the file, and the tensor where one is at
/// fault.
#[derive(Debug, thiserror::Error)]
pub enum WeightsError {
    /// The file could not be opened or mapped.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// The file is not a whole safetensors file (truncated, a header that is not one, ...).
    #[error("{path}: not a safetensors file, or cut short: {source}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What the parser said.
        source: SafeTensorError,
    },
    /// A tensor the model needs is not in the file.
    #[error("{path}: tensor `{name}` is missing (the file has {found} tensors: {names})")]
    Missing {
        /// The file.
        path: PathBuf,
        /// The tensor.
        name: String,
        /// How many tensors the file has.
        found: usize,
        /// The file's tensor names, sorted (the first 8).
        names: String,
    },
    /// A tensor of another dtype than the model's.
    #[error("{path}: tensor `{name}` is {found:?}; expected {expected:?}")]
    Dtype {
        /// The file.
        path: PathBuf,
        /// The tensor.
        name: String,
        /// Its dtype in the file.
        found: Dtype,
        /// The model's.
        expected: Dtype,
    },
    /// A tensor of another shape than the model's.
    #[error("{path}: tensor `{name}` has shape {found:?}; expected {expected:?}")]
    Shape {
        /// The file.
        path: PathBuf,
        /// The tensor.
        name: String,
        /// Its shape in the file.
        found: Vec<usize>,
        /// The model's.
        expected: Vec<usize>,
    },
    /// No layer at all.
    #[error("{path}: no `layers.0.weight`: not an MLP of this layout")]
    Empty {
        /// The file.
        path: PathBuf,
    },
}

/// The name of layer `l`'s weight or bias.
fn name(l: usize, what: &str) -> String {
    format!("layers.{l}.{what}")
}

/// An F32 tensor's values (little-endian, as safetensors stores them).
fn floats(t: &TensorView<'_>) -> Vec<f32> {
    t.data().chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

impl Mlp {
    /// Loads an MLP from safetensors file `path` (see the module documentation): every
    /// layer's weight and bias, checked for name, dtype and shape.
    pub fn from_safetensors(path: impl AsRef<Path>) -> Result<Self, WeightsError> {
        let path = path.as_ref();
        let io = |source| WeightsError::Io { path: path.to_path_buf(), source };
        let file = std::fs::File::open(path).map_err(io)?;
        // SAFETY: the map is read only while this function runs, and the file is not one
        // the program writes meanwhile; a file changed underneath by another process gives
        // wrong values, never a read outside the mapping (its length is fixed here).
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        let tensors = SafeTensors::deserialize(&map)
            .map_err(|source| WeightsError::Format { path: path.to_path_buf(), source })?;
        let get = |name: String, shape: &[usize]| -> Result<Vec<f32>, WeightsError> {
            let t = tensors.tensor(&name).map_err(|_| {
                let mut names = tensors.names();
                names.sort_unstable();
                let found = names.len();
                let names = names.into_iter().take(8).collect::<Vec<_>>().join(", ");
                WeightsError::Missing { path: path.to_path_buf(), name: name.clone(), found, names }
            })?;
            if t.dtype() != Dtype::F32 {
                return Err(WeightsError::Dtype {
                    path: path.to_path_buf(),
                    name,
                    found: t.dtype(),
                    expected: Dtype::F32,
                });
            }
            if t.shape() != shape {
                let (found, expected) = (t.shape().to_vec(), shape.to_vec());
                return Err(WeightsError::Shape { path: path.to_path_buf(), name, found, expected });
            }
            Ok(floats(&t))
        };
        let first = tensors
            .tensor(&name(0, "weight"))
            .map_err(|_| WeightsError::Empty { path: path.to_path_buf() })?;
        let width = first.shape().first().copied().unwrap_or(0);
        let (mut weights, mut biases) = (Vec::new(), Vec::new());
        let mut l = 0;
        while l == 0 || tensors.tensor(&name(l, "weight")).is_ok() {
            weights.push(get(name(l, "weight"), &[width, width])?);
            biases.push(get(name(l, "bias"), &[width])?);
            l += 1;
        }
        Ok(Self { width, weights, biases })
    }

    /// The model as safetensors bytes, in the layout [`Mlp::from_safetensors`] reads.
    pub fn to_safetensors(&self) -> Result<Vec<u8>, SafeTensorError> {
        let bytes: Vec<(String, Vec<u8>, Vec<usize>)> = self
            .weights
            .iter()
            .zip(&self.biases)
            .enumerate()
            .flat_map(|(l, (w, b))| {
                let le = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
                [
                    (name(l, "weight"), le(w), vec![self.width, self.width]),
                    (name(l, "bias"), le(b), vec![self.width]),
                ]
            })
            .collect();
        let views = bytes
            .iter()
            .map(|(n, b, s)| TensorView::new(Dtype::F32, s.clone(), b).map(|v| (n.clone(), v)))
            .collect::<Result<Vec<_>, _>>()?;
        safetensors::serialize(
            views,
            Some(HashMap::from([("format".to_string(), "offload-mlp".to_string())])),
        )
    }
}
