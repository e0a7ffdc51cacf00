//! `offload::weights`: tensors of a safetensors file by name and declared shape, in their
//! stored type or converted among F32, F16 and BF16, onto every device; and each way a
//! file or a tensor can be wrong refused with an error naming the file and the tensor.

use std::path::PathBuf;

use offload::half::{bf16, f16};
use offload::weights::{serialize, TensorMeta, Weights};
use offload_tests::{check, on_every_device};

/// A file of this process's temporary folder, removed when dropped.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

impl AsRef<std::path::Path> for Scratch {
    fn as_ref(&self) -> &std::path::Path {
        &self.0
    }
}

/// A fresh file named `name` with `bytes`, in a folder of this process.
fn file(name: &str, bytes: &[u8]) -> Scratch {
    let dir = std::env::temp_dir().join(format!("offload-weights-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary folder");
    let path = dir.join(name);
    std::fs::write(&path, bytes).expect("a temporary file");
    Scratch(path)
}

/// A safetensors file by hand: `header` (JSON) then `data`, as the format lays them out.
fn raw(header: &str, data: &[u8]) -> Vec<u8> {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out
}

fn values(n: usize) -> Vec<f32> {
    (0..n).map(|k| ((k as f32) * 0.731).sin() * 3.0 + 1.0 / 3.0).collect()
}

#[test]
fn tensors_come_back_as_stored_or_converted_once() {
    let v = values(24);
    let b: Vec<bf16> = v.iter().map(|&x| bf16::from_f32(x)).collect();
    let h: Vec<f16> = v.iter().map(|&x| f16::from_f32(x)).collect();
    let paths = [
        file("f32.safetensors", &serialize(&[("w", &[4, 6], &v[..])]).unwrap()),
        file("bf16.safetensors", &serialize(&[("w", &[4, 6], &b[..])]).unwrap()),
        file("f16.safetensors", &serialize(&[("w", &[4, 6], &h[..])]).unwrap()),
    ];
    let [f32s, bf16s, f16s] = paths.each_ref().map(|p| Weights::open(p).unwrap());
    assert_eq!(f32s.meta("w").unwrap(), TensorMeta { dtype: "F32".into(), shape: vec![4, 6] });
    assert_eq!(bf16s.meta("w").unwrap().dtype, "BF16");
    // In the stored type: exactly.
    assert_eq!(f32s.read::<f32>("w", &[4, 6]).unwrap(), v);
    assert_eq!(bf16s.read::<bf16>("w", &[4, 6]).unwrap(), b);
    assert_eq!(f16s.read::<f16>("w", &[4, 6]).unwrap(), h);
    // Converted: narrower rounded once from the exact value, wider exactly.
    assert_eq!(f32s.read_converted::<bf16>("w", &[4, 6]).unwrap(), b);
    assert_eq!(f32s.read_converted::<f16>("w", &[4, 6]).unwrap(), h);
    let wide: Vec<f32> = bf16s.read_converted("w", &[4, 6]).unwrap();
    assert_eq!(wide, b.iter().map(|x| x.to_f32()).collect::<Vec<_>>());
    let across: Vec<bf16> = f16s.read_converted("w", &[4, 6]).unwrap();
    assert_eq!(across, h.iter().map(|x| bf16::from_f32(x.to_f32())).collect::<Vec<_>>());
}

#[test]
fn a_tensor_that_is_not_what_the_model_declares_is_refused_naming_it() {
    let v = values(6);
    let path = file(
        "two.safetensors",
        &serialize(&[("fc.weight", &[2, 3], &v[..]), ("fc.bias", &[2], &v[..2])]).unwrap(),
    );
    let w = Weights::open(&path).unwrap();
    let msg = |e: offload::Error| e.to_string();
    let e = msg(w.read::<f32>("fc.weight", &[3, 2]).unwrap_err());
    assert!(
        e.contains("two.safetensors: tensor `fc.weight` has shape [2, 3]; the model declares [3, 2]"),
        "{e}"
    );
    let e = msg(w.read::<f32>("fc.wieght", &[2, 3]).unwrap_err());
    assert!(e.contains("tensor `fc.wieght` is missing (the file has 2 tensors: fc.bias, fc.weight)"), "{e}");
    let e = msg(w.read::<bf16>("fc.bias", &[2]).unwrap_err());
    assert!(e.contains("tensor `fc.bias` is F32; expected BF16 (read_converted converts"), "{e}");
    // A tensor of integers is not converted.
    let ids = file(
        "ids.safetensors",
        &raw(r#"{"ids":{"dtype":"I64","shape":[2],"data_offsets":[0,16]}}"#, &[0; 16]),
    );
    let w = Weights::open(&ids).unwrap();
    assert_eq!(w.meta("ids").unwrap().dtype, "I64");
    let e = msg(w.read_converted::<f32>("ids", &[2]).unwrap_err());
    assert!(e.contains("tensor `ids` is I64; expected F32, F16 or BF16"), "{e}");
}

#[test]
fn a_file_that_is_cut_short_damaged_or_absent_is_refused_before_any_read() {
    let v = values(8);
    let whole = serialize(&[("w", &[8], &v[..])]).unwrap();
    let msg = |p: Scratch| Weights::open(&p).unwrap_err().to_string();
    let e = msg(file("short.safetensors", &whole[..whole.len() - 3]));
    assert!(e.contains("short.safetensors: not a safetensors file, or cut short"), "{e}");
    let mut long = whole.clone();
    long.push(0);
    assert!(msg(file("long.safetensors", &long)).contains("not a safetensors file"));
    assert!(msg(file("header.safetensors", &whole[..5])).contains("not a safetensors file"));
    let e = msg(file("json.safetensors", &raw("{not json", &[])));
    assert!(e.contains("not a safetensors file"), "{e}");
    // Ranges that overlap, or a size that does not match the shape.
    let bad = raw(
        r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#,
        &[0; 12],
    );
    assert!(msg(file("overlap.safetensors", &bad)).contains("not a safetensors file"));
    let bad = raw(r#"{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#, &[0; 8]);
    assert!(msg(file("size.safetensors", &bad)).contains("not a safetensors file"));
    let e = msg(Scratch(std::env::temp_dir().join("offload-no-such-dir/none.safetensors")));
    assert!(e.contains("none.safetensors: cannot open"), "{e}");
}

#[test]
fn a_tensor_goes_onto_every_device_once() {
    let v = values(300);
    let path = file("device.safetensors", &serialize(&[("emb", &[30, 10], &v[..])]).unwrap());
    let w = Weights::open(&path).unwrap();
    on_every_device("weights onto a device", |rt, d| {
        let dev = rt.device(d)?;
        let b = w.to_device::<bf16>(&dev, "emb", &[30, 10])?;
        check!(b.len() == 300);
        let back = b.to_vec()?;
        check!(back == v.iter().map(|&x| bf16::from_f32(x)).collect::<Vec<_>>());
        check!(w.to_device::<f32>(&dev, "emb", &[300]).is_err());
        Ok(())
    });
}
