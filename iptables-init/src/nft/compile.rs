//! Istio's rule text (`meta l4proto tcp tcp dport 15008 counter return`) compiled into the
//! kernel's nf_tables expressions, the same ones `nft` 1.0.x generates for it: implicit
//! protocol dependencies (`meta l4proto`, `meta nfproto`) are added where nft adds them,
//! byte-aligned prefixes load only their bytes, a `{ a, b }` list becomes an anonymous set.
//!
//! Only the words Istio's capture writes are understood; anything else is an error naming the
//! word, never a guess.

use super::expr::{
    AnonSet, CMP_EQ, CMP_NEQ, Compiled, Expr, NETWORK_HEADER, NF_ACCEPT, NF_DROP, NFT_JUMP,
    NFT_RETURN, TRANSPORT_HEADER, ct, meta,
};

const NFPROTO_IPV4: u8 = 2;
const NFPROTO_IPV6: u8 = 10;
const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;
const IFNAMSIZ: usize = 16;

/// Why a rule's text could not be compiled.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("unsupported word {word:?} in nftables rule {rule:?}")]
    Unsupported { word: String, rule: String },
    #[error("bad value {value:?} for {what} in nftables rule {rule:?}")]
    Value {
        what: &'static str,
        value: String,
        rule: String,
    },
    #[error("nftables rule {rule:?} ends early (after {what})")]
    Truncated { what: &'static str, rule: String },
}

/// User and group names a rule may carry (`skgid ftp`), resolved as nft resolves them.
pub trait Names {
    fn uid(&self, name: &str) -> Option<u32>;
    fn gid(&self, name: &str) -> Option<u32>;
}

/// The protocol context of a rule so far: what the dependencies already established.
#[derive(Default)]
struct Context {
    nfproto: Option<u8>,
    l4proto: Option<u8>,
}

struct Compiler<'a> {
    rule: &'a str,
    words: Vec<&'a str>,
    at: usize,
    ctx: Context,
    out: Compiled,
    names: &'a dyn Names,
}

/// Compiles one rule's text.
pub fn compile(rule: &str, names: &dyn Names) -> Result<Compiled, Error> {
    let mut c = Compiler {
        rule,
        words: tokens(rule),
        at: 0,
        ctx: Context::default(),
        out: Compiled::default(),
        names,
    };
    while let Some(word) = c.next() {
        c.word(word)?;
    }
    Ok(c.out)
}

/// Words split on whitespace, with `{ 53, 15008 }` kept as one word `{53,15008}`.
fn tokens(rule: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = rule.trim();
    while !rest.is_empty() {
        let end = if rest.starts_with('{') {
            rest.find('}').map_or(rest.len(), |i| i + 1)
        } else {
            rest.find(char::is_whitespace).unwrap_or(rest.len())
        };
        out.push(&rest[..end]);
        rest = rest[end..].trim_start();
    }
    out
}

impl<'a> Compiler<'a> {
    fn next(&mut self) -> Option<&'a str> {
        let w = self.words.get(self.at).copied();
        self.at += 1;
        w
    }

    fn need(&mut self, what: &'static str) -> Result<&'a str, Error> {
        self.next().ok_or_else(|| Error::Truncated {
            what,
            rule: self.rule.to_string(),
        })
    }

    fn unsupported(&self, word: &str) -> Error {
        Error::Unsupported {
            word: word.to_string(),
            rule: self.rule.to_string(),
        }
    }

    fn bad(&self, what: &'static str, value: &str) -> Error {
        Error::Value {
            what,
            value: value.to_string(),
            rule: self.rule.to_string(),
        }
    }

    fn push(&mut self, e: Expr) {
        self.out.exprs.push(e);
    }

    /// `!=` before a value, consumed.
    fn negated(&mut self) -> bool {
        if self.words.get(self.at) == Some(&"!=") {
            self.at += 1;
            true
        } else {
            false
        }
    }

    fn word(&mut self, word: &'a str) -> Result<(), Error> {
        match word {
            "meta" => {
                let key = self.need("meta")?;
                if self.words.get(self.at) == Some(&"set") {
                    self.at += 1;
                    return self.meta_set(key);
                }
                self.meta_match(key)
            }
            "iifname" | "oifname" | "skuid" | "skgid" | "mark" => self.meta_match(word),
            "ip" | "ip6" => self.address(word),
            "tcp" | "udp" => self.port(word),
            "ct" => self.ct(),
            "counter" => {
                self.push(Expr::Counter);
                Ok(())
            }
            "accept" => self.verdict(NF_ACCEPT, None),
            "drop" => self.verdict(NF_DROP, None),
            "return" => self.verdict(NFT_RETURN, None),
            "jump" => {
                let chain = self.need("jump")?;
                self.verdict(NFT_JUMP, Some(chain.to_string()))
            }
            "redirect" => {
                let port = self.target_port("redirect")?;
                self.push(Expr::Immediate { data: port });
                self.push(Expr::Redirect);
                Ok(())
            }
            "tproxy" => {
                let fam = self.need("tproxy")?;
                let family = match fam {
                    "ip" => NFPROTO_IPV4,
                    "ip6" => NFPROTO_IPV6,
                    other => return Err(self.unsupported(other)),
                };
                if self.ctx.nfproto != Some(family) {
                    self.dependency(meta::NFPROTO, family);
                    self.ctx.nfproto = Some(family);
                }
                let port = self.target_port("tproxy")?;
                self.push(Expr::Immediate { data: port });
                self.push(Expr::Tproxy { family });
                Ok(())
            }
            other => Err(self.unsupported(other)),
        }
    }

    fn verdict(&mut self, code: i32, chain: Option<String>) -> Result<(), Error> {
        self.push(Expr::Verdict { code, chain });
        Ok(())
    }

    /// `to :PORT` → the port in network order.
    fn target_port(&mut self, what: &'static str) -> Result<Vec<u8>, Error> {
        let to = self.need(what)?;
        if to != "to" {
            return Err(self.unsupported(to));
        }
        let p = self.need(what)?;
        let port = p
            .strip_prefix(':')
            .and_then(|n| n.parse::<u16>().ok())
            .ok_or_else(|| self.bad("port", p))?;
        Ok(port.to_be_bytes().to_vec())
    }

    /// `meta l4proto tcp` / `nfproto ipv4` after a payload that needs it, as nft adds it.
    fn dependency(&mut self, key: u32, value: u8) {
        self.push(Expr::Meta { key });
        self.push(Expr::Cmp {
            op: CMP_EQ,
            data: vec![value],
        });
    }

    fn cmp(&mut self, negated: bool, data: Vec<u8>) {
        self.push(Expr::Cmp {
            op: if negated { CMP_NEQ } else { CMP_EQ },
            data,
        });
    }

    fn meta_match(&mut self, key: &'a str) -> Result<(), Error> {
        let neg = self.negated();
        let value = self.need("meta")?;
        let (k, data) = match key {
            "l4proto" => {
                let proto = match value {
                    "tcp" => IPPROTO_TCP,
                    "udp" => IPPROTO_UDP,
                    v => v.parse::<u8>().map_err(|_| self.bad("l4proto", v))?,
                };
                if !neg {
                    self.ctx.l4proto = Some(proto);
                }
                (meta::L4PROTO, vec![proto])
            }
            "nfproto" => {
                let proto = match value {
                    "ipv4" => NFPROTO_IPV4,
                    "ipv6" => NFPROTO_IPV6,
                    v => return Err(self.bad("nfproto", v)),
                };
                if !neg {
                    self.ctx.nfproto = Some(proto);
                }
                (meta::NFPROTO, vec![proto])
            }
            "iifname" | "oifname" => {
                if value.is_empty() || value.len() >= IFNAMSIZ || value.contains(['*', '"', '\\']) {
                    return Err(self.bad("interface name", value));
                }
                let mut name = value.as_bytes().to_vec();
                name.resize(IFNAMSIZ, 0);
                let k = if key == "iifname" {
                    meta::IIFNAME
                } else {
                    meta::OIFNAME
                };
                (k, name)
            }
            "skuid" => {
                let id = self.id(value, true)?;
                (meta::SKUID, id.to_ne_bytes().to_vec())
            }
            "skgid" => {
                let id = self.id(value, false)?;
                (meta::SKGID, id.to_ne_bytes().to_vec())
            }
            "mark" => (meta::MARK, self.u32(value)?.to_ne_bytes().to_vec()),
            other => return Err(self.unsupported(other)),
        };
        self.push(Expr::Meta { key: k });
        self.cmp(neg, data);
        Ok(())
    }

    fn meta_set(&mut self, key: &'a str) -> Result<(), Error> {
        if key != "mark" {
            return Err(self.unsupported(key));
        }
        let value = self.need("meta mark set")?;
        if value == "ct" {
            let what = self.need("meta mark set ct")?;
            if what != "mark" {
                return Err(self.unsupported(what));
            }
            self.push(Expr::Ct { key: ct::MARK });
        } else {
            let mark = self.u32(value)?;
            self.push(Expr::Immediate {
                data: mark.to_ne_bytes().to_vec(),
            });
        }
        self.push(Expr::MetaSet { key: meta::MARK });
        Ok(())
    }

    fn ct(&mut self) -> Result<(), Error> {
        let key = self.need("ct")?;
        if self.words.get(self.at) == Some(&"set") {
            self.at += 1;
            let value = self.need("ct set")?;
            match (key, value) {
                ("mark", "mark") => {
                    self.push(Expr::Meta { key: meta::MARK });
                    self.push(Expr::CtSet { key: ct::MARK });
                }
                ("zone", v) => {
                    let zone = v.parse::<u16>().map_err(|_| self.bad("ct zone", v))?;
                    self.push(Expr::Immediate {
                        data: zone.to_ne_bytes().to_vec(),
                    });
                    self.push(Expr::CtSet { key: ct::ZONE });
                }
                _ => return Err(self.unsupported(key)),
            }
            return Ok(());
        }
        let neg = self.negated();
        let value = self.need("ct")?;
        match key {
            "mark" => {
                let mark = self.u32(value)?;
                self.push(Expr::Ct { key: ct::MARK });
                self.cmp(neg, mark.to_ne_bytes().to_vec());
            }
            "state" => {
                let mut bits = 0u32;
                for s in value.split(',') {
                    bits |= match s {
                        "invalid" => 1,
                        "established" => 1 << 1,
                        "related" => 1 << 2,
                        "new" => 1 << 3,
                        "untracked" => 1 << 6,
                        other => return Err(self.bad("ct state", other)),
                    };
                }
                // A flag test: (state & bits) != 0 (== 0 when negated).
                self.push(Expr::Ct { key: ct::STATE });
                self.push(Expr::Bitwise {
                    mask: bits.to_ne_bytes().to_vec(),
                    xor: vec![0; 4],
                });
                self.cmp(!neg, vec![0; 4]);
            }
            other => return Err(self.unsupported(other)),
        }
        Ok(())
    }

    fn id(&self, value: &str, user: bool) -> Result<u32, Error> {
        if let Ok(n) = value.parse::<u32>() {
            return Ok(n);
        }
        let found = if user {
            self.names.uid(value)
        } else {
            self.names.gid(value)
        };
        found.ok_or_else(|| self.bad(if user { "user" } else { "group" }, value))
    }

    fn u32(&self, value: &str) -> Result<u32, Error> {
        match value.strip_prefix("0x") {
            Some(hex) => u32::from_str_radix(hex, 16).ok(),
            None => value.parse().ok(),
        }
        .ok_or_else(|| self.bad("number", value))
    }

    /// `ip saddr|daddr ADDR[/LEN]`, `ip6 ...`.
    fn address(&mut self, proto: &'a str) -> Result<(), Error> {
        let field = self.need("ip")?;
        let v6 = proto == "ip6";
        let offset = match (v6, field) {
            (false, "saddr") => 12,
            (false, "daddr") => 16,
            (true, "saddr") => 8,
            (true, "daddr") => 24,
            _ => return Err(self.unsupported(field)),
        };
        let neg = self.negated();
        let value = self.need("address")?;
        let (addr, bits) = match value.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (value, None),
        };
        let addr: std::net::IpAddr = addr.parse().map_err(|_| self.bad("address", value))?;
        let bytes = match (addr, v6) {
            (std::net::IpAddr::V4(a), false) => a.octets().to_vec(),
            (std::net::IpAddr::V6(a), true) => a.octets().to_vec(),
            _ => return Err(self.bad("address family", value)),
        };
        let full = bytes.len() * 8;
        let prefix = match bits {
            Some(p) => p
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=full).contains(n))
                .ok_or_else(|| self.bad("prefix length", value))?,
            None => full,
        };
        let family = if v6 { NFPROTO_IPV6 } else { NFPROTO_IPV4 };
        if self.ctx.nfproto != Some(family) {
            self.dependency(meta::NFPROTO, family);
            self.ctx.nfproto = Some(family);
        }
        let mask: Vec<u8> = (0..bytes.len())
            .map(|i| {
                let left = prefix.saturating_sub(i * 8).min(8);
                (0xffu16 << (8 - left)) as u8
            })
            .collect();
        let masked: Vec<u8> = bytes.iter().zip(&mask).map(|(b, m)| b & m).collect();
        if prefix % 8 == 0 {
            // A byte-aligned prefix loads only its bytes.
            let len = prefix / 8;
            self.push(Expr::Payload {
                base: NETWORK_HEADER,
                offset,
                len: len as u32,
            });
            self.cmp(neg, masked[..len].to_vec());
        } else {
            self.push(Expr::Payload {
                base: NETWORK_HEADER,
                offset,
                len: bytes.len() as u32,
            });
            self.push(Expr::Bitwise {
                mask,
                xor: vec![0; bytes.len()],
            });
            self.cmp(neg, masked);
        }
        Ok(())
    }

    /// `tcp|udp sport|dport PORT`, or `!= { P1, P2 }`.
    fn port(&mut self, proto: &'a str) -> Result<(), Error> {
        let field = self.need("tcp/udp")?;
        let offset = match field {
            "sport" => 0,
            "dport" => 2,
            other => return Err(self.unsupported(other)),
        };
        let neg = self.negated();
        let value = self.need("port")?;
        let l4 = if proto == "tcp" {
            IPPROTO_TCP
        } else {
            IPPROTO_UDP
        };
        if self.ctx.l4proto != Some(l4) {
            self.dependency(meta::L4PROTO, l4);
            self.ctx.l4proto = Some(l4);
        }
        let rule = self.rule;
        let parse = |p: &str| {
            p.trim()
                .parse::<u16>()
                .map(|n| n.to_be_bytes().to_vec())
                .map_err(|_| Error::Value {
                    what: "port",
                    value: p.trim().to_string(),
                    rule: rule.to_string(),
                })
        };
        self.push(Expr::Payload {
            base: TRANSPORT_HEADER,
            offset,
            len: 2,
        });
        match value.strip_prefix('{').and_then(|v| v.strip_suffix('}')) {
            Some(list) => {
                let elements = list.split(',').map(parse).collect::<Result<Vec<_>, _>>()?;
                self.out.sets.push(AnonSet {
                    key_type: 13,
                    key_len: 2,
                    elements,
                });
                let set = self.out.sets.len() - 1;
                self.push(Expr::Lookup { set, invert: neg });
            }
            None => {
                let data = parse(value)?;
                self.cmp(neg, data);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Db;
    impl Names for Db {
        fn uid(&self, name: &str) -> Option<u32> {
            (name == "istio-proxy").then_some(1337)
        }
        fn gid(&self, name: &str) -> Option<u32> {
            (name == "ftp").then_some(50)
        }
    }

    fn c(rule: &str) -> Vec<Expr> {
        compile(rule, &Db).expect(rule).exprs
    }

    fn meta(key: u32) -> Expr {
        Expr::Meta { key }
    }

    fn eq(data: &[u8]) -> Expr {
        Expr::Cmp {
            op: CMP_EQ,
            data: data.to_vec(),
        }
    }

    fn neq(data: &[u8]) -> Expr {
        Expr::Cmp {
            op: CMP_NEQ,
            data: data.to_vec(),
        }
    }

    const RETURN: Expr = Expr::Verdict {
        code: NFT_RETURN,
        chain: None,
    };

    #[test]
    fn an_explicit_l4proto_is_the_dependency_and_ports_are_big_endian() {
        // nft: meta load l4proto; cmp eq 6; payload load 2b @ transport + 2; cmp eq 0x3aa0 (15008).
        assert_eq!(
            c("meta l4proto tcp tcp dport 15008 counter return"),
            vec![
                meta(meta::L4PROTO),
                eq(&[6]),
                Expr::Payload {
                    base: TRANSPORT_HEADER,
                    offset: 2,
                    len: 2
                },
                eq(&[0x3a, 0xa0]),
                Expr::Counter,
                RETURN,
            ]
        );
        // Without it nft adds the same two expressions.
        assert_eq!(
            c("tcp dport 32000 counter return"),
            c("meta l4proto tcp tcp dport 32000 counter return")
        );
    }

    #[test]
    fn addresses_get_an_nfproto_dependency_and_prefixes_load_their_bytes() {
        assert_eq!(
            c("oifname lo ip saddr 127.0.0.6/32 return"),
            vec![
                meta(meta::OIFNAME),
                eq(b"lo\0\0\0\0\0\0\0\0\0\0\0\0\0\0"),
                meta(meta::NFPROTO),
                eq(&[2]),
                Expr::Payload {
                    base: NETWORK_HEADER,
                    offset: 12,
                    len: 4
                },
                eq(&[127, 0, 0, 6]),
                RETURN,
            ]
        );
        // 127.0.0.1/8: one byte, masked.
        assert_eq!(
            c("ip daddr != 127.0.0.1/8")[2..],
            [
                Expr::Payload {
                    base: NETWORK_HEADER,
                    offset: 16,
                    len: 1
                },
                neq(&[127])
            ]
        );
        let v6 = c("ip6 daddr 2001:db8::/32");
        assert_eq!(v6[1], eq(&[10]));
        assert_eq!(v6[3], eq(&[0x20, 0x01, 0x0d, 0xb8]));
        // An unaligned prefix: full load, mask, masked value.
        let odd = c("ip daddr 10.1.2.3/12");
        assert_eq!(
            odd[3],
            Expr::Bitwise {
                mask: vec![255, 240, 0, 0],
                xor: vec![0; 4]
            }
        );
        assert_eq!(odd[4], eq(&[10, 0, 0, 0]));
        // A second address of the same family adds no second dependency.
        let two = c("ip saddr 1.2.3.4 ip daddr 5.6.7.8");
        assert_eq!(two.iter().filter(|e| **e == meta(meta::NFPROTO)).count(), 1);
    }

    #[test]
    fn port_lists_become_an_inverted_anonymous_set_lookup() {
        let r = compile("tcp dport != { 53, 15008 } skuid istio-proxy", &Db).expect("rule");
        assert_eq!(r.sets.len(), 1);
        assert_eq!(r.sets[0].elements, vec![vec![0, 53], vec![0x3a, 0xa0]]);
        assert_eq!(r.sets[0].key_type, 13);
        assert_eq!(
            r.exprs[3],
            Expr::Lookup {
                set: 0,
                invert: true
            }
        );
        assert_eq!(r.exprs[5], eq(&1337u32.to_ne_bytes()));
    }

    #[test]
    fn statements() {
        assert_eq!(
            c("meta l4proto tcp counter redirect to :15001")[3..],
            [
                Expr::Immediate {
                    data: vec![0x3a, 0x99]
                },
                Expr::Redirect
            ]
        );
        let t = c(
            "meta l4proto tcp ip daddr != 127.0.0.1/32 tproxy ip to :15006 meta mark set 1337 counter accept",
        );
        assert_eq!(
            t[6],
            Expr::Immediate {
                data: vec![0x3a, 0x9e]
            }
        );
        assert_eq!(t[7], Expr::Tproxy { family: 2 });
        assert_eq!(
            t[8],
            Expr::Immediate {
                data: 1337u32.to_ne_bytes().to_vec()
            }
        );
        assert_eq!(t[9], Expr::MetaSet { key: meta::MARK });
        assert_eq!(
            c("meta l4proto tcp mark 1337 counter ct mark set mark")[4..],
            [
                Expr::Counter,
                meta(meta::MARK),
                Expr::CtSet { key: ct::MARK }
            ]
        );
        assert_eq!(
            c("meta mark set ct mark"),
            [
                Expr::Ct { key: ct::MARK },
                Expr::MetaSet { key: meta::MARK }
            ]
        );
        assert_eq!(
            c("ct zone set 2"),
            [
                Expr::Immediate {
                    data: 2u16.to_ne_bytes().to_vec()
                },
                Expr::CtSet { key: ct::ZONE }
            ]
        );
        assert_eq!(
            c("ct state related,established jump istio-divert"),
            [
                Expr::Ct { key: ct::STATE },
                Expr::Bitwise {
                    mask: 6u32.to_ne_bytes().to_vec(),
                    xor: vec![0; 4]
                },
                neq(&[0; 4]),
                Expr::Verdict {
                    code: NFT_JUMP,
                    chain: Some("istio-divert".into())
                }
            ]
        );
        assert_eq!(c("skgid ftp")[1], eq(&50u32.to_ne_bytes()));
    }

    #[test]
    fn unknown_words_and_bad_values_are_errors() {
        for (rule, needle) in [
            ("tcp dport 70000", "70000"),
            ("skgid nosuchgroup", "nosuchgroup"),
            ("oifname veth*", "veth*"),
            ("ip daddr 10.0.0.0/33", "10.0.0.0/33"),
            ("ip daddr ::1", "::1"),
            ("log prefix x", "log"),
            ("jump", "jump"),
            ("redirect to 15001", "15001"),
            ("tcp dport != { 53, x }", "x"),
        ] {
            let e = compile(rule, &Db).unwrap_err().to_string();
            assert!(e.contains(needle), "{rule}: {e}");
        }
    }
}
