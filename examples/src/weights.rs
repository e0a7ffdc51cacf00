//! A model's weights from a safetensors file, read through the library's
//! [`offload::weights::Weights`] (the file memory-mapped, its header checked whole): every
//! tensor the model needs is checked for its name, dtype and shape before any of it is
//! used, each failure an [`offload::Error::Weights`] that names the file and the tensor.
//!
//! The [`Mlp`]'s layout is `layers.{l}.weight` (`[width, width]`, `nn.Linear`'s `[out,
//! in]`) and `layers.{l}.bias` (`[width]`), F32, for `l` from 0 while a weight is present.

use std::collections::HashMap;
use std::path::Path;

use offload::weights::Weights;
use safetensors::tensor::{Dtype, SafeTensorError, TensorView};

use crate::inference::Mlp;

/// The name of layer `l`'s weight or bias.
fn name(l: usize, what: &str) -> String {
    format!("layers.{l}.{what}")
}

impl Mlp {
    /// Loads an MLP from safetensors file `path` (see the module documentation) through
    /// [`offload::weights::Weights`]: every layer's weight and bias, checked for name,
    /// dtype (F32) and shape; an error names the file and the tensor.
    pub fn from_safetensors(path: impl AsRef<Path>) -> Result<Self, offload::Error> {
        let weights = Weights::open(path)?;
        let width = weights
            .meta(&name(0, "weight"))
            .map_err(|_| offload::Error::Weights {
                path: weights.path().display().to_string(),
                what: "no `layers.0.weight`: not an MLP of this layout".into(),
            })?
            .shape
            .first()
            .copied()
            .unwrap_or(0);
        let (mut weights_of, mut biases) = (Vec::new(), Vec::new());
        let mut l = 0;
        while l == 0 || weights.meta(&name(l, "weight")).is_ok() {
            weights_of.push(weights.read::<f32>(&name(l, "weight"), &[width, width])?);
            biases.push(weights.read::<f32>(&name(l, "bias"), &[width])?);
            l += 1;
        }
        Ok(Self { width, weights: weights_of, biases })
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

/// Writes to `path` the state of a random `nn.Sequential` of `nn.Linear` layers of widths
/// `dims` (each followed by an activation, so its layers are `0`, `2`, `4`, ...), in F32,
/// as `safetensors.torch.save_file(model.state_dict(), path)` would: tensors
/// `{2l}.weight` (`[dims[l + 1], dims[l]]`) and `{2l}.bias`, drawn as `nn.Linear` draws
/// them (uniform within `1 / sqrt(in_features)`), from `seed`.
pub fn write_sequential(path: impl AsRef<Path>, dims: &[usize], seed: u64) -> Result<(), offload::Error> {
    let mut tensors: Vec<(String, Vec<usize>, Vec<f32>)> = Vec::new();
    for (l, d) in dims.windows(2).enumerate() {
        let bound = 1.0 / (d[0] as f32).sqrt();
        let draw = |s: u64, n: usize| -> Vec<f32> {
            crate::inference::uniform(seed.wrapping_add(s), n)
                .iter()
                .map(|u| (2.0 * u - 1.0) * bound)
                .collect()
        };
        tensors.push((format!("{}.weight", 2 * l), vec![d[1], d[0]], draw(2 * l as u64, d[1] * d[0])));
        tensors.push((format!("{}.bias", 2 * l), vec![d[1]], draw(2 * l as u64 + 1, d[1])));
    }
    let views: Vec<(&str, &[usize], &[f32])> =
        tensors.iter().map(|(n, s, v)| (n.as_str(), &s[..], &v[..])).collect();
    std::fs::write(path.as_ref(), offload::weights::serialize(&views)?).map_err(|e| offload::Error::Weights {
        path: path.as_ref().display().to_string(),
        what: format!("cannot write: {e}"),
    })
}
