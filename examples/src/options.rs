//! The examples' command lines, NVIDIA's and the C originals' style: `-name value` pairs,
//! `-name` switches, and positional arguments. One small parser for every example and port.

use std::str::FromStr;

/// A program's options: `-name value` pairs and switches, and positional arguments.
///
/// ```
/// use offload_examples::options::Options;
///
/// let o = Options::parse_from(["-nx", "64", "-csv", "7"], &["csv"])?;
/// assert_eq!(o.num("nx", 16384usize)?, 64);
/// assert!(o.has("csv") && !o.has("check"));
/// assert_eq!(o.positional, ["7"]);
/// o.only(&["nx", "csv"], "prog [-nx N] [-csv]")?;
/// # Ok::<(), String>(())
/// ```
#[derive(Debug)]
pub struct Options {
    flags: Vec<(String, String)>,
    /// Arguments that are not options (the originals' `argv[1]`, ...).
    pub positional: Vec<String>,
}

impl Options {
    /// Reads the program's command line; `switches` take no value.
    pub fn parse(switches: &[&str]) -> Result<Self, String> {
        Self::parse_from(std::env::args().skip(1), switches)
    }

    /// Reads `args` (without the program's name); `switches` take no value. A negative
    /// number is a positional argument, not an option.
    pub fn parse_from<I, S>(args: I, switches: &[&str]) -> Result<Self, String>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut flags = Vec::new();
        let mut positional = Vec::new();
        let mut it = args.into_iter().map(Into::into);
        while let Some(a) = it.next() {
            if let Some(name) = a.strip_prefix('-').filter(|n| n.parse::<f64>().is_err()) {
                if switches.contains(&name) {
                    flags.push((name.to_string(), String::new()));
                } else {
                    let v = it.next().ok_or(format!("-{name} needs a value"))?;
                    flags.push((name.to_string(), v));
                }
            } else {
                positional.push(a);
            }
        }
        Ok(Self { flags, positional })
    }

    /// The value of `-name` (the last one given) as a number, else `default`.
    pub fn num<T: FromStr>(&self, name: &str, default: T) -> Result<T, String> {
        match self.value(name) {
            None => Ok(default),
            Some(v) => v.parse().map_err(|_| format!("-{name} wants a number, got {v:?}")),
        }
    }

    /// The value of `-name` as a number when it was given.
    pub fn num_opt<T: FromStr>(&self, name: &str) -> Result<Option<T>, String> {
        self.value(name)
            .map(|v| v.parse().map_err(|_| format!("-{name} wants a number, got {v:?}")))
            .transpose()
    }

    /// The value of `-name`, else `default`.
    pub fn text(&self, name: &str, default: &str) -> String {
        self.value(name).unwrap_or(default).to_string()
    }

    /// The value of `-name` (the last one given), if any.
    pub fn value(&self, name: &str) -> Option<&str> {
        self.flags.iter().rev().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    /// The value of `-name` mapped by `choices` (`(spelling, value)`), else `default`; an
    /// error lists the spellings.
    pub fn choice<T: Copy>(&self, name: &str, choices: &[(&str, T)], default: T) -> Result<T, String> {
        let Some(v) = self.value(name) else { return Ok(default) };
        choices.iter().find(|(s, _)| *s == v).map(|&(_, t)| t).ok_or_else(|| {
            let names: Vec<&str> = choices.iter().map(|(s, _)| *s).collect();
            format!("-{name} wants {}, got {v:?}", names.join(" or "))
        })
    }

    /// The value of `-name` as a grid of `N` counts (`-grid 2x2`, `-grid 2x1x2`), each at
    /// least 1, when it was given.
    pub fn grid<const N: usize>(&self, name: &str) -> Result<Option<[usize; N]>, String> {
        let Some(v) = self.value(name) else { return Ok(None) };
        let counts: Vec<usize> = v.split('x').filter_map(|c| c.parse().ok()).filter(|&c| c > 0).collect();
        counts.try_into().map(Some).map_err(|_| {
            format!(
                "-{name} wants {N} counts of at least 1 joined by x (as {}), got {v:?}",
                vec!["2"; N].join("x")
            )
        })
    }

    /// Whether the switch `-name` was given.
    pub fn has(&self, name: &str) -> bool {
        self.flags.iter().any(|(n, _)| n == name)
    }

    /// Refuses options outside `known`, with `usage`.
    pub fn only(&self, known: &[&str], usage: &str) -> Result<(), String> {
        match self.flags.iter().find(|(n, _)| !known.contains(&n.as_str())) {
            Some((n, _)) => Err(format!("unknown option -{n}; usage: {usage}")),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Options;

    #[test]
    fn options_switches_and_positional_arguments() {
        let o =
            Options::parse_from(["-n", "3", "-n", "5", "-halo", "memcpy", "-check", "-2.5", "x"], &["check"])
                .expect("parses");
        assert_eq!(o.num("n", 0usize), Ok(5), "the last one given counts");
        assert_eq!(o.num_opt::<usize>("ndev"), Ok(None));
        assert_eq!(o.choice("halo", &[("peer", true), ("memcpy", false)], true), Ok(false));
        assert!(o.has("check"));
        assert_eq!(o.positional, ["-2.5", "x"]);
        assert!(o.only(&["n", "halo", "check"], "u").is_ok());
        assert_eq!(o.only(&["n"], "prog -n N").unwrap_err(), "unknown option -halo; usage: prog -n N");
        let bad = Options::parse_from(["-n", "many", "-halo", "x"], &[]).expect("parses");
        assert_eq!(bad.num("n", 0usize).unwrap_err(), "-n wants a number, got \"many\"");
        assert_eq!(
            bad.choice("halo", &[("peer", 1), ("memcpy", 2)], 1).unwrap_err(),
            "-halo wants peer or memcpy, got \"x\""
        );
        assert_eq!(Options::parse_from(["-nx"], &[]).unwrap_err(), "-nx needs a value");
    }
}
