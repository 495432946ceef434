#!/usr/bin/env python3
"""Every path the docs name exists in the tree: README.md and docs/*.md, outside
fenced code blocks (the README's shell blocks are run by readme_commands_test.py).

What counts as a path a document names:
  - an inline code span that is one path-like word with a `/` (`loader/door/`,
    `hdf5io/hdf5/dataset.cc`, `gpufeed/dataset.h`) or a source file's name
    (`feeder.cc`, `protocol.*`);
  - a path with a folder and a source or doc extension in the prose
    (tests/daemon/server_test.cc, docs/benchmarks.md);
  - a relative Markdown link's target ([format.md](format.md)).
A path with a `/` is looked for from the repository root, then under include/
(`gpufeed/x.h` as code includes it), then beside the document, then under the
folder the table row is about (a row whose first cell is `folder/`: its files
may be named by their place in it). A bare file name is looked for under that
folder, or anywhere in the tree outside a table row. Generated paths (build/,
build-*/, dist/, .venv/) and names outside the tree (absolute paths, addresses
such as unix:PATH or tcp://H:P, FILE.h5:/dataset, globs and placeholders) are
not checked. Each path that is missing is reported with its file and line, and
the test fails.

Before the docs, the checker runs on a small document of its own with paths that
exist and paths that do not, and fails unless it finds exactly the missing ones.

  doc_paths_test.py SOURCE_DIR
"""
import os
import re
import subprocess
import sys
import tempfile

SOURCE_EXT = ("cc", "h", "cu", "cuh", "c", "py", "sh", "md", "cmake", "map", "supp", "in")
FENCE = re.compile(r"^\s*```")
CODE_SPAN = re.compile(r"`([^`\n]+)`")
PATH_WORD = re.compile(r"^[A-Za-z0-9_.][A-Za-z0-9_.+\-]*(?:/[A-Za-z0-9_.+\-]+)*/?(?:\.\*)?$")
PROSE_PATH = re.compile(r"(?<![\w/.\-:`])((?:\.\./)*(?:[A-Za-z0-9_][\w.+\-]*/)+[\w+\-]+(?:\.[\w+\-]+)*"
                        r"\.(?:%s))(?![\w/])" % "|".join(SOURCE_EXT))
BRACES = re.compile(r"(?<![\w/.\-:])((?:[A-Za-z0-9_][\w.+\-]*/)*[\w+\-]+)\.\{([\w,]+)\}")  # dir/name.{h,cc}
LINK = re.compile(r"\]\(([^)\s]+)\)")
ROW_FOLDER = re.compile(r"^\|\s*`([^`]+/)`\s*\|")
GENERATED = re.compile(r"^(?:build(?:-[\w.-]+)?|dist|\.venv)(?:/|$)")
# Names that are not the tree's and say so: a system header.
OUTSIDE = {"dlpack/dlpack.h"}


def git_files(root, *args):
    """The files `git ls-files ARGS` lists, or None outside a git checkout."""
    try:
        out = subprocess.run(["git", "-C", root, "ls-files", "-z", *args], capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return {f.decode() for f in out.split(b"\0") if f and os.path.isfile(os.path.join(root, f.decode()))}


def walked_files(root):
    files = set()
    for d, subdirs, names in os.walk(root):
        rel = os.path.relpath(d, root)
        subdirs[:] = [s for s in subdirs
                      if s not in (".git", "__pycache__") and not (rel == "." and GENERATED.match(s + "/"))]
        files.update(n if rel == "." else os.path.join(rel, n) for n in names)
    return files


def folders_of(files):
    folders = set()
    for f in files:
        d = os.path.dirname(f)
        while d:
            folders.add(d)
            d = os.path.dirname(d)
    return folders


def is_source_name(word):
    if word.endswith(".*"):  # `protocol.*`: a source file's stem (not a test filter such as `Quant8Test.*`)
        return re.match(r"^[a-z0-9_]+\.\*$", word.rsplit("/", 1)[-1]) is not None
    return "." in word and word.rsplit(".", 1)[1] in SOURCE_EXT


def is_placeholder(word):
    """`I/O`, `DIR/x`, `XDG_RUNTIME_DIR/gpufeed`: a word in capitals first is a placeholder, not a path."""
    return re.match(r"^[A-Z][A-Z0-9_]*/", word) is not None


class Tree:
    """The tree's files: a git checkout's tracked and untracked ones (not the ignored: build outputs), else
    every file outside the generated folders. `committed`: the tracked files alone (what the Layout must show)."""

    def __init__(self, root):
        self.files = git_files(root, "-co", "--exclude-standard")
        self.committed = git_files(root)
        if self.files is None:
            self.files = self.committed = walked_files(root)
        self.folders = folders_of(self.files)
        self.by_name = {}
        for f in self.files:
            self.by_name.setdefault(os.path.basename(f), []).append(f)

    def has(self, rel):
        """rel (a file, `folder/`, or `stem.*`) is in the tree."""
        rel = os.path.normpath(rel.rstrip("/")) if rel.rstrip("/") else "."
        if rel.endswith(".*"):
            stem = rel[:-1]
            return any(f.startswith(stem) and "/" not in f[len(stem):] for f in self.files)
        return rel in self.files or rel in self.folders

    def has_name_under(self, name, folder):
        """A bare file name (or `stem.*`) somewhere under folder ('' for the whole tree)."""
        prefix = folder.rstrip("/") + "/" if folder else ""
        if name.endswith(".*"):
            stem = name[:-1]
            return any(f.startswith(prefix) and os.path.basename(f).startswith(stem) and
                       "." not in os.path.basename(f)[len(stem):] for f in self.files)
        return any(f.startswith(prefix) for f in self.by_name.get(name, []))


def resolve(tree, word, doc_dir, row_folder):
    """True when `word` names something in the tree (or is not the tree's to check)."""
    if GENERATED.match(word) or word in OUTSIDE:
        return True
    if word == ".." or word.startswith("../"):
        return False  # outside the repository: a user's clone has nothing there
    if "/" not in word.rstrip("/"):
        if word.endswith("/"):  # `folder/`
            if row_folder and tree.has(os.path.join(row_folder, word)):
                return True
            return tree.has(word) or tree.has(os.path.join(doc_dir, word))
        return tree.has_name_under(word, row_folder or "")
    candidates = [word, os.path.join("include", word), os.path.join(doc_dir, word)]
    if row_folder:
        candidates.append(os.path.join(row_folder, word))
    return any(tree.has(c) for c in candidates)


def names_in_line(line):
    """The path-like words a prose line names: [(word, is_link)]."""
    found = []
    for m in BRACES.finditer(line):
        found += [("%s.%s" % (m.group(1), ext), False) for ext in m.group(2).split(",")]
    line = BRACES.sub(" ", line)
    for m in CODE_SPAN.finditer(line):
        w = m.group(1).strip()
        if PATH_WORD.match(w) and ("/" in w or is_source_name(w)) and not is_placeholder(w):
            found.append((w, False))
    prose = CODE_SPAN.sub(" ", line)
    for m in LINK.finditer(prose):
        target = m.group(1)
        if not re.match(r"^[a-z][a-z0-9+.-]*:", target) and not target.startswith("/"):
            found.append((target, True))
    prose = LINK.sub(" ", prose)
    for m in PROSE_PATH.finditer(prose):
        found.append((m.group(1), False))
    return found


def anchors_of(path):
    """The anchors of a Markdown file's headings, as GitHub makes them: lower case, punctuation dropped,
    spaces to hyphens, a repeated one numbered (-1, -2, ...); headings in fenced blocks are not headings."""
    seen, anchors, in_fence = {}, set(), False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if FENCE.match(line):
                in_fence = not in_fence
            m = None if in_fence else re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
            if not m:
                continue
            slug = re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-")
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            anchors.add(slug if n == 0 else "%s-%d" % (slug, n))
    return anchors


def check_doc(tree, root, rel):
    """['rel:line: message'] for each path `rel` names that is not in the tree."""
    problems, in_fence = [], False
    doc_dir = os.path.dirname(rel)
    with open(os.path.join(root, rel), encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if FENCE.match(line):
                in_fence = not in_fence
                continue
            if in_fence:
                continue
            m = ROW_FOLDER.match(line)
            row_folder = m.group(1) if m and not GENERATED.match(m.group(1)) else None
            for word, is_link in names_in_line(line):
                if is_link:
                    target, _, anchor = word.partition("#")
                    target = os.path.join(doc_dir, target) if target else rel
                    ok = tree.has(target)
                    if ok and anchor and target.endswith(".md"):
                        ok = anchor in anchors_of(os.path.join(root, target))
                        if not ok:
                            problems.append("%s:%d: `%s`: %s has no heading whose anchor is #%s"
                                            % (rel, n, word, target, anchor))
                            continue
                else:
                    ok = resolve(tree, word, doc_dir, row_folder)
                if not ok:
                    where = " (in the row of `%s`)" % row_folder if row_folder else ""
                    what = "is outside the repository (a clone has nothing there)" if word.startswith("..") \
                        else "is not in the tree"
                    problems.append("%s:%d: `%s`%s %s" % (rel, n, word, where, what))
    return problems


def check_layout(tree, root, rel):
    """README.md's Layout: the fenced block under `## Layout` draws the tree, a folder a line (`name/` first on
    the line, under the nearest line above it that is indented less; a line whose first word is not a folder is
    a label and adds nothing to the path). Each folder drawn exists, and every folder of the committed tree at
    the top, or holding library sources (outside tests/, bench/, include/, examples/, scripts/), is drawn."""
    problems, drawn, stack = [], set(), []
    with open(os.path.join(root, rel), encoding="utf-8") as f:
        lines = f.read().split("\n")
    try:
        start = next(i for i, l in enumerate(lines) if re.match(r"^##\s+Layout\s*$", l))
        fence = next(i for i in range(start + 1, len(lines)) if FENCE.match(lines[i]))
        end = next(i for i in range(fence + 1, len(lines)) if FENCE.match(lines[i]))
    except StopIteration:
        return ["%s: no `## Layout` section with a code block drawing the tree" % rel]
    for n in range(fence + 1, end):
        m = re.match(r"^( *)(\S+)", lines[n])
        if not m:
            continue
        indent, word = len(m.group(1)), m.group(2)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1] if stack else ""
        if word.endswith("/") and PATH_WORD.match(word):
            path = parent + word
            if not tree.has(path):
                problems.append("%s:%d: the Layout draws `%s`, which is not in the tree" % (rel, n + 1, path))
            d = path.rstrip("/")
            while d:
                drawn.add(d)
                d = os.path.dirname(d)
            stack.append((indent, path))
        else:
            stack.append((indent, parent))
    mirrors = ("tests/", "bench/", "include/", "examples/", "scripts/")
    required = {f.split("/", 1)[0] for f in tree.committed if "/" in f and not f.startswith(".")}
    required |= {os.path.dirname(f) for f in tree.committed
                 if "/" in f and not f.startswith(".") and not f.startswith(mirrors)
                 and f.rsplit(".", 1)[-1] in ("cc", "h", "cu", "cuh", "py")}
    for d in sorted(required - drawn):
        problems.append("%s:%d: the Layout does not draw `%s/`, a folder of the tree: add a line for it"
                        % (rel, fence + 1, d))
    return problems


def docs_of(root):
    docs = ["README.md"] if os.path.isfile(os.path.join(root, "README.md")) else []
    d = os.path.join(root, "docs")
    if os.path.isdir(d):
        docs += sorted(os.path.join("docs", f) for f in os.listdir(d) if f.endswith(".md"))
    return docs


def self_check():
    """The checker finds exactly the missing paths of a document made for it."""
    with tempfile.TemporaryDirectory() as t:
        for p in ("lib/io/file.cc", "lib/io/file.h", "include/gpufeed/api.h", "docs/other.md", "tests/lib/a_test.cc",
                  "tools/gen.py"):
            os.makedirs(os.path.join(t, os.path.dirname(p)), exist_ok=True)
            open(os.path.join(t, p), "w").close()
        doc = ("# x\n"
               "`lib/io/` and `lib/io/file.cc` and `gpufeed/api.h` and `file.*` and [o](docs/other.md)\n"
               "missing: `lib/net/` and `lib/io/gone.cc` and tests/lib/b_test.cc and [m](docs/none.md#a) and "
               "`lib/io/file.{h,c}`\n"
               "outside: `../shared/data/` and ../shared/NOTES.md\n"
               "| `lib/` | `io/file.h`, `file.cc`, `gone.h` |\n"
               "not paths: `build/gpufeed`, `unix:/tmp/s`, `FILE.h5:/images`, `'dir/*.h5'`, `/usr/share/x`, `I/O`,\n"
               "`DIR/a.cc`, `Suite.*`, `dist/gpufeed/lib/x.so`, [here](#layout), [no](#nowhere)\n"
               "```\nlib/fenced/not_checked.cc `nope/`\n```\n"
               "## Layout\n```text\nlib/   the library\n  io/   reading\n  net/  missing\nthe rest\n"
               "  include/gpufeed/ headers\ndocs/\ntests/  mirrors lib/\n```\n")
        with open(os.path.join(t, "README.md"), "w") as f:
            f.write(doc)
        got = check_doc(Tree(t), t, "README.md") + check_layout(Tree(t), t, "README.md")
        want = sorted(["README.md:3: `lib/net/`", "README.md:3: `lib/io/gone.cc`", "README.md:3: `lib/io/file.c`",
                       "README.md:3: `tests/lib/b_test.cc`",
                       "README.md:3: `docs/none.md#a`", "README.md:4: `../shared/data/`",
                       "README.md:4: `../shared/NOTES.md`", "README.md:5: `gone.h`", "README.md:7: `#nowhere`",
                       "README.md:15: the Layout draws `lib/net/`", "README.md:12: the Layout does not draw `tools/`"])
        got = sorted(got)
        if len(got) != len(want) or any(not g.startswith(w) for g, w in zip(got, want)):
            sys.exit("doc_paths: the checker's own check failed:\n  want %s\n  got  %s" % (want, got))


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    root = sys.argv[1]
    self_check()
    tree = Tree(root)
    docs = docs_of(root)
    problems = [p for d in docs for p in check_doc(tree, root, d)]
    if "README.md" in docs:
        problems += check_layout(tree, root, "README.md")
    for p in problems:
        print(p)
    if problems:
        sys.exit("doc_paths: %d problems in %s: write each path from the repository root as it is now (or fix "
                 "the name), and draw every folder in README.md's Layout" % (len(problems), ", ".join(docs)))
    print("doc_paths: every path named in %s exists" % ", ".join(docs))


if __name__ == "__main__":
    main()
