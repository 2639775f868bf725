//! A subset of Go's `text/template` (plus the sprig functions and `toJSON` Istio registers) over
//! a [`serde_json::Value`] data model, enough to render Istio-style bootstrap templates.
//!
//! Supported: text and `{{ }}` actions, `{{-` / `-}}` trimming, `{{/* comments */}}`, field
//! chains (`.a.b`, `$.a`, `$x.a`), variables (`$x := p`, `$x = p`), pipelines (`p | f a`),
//! parenthesised pipelines, string/number/bool/nil literals, `if`/`else if`/`else`, `range`
//! (arrays, maps in key order, integers; `$i, $v :=`; `else`; `break`/`continue`),
//! `with`/`else with`/`else`,
//! and the functions `and or not eq ne lt le gt ge len index print printf println js html
//! urlquery` (Go) and `toJSON toJson quote squote default empty join contains hasPrefix
//! hasSuffix trim trimPrefix trimSuffix upper lower replace toString` (Istio/sprig). `toJson`
//! and `toJSON` encode as Go's `encoding/json` does (HTML characters escaped, integral numbers
//! without a fraction).
//!
//! Parts: [`lex`] (text and action tokens), [`parse`] (the node tree), [`exec`] (walking it over
//! the data), [`funcs`] (the callable functions) and [`format`] (Go's printing and escaping).
//!
//! Like Go with the default `missingkey` option (Istio sets none), a missing key or nil value
//! prints as `<no value>`. Maps print in Go's `map[k:v]` form and lists as `[a b]`.
//! `define`/`template`/`block` are not supported and are reported as parse errors.
//! Errors carry the line:column of the offending action and never panic.

use serde_json::Value;

/// A parse or execution error, positioned at `line:col` (1-based, columns in characters).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("template parse error at {line}:{col}: {msg}")]
    Parse {
        line: usize,
        col: usize,
        msg: String,
    },
    #[error("template execution error at {line}:{col}: {msg}")]
    Exec {
        line: usize,
        col: usize,
        msg: String,
    },
}

use exec::Exec;
use lex::lex;
use parse::{Node, Parser};

/// Maximum nesting of blocks and parentheses (bounds recursion on hostile input).
const MAX_DEPTH: usize = 100;

/// A parsed template.
#[derive(Debug, Clone)]
pub struct Template {
    src: String,
    nodes: Vec<Node>,
}

impl Template {
    /// Parses `src`.
    pub fn parse(src: &str) -> Result<Template, Error> {
        let items = lex(src)?;
        let mut p = Parser {
            src,
            items,
            i: 0,
            depth: 0,
        };
        let (nodes, end) = p.list()?;
        if let Some((kw, pos)) = end {
            return Err(perr(src, pos, format!("unexpected {{{{{kw}}}}}")));
        }
        Ok(Template {
            src: src.to_string(),
            nodes,
        })
    }

    /// Executes the template with `data` as `.` and `$`.
    pub fn render(&self, data: &Value) -> Result<String, Error> {
        let mut ex = Exec {
            src: &self.src,
            vars: vec![("$".to_string(), data.clone())],
            out: String::new(),
        };
        ex.walk(&self.nodes, data)?;
        Ok(ex.out)
    }
}

/// Parses and renders `src` in one step.
pub fn render(src: &str, data: &Value) -> Result<String, Error> {
    Template::parse(src)?.render(data)
}

fn line_col(src: &str, pos: usize) -> (usize, usize) {
    let pos = pos.min(src.len());
    let mut start = pos;
    while !src.is_char_boundary(start) {
        start -= 1;
    }
    let before = &src[..start];
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().unwrap_or("").chars().count() + 1;
    (line, col)
}

fn perr(src: &str, pos: usize, msg: impl Into<String>) -> Error {
    let (line, col) = line_col(src, pos);
    Error::Parse {
        line,
        col,
        msg: msg.into(),
    }
}

mod exec;
mod format;
mod funcs;
mod lex;
mod parse;

#[cfg(test)]
mod tests;
