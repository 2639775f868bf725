//! Execution: walks the parsed tree over the data, printing as Go's `text/template` does.

use serde_json::Value;

use super::format::{go_print, go_type, print_value};
use super::funcs::{call_func, truth};
use super::parse::{Arg, Cmd, Node, Pipe};
use super::{Error, line_col};

pub(super) enum Flow {
    Normal,
    Break,
    Continue,
}

pub(super) struct Exec<'a> {
    pub(super) src: &'a str,
    pub(super) vars: Vec<(String, Value)>,
    pub(super) out: String,
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

    pub(super) fn walk(&mut self, nodes: &[Node], dot: &Value) -> Result<Flow, Error> {
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
