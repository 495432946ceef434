#!/usr/bin/env python3
"""No library function over LIMIT lines without a reason written beside it (issue 47, item 6).

A function body is found by matching braces in the source with its comments,
strings and preprocessor lines blanked out: a `{` whose enclosing braces are
all namespaces, classes, structs, unions or `extern "C"` blocks, and whose
header (the text since the previous `;`, `{` or `}`) has a parameter list and
is not an initializer (`= {`), opens a function. Its length counts the lines
from the header's first line to the closing brace. A function over the limit
fails this check unless the line just before its header is a comment
`// long: <reason>` with a reason.

  tests/structure/check_function_length.py SOURCE_DIR [--limit N] [--list] [FILE...]

--list prints every function over the limit (with or without a reason), longest
first; FILE arguments check those files instead of the library folders.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

LIBRARY_FOLDERS = ("common", "hdf5io", "loader", "gpu", "daemon", "trainer", "capi", "cli")
SUFFIXES = (".cc", ".cu", ".h", ".cuh")
LONG_COMMENT = re.compile(r"^\s*//\s*long:\s*\S")
SCOPE_KEYWORDS = re.compile(r"^(?:template\s*<.*>\s*)?(?:namespace|class|struct|union|enum)\b|^extern\s*$", re.S)


def blank_code(text):
    """The text with comments, string and character literals and preprocessor
    lines replaced by spaces; newlines are kept, so offsets and lines match."""
    out = list(text)
    i, n = 0, len(text)
    line_start = True

    def blank(a, b):
        for k in range(a, b):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        c = text[i]
        if line_start and c == "#" or (line_start and c in " \t" and text[i:].lstrip(" \t").startswith("#")):
            # A preprocessor line, with its continuations.
            j = i
            while j < n:
                if text[j] == "\n" and (j == 0 or text[j - 1] != "\\"):
                    break
                j += 1
            blank(i, j)
            i = j
            continue
        if c == "\n":
            line_start = True
            i += 1
            continue
        line_start = False
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            blank(i, j)
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            blank(i, j)
            i = j
        elif c == "R" and i + 1 < n and text[i + 1] == '"' and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'R"([^()\\ ]{0,16})\(', text[i:])
            if m:
                end = text.find(")" + m.group(1) + '"', i + m.end())
                j = n if end < 0 else end + len(m.group(1)) + 2
                blank(i + 1, j)
                i = j
            else:
                i += 1
        elif c == '"' or (c == "'" and not (i > 0 and text[i - 1].isalnum())):  # 1'000 is a digit separator
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            blank(i + 1, min(j, n))
            i = j + 1
        else:
            i += 1
    return "".join(out)


def is_function_header(header):
    h = " ".join(header.split())
    if not h or "(" not in h:
        return False
    if SCOPE_KEYWORDS.match(h) or h.startswith("extern "):
        return False
    # An initializer (`x = {`, `kTable[] = {`): an `=` outside parentheses that is not an operator's name.
    h2 = re.sub(r"operator\s*(?:[=!<>+\-*/%^&|~\[\]()]+)", "operator", h)
    depth = 0
    for ch in h2:
        if ch in "(<[":
            depth += 1
        elif ch in ")>]":
            depth = max(0, depth - 1)
        elif ch == "=" and depth == 0:
            return False
    if h2.rstrip().endswith(("=", ",", "return", "(")):
        return False
    return True


def functions(path):
    """(first line, last line, header) of each function defined in the file, 1-based."""
    text = open(path, encoding="utf-8", errors="replace").read()
    code = blank_code(text)
    stack = []  # per open brace: True where it is a scope functions are defined in
    header_start = 0
    found = []
    for i, c in enumerate(code):
        if c == "{":
            in_scope = all(s[0] for s in stack)
            header = code[header_start:i]
            if in_scope and is_function_header(header):
                first = header_start + (len(header) - len(header.lstrip()))
                stack.append((False, first, " ".join(header.split())))
            else:
                h = " ".join(header.split())
                scope = in_scope and (SCOPE_KEYWORDS.match(h) is not None or h.startswith("extern"))
                stack.append((scope, None, None))
            header_start = i + 1
        elif c == "}":
            if not stack:
                raise ValueError(f"{path}:{code.count(chr(10), 0, i) + 1}: '}}' without its '{{'")
            _, first, header = stack.pop()
            if first is not None:
                found.append((code.count("\n", 0, first) + 1, code.count("\n", 0, i) + 1, header))
            header_start = i + 1
        elif c == ";":
            header_start = i + 1
        elif c == ":" and stack and stack[-1][0] and re.search(r"\b(public|private|protected)\s*$", code[header_start:i]):
            header_start = i + 1
    if stack:
        raise ValueError(f"{path}: {len(stack)} '{{' never closed (braces split across #if branches?)")
    return text.split("\n"), found


def FunctionName(header):
    """The name a header defines: the identifier before its parameter list
    (attributes such as __launch_bounds__(256) skipped)."""
    for m in re.finditer(r"([A-Za-z_~][\w:~<>]*)\s*\(", header):
        if not m.group(1).startswith("__") and m.group(1) not in ("alignas", "decltype", "noexcept"):
            return m.group(1)
    return header[:40]


def library_files(src):
    try:
        listed = subprocess.run(["git", "-C", src, "ls-files", *LIBRARY_FOLDERS], check=True, capture_output=True,
                                text=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        listed = [os.path.relpath(os.path.join(d, f), src) for folder in LIBRARY_FOLDERS
                  for d, _, files in os.walk(os.path.join(src, folder)) for f in files]
    return sorted(f for f in listed if f.endswith(SUFFIXES))


def check(src, files, limit):
    """(every function over `limit` as (length, file, line, name, has a reason), the failures)."""
    long_ones, bad = [], []
    for rel in files:
        path = rel if os.path.isabs(rel) else os.path.join(src, rel)
        try:
            lines, found = functions(path)
        except ValueError as e:
            bad.append(f"{e}: cannot tell its functions apart")
            continue
        for first, last, header in found:
            length = last - first + 1
            if length <= limit:
                continue
            name = FunctionName(header)
            reason = first >= 2 and LONG_COMMENT.match(lines[first - 2])
            long_ones.append((length, rel, first, name, bool(reason)))
            if not reason:
                bad.append(f"{rel}:{first}: {name} is {length} lines (over {limit}): split it by what it "
                           f"does, or write '// long: <reason>' on the line before it")
    return long_ones, bad


def self_test(limit):
    """The check itself on a planted file: a function one line over the limit
    fails, the same with its reason does not, one at the limit does not.
    Over and Excused: 1 + 1 + (limit - 3) + 2 lines; AtTheLimit: one fewer."""
    body = "".join(f"  x += {k};  // {{ not a brace: a comment\n" for k in range(limit - 3))
    text = ("namespace planted {\nnamespace {\n"
            "int Over(int x) {\n  x += 1;\n" + body + "  return x;\n}\n"
            "// long: planted, with its reason\nint Excused(int x) {\n  x += 1;\n" + body + "  return x;\n}\n"
            "int AtTheLimit(int x) {\n" + body + "  return x;\n}\n"
            "const char* kText = \"}\";\n}  // namespace\n}  // namespace planted\n")
    with tempfile.NamedTemporaryFile("w", suffix=".cc", delete=False) as f:
        f.write(text)
    try:
        long_ones, bad = check("", [f.name], limit)
    finally:
        os.unlink(f.name)
    got = sorted((name, reason) for _, _, _, name, reason in long_ones)
    return got == [("Excused", True), ("Over", False)] and len(bad) == 1


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src")
    ap.add_argument("files", nargs="*")
    ap.add_argument("--limit", type=int, default=100)
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args()
    if not self_test(args.limit):
        print("check_function_length: the check missed a planted long function (its parser is broken)")
        return 1
    files = args.files or library_files(args.src)
    if not files:
        print(f"check_function_length: no library sources under {args.src}")
        return 1
    long_ones, bad = check(args.src, files, args.limit)
    if args.list:
        for length, rel, first, name, reason in sorted(long_ones, reverse=True):
            print(f"{length:5d} {rel}:{first} {name}{'  (long: reason given)' if reason else ''}")
    for b in bad:
        print(b)
    if bad:
        print(f"check_function_length: {len(bad)} function(s) over {args.limit} lines without a reason")
        return 1
    print(f"check_function_length: {len(files)} files, {len(long_ones)} function(s) over {args.limit} lines, "
          f"each with its reason")
    return 0


if __name__ == "__main__":
    sys.exit(main())
