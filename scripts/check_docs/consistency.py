"""Checks 14 to 18: the documents agree with themselves and with what the kit ships.

14. Every `skopeo copy` keeps the digest (`--preserve-digests`): the kit pins images by digest.
15. No hedge about the shipped binary ("does not write it yet"): a document describes this
    version's behaviour, not an older one's.
16. README.md, install.md, operate.md: a ```sh block that runs `scripts/...` or `cargo` says,
    in the lines just before it, that it needs a checkout (the quick start needs none).
17. No document says the admin listener binds `[::]` (it never does: the profiles bind the pod
    IPs and loopback, and so does the boot-files component).
18. A doctor sample (a block ending `N checks, M failed`) and a prose list of doctor's lines
    (`doctor` prints one `PASS` line per check (...)) name every check family doctor runs by
    default (src/doctor/*.rs; `peers`, `egress` need --peers, `listener` a boot TLS listener).
"""

import re

from .common import count, fail, prose_lines, source_text

# Families doctor reports only under a flag or a listener most pods lack.
OPTIONAL_FAMILIES = {"peers", "egress", "listener"}


def families():
    code = source_text(["src/doctor/*.rs"])
    found = set(re.findall(r'(?:let name = |name: |format!\()\s*"([a-z]+)[.\[{"]', code))
    return found - OPTIONAL_FAMILIES


def fences(text):
    """(first line number, language, body lines) of every fenced block."""
    out, lang, start, body = [], None, 0, []
    for n, line in enumerate(text.splitlines(), 1):
        m = re.match(r"\s*```(\S*)", line)
        if m and lang is None:
            lang, start, body = m.group(1), n, []
        elif m:
            out.append((start, lang, body))
            lang = None
        elif lang is not None:
            body.append(line)
    return out


def check_consistency(all_docs):
    want = families()
    for path, text in all_docs:
        lines = text.splitlines()
        for n, line, _ in prose_lines(text):
            for m in re.finditer(r"skopeo copy\b([^`\n]*)", line):
                count("skopeo copies")
                if "--preserve-digests" not in m.group(1):
                    fail(f"{path}:{n}", "`skopeo copy` without --preserve-digests: the pushed "
                         "image may get another digest than the one the kit pins")
            if re.search(r"\b(?:does not|doesn't|do not|don't)\s+(?:\w+\s+){0,3}\w+\s+it\s+yet\b",
                          line):
                fail(f"{path}:{n}", "hedges about a version that does not do it yet: say what "
                     "this version does")
            if re.search(r"admin\b[^.]*\b(?:binds?|listens? on)\s+`?\[::\]", line) and \
                    not re.search(r"\b(?:never|not)\b", line):
                fail(f"{path}:{n}", "says the admin listener binds [::]: it binds the pod IPs and "
                     "127.0.0.1")
        flat = " ".join(lines)
        for m in re.finditer(r"`doctor` prints one `PASS` line per check \(([^)]*)\)", flat):
            count("doctor samples")
            named = {re.split(r"[.\[*]", w)[0] for w in re.findall(r"`([^`]+)`", m.group(1))}
            if want - named:
                fail(path, f"the list of doctor's lines lacks {', '.join(sorted(want - named))}")
        if path in ("README.md", "docs/install.md", "docs/operate.md"):
            for start, lang, body in fences(text):
                if lang != "sh" or not any(re.search(r"(?:^|[\s(])(?:scripts/|cargo )", b)
                                           for b in body):
                    continue
                count("checkout blocks")
                before = " ".join(lines[max(0, start - 5):start - 1]).lower()
                if "checkout" not in before:
                    fail(f"{path}:{start}", "runs scripts/ or cargo without saying it needs a "
                         "checkout (the release folder has neither)")
        for start, lang, body in fences(text):
            if not body or not re.fullmatch(r"\d+ checks, \d+ failed", body[-1].strip()):
                continue
            count("doctor samples")
            have = {re.split(r"[.\[:]", l.split(" ", 1)[1])[0] for l in body
                    if re.match(r"(PASS|FAIL|WARN) ", l)}
            if want - have:
                fail(f"{path}:{start}", f"doctor's sample output lacks the "
                     f"{', '.join(sorted(want - have))} line(s) doctor prints by default")
