//! The environment, read one way for every setting: a value is trimmed of surrounding white
//! space, an empty value is the same as an unset one (the default applies), and typed values go
//! through Go's syntax ([`go_syntax`]).
//!
//! A typed value that does not parse (or is out of its range) is what Istio's `pkg/env` makes
//! of it: a warning naming the variable, the value and the default used, and the default. Each
//! such fallback is recorded ([`Fallbacks`]) and counted in
//! `istio_agent_env_parse_errors_total{variable}` ([`Metrics`]). With
//! `ISTIO_AGENT_STRICT_ENV=true` (not in Istio) it is an error naming the variable, its value
//! and what was expected, and the agent does not start.

use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt::Debug;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use super::Error;

/// The switch (not in Istio, off by default) that turns a typed value that does not parse into
/// an error instead of a warning and the default.
pub const STRICT_ENV: &str = "ISTIO_AGENT_STRICT_ENV";

/// Whether an unparsable value is an error, and the variables whose default replaced a value
/// that did not parse.
#[derive(Debug, Default)]
pub struct Fallbacks {
    strict: bool,
    used: RefCell<Vec<String>>,
}

impl Fallbacks {
    /// Reads [`STRICT_ENV`] from `vars`. A value of its own that does not parse is warned about
    /// and recorded like any other, and leaves strict mode off.
    pub fn new(vars: &HashMap<String, String>) -> Fallbacks {
        let lenient = Fallbacks::default();
        let strict = Env::new(vars, &lenient)
            .bool(STRICT_ENV, false)
            .unwrap_or(false);
        Fallbacks {
            strict,
            used: lenient.used,
        }
    }

    /// The variables whose default was used instead of their value, in the order read.
    pub fn into_variables(self) -> Vec<String> {
        self.used.into_inner()
    }
}

/// `variable`: the environment variable whose value did not parse.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VariableLabel {
    variable: String,
}

/// `env_parse_errors_total{variable}` (under the agent's `istio_agent_` prefix): environment
/// values that did not parse, each replaced by its variable's default.
#[derive(Debug, Clone, Default)]
pub struct Metrics {
    parse_errors: Family<VariableLabel, Counter>,
}

impl Metrics {
    pub fn new(registry: &mut Registry) -> Self {
        let m = Metrics::default();
        registry.register(
            "env_parse_errors",
            "Environment variable values that did not parse; the variable's default was used",
            m.parse_errors.clone(),
        );
        m
    }

    /// Counts each variable of `variables` (a [`super::Config`]'s `env_fallbacks`).
    pub fn record(&self, variables: &[String]) {
        for variable in variables {
            self.parse_errors
                .get_or_create(&VariableLabel {
                    variable: variable.clone(),
                })
                .inc();
        }
    }
}

/// The agent's environment (an injectable map: tests never touch the process environment),
/// and what becomes of a value that does not parse.
#[derive(Clone, Copy)]
pub struct Env<'a> {
    vars: &'a HashMap<String, String>,
    fallbacks: &'a Fallbacks,
}

impl<'a> Env<'a> {
    pub fn new(vars: &'a HashMap<String, String>, fallbacks: &'a Fallbacks) -> Self {
        Env { vars, fallbacks }
    }

    /// Every variable, as given.
    pub fn vars(&self) -> &'a HashMap<String, String> {
        self.vars
    }

    /// The trimmed value, `None` when unset or empty.
    pub fn get(&self, var: &str) -> Option<&'a str> {
        self.vars
            .get(var)
            .map(|v| v.trim())
            .filter(|v| !v.is_empty())
    }

    pub fn is_set(&self, var: &str) -> bool {
        self.get(var).is_some()
    }

    pub fn str(&self, var: &str, default: &str) -> String {
        self.get(var).unwrap_or(default).to_string()
    }

    /// The value untrimmed (JSON documents, probe specs): `None` when unset.
    pub fn raw(&self, var: &str) -> Option<&'a str> {
        self.vars.get(var).map(String::as_str)
    }

    pub fn bool(&self, var: &str, default: bool) -> Result<bool, Error> {
        self.parse(var, default, "true or false", |v| {
            go_syntax::parse_bool(v).ok()
        })
    }

    pub fn port(&self, var: &str, default: u16) -> Result<u16, Error> {
        self.parse(var, default, "a port number 0-65535", |v| {
            v.parse::<u16>().ok()
        })
    }

    pub fn u32(&self, var: &str, default: u32) -> Result<u32, Error> {
        self.parse(var, default, "a non-negative integer", |v| {
            v.parse::<u32>().ok()
        })
    }

    /// A ratio in `[0, 1]`.
    pub fn ratio(&self, var: &str, default: f64) -> Result<f64, Error> {
        self.parse(var, default, "a number between 0 and 1", |v| {
            v.parse::<f64>().ok().filter(|f| (0.0..=1.0).contains(f))
        })
    }

    /// A Go duration at least `min`.
    pub fn duration(&self, var: &str, default: Duration, min: Duration) -> Result<Duration, Error> {
        let Some(v) = self.get(var) else {
            return Ok(default);
        };
        match go_syntax::parse_duration(v) {
            Ok(d) if d >= min => Ok(d),
            Ok(_) => self.fallback(var, v, default, &format!("a duration of at least {min:?}")),
            Err(why) => self.fallback(
                var,
                v,
                default,
                &format!("{} ({why})", go_syntax::DURATION_EXPECTED),
            ),
        }
    }

    /// `<PREFIX><K>=<V>` pairs as `(K, V)`, sorted by key (`XDS_HEADER_`, `CA_HEADER_`).
    pub fn prefixed(&self, prefix: &str) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = self
            .vars
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

    /// The error for a value that is refused in both modes (it has no default to fall back
    /// on, or a default would hide a real mistake).
    pub fn invalid(&self, var: &str, value: &str, expected: &str) -> Error {
        Error::Env {
            var: var.to_string(),
            value: value.to_string(),
            expected: expected.to_string(),
        }
    }

    /// The value of `var` read by `f`; `default` when unset, and when `f` refuses it (warned
    /// and recorded; an error in strict mode).
    pub fn parse<T: Debug>(
        &self,
        var: &str,
        default: T,
        expected: &str,
        f: impl FnOnce(&str) -> Option<T>,
    ) -> Result<T, Error> {
        match self.get(var) {
            None => Ok(default),
            Some(v) => match f(v) {
                Some(t) => Ok(t),
                None => self.fallback(var, v, default, expected),
            },
        }
    }

    /// `value` of `var` did not parse: the default, as Istio's `pkg/env`, or in strict mode the
    /// error.
    fn fallback<T: Debug>(
        &self,
        var: &str,
        value: &str,
        default: T,
        expected: &str,
    ) -> Result<T, Error> {
        if self.fallbacks.strict {
            return Err(self.invalid(var, value, expected));
        }
        tracing::warn!(
            variable = var,
            value,
            expected,
            default = ?default,
            "invalid environment variable value: using the default ({STRICT_ENV}=true makes this an error)"
        );
        self.fallbacks.used.borrow_mut().push(var.to_string());
        Ok(default)
    }
}
