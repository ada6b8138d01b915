"""Checks 7 to 10 of scripts/check-docs: flags against --help, section links and tables of
contents, doctor's FAIL lines, the reference's key defaults against `check`."""

import os
import re
import subprocess
import sys
import tempfile
import tomllib

from .common import BIN, PENDING, ROOT, count, fail, prose_lines, read, source_text


# ------------------------------------------------------------------ 7: flags
def help_tree():
    def sub(path):
        run = subprocess.run([BIN] + list(path) + ["--help"], capture_output=True, text=True)
        if run.returncode != 0:
            return None
        out = run.stdout
        flags = set(re.findall(r"(?:^|\s)(--[a-z][a-z0-9-]*)", out)) | {"--help", "--version"}
        cmds = set()
        if "\nCommands:\n" in out:
            block = out.split("\nCommands:\n", 1)[1].split("\n\n", 1)[0]
            cmds = {l.split()[0] for l in block.splitlines() if l.strip()} - {"help"}
        return flags, cmds
    return sub


def check_command_table():
    """Every command of --help that takes no subcommand has a row in the README's command
    table (`| \`ironic-proxy CMD ...\` | ... |`)."""
    sub = help_tree()
    readme = read("README.md")
    rows = re.findall(r"^\| `ironic-proxy ([a-z ]+?)(?: [\[(<A-Z-]|`)", readme, re.M)
    listed = {r.strip() for r in rows}
    leaves, todo = [], [()]
    while todo:
        path = todo.pop()
        got = sub(path)
        if got is None:
            continue
        if got[1]:
            todo += [path + (c,) for c in sorted(got[1])]
        elif path:
            leaves.append(" ".join(path))
    for leaf in sorted(leaves):
        count("command table")
        if leaf not in listed:
            fail("README.md", f"the command table has no row for `ironic-proxy {leaf}` "
                 "(--help lists it)")


def check_flags(all_docs):
    helper = help_tree()
    cache = {}
    used_pending = set()

    def lookup(path):
        if path not in cache:
            cache[path] = helper(path)
        return cache[path]

    for path, text in all_docs:
        texts = []
        lines = list(prose_lines(text))
        i = 0
        while i < len(lines):
            n, line, fenced = lines[i]
            if fenced and not line.lstrip().startswith("```"):
                joined = line
                while joined.rstrip().endswith("\\") and i + 1 < len(lines):
                    i += 1
                    joined = joined.rstrip()[:-1] + " " + lines[i][1]
                texts.append((n, joined))
            else:
                texts.extend((n, span) for span in re.findall(r"`([^`]+)`", line))
            i += 1
        for n, t in texts:
            # Each `ironic-proxy` that is a command word (`-c ironic-proxy --` names a container),
            # up to the next shell separator.
            for m in re.finditer(r"(?:^|(?<=[\s/]))ironic-proxy(?=\s|$)", t):
                words = re.split(r"[|;&#]", t[m.end():], maxsplit=1)[0].split()
                cmd = []
                known = lookup(())
                for w in words:
                    if w.startswith("-"):
                        break
                    if known is not None and w in known[1]:
                        cmd.append(w)
                        known = lookup(tuple(cmd))
                    elif tuple(cmd + [w]) in PENDING:
                        cmd.append(w)
                        used_pending.add(tuple(cmd))
                        known = None
                    else:
                        break
                if not cmd:
                    continue
                for w in words[len(cmd):]:
                    flag = w.strip("()[]\\").split("=", 1)[0]
                    if not re.fullmatch(r"--[a-z][a-z0-9-]*", flag):
                        continue
                    count("flags")
                    if known is not None and flag in known[0]:
                        continue
                    if tuple(cmd + [flag]) in PENDING:
                        used_pending.add(tuple(cmd + [flag]))
                        continue
                    if known is None:
                        continue  # a pending subcommand: its flags are listed in PENDING
                    fail(f"{path}:{n}", f"`ironic-proxy {' '.join(cmd)} {flag}`: not in "
                         f"`ironic-proxy {' '.join(cmd)} --help`")
    for p in sorted(PENDING):
        parent = lookup(p[:-1]) if len(p) > 1 else lookup(())
        if parent is not None and (p[-1] in parent[0] or p[-1] in parent[1]):
            fail("scripts/check-docs", f"PENDING lists {' '.join(p)}, which `--help` now has: "
                 "remove it from PENDING")
    return used_pending


# ------------------------------------------------------------------ 8: anchors and contents
def slug(heading):
    h = re.sub(r"`", "", heading.strip()).lower()
    h = re.sub(r"[^\w\- ]", "", h)
    return h.replace(" ", "-")


def headings(text):
    out, seen = [], {}
    for _, line, fenced in prose_lines(text):
        m = re.match(r"(#{1,6})\s+(.*)", line)
        if m and not fenced:
            s = slug(m.group(2))
            k = seen.get(s, 0)
            seen[s] = k + 1
            out.append((len(m.group(1)), s if k == 0 else f"{s}-{k}"))
    return out


def targets(text):
    """The anchors of a document: its headings' slugs and its `<a id="...">` (table rows)."""
    return {s for _, s in headings(text)} | set(re.findall(r'<a id="([^"]+)"></a>', text))


def check_links(all_docs):
    anchors = {}
    for path, text in all_docs:
        anchors[path] = targets(text)
    anchors["BENCHMARKS.md"] = targets(read("BENCHMARKS.md"))
    for path, text in all_docs:
        base = os.path.dirname(path)
        for n, line, fenced in prose_lines(text):
            if fenced:
                continue
            for target, anchor in re.findall(r"\]\(([^)#\s]*)#([^)\s]+)\)", line):
                dest = path if target == "" else os.path.normpath(os.path.join(base, target))
                if not target.endswith(".md") and target != "":
                    continue
                if dest not in anchors:
                    if not os.path.isfile(os.path.join(ROOT, dest)):
                        fail(f"{path}:{n}", f"links to {target}, which does not exist")
                        continue
                    anchors[dest] = targets(read(dest))
                count("section links")
                if anchor not in anchors[dest]:
                    fail(f"{path}:{n}", f"links to {target or path}#{anchor}: no such heading "
                         "or row id")
        # A section twice (two `## ` headings with one slug): a link can reach only the
        # first, and the second is most often a pasted copy.
        seen = set()
        for level, s in headings(text):
            if level != 2:
                continue
            count("unique sections")
            base = re.sub(r"-\d+$", "", s)
            if base != s and base in seen:
                fail(path, f"the section #{base} appears twice")
            seen.add(s)
        # A table of contents: the link list before the first `## `.
        head = text.split("\n## ", 1)[0]
        toc = re.findall(r"^- \[[^\]]+\]\(#([^)]+)\)", head, re.M)
        if toc:
            count("tables of contents")
            sections = [s for level, s in headings(text) if level == 2]
            for s in sections:
                if s not in toc:
                    fail(path, f"the table of contents misses the section #{s}")
            for s in toc:
                if s not in sections:
                    fail(path, f"the table of contents lists #{s}, which is no `## ` section")


# ------------------------------------------------------------------ 10: key defaults
def seconds(v):
    """A duration as the config writes it ("60s", "1m", "1day", "250ms") in seconds, else None."""
    m = re.fullmatch(r"(\d+)\s*(ms|s|m|h|d|day|days|y)", str(v))
    if not m:
        return None
    mult = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "day": 86400, "days": 86400,
            "y": 365 * 86400}[m.group(2)]
    return int(m.group(1)) * mult


def same(doc, eff):
    doc = doc.strip('"')
    if isinstance(eff, bool):
        return doc == str(eff).lower()
    if str(eff) == doc:
        return True
    a, b = seconds(doc), seconds(eff)
    return a is not None and a == b


def check_key_defaults(ref, profile_limits):
    with tempfile.TemporaryDirectory() as tmp:
        with open(f"{tmp}/min.toml", "w") as f:
            f.write('[[listeners]]\nlisten = "127.0.0.1:0"\nupstream = "unix:/nonexistent.sock"\n')
        run = subprocess.run([BIN, "check", "--config", f"{tmp}/min.toml"], capture_output=True,
                             text=True, timeout=60)
    if run.returncode != 0:
        sys.exit(f"check-docs: {BIN} check --config (a minimal file): {run.stderr.strip()}")
    eff = tomllib.loads(run.stdout)
    for table in ("dns", "limits", "tls"):
        m = re.search(r"\n### `\[" + table + r"\]`[^\n]*\n(.*?)(?=\n### |\n## )", ref, re.S)
        if not m:
            fail("docs/reference.md", f"no `[{table}]` section")
            continue
        for key, default in re.findall(r"^- `([a-z_]+)` \([^)]*?default `([^`]+)`", m.group(1), re.M):
            if key not in eff.get(table, {}):
                continue
            count("key defaults")
            if not same(default, eff[table][key]):
                fail("docs/reference.md", f"[{table}] {key}: the reference says default {default}; "
                     f"`check` prints {eff[table][key]!r}")
        # List defaults, in order (the TLS groups): the bullet's parenthesis names them.
        for key, paren in re.findall(r"^- `([a-z_]+)` \(list, default: ([^)]*)\)", m.group(1),
                                     re.M | re.S):
            got = eff.get(table, {}).get(key)
            named = re.findall(r"`([^`]+)`", paren)
            if not isinstance(got, list) or not got or not named:
                continue
            count("key defaults")
            if named != got:
                fail("docs/reference.md", f"[{table}] {key}: the reference's default is "
                     f"{', '.join(named)}; `check` prints {', '.join(got)}")
            seq = ", ".join(f"`{g}`" for g in got)
            if table == "tls" and key == "groups" and seq not in " ".join(read("docs/install.md").split()):
                fail("docs/install.md", f"the default TLS groups, in order, are {seq} (`check`); "
                     "the TLS policy section does not say so")
        for key, value in re.findall(r"^- `([a-z_]+)` \([^)]*?the built-in profiles set `([^`]+)`",
                                     m.group(1), re.M):
            for prof, got in profile_limits.get(table, {}).items():
                count("key defaults")
                if key in got and not same(value, got[key]):
                    fail("docs/reference.md", f"[{table}] {key}: the reference says the profiles set "
                         f"{value}; `check --profile {prof}` prints {got[key]!r}")


# ------------------------------------------------------------------ 9: doctor FAIL lines
def check_doctor():
    code = source_text(["src/doctor/*.rs"])
    names = set(re.findall(r'report\.fail\(\s*"([a-z.]+)"', code))
    names |= set(re.findall(r'let name = "([a-z.]+)"', code))
    names |= {f"{n}[N]" for n in re.findall(r'format!\("([a-z]+)\[\{[a-z]+\}\]"\)', code)}
    suffixes = set(re.findall(r'format!\("\{base\}\.([a-z]+)"\)', code))
    text = read("docs/troubleshoot.md")
    start = text.index("## Doctor FAIL lines")
    section = text[start:text.index("\n## ", start + 5)]
    for n in sorted(names):
        count("doctor checks")
        if f"`{n}:" not in section:
            fail("docs/troubleshoot.md", f"doctor can report `FAIL {n}: ...` (src/doctor/); "
                 "\"Doctor FAIL lines\" has no row for it")
    for x in sorted(suffixes):
        count("doctor checks")
        if f".{x}:" not in section:
            fail("docs/troubleshoot.md", f"doctor can report `FAIL upstream[L]...{x}: ...` "
                 "(src/doctor/); \"Doctor FAIL lines\" has no row for it")
