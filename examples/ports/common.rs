//! What the three ports share: their command lines, the timing of repeated runs and C's
//! `%g`, so that their output reads like the originals'.

#![allow(dead_code)]

pub use offload_examples::options::Options;

/// The examples' runtime (GPUs, else host devices) and the device to run on: `-device D`,
/// else the first.
pub fn runtime(o: &Options) -> Result<(offload::Runtime, usize), Box<dyn std::error::Error>> {
    let rt = offload_examples::example_runtime()?;
    let dev = o.num("device", offload_examples::example_devices(&rt, Some(1))[0])?;
    Ok((rt, dev))
}

/// The median of `v` (the mean of the middle two for an even count).
pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

/// C's `%g` (and `std::cout`'s default) with 6 significant digits.
pub fn g6(x: f64) -> String {
    if x == 0.0 || !x.is_finite() {
        return format!("{x}");
    }
    let e = x.abs().log10().floor() as i32;
    // Round first: 9.999995 prints as 10 (exponent 1), as C does.
    let r: f64 = format!("{:.5e}", x).parse().unwrap_or(x);
    let e = if r != 0.0 { r.abs().log10().floor() as i32 } else { e };
    if !(-4..6).contains(&e) {
        let s = format!("{:.5e}", x);
        let (m, ex) = s.split_once('e').unwrap_or((&s, "0"));
        let m = trim_zeros(m);
        let ex: i32 = ex.parse().unwrap_or(0);
        format!("{m}e{}{:02}", if ex < 0 { '-' } else { '+' }, ex.abs())
    } else {
        let decimals = (5 - e).max(0) as usize;
        trim_zeros(&format!("{x:.decimals$}")).to_string()
    }
}

/// C's `%.{digits}e` (`-1.285936924e+04`; Rust's `{:e}` writes `e4`).
pub fn c_exp(x: f64, digits: usize) -> String {
    let s = format!("{x:.digits$e}");
    match s.split_once('e') {
        Some((m, e)) => {
            let e: i32 = e.parse().unwrap_or(0);
            format!("{m}e{}{:02}", if e < 0 { '-' } else { '+' }, e.abs())
        }
        None => s,
    }
}

fn trim_zeros(s: &str) -> &str {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.')
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn g6_prints_as_c() {
        for (x, want) in [
            (0.00781059, "0.00781059"),
            (3.91109e-05, "3.91109e-05"),
            (1.0, "1"),
            (123456.7, "123457"),
            (1234567.0, "1.23457e+06"),
            (0.0001, "0.0001"),
            (9.999996, "10"),
        ] {
            assert_eq!(super::g6(x), want);
        }
        assert_eq!(super::c_exp(-12859.36924, 9), "-1.285936924e+04");
        assert_eq!(super::c_exp(9.9e-7, 2), "9.90e-07");
    }
}
