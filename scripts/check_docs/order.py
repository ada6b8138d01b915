"""Checks 11 and 12 of scripts/check-docs: doctor's check order in the documents against the
code, the counts that help texts and messages give against what the command prints; and the
`kit check` rows of troubleshoot.md against the checks the code runs."""

import os
import re
import subprocess
import tempfile

from .common import BIN, ROOT, count, docs, fail, read

NUMBERS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
           "eight": 8, "nine": 9, "ten": 10}


def anchor(name):
    """The troubleshoot row's anchor of a doctor check (src/doctor/mod.rs `anchor`): brackets
    dropped, `.`/`_` as `-`, `-each` when the name ends in a bracket."""
    out, depth = "", 0
    for c in name:
        if c == "[":
            depth += 1
        elif c == "]":
            depth -= 1
        elif depth == 0:
            out += "-" if c in "._" else c
    return "doctor-" + out + ("-each" if name.endswith("]") else "")


# ------------------------------------------------------------------ 11: doctor's order
NAME = r'"([a-z][a-z_.-]*(?:\[\{[^"]*\}\][a-z_.-]*)*)"'


def module_names(path):
    """The check names a doctor module reports, in the order they first appear in its text: the
    order they run (each module checks top to bottom; a helper is defined after its caller).
    `{base}` is the prefix the last `let base`/`let peer = format!(...)` bound."""
    text = read(path)
    events = []
    for m in re.finditer(r"let (base|peer) = format!\(\"([^\"]+)\"", text):
        events.append((m.start(), "bind", m.group(2)))
    for m in re.finditer(r"(?:report\.(?:pass|fail|warn)\(\s*|let name = |format!\()" + NAME, text):
        events.append((m.start(), "name", m.group(1)))
    for m in re.finditer(r"format!\(\"\{base\}(\.[a-z_]+)\"\)", text):
        events.append((m.start(), "name", "{base}" + m.group(1)))
    binds = {v for _, k, v in events if k == "bind"}
    base, out = "", []
    for _, kind, value in sorted(events):
        if kind == "name" and value in binds:
            continue  # the prefix itself, not a check
        value = value.replace("{base}", base)
        if kind == "bind":
            base = value
        elif value not in out and "{" not in re.sub(r"\[[^\]]*\]", "", value):
            out.append(value)
    return out


def code_order():
    """doctor's checks in the order `run` (src/doctor/mod.rs) reports them, as anchors."""
    text = read("src/doctor/mod.rs")
    body = text[text.index("pub async fn run("):]
    body = body[:body.index("\n}\n")]
    order = []
    for m in re.finditer(r"(\w+)::check(?:_admin)?\(|scale_out|" + NAME, body):
        if m.group(0) == "scale_out":
            scale = read("src/config/scale/mod.rs")
            order += [f"scale.{c}" for c in re.findall(r'push\(\s*"([a-z_]+)"', scale)]
        elif m.group(1):
            order += module_names(f"src/doctor/{m.group(1)}.rs")
        elif m.group(2) and not m.group(2).startswith("scale."):
            order.append(m.group(2))
    seen, anchors = set(), []
    for n in order:
        a = anchor(n)
        if a not in seen:
            seen.add(a)
            anchors.append(a)
    return anchors


def doc_order(text, start, end):
    """The check names of a section's table rows (the first cell's first code span, up to
    `:`), as anchors in document order."""
    i = text.index(start)
    section = text[i:text.index(end, i + len(start))]
    out = []
    for line in section.splitlines():
        m = re.match(r"\|\s*(?:<a id=\"[^\"]*\"></a>)?`([^`]+)`", line)
        if m and not line.startswith("|---"):
            a = anchor(re.split(r": |:$", m.group(1))[0].strip())
            if a not in out:
                out.append(a)
    return out


def check_doctor_order():
    code = code_order()
    docs = [
        ("docs/troubleshoot.md", "## Doctor FAIL lines", "\n## "),
        ("docs/reference.md", "| check | passes when |\n|---|---|\n| `identity", "\n\n"),
    ]
    for path, start, end in docs:
        text = read(path)
        if start not in text:
            fail(path, "doctor's check table not found (its heading or first row changed)")
            continue
        listed = doc_order(text, start, end)
        for a in listed:
            count("doctor order")
            if a not in code:
                fail(path, f"doctor's table names a check ({a}) that src/doctor/ does not report")
        for a in code:
            if a not in listed:
                fail(path, f"doctor's table lacks the check {a} (src/doctor/)")
        known = [a for a in listed if a in code]
        for before, after in zip(known, known[1:]):
            if code.index(before) > code.index(after):
                fail(path, f"doctor's table lists {after} after {before}; doctor runs {after} "
                     f"first (src/doctor/mod.rs `run`, in order: {', '.join(code)})")
                break
    # Every troubleshoot row a FAIL line links to exists.
    text = read("docs/troubleshoot.md")
    for a in code:
        count("doctor order")
        if f'id="{a}"' not in text:
            fail("docs/troubleshoot.md", f"doctor's FAIL lines link #{a}; no row has that id")


def check_readme_doctor_order():
    """The quick start's list of doctor's checks ("`doctor` prints one `PASS` line per check
    (...)", in the README and in install.md) in the order doctor reports them."""
    for path in ("README.md", "docs/install.md"):
        doctor_list_order(path)


def doctor_list_order(path):
    code = code_order()
    text = read(path)
    m = re.search(r"`doctor` prints one `PASS` line per check \(([^)]*)\)", text)
    if not m:
        fail(path, "the quick start's list of doctor's checks was not found")
        return
    at = []
    for span in re.findall(r"`([^`]+)`", m.group(1)):
        prefix = anchor(re.split(r"[.\[]", span)[0])
        idx = next((i for i, a in enumerate(code) if a == prefix or a.startswith(prefix + "-")),
                   None)
        count("readme doctor order")
        if idx is None:
            fail(path, f"doctor's list names {span}, which src/doctor/ does not report")
            continue
        at.append((idx, span))
    for (i, a), (j, b) in zip(at, at[1:]):
        if i > j:
            fail(path, f"doctor's list gives {b} after {a}; doctor reports {b} first "
                 "(src/doctor/mod.rs `run`)")
            break


# ------------------------------------------------------------------ 12: counts in help texts
def printed_secrets():
    """How many Secrets `kit secrets` prints with the default flags."""
    with tempfile.TemporaryDirectory() as tmp:
        ca = os.path.join(tmp, "ca")
        subprocess.run([BIN, "ca", "init", "--out", ca], check=True, capture_output=True)
        run = subprocess.run([BIN, "kit", "secrets", "--namespace", "x", "--ca-dir", ca],
                             capture_output=True, text=True)
    if run.returncode != 0:
        fail("scripts/check-docs", f"`kit secrets` failed: {run.stderr.strip()}")
        return None
    return len(re.findall(r"^kind: Secret$", run.stdout, re.M))


def check_counts():
    n = printed_secrets()
    if n is None:
        return
    said = []
    for sub in (["kit", "--help"], ["kit", "secrets", "--help"]):
        out = subprocess.run([BIN] + sub, capture_output=True, text=True).stdout
        said += [(f"`ironic-proxy {' '.join(sub)}`", w) for w in
                 re.findall(r"\b(" + "|".join(NUMBERS) + r") Secrets\b", out, re.I)]
    # The source of those texts and of the refusal messages (what the binary will say once built).
    src = read("src/cli/kit.rs")
    words = "|".join(NUMBERS)
    for m in re.finditer(rf"\b({words}) Secrets\b|\bkit's ({words})\b", src, re.I):
        said.append(("src/cli/kit.rs", m.group(1) or m.group(2)))
    if not said:
        fail("scripts/check-docs", "no count of Secrets found in `kit secrets --help` or "
             "src/cli/kit.rs: their wording changed")
    for where, word in said:
        count("help counts")
        if NUMBERS[word.lower()] != n:
            fail(where, f"says {word} Secrets; `kit secrets` prints {n}")


# ------------------------------------------------------------------ kit check rows
def check_kit_rows():
    """Every check `kit check` runs (src/cli/kit_check/) has its troubleshoot row (the anchor its
    FAIL line links to)."""
    folder = os.path.join(ROOT, "src", "cli", "kit_check")
    code = "\n".join(read(f"src/cli/kit_check/{f}") for f in sorted(os.listdir(folder))
                     if f.endswith(".rs") and not f.endswith("_tests.rs"))
    names = sorted(set(re.findall(r'Line::(?:pass|fail)\(\s*"([a-z_.]+)"', code)))
    text = read("docs/troubleshoot.md")
    for n in names:
        count("kit check rows")
        a = "kit-check-" + n.replace(".", "-").replace("_", "-")
        if f'id="{a}"' not in text:
            fail("docs/troubleshoot.md", f"`kit check` can print `FAIL {n}: ...` linking #{a}; "
                 "no row has that id")


# ------------------------------------------------------------------ counts, file names, reads
def check_compatibility_counts():
    """compatibility.md: the variants the heading counts are the most any cell passed or ran
    (a cell `a/b variants` with b above the heading's N contradicts it)."""
    text = read("docs/compatibility.md")
    m = re.search(r"x (\d+) variants in", text)
    if not m:
        fail("docs/compatibility.md", "no `x N variants in` line: the heading changed")
        return
    n = int(m.group(1))
    for a, b in re.findall(r"(\d+)/(\d+) variants", text):
        count("compatibility counts")
        if int(b) != n:
            fail("docs/compatibility.md", f"a cell says {a}/{b} variants under a heading of "
                 f"{n} variants: regenerate it (scripts/gen-compatibility)")
            return


def ipa_build_names():
    """The files scripts/build-ipa-ramdisk writes into its output directory."""
    text = read("scripts/build-ipa-ramdisk")
    names = set(re.findall(r'"\$work/out/([A-Za-z0-9._-]+)"', text))
    for loop in re.findall(r"for f in ([^;]+); do", text):
        for f in loop.split():
            if 'sha256sum "$f" >"$f.sha256"' in text:
                names.add(f"{f}.sha256")
    names.add("SHA256SUMS")
    return names


def check_ipa_file_names():
    """The IPA files the quick start reads (`$(cat NAME)`) and the names the kit serves are
    the ones scripts/build-ipa-ramdisk writes."""
    built = ipa_build_names()
    for path in ("README.md", "docs/install.md"):
        text = read(path)
        for name in re.findall(r"\$\(cat ([A-Za-z0-9._-]+\.sha256)\)", text):
            count("IPA file names")
            if name not in built:
                fail(path, f"the quick start reads {name}; scripts/build-ipa-ramdisk writes "
                     f"{', '.join(sorted(built))}")
    kit = read("config/k8s/components/deploy-ramdisk/kustomization.yaml")
    for name in re.findall(r"get (ironic-python-agent\.[a-z]+) ", kit):
        count("IPA file names")
        if name not in built:
            fail("config/k8s/components/deploy-ramdisk", f"serves {name}, which "
                 "scripts/build-ipa-ramdisk does not write")


def check_command_reads():
    """A sentence saying which variable a command reads names every variable that command's
    configuration comes from: `run`, `check` and `doctor` take IRONIC_PROXY_CONFIG before
    IRONIC_PROXY_PROFILE (src/main.rs), so a text naming only the profile's is wrong for a
    container that sets the file (the boot-files component does)."""
    main = read("src/main.rs")
    both = "IRONIC_PROXY_CONFIG" in main and "IRONIC_PROXY_PROFILE" in main
    for path, text in docs():
        for sentence in re.split(r"(?<=[.;])\s", text.replace("\n", " ")):
            m = re.search(r"`(run|check|doctor)` reads\b", sentence)
            if not m or "IRONIC_PROXY_PROFILE" not in sentence:
                continue
            count("command reads")
            if both and "IRONIC_PROXY_CONFIG" not in sentence:
                fail(path, f"says `{m.group(1)}` reads IRONIC_PROXY_PROFILE without "
                     "IRONIC_PROXY_CONFIG, which it reads first")
