//! The parser: actions into a tree of text, pipelines and `if`/`range`/`with` blocks.

use serde_json::Value;

use super::lex::{Item, Tok};
use super::{Error, MAX_DEPTH, perr};

#[derive(Debug, Clone)]
pub(super) enum Arg {
    Field(Vec<String>),
    Var(String, Vec<String>),
    Func(String),
    Lit(Value),
    Sub(Box<Pipe>, Vec<String>),
}

#[derive(Debug, Clone)]
pub(super) struct Cmd {
    pub(super) args: Vec<(Arg, usize)>,
}

#[derive(Debug, Clone)]
pub(super) struct Pipe {
    pub(super) decl: Vec<String>,
    /// `=` rather than `:=`.
    pub(super) assign: bool,
    pub(super) cmds: Vec<Cmd>,
    pub(super) pos: usize,
}

#[derive(Debug, Clone)]
pub(super) enum Node {
    Text(String),
    Action(Pipe),
    If(Vec<(Pipe, Vec<Node>)>, Vec<Node>),
    Range(Pipe, Vec<Node>, Vec<Node>),
    With(Pipe, Vec<Node>, Vec<Node>),
    Break(usize),
    Continue(usize),
}

pub(super) struct Parser<'a> {
    pub(super) src: &'a str,
    pub(super) items: Vec<Item>,
    pub(super) i: usize,
    pub(super) depth: usize,
}

/// How a list ended: `end`, `else` (with the rest of the action) or end of input (`None`).
type ListEnd = Option<(&'static str, usize)>;

impl Parser<'_> {
    fn err(&self, pos: usize, msg: impl Into<String>) -> Error {
        perr(self.src, pos, msg)
    }

    /// Parses nodes until `{{end}}` (consumed), `{{else ...}}` (left for the caller) or EOF.
    pub(super) fn list(&mut self) -> Result<(Vec<Node>, ListEnd), Error> {
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
                    else_body = self.else_body(kw, pos)?;
                    break;
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

    /// The body of a block's plain `{{else}}`, up to the block's `{{end}}`.
    fn else_body(&mut self, kw: &'static str, pos: usize) -> Result<Vec<Node>, Error> {
        let (body, e) = self.list()?;
        match e {
            Some(("end", _)) => Ok(body),
            Some((_, p)) => Err(self.err(
                p,
                format!("expected {{{{end}}}} after {{{{else}}}} of {kw}"),
            )),
            None => Err(self.err(
                pos,
                format!("unexpected EOF: {{{{{kw}}}}} has no {{{{end}}}}"),
            )),
        }
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
    "js",
    "html",
    "urlquery",
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
