//! The environment, read one way for every setting: a value is trimmed of surrounding white
//! space, an empty value is the same as an unset one (the default applies), and typed values go
//! through Go's syntax ([`go_syntax`]). Every error names the variable, its value and what was
//! expected.

use std::collections::HashMap;
use std::time::Duration;

use super::Error;

/// The agent's environment (an injectable map: tests never touch the process environment).
#[derive(Clone, Copy)]
pub struct Env<'a>(pub &'a HashMap<String, String>);

impl<'a> Env<'a> {
    /// The trimmed value, `None` when unset or empty.
    pub fn get(&self, var: &str) -> Option<&'a str> {
        self.0.get(var).map(|v| v.trim()).filter(|v| !v.is_empty())
    }

    pub fn is_set(&self, var: &str) -> bool {
        self.get(var).is_some()
    }

    pub fn str(&self, var: &str, default: &str) -> String {
        self.get(var).unwrap_or(default).to_string()
    }

    /// The value untrimmed (JSON documents, probe specs): `None` when unset.
    pub fn raw(&self, var: &str) -> Option<&'a str> {
        self.0.get(var).map(String::as_str)
    }

    pub fn bool(&self, var: &str, default: bool) -> Result<bool, Error> {
        self.parse(var, default, "true or false", |v| {
            go_syntax::parse_bool(v).map_err(|_| ())
        })
    }

    pub fn port(&self, var: &str, default: u16) -> Result<u16, Error> {
        self.parse(var, default, "a port number 0-65535", |v| {
            v.parse::<u16>().map_err(|_| ())
        })
    }

    pub fn u32(&self, var: &str, default: u32) -> Result<u32, Error> {
        self.parse(var, default, "a non-negative integer", |v| {
            v.parse::<u32>().map_err(|_| ())
        })
    }

    /// A ratio in `[0, 1]`.
    pub fn ratio(&self, var: &str, default: f64) -> Result<f64, Error> {
        self.parse(var, default, "a number between 0 and 1", |v| {
            v.parse::<f64>()
                .ok()
                .filter(|f| (0.0..=1.0).contains(f))
                .ok_or(())
        })
    }

    /// A Go duration at least `min`.
    pub fn duration(&self, var: &str, default: Duration, min: Duration) -> Result<Duration, Error> {
        let Some(v) = self.get(var) else {
            return Ok(default);
        };
        match go_syntax::parse_duration(v) {
            Ok(d) if d >= min => Ok(d),
            Ok(_) => Err(self.invalid(var, v, &format!("a duration of at least {min:?}"))),
            Err(why) => {
                Err(self.invalid(var, v, &format!("{} ({why})", go_syntax::DURATION_EXPECTED)))
            }
        }
    }

    /// `<PREFIX><K>=<V>` pairs as `(K, V)`, sorted by key (`XDS_HEADER_`, `CA_HEADER_`).
    pub fn prefixed(&self, prefix: &str) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = self
            .0
            .iter()
            .filter_map(|(k, v)| {
                k.strip_prefix(prefix)
                    .filter(|k| !k.is_empty())
                    .map(|k| (k.to_string(), v.clone()))
            })
            .collect();
        out.sort();
        out
    }

    pub fn invalid(&self, var: &str, value: &str, expected: &str) -> Error {
        Error::Env {
            var: var.to_string(),
            value: value.to_string(),
            expected: expected.to_string(),
        }
    }

    fn parse<T>(
        &self,
        var: &str,
        default: T,
        expected: &str,
        f: impl FnOnce(&str) -> Result<T, ()>,
    ) -> Result<T, Error> {
        match self.get(var) {
            None => Ok(default),
            Some(v) => f(v).map_err(|()| self.invalid(var, v, expected)),
        }
    }
}
