//! The lexer: template text and `{{ }}` actions, each action a list of tokens with offsets.

use serde_json::Value;

use super::{Error, perr};

#[derive(Debug, Clone, PartialEq)]
pub(super) enum Tok {
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
pub(super) enum Item {
    Text(String),
    Action { toks: Vec<(Tok, usize)>, pos: usize },
}

pub(super) fn lex(src: &str) -> Result<Vec<Item>, Error> {
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
        let (tok, end) = lex_token(src, i)?;
        toks.push((tok, i));
        i = end;
    }
}

/// The token at `start` and the offset after it.
fn lex_token(src: &str, start: usize) -> Result<(Tok, usize), Error> {
    let b = src.as_bytes();
    let mut i = start;
    let tok = match b[i] {
        b'|' => {
            i += 1;
            Tok::Pipe
        }
        b'(' => {
            i += 1;
            Tok::LParen
        }
        b')' => {
            let (chain, e) = lex_chain(src, i + 1)?;
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
            return lex_number(src, start);
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
    Ok((tok, i))
}

/// A number at `start` (Go's syntax: signs, exponents, hex, ...) and the offset after it.
fn lex_number(src: &str, start: usize) -> Result<(Tok, usize), Error> {
    let b = src.as_bytes();
    let mut i = start + 1;
    while i < b.len()
        && (is_ident(b[i])
            || b[i] == b'.'
            || ((b[i] == b'-' || b[i] == b'+') && matches!(b[i - 1], b'e' | b'E')))
    {
        i += 1;
    }
    let num = parse_number(&src[start..i]).ok_or_else(|| {
        perr(
            src,
            start,
            format!("bad number syntax: {:?}", &src[start..i]),
        )
    })?;
    Ok((Tok::Num(num), i))
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
                let ch = go_syntax::escape(e, &mut chars.by_ref().map(|(_, c)| c));
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
