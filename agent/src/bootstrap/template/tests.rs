use super::*;
use serde_json::json;

fn data() -> Value {
    json!({
        "name": "web",
        "port": 15000,
        "ratio": 0.5,
        "on": true,
        "off": false,
        "zero": 0,
        "empty": "",
        "none": null,
        "list": ["a", "b", "c"],
        "nolist": [],
        "map": {"z": 1, "a": 2},
        "nomap": {},
        "config": {"ProxyAdminPort": 15000, "ConfigPath": "./etc/istio/proxy"},
        "html": "<a&b>",
    })
}

fn r(src: &str) -> String {
    render(src, &data()).unwrap_or_else(|e| panic!("{src:?}: {e}"))
}

fn err(src: &str) -> Error {
    match render(src, &data()) {
        Ok(out) => panic!("{src:?} rendered {out:?}, expected an error"),
        Err(e) => e,
    }
}

fn parse_err(src: &str) -> (usize, usize, String) {
    match err(src) {
        Error::Parse { line, col, msg } => (line, col, msg),
        e => panic!("{src:?}: expected a parse error, got {e}"),
    }
}

fn exec_err(src: &str) -> (usize, usize, String) {
    match err(src) {
        Error::Exec { line, col, msg } => (line, col, msg),
        e => panic!("{src:?}: expected an execution error, got {e}"),
    }
}

#[test]
fn text_fields_and_chains() {
    assert_eq!(r("plain {text}"), "plain {text}");
    assert_eq!(r("{{ .name }}:{{.port}}"), "web:15000");
    assert_eq!(r("{{ .config.ProxyAdminPort }}"), "15000");
    assert_eq!(r("{{ $.config.ConfigPath }}/XDS"), "./etc/istio/proxy/XDS");
    assert_eq!(
        r("{{ .ratio }} {{ .on }} {{ .list }} {{ .map }}"),
        "0.5 true [a b c] map[a:2 z:1]"
    );
    assert_eq!(
        r(r#"{{ "q\"s\n" }}{{ `raw\n` }}{{ 0x10 }}{{ -3 }}{{ 1.5 }}"#),
        "q\"s\nraw\\n16-31.5"
    );
}

/// Go's default `missingkey`: missing keys and nil print `<no value>`.
#[test]
fn missing_keys_print_no_value() {
    assert_eq!(
        r("{{ .nope }}|{{ .none }}|{{ .nope.deeper }}"),
        "<no value>|<no value>|<no value>"
    );
    assert_eq!(r("{{ printf \"%v\" .nope }}"), "<nil>");
}

#[test]
fn trimming_and_comments() {
    assert_eq!(r("a  \n\t {{- .name -}} \n  b"), "awebb");
    assert_eq!(r("a {{- /* gone */ -}} b"), "ab");
    assert_eq!(r("a {{/* multi\nline */}} b"), "a  b");
    assert_eq!(r("x\n{{- if .on }}\n  y\n{{- end }}\nz"), "x\n  y\nz");
    // `{{-3}}` is the number -3, not a trim marker.
    assert_eq!(r("a {{-3}} b"), "a -3 b");
}

#[test]
fn variables() {
    assert_eq!(r("{{ $x := .name }}{{ $x }}"), "web");
    assert_eq!(r("{{ $x := 1 }}{{ $x = 2 }}{{ $x }}"), "2");
    assert_eq!(r("{{ $c := .config }}{{ $c.ProxyAdminPort }}"), "15000");
    assert_eq!(r("{{ range .list }}{{ $.name }}{{ end }}"), "webwebweb");
    // A variable declared inside a block ends with it.
    assert_eq!(
        exec_err("{{ if .on }}{{ $y := 1 }}{{ end }}{{ $y }}").2,
        "undefined variable: $y"
    );
}

#[test]
fn pipelines_and_parens() {
    assert_eq!(
        r("{{ .name | printf \"%s-%d\" \"x\" }}"),
        "x-%!d(string=web)"
    );
    assert_eq!(r("{{ .port | printf \"%s:%d\" .name }}"), "web:15000");
    assert_eq!(
        r("{{ .empty | default \"d\" }}{{ .name | default \"d\" }}"),
        "dweb"
    );
    assert_eq!(r("{{ (index .list 1) | quote }}"), "\"b\"");
    assert_eq!(r("{{ (index .map.a | printf \"%d\") }}"), "2");
    assert_eq!(r("{{ (.config).ProxyAdminPort }}"), "15000");
}

#[test]
fn conditionals_and_truthiness() {
    for (v, want) in [
        ("on", "T"),
        ("off", "F"),
        ("zero", "F"),
        ("port", "T"),
        ("ratio", "T"),
        ("empty", "F"),
        ("name", "T"),
        ("none", "F"),
        ("nope", "F"),
        ("list", "T"),
        ("nolist", "F"),
        ("map", "T"),
        ("nomap", "F"),
    ] {
        assert_eq!(
            r(&format!("{{{{ if .{v} }}}}T{{{{ else }}}}F{{{{ end }}}}")),
            want,
            "{v}"
        );
    }
    let chain = "{{ if eq .name \"x\" }}1{{ else if eq .name \"web\" }}2{{ else }}3{{ end }}";
    assert_eq!(r(chain), "2");
    assert_eq!(
        r("{{ if and .on .name }}y{{ end }}{{ if or .off .zero }}n{{ end }}"),
        "y"
    );
    assert_eq!(
        r("{{ and .on .name }} {{ or .off .empty .port }} {{ not .on }}"),
        "web 15000 false"
    );
    // `and` short-circuits: the failing index is never evaluated.
    assert_eq!(r("{{ if and .off (index .list 9) }}x{{ end }}"), "");
    assert_eq!(
        r("{{ with .config }}{{ .ProxyAdminPort }}{{ end }}"),
        "15000"
    );
    assert_eq!(r("{{ with .nope }}x{{ else }}{{ .name }}{{ end }}"), "web");
    assert_eq!(r("{{ if $v := .name }}{{ $v }}{{ end }}"), "web");
    let else_with =
        "{{ with .nope }}1{{ else with .config }}{{ .ProxyAdminPort }}{{ else }}3{{ end }}";
    assert_eq!(r(else_with), "15000");
    assert_eq!(
        r("{{ with .nope }}1{{ else with .none }}2{{ else }}3{{ end }}"),
        "3"
    );
}

#[test]
fn range_forms() {
    assert_eq!(r("{{ range .list }}{{ . }},{{ end }}"), "a,b,c,");
    assert_eq!(
        r("{{ range $i, $v := .list }}{{ $i }}={{ $v }} {{ end }}"),
        "0=a 1=b 2=c "
    );
    assert_eq!(
        r("{{ range $k, $v := .map }}{{ $k }}={{ $v }} {{ end }}"),
        "a=2 z=1 "
    );
    assert_eq!(r("{{ range $v := .map }}{{ $v }}{{ end }}"), "21");
    assert_eq!(r("{{ range .nolist }}x{{ else }}none{{ end }}"), "none");
    assert_eq!(r("{{ range .nope }}x{{ else }}missing{{ end }}"), "missing");
    assert_eq!(r("{{ range 3 }}{{ . }}{{ end }}"), "012");
    assert_eq!(
        r(
            "{{ range .list }}{{ if eq . \"b\" }}{{ continue }}{{ end }}{{ if eq . \"c\" }}{{ break }}{{ end }}{{ . }}{{ end }}"
        ),
        "a"
    );
    // JSON-list idiom: a comma before every element but the first.
    assert_eq!(
        r("[{{ range $i, $v := .list }}{{ if $i }},{{ end }}\"{{ $v }}\"{{ end }}]"),
        r#"["a","b","c"]"#
    );
}

#[test]
fn functions() {
    assert_eq!(r("{{ toJSON .map }}"), r#"{"a":2,"z":1}"#);
    assert_eq!(r("{{ toJSON .list }}"), r#"["a","b","c"]"#);
    assert_eq!(r("{{ toJSON .nope }}"), "{}");
    assert_eq!(r("{{ toJSON .html }}"), r#""\u003ca\u0026b\u003e""#);
    assert_eq!(
        r("{{ .name | quote }} {{ quote .port }} {{ quote \"a\\\"b\" }}"),
        r#""web" "15000" "a\"b""#
    );
    assert_eq!(
        r("{{ eq .port 15000 }} {{ ne .name \"web\" }} {{ eq .name \"x\" \"web\" }}"),
        "true false true"
    );
    assert_eq!(
        r("{{ lt 1 2 }} {{ gt 1 2 }} {{ le 2 2 }} {{ ge \"a\" \"b\" }} {{ lt 1 1.5 }}"),
        "true false true false true"
    );
    assert_eq!(r("{{ len .list }} {{ len .name }} {{ len .map }}"), "3 3 2");
    assert_eq!(
        r("{{ index .list 0 }} {{ index .map \"z\" }} {{ index . \"config\" \"ProxyAdminPort\" }}"),
        "a 1 15000"
    );
    assert_eq!(r("{{ index .map \"nope\" }}"), "<no value>");
    assert_eq!(
        r("{{ printf \"%s=%d %v %q %t %x %%\" .name .port .list .name .on 255 }}"),
        "web=15000 [a b c] \"web\" true ff %"
    );
    assert_eq!(
        r("{{ printf \"%d\" }}|{{ printf \"x\" 1 }}"),
        "%!d(MISSING)|x%!(EXTRA int=1)"
    );
    assert_eq!(r("{{ join \",\" .list }}"), "a,b,c");
    assert_eq!(
        r("{{ contains \"e\" .name }} {{ hasPrefix \"we\" .name }} {{ hasSuffix \"x\" .name }}"),
        "true true false"
    );
    assert_eq!(
        r("[{{ trim \"  x \\n\" }}] {{ upper .name }} {{ trimSuffix \"b\" .name }}"),
        "[x] WEB we"
    );
    assert_eq!(
        r("{{ replace \"e\" \"E\" .name }} {{ print .name 1 2 }} {{ empty .empty }}"),
        "wEb web1 2 true"
    );
    assert_eq!(r("{{ .name | contains \"w\" }}"), "true");
}

#[test]
fn parse_errors_have_positions() {
    let (l, c, m) = parse_err("ok\n  {{ .name ");
    assert_eq!((l, c), (2, 3), "{m}");
    assert!(m.contains("unclosed action"), "{m}");

    let (l, c, m) = parse_err("{{ if .on }}x");
    assert_eq!((l, c), (1, 1));
    assert!(m.contains("no {{end}}"), "{m}");

    let (l, c, m) = parse_err("a{{ end }}");
    assert_eq!((l, c), (1, 2));
    assert!(m.contains("unexpected {{end}}"), "{m}");

    let (_, c, m) = parse_err("{{ nosuch .x }}");
    assert_eq!(c, 4);
    assert!(m.contains("function \"nosuch\" not defined"), "{m}");

    assert!(
        parse_err("{{ \"abc }}")
            .2
            .contains("unterminated quoted string")
    );
    assert!(
        parse_err("{{ (len .list }}")
            .2
            .contains("unclosed left paren")
    );
    assert!(parse_err("{{ }}").2.contains("missing value"));
    assert!(parse_err("{{ .a | }}").2.contains("missing value"));
    assert!(
        parse_err("{{ if }}{{ end }}")
            .2
            .contains("missing value for if")
    );
    assert!(
        parse_err("{{ range .list }}{{ else }}{{ else }}{{ end }}")
            .2
            .contains("expected {{end}}")
    );
    assert!(
        parse_err("{{ define \"x\" }}{{ end }}")
            .2
            .contains("not supported")
    );
    assert!(parse_err("{{/* open").2.contains("unclosed comment"));
    assert!(parse_err("{{ $a, $b := .x }}").2.contains("variable name"));
    assert!(parse_err("{{ 1x2 }}").2.contains("bad number"));
    assert!(parse_err("{{ .a. }}").2.contains("field name"));
    let (l, c, _) = parse_err("é\n\t€{{ @ }}");
    assert_eq!((l, c), (2, 6));
}

#[test]
fn exec_errors_have_positions() {
    let (l, c, m) = exec_err("x\n {{ index .list 7 }}");
    assert_eq!((l, c), (2, 5), "{m}");
    assert_eq!(m, "error calling index: index out of range: 7");
    assert!(
        exec_err("{{ .name.first }}")
            .2
            .contains("can't evaluate field first in type string")
    );
    assert!(
        exec_err("{{ $nope }}")
            .2
            .contains("undefined variable: $nope")
    );
    assert!(
        exec_err("{{ lt .name 1 }}")
            .2
            .contains("incompatible types")
    );
    assert!(exec_err("{{ len .port }}").2.contains("len of type int"));
    assert!(
        exec_err("{{ range .name }}{{ end }}")
            .2
            .contains("range can't iterate over web")
    );
    assert!(
        exec_err("{{ .name | .port }}")
            .2
            .contains("can't give argument to non-function")
    );
    assert!(exec_err("{{ break }}").2.contains("outside range"));
    assert!(
        exec_err("{{ not }}")
            .2
            .contains("wrong number of args for not")
    );
    let e = exec_err("{{ eq .list 1 }}");
    assert!(e.2.contains("non-comparable"), "{e:?}");
    // The Display form names the position.
    let shown = render("\n\n  {{ len 1 }}", &data())
        .unwrap_err()
        .to_string();
    assert_eq!(
        shown,
        "template execution error at 3:6: error calling len: len of type int"
    );
}

/// Garbage in, an error or output out, never a panic: every prefix of a set of templates, plus
/// pseudo-random strings over the template alphabet.
#[test]
fn no_panics_on_garbage() {
    let seeds = [
        "{{- if .on }}a{{ else if .x }}b{{ else }}c{{- end }}",
        "{{ range $i, $v := .list }}{{ if $i }},{{ end }}{{ toJSON $v | printf \"%s\" }}{{ end }}",
        "{{ with $x := (index .map \"a\") }}{{ $x }}{{ end }}{{/* c */}}",
        r#"{{ "a\u00e9\x41" | quote }}{{ `r` }}{{ 1e3 }}{{ -0x1f }}{{ .a.b.c }}"#,
        "{{ (((.list))) }}{{ $ }}{{ $.map.a }}{{ range 2 }}{{ break }}{{ end }}",
    ];
    let mut inputs: Vec<String> = Vec::new();
    for s in seeds {
        for (i, _) in s.char_indices() {
            inputs.push(s[..i].to_string());
            inputs.push(s[i..].to_string());
        }
    }
    let alphabet: Vec<char> = "{{}}-. $:=|()\"`'/*ifelsendrangwth,0x1e\\\né"
        .chars()
        .collect();
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    for _ in 0..3000 {
        let mut s = String::new();
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let len = (state % 40) as usize;
        for _ in 0..len {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            s.push(alphabet[(state % alphabet.len() as u64) as usize]);
        }
        inputs.push(s);
    }
    let nested = "{{ if 1 }}".repeat(500) + &"{{ end }}".repeat(500);
    inputs.push(nested);
    inputs.push("(".repeat(1000));
    inputs.push(format!("{{{{ {}1{} }}}}", "(".repeat(500), ")".repeat(500)));
    let d = data();
    for s in &inputs {
        let _ = render(s, &d);
    }
    assert!(render(&("{{ if 1 }}".repeat(500) + &"{{ end }}".repeat(500)), &d).is_err());
}

/// Go's `js`: quotes, backslash and `< > & =` escaped (upper-case hex), control characters as
/// `\u00XX`, printable non-ASCII kept; Istio's template relies on it for the inclusion regexes.
#[test]
fn js_escapes_as_go() {
    let d = json!({"re": r"vhost\..*\.route\..*", "odd": "a'b\"c<d>e&f=g\u{1}h\u{e9}\u{a0}"});
    assert_eq!(
        render("{{js .re}}", &d).unwrap(),
        r"vhost\\..*\\.route\\..*"
    );
    assert_eq!(
        render("{{ js .odd }}", &d).unwrap(),
        r#"a\'b\"c\u003Cd\u003Ee\u0026f\u003Dg\u0001h\u00e9\u00A0"#.replace(r"\u00e9", "\u{e9}")
    );
    assert_eq!(
        r(r#"{{ html "<a href='x'>&" }}"#),
        "&lt;a href=&#39;x&#39;&gt;&amp;"
    );
    assert_eq!(r(r#"{{ urlquery "a b&c/é" }}"#), "a+b%26c%2F%C3%A9");
}

/// Sprig's `toJson` is Go's `json.Marshal`: sorted keys, integral floats without a fraction,
/// HTML characters escaped; the histogram buckets of Istio's template render this way.
#[test]
fn to_json_encodes_as_go() {
    let d = json!({
        "buckets": [{"match": {"prefix": "envoy"}, "buckets": [1.0, 5.0, 2.5, 1e21, 1e-7]}],
        "s": "<a&b>\u{2028}\n\u{1}",
    });
    assert_eq!(
        render("{{ toJson .buckets }}", &d).unwrap(),
        r#"[{"buckets":[1,5,2.5,1e+21,1e-07],"match":{"prefix":"envoy"}}]"#
    );
    assert_eq!(
        render("{{ toJson .s }}", &d).unwrap(),
        r#""\u003ca\u0026b\u003e\u2028\n\u0001""#
    );
    assert_eq!(render("{{ toJSON .missing }}", &d).unwrap(), "{}");
}
