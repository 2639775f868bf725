//! YAML alias bombs: what a file's documents may expand to.
//!
//! Every alias (`*name`) is replaced by a copy of what its anchor names, so a few kilobytes of
//! nested aliases expand to gigabytes (a 17 KB file cost istiod-lite 360 MB before this
//! check). Before a file is turned into values, its documents are walked once, building
//! nothing, and counted in units: one per node, plus one per 8 bytes of each string. A file may
//! expand to [`budget`] units: half its length plus 10,000, so a file without aliases always
//! fits (every node takes at least two bytes of text: `1,` in a flow sequence) and aliases
//! leave little room to repeat anything. Nesting deeper than 128 is refused by the YAML parser
//! itself.

use std::cell::Cell;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, EnumAccess, MapAccess, SeqAccess, Visitor};

/// Units `text` may expand to.
pub fn budget(text: &str) -> usize {
    (text.len() / 2).saturating_add(10_000)
}

/// Walks every document of `text`; the error says what went over the budget, and in which
/// document (0-based). A YAML syntax error is left to the parser proper, which reports it.
pub fn check(text: &str) -> Result<(), (usize, String)> {
    let used = Cell::new(0);
    let count = Count {
        used: &used,
        budget: budget(text),
    };
    for (doc, de) in serde_yaml::Deserializer::from_str(text).enumerate() {
        if let Err(e) = count.deserialize(de) {
            if used.get() > count.budget {
                return Err((
                    doc,
                    format!(
                        "expands to more than {} nodes (YAML aliases repeating content?): refused",
                        count.budget
                    ),
                ));
            }
            // Not ours: the parser reports it with the document.
            tracing::trace!(error = %e, "expansion check stopped");
            return Ok(());
        }
    }
    Ok(())
}

/// Counts what a document expands to, failing once past the budget.
#[derive(Clone, Copy)]
struct Count<'a> {
    used: &'a Cell<usize>,
    budget: usize,
}

impl Count<'_> {
    fn charge<E: de::Error>(self, units: usize) -> Result<(), E> {
        let used = self.used.get().saturating_add(units);
        self.used.set(used);
        if used > self.budget {
            Err(E::custom("over the expansion budget"))
        } else {
            Ok(())
        }
    }

    fn string<E: de::Error>(self, len: usize) -> Result<(), E> {
        self.charge(1 + len / 8)
    }
}

impl<'de> DeserializeSeed<'de> for Count<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Count<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML value")
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        self.charge(1)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        self.charge(1)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        self.charge(1)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        self.charge(1)
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
        self.string(v.len())
    }
    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<(), E> {
        self.string(v.len())
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.charge(1)
    }
    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        self.charge(1)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        self.charge(1)?;
        self.deserialize(d)
    }
    fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        self.charge(1)?;
        self.deserialize(d)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        self.charge(1)?;
        while seq.next_element_seed(self)?.is_some() {}
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        self.charge(1)?;
        while map.next_key_seed(self)?.is_some() {
            map.next_value_seed(self)?;
        }
        Ok(())
    }
    /// A tagged value (`!Tag value`): the tag, then the value.
    fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<(), A::Error> {
        use serde::de::VariantAccess;
        self.charge(1)?;
        let ((), variant) = data.variant_seed(self)?;
        variant.newtype_variant_seed(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Nine levels of ten aliases each: ~1 KB that expands to 10^9 strings.
    fn billion_laughs() -> String {
        let mut y = String::from(
            "a0: &a0 [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n",
        );
        for i in 1..=9 {
            let prev = format!("*a{}", i - 1);
            let items = [prev.as_str(); 10].join(",");
            y.push_str(&format!("a{i}: &a{i} [{items}]\n"));
        }
        y
    }

    #[test]
    fn an_alias_bomb_is_refused_with_its_document() {
        let text = format!("kind: ConfigMap\n---\n{}", billion_laughs());
        let (doc, why) = check(&text).expect_err("a bomb");
        assert_eq!(doc, 1);
        assert!(why.contains("aliases"), "{why}");
        // A long string repeated through aliases counts its bytes.
        let long = "x".repeat(50_000);
        let text = format!("a: &s \"{long}\"\nb: [{}]\n", vec!["*s"; 100].join(","));
        assert!(check(&text).is_err());
    }

    #[test]
    fn ordinary_files_and_a_few_aliases_fit() {
        let text = "apiVersion: v1\nkind: Service\nmetadata: &m {name: a, namespace: b}\n\
                    spec: {ports: [{port: 80}], selector: {app: a}}\n---\n\
                    kind: X\nmetadata: *m\n";
        assert_eq!(check(text), Ok(()));
        // Big flat content fits whatever its size: every node costs text, the densest two
        // bytes (`1,` in a flow sequence).
        let dense = format!("[{}]", ["1"; 200_000].join(","));
        assert_eq!(check(&dense), Ok(()));
        let flat: String = (0..50_000)
            .map(|i| format!("k{i}: [1, 2, \"v\"]\n"))
            .collect();
        assert_eq!(check(&flat), Ok(()));
        // A syntax error is the parser's to report.
        assert_eq!(check("a: [1, 2"), Ok(()));
    }
}
