//! A subset of Go's `text/template` (plus the sprig functions and `toJSON` Istio registers) over
//! a [`serde_json::Value`] data model, enough to render Istio-style bootstrap templates.
//!
//! Supported: text and `{{ }}` actions, `{{-` / `-}}` trimming, `{{/* comments */}}`, field
//! chains (`.a.b`, `$.a`, `$x.a`), variables (`$x := p`, `$x = p`), pipelines (`p | f a`),
//! parenthesised pipelines, string/number/bool/nil literals, `if`/`else if`/`else`, `range`
//! (arrays, maps in key order, integers; `$i, $v :=`; `else`; `break`/`continue`),
//! `with`/`else with`/`else`,
//! and the functions `and or not eq ne lt le gt ge len index print printf println` (Go) and
//! `toJSON toJson quote squote default empty join contains hasPrefix hasSuffix trim trimPrefix
//! trimSuffix upper lower replace toString` (Istio/sprig).
//!
//! Like Go with the default `missingkey` option (Istio sets none), a missing key or nil value
//! prints as `<no value>`. Maps print in Go's `map[k:v]` form and lists as `[a b]`.
//! `define`/`template`/`block` are not supported and are reported as parse errors.
//! Errors carry the line:column of the offending action and never panic.

use std::fmt::Write as _;

use serde_json::{Map, Value};

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

// ---------------------------------------------------------------------------------------------
// Lexer: text and actions, each action a list of tokens.

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    /// `.a.b` (empty for `.`).
    Field(Vec<String>),
    /// `$name` with an optional field chain (`$` alone is the root).
    Var(String, Vec<String>),
    Ident(String),
    Str(String),
    Num(Value),
    Pipe,
    LParen,
    /// `)` with a field chain following it, as in `(index .a 0).b`.
    RParen(Vec<String>),
    Declare,
    Assign,
    Comma,
}

#[derive(Debug)]
enum Item {
    Text(String),
    Action { toks: Vec<(Tok, usize)>, pos: usize },
}

fn lex(src: &str) -> Result<Vec<Item>, Error> {
    let b = src.as_bytes();
    let mut items = Vec::new();
    let mut i = 0;
    let mut trim_next = false;
    loop {
        let next = src[i..].find("{{").map(|o| i + o);
        let text_end = next.unwrap_or(src.len());
        let mut text = &src[i..text_end];
        if trim_next {
            text = text.trim_start_matches([' ', '\t', '\r', '\n']);
        }
        let Some(open) = next else {
            if !text.is_empty() {
                items.push(Item::Text(text.to_string()));
            }
            return Ok(items);
        };
        let mut j = open + 2;
        if b.get(j) == Some(&b'-') && b.get(j + 1).is_some_and(|c| is_space(*c)) {
            text = text.trim_end_matches([' ', '\t', '\r', '\n']);
            j += 2;
        }
        if !text.is_empty() {
            items.push(Item::Text(text.to_string()));
        }
        // Comment: `{{/* ... */}}`, optionally trimmed.
        let k = skip_space(b, j);
        if src[k..].starts_with("/*") {
            let Some(close) = src[k + 2..].find("*/").map(|o| k + 2 + o + 2) else {
                return Err(perr(src, open, "unclosed comment"));
            };
            let (end, trim) = close_delim(b, skip_space(b, close))
                .ok_or_else(|| perr(src, close, "comment ends with */ but not */}}"))?;
            trim_next = trim;
            i = end;
            continue;
        }
        let (toks, end, trim) = lex_action(src, j, open)?;
        trim_next = trim;
        items.push(Item::Action { toks, pos: open });
        i = end;
    }
}

fn is_space(c: u8) -> bool {
    matches!(c, b' ' | b'\t' | b'\r' | b'\n')
}

fn skip_space(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && is_space(b[i]) {
        i += 1;
    }
    i
}

/// At `i` (after spaces): `}}` or `-}}` (the latter only after a space). Returns the index after
/// the delimiter and whether it trims.
fn close_delim(b: &[u8], i: usize) -> Option<(usize, bool)> {
    if b[i..].starts_with(b"}}") {
        Some((i + 2, false))
    } else if b[i..].starts_with(b"-}}") && i > 0 && is_space(b[i - 1]) {
        Some((i + 3, true))
    } else {
        None
    }
}

/// An action's tokens (with their offsets), the offset after `}}` and whether it trims.
type LexedAction = (Vec<(Tok, usize)>, usize, bool);

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

fn lex_action(src: &str, mut i: usize, open: usize) -> Result<LexedAction, Error> {
    let b = src.as_bytes();
    let mut toks = Vec::new();
    loop {
        i = skip_space(b, i);
        if i >= b.len() {
            return Err(perr(src, open, "unclosed action: expected }}"));
        }
        if let Some((end, trim)) = close_delim(b, i) {
            return Ok((toks, end, trim));
        }
        let start = i;
        let c = b[i];
        let tok = match c {
            b'|' => {
                i += 1;
                Tok::Pipe
            }
            b'(' => {
                i += 1;
                Tok::LParen
            }
            b')' => {
                i += 1;
                let (chain, e) = lex_chain(src, i)?;
                i = e;
                Tok::RParen(chain)
            }
            b',' => {
                i += 1;
                Tok::Comma
            }
            b':' if b.get(i + 1) == Some(&b'=') => {
                i += 2;
                Tok::Declare
            }
            b'=' => {
                i += 1;
                Tok::Assign
            }
            b'.' if !b.get(i + 1).is_some_and(u8::is_ascii_digit) => {
                if b.get(i + 1).is_some_and(|c| is_ident(*c)) {
                    let (chain, e) = lex_chain(src, i)?;
                    i = e;
                    Tok::Field(chain)
                } else {
                    i += 1;
                    Tok::Field(Vec::new())
                }
            }
            b'$' => {
                i += 1;
                while i < b.len() && is_ident(b[i]) {
                    i += 1;
                }
                let name = src[start..i].to_string();
                let (chain, e) = lex_chain(src, i)?;
                i = e;
                Tok::Var(name, chain)
            }
            b'"' => {
                let (s, e) = lex_string(src, i)?;
                i = e;
                Tok::Str(s)
            }
            b'`' => {
                let Some(e) = src[i + 1..].find('`').map(|o| i + 1 + o) else {
                    return Err(perr(src, start, "unterminated raw string"));
                };
                let s = src[i + 1..e].to_string();
                i = e + 1;
                Tok::Str(s)
            }
            b'\'' => return Err(perr(src, start, "character constants are not supported")),
            c if c.is_ascii_digit() || c == b'-' || c == b'+' || c == b'.' => {
                i += 1;
                while i < b.len()
                    && (is_ident(b[i])
                        || b[i] == b'.'
                        || ((b[i] == b'-' || b[i] == b'+') && matches!(b[i - 1], b'e' | b'E')))
                {
                    i += 1;
                }
                Tok::Num(parse_number(&src[start..i]).ok_or_else(|| {
                    perr(
                        src,
                        start,
                        format!("bad number syntax: {:?}", &src[start..i]),
                    )
                })?)
            }
            c if c.is_ascii_alphabetic() || c == b'_' => {
                while i < b.len() && is_ident(b[i]) {
                    i += 1;
                }
                Tok::Ident(src[start..i].to_string())
            }
            _ => {
                let ch = src[i..].chars().next().unwrap_or('?');
                return Err(perr(src, start, format!("unexpected {ch:?} in action")));
            }
        };
        toks.push((tok, start));
    }
}

/// `.a.b.c` starting at `i` (possibly empty).
fn lex_chain(src: &str, mut i: usize) -> Result<(Vec<String>, usize), Error> {
    let b = src.as_bytes();
    let mut chain = Vec::new();
    while b.get(i) == Some(&b'.') {
        let s = i + 1;
        let mut e = s;
        while e < b.len() && is_ident(b[e]) {
            e += 1;
        }
        if e == s {
            return Err(perr(src, i, "expected a field name after '.'"));
        }
        chain.push(src[s..e].to_string());
        i = e;
    }
    Ok((chain, i))
}

fn lex_string(src: &str, start: usize) -> Result<(String, usize), Error> {
    let mut out = String::new();
    let mut chars = src[start + 1..].char_indices();
    while let Some((o, c)) = chars.next() {
        match c {
            '"' => return Ok((out, start + 1 + o + 1)),
            '\n' => break,
            '\\' => {
                let Some((_, e)) = chars.next() else { break };
                let ch = crate::config::go_escape(e, &mut chars.by_ref().map(|(_, c)| c));
                let ch = ch.ok_or_else(|| {
                    let at = start + 1 + o;
                    match e {
                        'x' | 'u' | 'U' => perr(src, at, "bad escape in string"),
                        _ => perr(src, at, format!("unknown escape \\{e}")),
                    }
                })?;
                out.push(ch);
            }
            c => out.push(c),
        }
    }
    Err(perr(src, start, "unterminated quoted string"))
}

fn parse_number(s: &str) -> Option<Value> {
    let (neg, digits) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let digits = digits.replace('_', "");
    let int = if let Some(h) = digits
        .strip_prefix("0x")
        .or_else(|| digits.strip_prefix("0X"))
    {
        i64::from_str_radix(h, 16).ok()
    } else if let Some(o) = digits.strip_prefix("0o") {
        i64::from_str_radix(o, 8).ok()
    } else {
        digits.parse::<i64>().ok()
    };
    if let Some(n) = int {
        return Some(Value::from(if neg { -n } else { n }));
    }
    if digits.parse::<u64>().is_ok() && !neg {
        return digits.parse::<u64>().ok().map(Value::from);
    }
    let f: f64 = digits.parse().ok().filter(|f: &f64| f.is_finite())?;
    if !digits
        .bytes()
        .all(|c| c.is_ascii_digit() || matches!(c, b'.' | b'e' | b'E' | b'-' | b'+'))
    {
        return None;
    }
    serde_json::Number::from_f64(if neg { -f } else { f }).map(Value::Number)
}

// ---------------------------------------------------------------------------------------------
// Parser.

#[derive(Debug, Clone)]
enum Arg {
    Field(Vec<String>),
    Var(String, Vec<String>),
    Func(String),
    Lit(Value),
    Sub(Box<Pipe>, Vec<String>),
}

#[derive(Debug, Clone)]
struct Cmd {
    args: Vec<(Arg, usize)>,
}

#[derive(Debug, Clone)]
struct Pipe {
    decl: Vec<String>,
    /// `=` rather than `:=`.
    assign: bool,
    cmds: Vec<Cmd>,
    pos: usize,
}

#[derive(Debug, Clone)]
enum Node {
    Text(String),
    Action(Pipe),
    If(Vec<(Pipe, Vec<Node>)>, Vec<Node>),
    Range(Pipe, Vec<Node>, Vec<Node>),
    With(Pipe, Vec<Node>, Vec<Node>),
    Break(usize),
    Continue(usize),
}

struct Parser<'a> {
    src: &'a str,
    items: Vec<Item>,
    i: usize,
    depth: usize,
}

/// How a list ended: `end`, `else` (with the rest of the action) or end of input (`None`).
type ListEnd = Option<(&'static str, usize)>;

impl Parser<'_> {
    fn err(&self, pos: usize, msg: impl Into<String>) -> Error {
        perr(self.src, pos, msg)
    }

    /// Parses nodes until `{{end}}` (consumed), `{{else ...}}` (left for the caller) or EOF.
    fn list(&mut self) -> Result<(Vec<Node>, ListEnd), Error> {
        let mut nodes = Vec::new();
        while self.i < self.items.len() {
            let item = std::mem::replace(&mut self.items[self.i], Item::Text(String::new()));
            self.i += 1;
            match item {
                Item::Text(t) => nodes.push(Node::Text(t)),
                Item::Action { toks, pos } => {
                    let kw = match toks.first() {
                        Some((Tok::Ident(k), _)) => k.as_str(),
                        None => return Err(self.err(pos, "missing value for command")),
                        _ => "",
                    };
                    match kw {
                        "end" => {
                            if toks.len() > 1 {
                                return Err(self.err(toks[1].1, "unexpected token after end"));
                            }
                            return Ok((nodes, Some(("end", pos))));
                        }
                        "else" => {
                            // Put the remainder back so the block parser can read `else if`.
                            self.i -= 1;
                            self.items[self.i] = Item::Action { toks, pos };
                            return Ok((nodes, Some(("else", pos))));
                        }
                        "if" | "range" | "with" => {
                            let kw = if kw == "if" {
                                "if"
                            } else if kw == "range" {
                                "range"
                            } else {
                                "with"
                            };
                            nodes.push(self.block(kw, &toks[1..], pos)?);
                        }
                        "break" | "continue" => {
                            if toks.len() > 1 {
                                return Err(
                                    self.err(toks[1].1, format!("unexpected token after {kw}"))
                                );
                            }
                            nodes.push(if kw == "break" {
                                Node::Break(pos)
                            } else {
                                Node::Continue(pos)
                            });
                        }
                        "define" | "template" | "block" => {
                            return Err(self.err(pos, format!("{{{{{kw}}}}} is not supported")));
                        }
                        _ => {
                            let pipe = self.pipeline(&toks, pos, false)?;
                            nodes.push(Node::Action(pipe));
                        }
                    }
                }
            }
        }
        Ok((nodes, None))
    }

    /// After `{{else` was seen: takes that action back and returns its tokens after `else`.
    fn take_else(&mut self) -> (Vec<(Tok, usize)>, usize) {
        let item = std::mem::replace(&mut self.items[self.i], Item::Text(String::new()));
        self.i += 1;
        match item {
            Item::Action { mut toks, pos } => {
                toks.remove(0);
                (toks, pos)
            }
            Item::Text(_) => (Vec::new(), 0),
        }
    }

    fn block(
        &mut self,
        kw: &'static str,
        toks: &[(Tok, usize)],
        pos: usize,
    ) -> Result<Node, Error> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(self.err(pos, "blocks nested too deeply"));
        }
        if toks.is_empty() {
            return Err(self.err(pos, format!("missing value for {kw}")));
        }
        let pipe = self.pipeline(toks, toks[0].1, kw == "range")?;
        let (body, end) = self.list()?;
        let mut branches = vec![(pipe, body)];
        let mut else_body = Vec::new();
        let mut end = end;
        loop {
            match end {
                None => {
                    return Err(self.err(
                        pos,
                        format!("unexpected EOF: {{{{{kw}}}}} has no {{{{end}}}}"),
                    ));
                }
                Some(("end", _)) => break,
                Some((_, _)) => {
                    let (rest, epos) = self.take_else();
                    if kw == "if" && matches!(rest.first(), Some((Tok::Ident(k), _)) if k == "if") {
                        if rest.len() < 2 {
                            return Err(self.err(epos, "missing value for else if"));
                        }
                        let p = self.pipeline(&rest[1..], rest[1].1, false)?;
                        let (body, e) = self.list()?;
                        branches.push((p, body));
                        end = e;
                        continue;
                    }
                    // `{{else with p}}` (Go 1.23): a nested with sharing this block's `{{end}}`.
                    if kw == "with"
                        && matches!(rest.first(), Some((Tok::Ident(k), _)) if k == "with")
                    {
                        else_body = vec![self.block("with", &rest[1..], epos)?];
                        break;
                    }
                    if let Some((_, p)) = rest.first() {
                        return Err(self.err(*p, "unexpected token after else"));
                    }
                    let (body, e) = self.list()?;
                    else_body = body;
                    match e {
                        Some(("end", _)) => break,
                        Some((_, p)) => {
                            return Err(self.err(
                                p,
                                format!("expected {{{{end}}}} after {{{{else}}}} of {kw}"),
                            ));
                        }
                        None => {
                            return Err(self.err(
                                pos,
                                format!("unexpected EOF: {{{{{kw}}}}} has no {{{{end}}}}"),
                            ));
                        }
                    }
                }
            }
        }
        self.depth -= 1;
        Ok(match kw {
            "if" => Node::If(branches, else_body),
            "range" => {
                let (p, b) = branches.remove(0);
                Node::Range(p, b, else_body)
            }
            _ => {
                let (p, b) = branches.remove(0);
                Node::With(p, b, else_body)
            }
        })
    }

    /// A pipeline: optional declarations, then commands separated by `|`.
    fn pipeline(&self, toks: &[(Tok, usize)], pos: usize, allow_two: bool) -> Result<Pipe, Error> {
        let mut decl = Vec::new();
        let mut assign = false;
        let mut rest = toks;
        // `$x :=`, `$x =`, `$i, $v :=`.
        let decl_at = toks
            .iter()
            .position(|(t, _)| matches!(t, Tok::Declare | Tok::Assign));
        if let Some(d) = decl_at {
            let names = &toks[..d];
            let ok = match names {
                [(Tok::Var(a, c), _)] if c.is_empty() && a != "$" => {
                    decl.push(a.clone());
                    true
                }
                [(Tok::Var(a, ca), _), (Tok::Comma, _), (Tok::Var(b, cb), _)]
                    if allow_two && ca.is_empty() && cb.is_empty() && a != "$" && b != "$" =>
                {
                    decl.push(a.clone());
                    decl.push(b.clone());
                    true
                }
                _ => false,
            };
            if !ok {
                return Err(self.err(toks[d].1, "expected variable name(s) before := or ="));
            }
            assign = matches!(toks[d].0, Tok::Assign);
            rest = &toks[d + 1..];
        }
        let mut cmds = Vec::new();
        let mut i = 0;
        let cmd_pos = rest.first().map_or(pos, |t| t.1);
        cmds.push(self.command(rest, &mut i, cmd_pos, 0)?);
        while i < rest.len() {
            match &rest[i].0 {
                Tok::Pipe => {
                    i += 1;
                    let p = rest.get(i).map_or(rest[i - 1].1, |t| t.1);
                    cmds.push(self.command(rest, &mut i, p, 0)?);
                }
                _ => return Err(self.err(rest[i].1, "unexpected token in pipeline")),
            }
        }
        Ok(Pipe {
            decl,
            assign,
            cmds,
            pos,
        })
    }

    /// One command: operands until `|`, `)` or the end.
    fn command(
        &self,
        toks: &[(Tok, usize)],
        i: &mut usize,
        pos: usize,
        depth: usize,
    ) -> Result<Cmd, Error> {
        if depth > MAX_DEPTH {
            return Err(self.err(pos, "parentheses nested too deeply"));
        }
        let mut args = Vec::new();
        while *i < toks.len() {
            let (t, p) = &toks[*i];
            let arg = match t {
                Tok::Pipe | Tok::RParen(_) => break,
                Tok::Field(c) => Arg::Field(c.clone()),
                Tok::Var(n, c) => Arg::Var(n.clone(), c.clone()),
                Tok::Str(s) => Arg::Lit(Value::String(s.clone())),
                Tok::Num(n) => Arg::Lit(n.clone()),
                Tok::Ident(id) => match id.as_str() {
                    "true" => Arg::Lit(Value::Bool(true)),
                    "false" => Arg::Lit(Value::Bool(false)),
                    "nil" => Arg::Lit(Value::Null),
                    "if" | "else" | "end" | "range" | "with" | "define" | "template" | "block"
                    | "break" | "continue" => {
                        return Err(self.err(*p, format!("unexpected keyword {id} in operand")));
                    }
                    _ if is_func(id) => Arg::Func(id.clone()),
                    _ => return Err(self.err(*p, format!("function {id:?} not defined"))),
                },
                Tok::LParen => {
                    *i += 1;
                    let inner_pos = toks.get(*i).map_or(*p, |t| t.1);
                    let mut cmds = vec![self.command(toks, i, inner_pos, depth + 1)?];
                    loop {
                        match toks.get(*i) {
                            Some((Tok::Pipe, _)) => {
                                *i += 1;
                                let pp = toks.get(*i).map_or(*p, |t| t.1);
                                cmds.push(self.command(toks, i, pp, depth + 1)?);
                            }
                            Some((Tok::RParen(chain), _)) => {
                                let chain = chain.clone();
                                *i += 1;
                                args.push((
                                    Arg::Sub(
                                        Box::new(Pipe {
                                            decl: Vec::new(),
                                            assign: false,
                                            cmds,
                                            pos: *p,
                                        }),
                                        chain,
                                    ),
                                    *p,
                                ));
                                break;
                            }
                            _ => return Err(self.err(*p, "unclosed left paren: expected )")),
                        }
                    }
                    continue;
                }
                Tok::Declare | Tok::Assign | Tok::Comma => {
                    return Err(self.err(*p, "unexpected := , or = in operand"));
                }
            };
            args.push((arg, *p));
            *i += 1;
        }
        if args.is_empty() {
            return Err(self.err(pos, "missing value for command"));
        }
        Ok(Cmd { args })
    }
}

const FUNCS: &[&str] = &[
    "and",
    "or",
    "not",
    "eq",
    "ne",
    "lt",
    "le",
    "gt",
    "ge",
    "len",
    "index",
    "print",
    "printf",
    "println",
    "toJSON",
    "toJson",
    "quote",
    "squote",
    "default",
    "empty",
    "join",
    "contains",
    "hasPrefix",
    "hasSuffix",
    "trim",
    "trimPrefix",
    "trimSuffix",
    "upper",
    "lower",
    "replace",
    "toString",
];

fn is_func(name: &str) -> bool {
    FUNCS.contains(&name)
}

// ---------------------------------------------------------------------------------------------
// Execution.

enum Flow {
    Normal,
    Break,
    Continue,
}

struct Exec<'a> {
    src: &'a str,
    vars: Vec<(String, Value)>,
    out: String,
}

impl Exec<'_> {
    fn err(&self, pos: usize, msg: impl Into<String>) -> Error {
        let (line, col) = line_col(self.src, pos);
        Error::Exec {
            line,
            col,
            msg: msg.into(),
        }
    }

    fn walk(&mut self, nodes: &[Node], dot: &Value) -> Result<Flow, Error> {
        for n in nodes {
            match n {
                Node::Text(t) => self.out.push_str(t),
                Node::Action(p) => {
                    let v = self.pipe(p, dot)?;
                    if p.decl.is_empty() {
                        print_value(&mut self.out, &v, true);
                    }
                }
                Node::If(branches, else_body) => {
                    let mark = self.vars.len();
                    let mut taken = None;
                    for (p, body) in branches {
                        if truth(&self.pipe(p, dot)?) {
                            taken = Some(body);
                            break;
                        }
                    }
                    let flow = self.walk(taken.unwrap_or(else_body), dot)?;
                    self.vars.truncate(mark);
                    if !matches!(flow, Flow::Normal) {
                        return Ok(flow);
                    }
                }
                Node::With(p, body, else_body) => {
                    let mark = self.vars.len();
                    let v = self.pipe(p, dot)?;
                    let flow = if truth(&v) {
                        self.walk(body, &v)?
                    } else {
                        self.walk(else_body, dot)?
                    };
                    self.vars.truncate(mark);
                    if !matches!(flow, Flow::Normal) {
                        return Ok(flow);
                    }
                }
                Node::Range(p, body, else_body) => {
                    let flow = self.range(p, body, else_body, dot)?;
                    if !matches!(flow, Flow::Normal) {
                        return Ok(flow);
                    }
                }
                Node::Break(pos) | Node::Continue(pos) => {
                    if !self.vars.iter().any(|(n, _)| n == "\0range") {
                        return Err(self.err(*pos, "break or continue outside range"));
                    }
                    return Ok(if matches!(n, Node::Break(_)) {
                        Flow::Break
                    } else {
                        Flow::Continue
                    });
                }
            }
        }
        Ok(Flow::Normal)
    }

    fn range(
        &mut self,
        p: &Pipe,
        body: &[Node],
        else_body: &[Node],
        dot: &Value,
    ) -> Result<Flow, Error> {
        let mark = self.vars.len();
        // Evaluate without declaring: the declared names take key/element per iteration.
        let undeclared = Pipe {
            decl: Vec::new(),
            assign: false,
            cmds: p.cmds.clone(),
            pos: p.pos,
        };
        let v = self.pipe(&undeclared, dot)?;
        let elems: Vec<(Value, Value)> = match &v {
            Value::Array(a) => a
                .iter()
                .enumerate()
                .map(|(i, e)| (Value::from(i), e.clone()))
                .collect(),
            // Go visits map keys in sorted order.
            Value::Object(m) => {
                let mut keys: Vec<&String> = m.keys().collect();
                keys.sort();
                keys.into_iter()
                    .map(|k| (Value::String(k.clone()), m[k].clone()))
                    .collect()
            }
            Value::Null => Vec::new(),
            Value::Number(n) if n.as_i64().is_some() => {
                let n = n.as_i64().unwrap_or(0);
                (0..n.max(0))
                    .map(|i| (Value::from(i), Value::from(i)))
                    .collect()
            }
            other => {
                return Err(self.err(
                    p.pos,
                    format!("range can't iterate over {}", go_print(other)),
                ));
            }
        };
        if elems.is_empty() {
            let flow = self.walk(else_body, dot)?;
            self.vars.truncate(mark);
            return Ok(flow);
        }
        self.vars.push(("\0range".into(), Value::Null));
        let inner = self.vars.len();
        for (k, e) in elems {
            match p.decl.as_slice() {
                [v] => self.vars.push((v.clone(), e.clone())),
                [i, v] => {
                    self.vars.push((i.clone(), k));
                    self.vars.push((v.clone(), e.clone()));
                }
                _ => {}
            }
            let flow = self.walk(body, &e)?;
            self.vars.truncate(inner);
            if matches!(flow, Flow::Break) {
                break;
            }
        }
        self.vars.truncate(mark);
        Ok(Flow::Normal)
    }

    fn pipe(&mut self, p: &Pipe, dot: &Value) -> Result<Value, Error> {
        let mut prev: Option<Value> = None;
        for c in &p.cmds {
            prev = Some(self.command(c, dot, prev)?);
        }
        let v = prev.unwrap_or(Value::Null);
        if p.assign {
            let name = &p.decl[0];
            let Some(slot) = self.vars.iter_mut().rev().find(|(n, _)| n == name) else {
                return Err(self.err(p.pos, format!("undefined variable: {name}")));
            };
            slot.1 = v.clone();
        } else {
            for name in &p.decl {
                self.vars.push((name.clone(), v.clone()));
            }
        }
        Ok(v)
    }

    fn command(&mut self, c: &Cmd, dot: &Value, final_arg: Option<Value>) -> Result<Value, Error> {
        let (first, fpos) = &c.args[0];
        if let Arg::Func(name) = first {
            return self.call(name, *fpos, &c.args[1..], dot, final_arg);
        }
        if c.args.len() > 1 || final_arg.is_some() {
            let what = match first {
                Arg::Field(ch) => format!(".{}", ch.join(".")),
                Arg::Var(n, _) => n.clone(),
                _ => "a constant".into(),
            };
            return Err(self.err(*fpos, format!("can't give argument to non-function {what}")));
        }
        self.arg(first, *fpos, dot)
    }

    fn arg(&mut self, a: &Arg, pos: usize, dot: &Value) -> Result<Value, Error> {
        match a {
            Arg::Field(chain) => self.chain(dot, chain, pos),
            Arg::Var(name, chain) => {
                let Some((_, v)) = self.vars.iter().rev().find(|(n, _)| n == name) else {
                    return Err(self.err(pos, format!("undefined variable: {name}")));
                };
                let v = v.clone();
                self.chain(&v, chain, pos)
            }
            Arg::Lit(v) => Ok(v.clone()),
            Arg::Sub(p, chain) => {
                let v = self.pipe(p, dot)?;
                self.chain(&v, chain, pos)
            }
            Arg::Func(name) => self.call(name, pos, &[], dot, None),
        }
    }

    fn chain(&self, v: &Value, chain: &[String], pos: usize) -> Result<Value, Error> {
        let mut cur = v;
        for name in chain {
            cur = match cur {
                Value::Object(m) => m.get(name).unwrap_or(&Value::Null),
                Value::Null => &Value::Null,
                other => {
                    return Err(self.err(
                        pos,
                        format!("can't evaluate field {name} in type {}", go_type(other)),
                    ));
                }
            };
        }
        Ok(cur.clone())
    }

    fn call(
        &mut self,
        name: &str,
        pos: usize,
        args: &[(Arg, usize)],
        dot: &Value,
        final_arg: Option<Value>,
    ) -> Result<Value, Error> {
        let total = args.len() + usize::from(final_arg.is_some());
        // `and`/`or` short-circuit and return the deciding operand.
        if name == "and" || name == "or" {
            if total == 0 {
                return Err(self.err(
                    pos,
                    format!("wrong number of args for {name}: want at least 1 got 0"),
                ));
            }
            let mut last = Value::Null;
            for (a, p) in args {
                last = self.arg(a, *p, dot)?;
                if truth(&last) == (name == "or") {
                    return Ok(last);
                }
            }
            if let Some(f) = final_arg {
                last = f;
            }
            return Ok(last);
        }
        let mut vals = Vec::with_capacity(total);
        for (a, p) in args {
            vals.push(self.arg(a, *p, dot)?);
        }
        if let Some(f) = final_arg {
            vals.push(f);
        }
        call_func(name, &vals).map_err(|msg| self.err(pos, format!("error calling {name}: {msg}")))
    }
}

fn want(name: &str, vals: &[Value], n: usize) -> Result<(), String> {
    if vals.len() == n {
        Ok(())
    } else {
        Err(format!(
            "wrong number of args for {name}: want {n} got {}",
            vals.len()
        ))
    }
}

fn want_str<'v>(v: &'v Value, what: &str) -> Result<&'v str, String> {
    v.as_str()
        .ok_or_else(|| format!("{what} must be a string, got {}", go_type(v)))
}

fn call_func(name: &str, vals: &[Value]) -> Result<Value, String> {
    let s = Value::String;
    Ok(match name {
        "not" => {
            want(name, vals, 1)?;
            Value::Bool(!truth(&vals[0]))
        }
        "eq" => {
            if vals.len() < 2 {
                return Err("missing argument for comparison".into());
            }
            let mut any = false;
            for other in &vals[1..] {
                any |= compare(&vals[0], other)? == Some(std::cmp::Ordering::Equal);
            }
            Value::Bool(any)
        }
        "ne" | "lt" | "le" | "gt" | "ge" => {
            want(name, vals, 2)?;
            let ord = compare(&vals[0], &vals[1])?;
            use std::cmp::Ordering::*;
            if name != "ne" && ord.is_none() {
                return Err(format!(
                    "invalid type for comparison: {}",
                    go_type(&vals[0])
                ));
            }
            Value::Bool(match name {
                "ne" => ord != Some(Equal),
                "lt" => ord == Some(Less),
                "le" => ord != Some(Greater),
                "gt" => ord == Some(Greater),
                _ => ord != Some(Less),
            })
        }
        "len" => {
            want(name, vals, 1)?;
            Value::from(match &vals[0] {
                Value::String(t) => t.len(),
                Value::Array(a) => a.len(),
                Value::Object(m) => m.len(),
                other => return Err(format!("len of type {}", go_type(other))),
            })
        }
        "index" => {
            let Some((first, keys)) = vals.split_first() else {
                return Err("wrong number of args for index: want at least 1 got 0".into());
            };
            let mut cur = first.clone();
            for k in keys {
                cur = match (&cur, k) {
                    (Value::Object(m), Value::String(key)) => {
                        m.get(key).cloned().unwrap_or(Value::Null)
                    }
                    (Value::Array(a), Value::Number(n)) => {
                        let i = n
                            .as_i64()
                            .ok_or_else(|| format!("cannot index slice/array with {n}"))?;
                        usize::try_from(i)
                            .ok()
                            .and_then(|i| a.get(i).cloned())
                            .ok_or_else(|| format!("index out of range: {i}"))?
                    }
                    (Value::String(t), Value::Number(n)) => {
                        let i = n
                            .as_i64()
                            .ok_or_else(|| format!("cannot index string with {n}"))?;
                        usize::try_from(i)
                            .ok()
                            .and_then(|i| t.as_bytes().get(i).copied())
                            .map(Value::from)
                            .ok_or_else(|| format!("index out of range: {i}"))?
                    }
                    (Value::Null, _) => return Err("index of untyped nil".into()),
                    (c, k) => {
                        return Err(format!("cannot index {} with {}", go_type(c), go_type(k)));
                    }
                };
            }
            cur
        }
        "print" => {
            // Go's Sprint: spaces between operands when neither is a string.
            let mut out = String::new();
            for (i, v) in vals.iter().enumerate() {
                if i > 0 && !vals[i - 1].is_string() && !v.is_string() {
                    out.push(' ');
                }
                print_value(&mut out, v, false);
            }
            s(out)
        }
        "println" => {
            let parts: Vec<String> = vals.iter().map(go_print).collect();
            s(parts.join(" ") + "\n")
        }
        "printf" => {
            let Some((fmt, rest)) = vals.split_first() else {
                return Err("wrong number of args for printf: want at least 1 got 0".into());
            };
            s(sprintf(want_str(fmt, "format")?, rest))
        }
        "toJSON" => {
            want(name, vals, 1)?;
            if vals[0].is_null() {
                s("{}".into())
            } else {
                s(go_json(&vals[0]))
            }
        }
        "toJson" => {
            want(name, vals, 1)?;
            s(go_json(&vals[0]))
        }
        "quote" | "squote" => {
            let parts: Vec<String> = vals
                .iter()
                .filter(|v| !v.is_null())
                .map(|v| {
                    let t = go_print(v);
                    if name == "quote" {
                        go_quote(&t)
                    } else {
                        format!("'{t}'")
                    }
                })
                .collect();
            s(parts.join(" "))
        }
        "default" => {
            if vals.is_empty() || vals.len() > 2 {
                return Err(format!(
                    "wrong number of args for default: want 1 or 2 got {}",
                    vals.len()
                ));
            }
            match vals.get(1) {
                Some(v) if truth(v) => v.clone(),
                _ => vals[0].clone(),
            }
        }
        "empty" => {
            want(name, vals, 1)?;
            Value::Bool(!truth(&vals[0]))
        }
        "join" => {
            want(name, vals, 2)?;
            let sep = go_print(&vals[0]);
            let parts: Vec<String> = match &vals[1] {
                Value::Array(a) => a.iter().filter(|v| !v.is_null()).map(go_print).collect(),
                Value::Null => Vec::new(),
                other => vec![go_print(other)],
            };
            s(parts.join(&sep))
        }
        "contains" | "hasPrefix" | "hasSuffix" | "trimPrefix" | "trimSuffix" => {
            want(name, vals, 2)?;
            let needle = go_print(&vals[0]);
            let hay = go_print(&vals[1]);
            match name {
                "contains" => Value::Bool(hay.contains(&needle)),
                "hasPrefix" => Value::Bool(hay.starts_with(&needle)),
                "hasSuffix" => Value::Bool(hay.ends_with(&needle)),
                "trimPrefix" => s(hay
                    .strip_prefix(needle.as_str())
                    .unwrap_or(&hay)
                    .to_string()),
                _ => s(hay
                    .strip_suffix(needle.as_str())
                    .unwrap_or(&hay)
                    .to_string()),
            }
        }
        "trim" | "upper" | "lower" | "toString" => {
            want(name, vals, 1)?;
            let t = go_print(&vals[0]);
            s(match name {
                "trim" => t.trim().to_string(),
                "upper" => t.to_uppercase(),
                "lower" => t.to_lowercase(),
                _ => t,
            })
        }
        "replace" => {
            want(name, vals, 3)?;
            s(go_print(&vals[2]).replace(&go_print(&vals[0]), &go_print(&vals[1])))
        }
        other => return Err(format!("function {other:?} not defined")),
    })
}

/// Go's truthiness: false, 0, "", nil and empty lists/maps are false.
pub fn truth(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(m) => !m.is_empty(),
    }
}

fn compare(a: &Value, b: &Value) -> Result<Option<std::cmp::Ordering>, String> {
    Ok(match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_i64(), y.as_i64()) {
            (Some(x), Some(y)) => Some(x.cmp(&y)),
            _ => x
                .as_f64()
                .zip(y.as_f64())
                .and_then(|(x, y)| x.partial_cmp(&y)),
        },
        (Value::String(x), Value::String(y)) => Some(x.cmp(y)),
        (Value::Bool(x), Value::Bool(y)) => (x == y).then_some(std::cmp::Ordering::Equal),
        (Value::Null, Value::Null) => Some(std::cmp::Ordering::Equal),
        (Value::Null, _) | (_, Value::Null) => None,
        (Value::Array(_) | Value::Object(_), _) | (_, Value::Array(_) | Value::Object(_)) => {
            return Err(format!(
                "non-comparable type {}",
                go_type(if a.is_array() || a.is_object() { a } else { b })
            ));
        }
        _ => {
            return Err(format!(
                "incompatible types for comparison: {} and {}",
                go_type(a),
                go_type(b)
            ));
        }
    })
}

fn go_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "<nil>",
        Value::Bool(_) => "bool",
        Value::Number(n) if n.is_f64() => "float64",
        Value::Number(_) => "int",
        Value::String(_) => "string",
        Value::Array(_) => "[]interface {}",
        Value::Object(_) => "map[string]interface {}",
    }
}

/// Go's `%v`.
fn go_print(v: &Value) -> String {
    let mut s = String::new();
    print_value(&mut s, v, false);
    s
}

/// Writes `v` as Go's fmt prints it; a top-level nil is `<no value>` (text/template) and a nested
/// one `<nil>`.
fn print_value(out: &mut String, v: &Value, top: bool) {
    match v {
        Value::Null if top => out.push_str("<no value>"),
        Value::Null => out.push_str("<nil>"),
        Value::Bool(b) => {
            let _ = write!(out, "{b}");
        }
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                let _ = write!(out, "{i}");
            } else if let Some(u) = n.as_u64() {
                let _ = write!(out, "{u}");
            } else {
                let f = n.as_f64().unwrap_or(0.0);
                if f != 0.0 && (f.abs() >= 1e21 || f.abs() < 1e-4) {
                    let _ = write!(out, "{f:e}");
                } else {
                    let _ = write!(out, "{f}");
                }
            }
        }
        Value::String(s) => out.push_str(s),
        Value::Array(a) => {
            out.push('[');
            for (i, e) in a.iter().enumerate() {
                if i > 0 {
                    out.push(' ');
                }
                print_value(out, e, false);
            }
            out.push(']');
        }
        Value::Object(m) => {
            out.push_str("map[");
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            for (i, (k, e)) in keys.into_iter().map(|k| (k, &m[k])).enumerate() {
                if i > 0 {
                    out.push(' ');
                }
                out.push_str(k);
                out.push(':');
                print_value(out, e, false);
            }
            out.push(']');
        }
    }
}

/// Go's `json.Marshal`: sorted keys, `<`, `>` and `&` escaped as `\u003c` etc.
fn go_json(v: &Value) -> String {
    let sorted = sort_keys(v);
    serde_json::to_string(&sorted)
        .unwrap_or_else(|_| "{}".into())
        .replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026")
}

fn sort_keys(v: &Value) -> Value {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            let mut out = Map::new();
            for k in keys {
                out.insert(k.clone(), sort_keys(&m[k]));
            }
            Value::Object(out)
        }
        Value::Array(a) => Value::Array(a.iter().map(sort_keys).collect()),
        other => other.clone(),
    }
}

/// Go's `strconv.Quote`.
fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            '\x07' => out.push_str("\\a"),
            '\x08' => out.push_str("\\b"),
            '\x0c' => out.push_str("\\f"),
            '\x0b' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c == '\x7f' => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Go's `fmt.Sprintf` for `%s %v %d %q %t %f %x %%` (flags and widths are kept verbatim in the
/// error form rather than interpreted).
fn sprintf(fmt: &str, args: &[Value]) -> String {
    let mut out = String::new();
    let mut args = args.iter();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let Some(verb) = chars.next() else {
            out.push_str("%!(NOVERB)");
            break;
        };
        if verb == '%' {
            out.push('%');
            continue;
        }
        let Some(arg) = args.next() else {
            let _ = write!(out, "%!{verb}(MISSING)");
            continue;
        };
        match (verb, arg) {
            ('s' | 'v', v) => print_value(&mut out, v, false),
            ('d', Value::Number(n)) if n.as_i64().is_some() || n.as_u64().is_some() => {
                print_value(&mut out, arg, false)
            }
            ('q', Value::String(t)) => out.push_str(&go_quote(t)),
            ('t', Value::Bool(b)) => {
                let _ = write!(out, "{b}");
            }
            ('f', Value::Number(n)) => {
                let _ = write!(out, "{:.6}", n.as_f64().unwrap_or(0.0));
            }
            ('x', Value::Number(n)) if n.as_i64().is_some() => {
                let _ = write!(out, "{:x}", n.as_i64().unwrap_or(0));
            }
            ('x', Value::String(t)) => {
                for b in t.bytes() {
                    let _ = write!(out, "{b:02x}");
                }
            }
            (verb, v) => {
                let _ = write!(out, "%!{verb}({}={})", go_type(v), go_print(v));
            }
        }
    }
    let extra: Vec<String> = args
        .map(|v| format!("{}={}", go_type(v), go_print(v)))
        .collect();
    if !extra.is_empty() {
        let _ = write!(out, "%!(EXTRA {})", extra.join(", "));
    }
    out
}

#[cfg(test)]
mod tests;
