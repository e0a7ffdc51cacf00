//! `Mlp::from_safetensors`: a model written by `to_safetensors` reads back the same, and a
//! truncated file, a tensor of the wrong dtype or shape, a missing tensor and a missing
//! file each give an error that names the file and the tensor.

use offload_examples::inference::Mlp;
use safetensors::tensor::{Dtype, TensorView};

/// A file in the temporary folder, removed when dropped.
struct TempFile(std::path::PathBuf);

impl TempFile {
    fn with(what: &str, bytes: &[u8]) -> Self {
        let p =
            std::env::temp_dir().join(format!("offload-weights-{what}-{}.safetensors", std::process::id()));
        std::fs::write(&p, bytes).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        Self(p)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A file of the given tensors: (name, dtype, shape), each filled with zero bytes.
fn file_of(tensors: &[(&str, Dtype, Vec<usize>)]) -> Vec<u8> {
    let bytes: Vec<Vec<u8>> =
        tensors.iter().map(|(_, d, s)| vec![0u8; s.iter().product::<usize>() * d.bitsize() / 8]).collect();
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .zip(&bytes)
        .map(|((n, d, s), b)| (n.to_string(), TensorView::new(*d, s.clone(), b).expect("a consistent view")))
        .collect();
    safetensors::serialize(views, None).expect("serialisable")
}

#[test]
fn a_model_reads_back_as_written() {
    let model = Mlp::new(3, 16);
    let f = TempFile::with("round", &model.to_safetensors().expect("serialisable"));
    let back = Mlp::from_safetensors(&f.0).expect("reads back");
    assert_eq!((back.width, &back.weights, &back.biases), (16, &model.weights, &model.biases));
}

#[test]
fn a_truncated_file_is_an_error_naming_it() {
    let bytes = Mlp::new(2, 8).to_safetensors().expect("serialisable");
    let f = TempFile::with("cut", &bytes[..bytes.len() - 10]);
    let e = Mlp::from_safetensors(&f.0).expect_err("cut short");
    assert!(matches!(e, offload::Error::Weights { .. }), "{e}");
    assert!(e.to_string().contains(&f.0.display().to_string()) && e.to_string().contains("cut short"), "{e}");
}

#[test]
fn a_tensor_of_the_wrong_dtype_is_named() {
    let f = TempFile::with(
        "dtype",
        &file_of(&[
            ("layers.0.weight", Dtype::F32, vec![4, 4]),
            ("layers.0.bias", Dtype::F32, vec![4]),
            ("layers.1.weight", Dtype::F32, vec![4, 4]),
            ("layers.1.bias", Dtype::F64, vec![4]),
        ]),
    );
    let e = Mlp::from_safetensors(&f.0).expect_err("F64 bias");
    let want = format!("{}: tensor `layers.1.bias` is F64; expected F32", f.0.display());
    assert!(e.to_string().starts_with(&want), "{e}");
}

#[test]
fn a_missing_tensor_is_named() {
    let f = TempFile::with(
        "missing",
        &file_of(&[
            ("layers.0.weight", Dtype::F32, vec![4, 4]),
            ("layers.0.bias", Dtype::F32, vec![4]),
            ("layers.1.weight", Dtype::F32, vec![4, 4]),
        ]),
    );
    let e = Mlp::from_safetensors(&f.0).expect_err("no layers.1.bias");
    assert!(
        e.to_string().contains(
            "tensor `layers.1.bias` is missing (the file has 3 tensors: layers.0.bias, layers.0.weight, layers.1.weight)"
        ),
        "{e}"
    );
}

#[test]
fn a_tensor_of_the_wrong_shape_is_named() {
    let f = TempFile::with(
        "shape",
        &file_of(&[("layers.0.weight", Dtype::F32, vec![4, 4]), ("layers.0.bias", Dtype::F32, vec![5])]),
    );
    let e = Mlp::from_safetensors(&f.0).expect_err("a bias of 5");
    assert_eq!(
        e.to_string(),
        format!("{}: tensor `layers.0.bias` has shape [5]; the model declares [4]", f.0.display())
    );
    let f = TempFile::with("empty", &file_of(&[("other", Dtype::F32, vec![1])]));
    let e = Mlp::from_safetensors(&f.0).expect_err("no layers.0.weight");
    assert!(e.to_string().contains("no `layers.0.weight`: not an MLP of this layout"), "{e}");
}

#[test]
fn a_missing_file_is_an_error_naming_it() {
    let p = std::env::temp_dir().join("offload-no-such-weights.safetensors");
    let e = Mlp::from_safetensors(&p).expect_err("no file");
    assert!(e.to_string().contains(&p.display().to_string()) && e.to_string().contains("cannot open"), "{e}");
}
