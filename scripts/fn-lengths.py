#!/usr/bin/env python3
"""Function lengths (from `fn` to its closing brace; tests included) over 80 lines, and the count of
`Result<_, String>`, in the Rust sources under the folders (or files) given:
`scripts/fn-lengths.py iptables-init/src`, `scripts/fn-lengths.py agent/src/xds_proxy.rs agent/src/xds_proxy`.
`--summary`: the last line only."""
import re, sys, pathlib

FN = re.compile(r'^\s*(pub(\([^)]*\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?(extern\s+"[^"]*"\s+)?fn\s+(\w+)')

def strip(line, state):
    # drop string literals and comments crudely; state tracks block comments
    out, i = [], 0
    while i < len(line):
        if state['block']:
            j = line.find('*/', i)
            if j < 0: return ''.join(out)
            state['block'] = False; i = j + 2; continue
        c = line[i]
        if line.startswith('//', i): break
        if line.startswith('/*', i): state['block'] = True; i += 2; continue
        if c == '"':
            i += 1
            while i < len(line) and line[i] != '"':
                i += 2 if line[i] == '\\' else 1
            i += 1; continue
        if c == "'" and i + 2 < len(line) and (line[i+2] == "'" or line[i+1] == '\\'):
            j = line.find("'", i + 2 if line[i+1] != '\\' else i + 3)
            i = j + 1 if j > 0 else i + 1; continue
        out.append(c); i += 1
    return ''.join(out)

def functions(path):
    lines = path.read_text().splitlines()
    state = {'block': False}
    clean = [strip(l, state) for l in lines]
    res = []
    for n, l in enumerate(clean):
        m = FN.match(l)
        if not m: continue
        depth, opened = 0, False
        for k in range(n, len(clean)):
            for ch in clean[k]:
                if ch == '{': depth += 1; opened = True
                elif ch == '}': depth -= 1
                elif ch == ';' and not opened and depth == 0:
                    break
            else:
                if opened and depth == 0:
                    res.append((k - n + 1, f"{path}:{n+1}", m.group(7))); break
                continue
            break
    return res

def string_errors(text):
    """`Result<T, String>`s: a `Result` whose last type argument (at its own depth) is `String`."""
    n = 0
    for m in re.finditer(r'\bResult<', text):
        depth, args, cur = 1, [], ''
        for ch in text[m.end():m.end() + 400]:
            if ch in '<([':
                depth += 1
            elif ch in '>)]':
                depth -= 1
                if depth == 0:
                    break
            elif ch == ',' and depth == 1:
                args.append(cur); cur = ''
                continue
            cur += ch
        args.append(cur)
        n += len(args) == 2 and args[1].strip() == 'String'
    return n

summary = '--summary' in sys.argv[1:]
roots = [a for a in sys.argv[1:] if a != '--summary']
allf, strings = [], 0
for r in roots:
    root = pathlib.Path(r)
    for p in [root] if root.is_file() else sorted(root.rglob('*.rs')):
        allf += functions(p)
        strings += string_errors(p.read_text())
over80 = [f for f in allf if f[0] > 80]
over120 = [f for f in allf if f[0] > 120]
for f in [] if summary else sorted(over80, reverse=True):
    print(f"{f[0]:5} {f[1]} {f[2]}")
print(f"functions: {len(allf)}  over 80: {len(over80)}  over 120: {len(over120)}  Result<_, String>: {strings}")
